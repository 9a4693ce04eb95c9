"""Searching a padded batch: output limits, the strategy's start program, then its loop in
stages (`compaction`); and compiling a batch shape's programs ahead of its first search."""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from transformer.config import SearchConfig
from transformer.model import Transformer
from transformer.search.compaction import compact_rows, run_in_stages
from transformer.search.programs import programs_for
from transformer.search.result import SearchResult
from transformer.strategies import plan_search

if TYPE_CHECKING:
    from transformer.ensemble import Ensemble

Array = jax.Array


def search(model: Transformer | Ensemble, src_ids: np.ndarray | Array, config: SearchConfig,
           rng: Array | None = None, compact: bool = False,
           candidates: np.ndarray | None = None) -> SearchResult:
    """Translate a padded batch of source ids [batch, src_len] (EOS included, PAD after).

    `config` names the strategy (`transformer.strategies.plan_search`); beam search with
    beam_size 1 is run as beam search (greedy search is strategy="greedy"). `compact` and
    `candidates`: see `search_with_state`.
    """
    graphdef, state = nnx.split(model)
    return search_with_state(graphdef, state, src_ids, config, rng, compact, candidates)


def search_with_state(graphdef: nnx.GraphDef, state: nnx.State, src_ids: np.ndarray | Array,
                      config: SearchConfig, rng: Array | None = None, compact: bool = False,
                      candidates: np.ndarray | None = None) -> SearchResult:
    """`search` for a model already split with `nnx.split` (what training loops hold).

    With `compact`, the search leaves finished sentences behind as it goes
    (`transformer.search.compaction`): less work on real text, for a few more programs to
    compile (one per row count), which pays over many batches of a shape
    (`nmt.models.translator` decides). Without, every row computes until the batch's last
    sentence ends. The hypotheses are the same either way.

    `candidates` (int32 [K], ascending, every special id first: `transformer.shortlist`)
    restricts the output to those tokens: the output projection and softmax run over K
    tokens instead of the vocabulary. With every token as a candidate the result is the
    search's without.
    """
    strategy = _planned(config)
    if strategy.draws and rng is None:
        raise ValueError("strategy='sample' needs an rng (jax.random.key(seed)).")
    rng = rng if rng is not None else jax.random.key(0)
    programs = programs_for(graphdef, state)
    model_config = programs.model_config
    strategy.check_vocabulary(model_config.vocab_size)
    src = np.asarray(src_ids, dtype=np.int32)
    limits, max_len = output_limits(src, config, model_config.pad_id, model_config.max_len)
    loop = programs.loop(strategy)
    if candidates is not None:
        candidates = check_candidates(candidates, model_config)
        strategy.check_vocabulary(len(candidates), "the candidate tokens given")
    sources, loop_state = loop.start(strategy, max_len, state, src, limits)
    result = run_in_stages(loop, strategy, max_len, state, sources, loop_state, limits,
                           model_config.pad_id, rng, compact, candidates)
    if candidates is None:
        return result
    return dataclasses.replace(result, tokens=candidates[result.tokens])


def check_candidates(candidates: np.ndarray, model_config) -> np.ndarray:
    """int32 candidates, ascending, holding every special id at its own position (ValueError
    otherwise): the search then treats positions < that as the ids themselves."""
    candidates = np.asarray(candidates, np.int32)
    special = max(model_config.pad_id, model_config.unk_id, model_config.bos_id,
                  model_config.eos_id) + 1
    if (candidates.ndim != 1 or len(candidates) <= special
            or not np.array_equal(candidates[:special], np.arange(special))
            or np.any(np.diff(candidates) <= 0) or candidates[-1] >= model_config.vocab_size):
        raise ValueError(f"candidates must be ascending token ids below the vocabulary size "
                         f"({model_config.vocab_size}), starting with 0..{special - 1} (the "
                         "special ids) and at least one more token.")
    return candidates


def compile_search(graphdef: nnx.GraphDef, state: nnx.State, batch_shape: tuple[int, int],
                   config: SearchConfig, halvings: bool = True,
                   candidates: int | None = None) -> list:
    """Compile (or load from the compilation cache) the programs a search of a batch of
    `batch_shape` (rows, padded source length) runs, without running them: its start and its
    loop, and with `halvings` the loop and compaction at every halving of the rows
    (`compact`); `candidates`: the size of a shortlist's candidate list, if searched with
    one. Thread-safe: a later search of that shape finds them compiled. Returns the compiled
    programs in that order (their `memory_analysis()` says what each allocates)."""
    rows, width = batch_shape
    programs = programs_for(graphdef, state)
    strategy = _planned(config)
    loop = programs.loop(strategy)
    max_len = config.max_output_len(width, programs.model_config.max_len)
    int32 = functools.partial(jax.ShapeDtypeStruct, dtype=jnp.int32)
    start = loop.start.compile(strategy, max_len, state, int32((rows, width)), int32((rows,)))
    compiled = [start]
    sources, loop_state = _shapes_of(start.out_info)
    while True:
        compiled.append(loop.resume.compile(
            strategy, max_len, state, sources, loop_state, int32(()), jax.random.key(0),
            None if candidates is None else int32((candidates,))))
        if not halvings or rows == 1:
            return compiled
        rows //= 2
        compiled.append(compact_rows.compile(sources, loop_state, int32((rows,))))
        sources, loop_state = _shapes_of(compiled[-1].out_info)


@functools.lru_cache(maxsize=64)
def _planned(config: SearchConfig):
    """`plan_search`, once per settings: every batch of a call searches with the same."""
    return plan_search(config)


def _shapes_of(out_info):
    """A program's outputs as plain shapes and dtypes, as the arrays a search passes on
    present them (without the executable's placement, which would key another program)."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=x.weak_type), out_info)


def output_limits(src_ids: np.ndarray, config: SearchConfig, pad_id: int, model_max_len: int
                  ) -> tuple[np.ndarray, int]:
    """Per-sentence output limits [batch] (1 for a row of PAD only) and the static loop
    length: the limit for a source as long as the padded width, which bounds every limit.

    The static length depends only on the padded source width, so it adds no compiled shapes.
    """
    src_lens = (src_ids != pad_id).sum(axis=1)
    limits = np.array([config.max_output_len(int(n), model_max_len) for n in src_lens], np.int32)
    static = config.max_output_len(src_ids.shape[1], model_max_len)
    # A row of PAD only fills a batch to its compiled shape: it ends at its first position, so
    # that it never keeps the loop running after every real sentence is done.
    limits = np.where(src_lens == 0, 1, limits)
    return np.minimum(limits, static), static


def pad_sources(sequences: Sequence[Sequence[int]], pad_id: int, batch_size: int | None = None,
                width: int | None = None) -> np.ndarray:
    """Pad token-id lists (EOS included) to [batch_size or len(sequences), width or longest
    length]."""
    rows = batch_size or len(sequences)
    if rows < len(sequences):
        raise ValueError(f"batch_size {rows} is smaller than the {len(sequences)} sequences given.")
    width = width or max((len(s) for s in sequences), default=1)
    out = np.full((rows, width), pad_id, dtype=np.int32)
    for i, seq in enumerate(sequences):
        out[i, : len(seq)] = seq
    return out
