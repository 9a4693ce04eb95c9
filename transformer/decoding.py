"""Greedy, sampling and beam search over the Transformer's cached decoder, and force
decoding of given references (`reference_logprobs`).

Every search starts from BOS, runs the decoder on one new position per step (keys and values
of earlier positions come from the cache), and loops with `lax.while_loop` over static shapes
until every sentence has ended or reached its length limit. A search is two jitted programs,
its start (encoder, first step) and its loop, so that the loop can stop early and resume on
fewer rows once most sentences are done (`compact`, `_search_in_stages`). Each sentence has
its own limit `max_len_a * source_length + max_len_b` (EOS included); at that position EOS is
forced, as fairseq does, so every output ends with EOS. PAD and BOS are never produced.
After EOS a sequence is padded with PAD.

The model is a `Transformer` or a `transformer.ensemble.Ensemble`, which decodes several
models in step and returns log-probabilities as logits; both give caches with the operations
beam search needs (`transformer.cache.SearchCache`).
It is split once (`nnx.split`) and the jitted functions take its state as an argument,
so searching with new parameters (e.g. after a training step) does not recompile. The
model's graph is closed over, one set of jitted programs per graph (`_Programs`): jit hashes
its static arguments at every call, and a graph's hash walks the whole model. A jitted search
has one static argument, `_SearchProgram`: the `SearchConfig`
with the settings its strategy never reads reset, and the output length. A new search option
is one field of `SearchConfig`, read where it is needed. A compiled shape is (batch, padded
source length); the output length is derived from the padded source length.
`nmt.models.translator.Translator` feeds search with batches from
`data.batching.inference_batches`, whose source widths come from the fixed bucket list
`data.config.INFERENCE_BUCKETS` (8 lengths from 16 to 256, capped at the model's max_len),
with a few power-of-two batch sizes per width (small calls get small batches), so the number
of compiled shapes stays bounded however many sentences are translated.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
from typing import TYPE_CHECKING, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from transformer.cache import SearchCache
from transformer.config import ModelConfig, SearchConfig
from transformer.model import Transformer
from transformer.stored import StoredJit, stable_repr

if TYPE_CHECKING:
    from transformer.ensemble import Ensemble

Array = jax.Array

# A large negative number rather than -inf: scores are added and compared, never subtracted,
# and finite values keep every comparison free of NaN.
NEG_INF = -1.0e9

@dataclasses.dataclass(frozen=True)
class SearchResult:
    """Hypotheses per sentence, best first.

    tokens:  int32 [batch, nbest, max_len], each ending with EOS and padded after it.
    scores:  float32 [batch, nbest]: log-probability divided by the length penalty (beam),
             or the plain log-probability (greedy, sampling; nbest = 1).
    lengths: int32 [batch, nbest], tokens up to and including EOS.
    limits:  int32 [batch], each sentence's output limit (EOS included); a hypothesis as long
             as its limit ended there because EOS was forced.
    steps:   decoder steps the search ran: the batch's longest search, at most the limit for a
             source of the padded width.
    row_steps: the work those steps did, rows (sentences) decoded summed over the steps: less
             than batch * steps where finished sentences were left behind.
    stage_rows: the rows of each stage of the search, the batch's first (see
             `_search_in_stages`).
    """

    tokens: np.ndarray
    scores: np.ndarray
    lengths: np.ndarray
    limits: np.ndarray
    steps: int
    row_steps: int
    stage_rows: tuple[int, ...]

    def reached_limit(self) -> np.ndarray:
        """bool [batch]: the best hypothesis ended at its output limit, by a forced EOS."""
        return self.lengths[:, 0] >= self.limits


def length_penalty(length: Array, alpha: float, power: bool = False) -> Array:
    """GNMT's length penalty ((5 + length) / 6) ** alpha (Wu et al. 2016, Eq. 14), or with
    `power` length ** alpha (transformers, CTranslate2, Marian). `length` counts EOS."""
    length = length.astype(jnp.float32)
    return length ** alpha if power else ((5.0 + length) / 6.0) ** alpha


def top_k_over_vocab(scores: Array, k: int) -> tuple[Array, Array]:
    """`jax.lax.top_k(scores, k)` for a small k over a long last axis, in two cheap passes.

    scores [rows, n] -> (values [rows, k], int32 indices [rows, k]), identical to
    `lax.top_k`, ties included (equal values: lower index first). Cuts the last axis into
    groups (32, 16 or 8 entries, whichever divides n) and takes the k groups with the largest
    maxima: every one of the k best entries lies in them, since an entry outside them is
    beaten by k group maxima. The chosen groups are read in index order, so ties resolve as
    `lax.top_k` resolves them. One vectorised max and two small top-k replace a top-k over
    [rows, n], which XLA:CPU runs as a scalar loop per row (docs/design.md, "Kernels").
    Falls back to `lax.top_k` when no group size divides n or n is too short for the split
    to pay.
    """
    rows, n = scores.shape
    group = next((g for g in (32, 16, 8) if n % g == 0), None)
    if group is None or n < 8 * k * group:
        return jax.lax.top_k(scores, k)
    groups = scores.reshape(rows, n // group, group)
    _, best_groups = jax.lax.top_k(groups.max(axis=-1), k)  # [rows, k]
    best_groups = jnp.sort(best_groups, axis=-1)
    candidates = jnp.take_along_axis(groups, best_groups[:, :, None], axis=1)  # [rows, k, g]
    values, within = jax.lax.top_k(candidates.reshape(rows, k * group), k)
    group_of = jnp.take_along_axis(best_groups, within // group, axis=1)
    return values, (group_of * group + within % group).astype(jnp.int32)


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


# SearchConfig fields that a strategy's compiled program never reads. Its static argument holds
# them at their defaults, so configs that differ only there share one compiled program. The
# length limit's a and b reach every program as `limits` and `max_len` instead.
_LENGTH_LIMIT_SETTINGS = ("max_len_a", "max_len_b")
_BEAM_SETTINGS = ("beam_size", "nbest", "alpha", "length_penalty", "beam_rules")
_SAMPLING_SETTINGS = ("temperature", "top_k")
_UNREAD_SETTINGS = {
    "beam": _LENGTH_LIMIT_SETTINGS + _SAMPLING_SETTINGS,
    "greedy": _LENGTH_LIMIT_SETTINGS + _BEAM_SETTINGS + _SAMPLING_SETTINGS,
    "sample": _LENGTH_LIMIT_SETTINGS + _BEAM_SETTINGS,
}


@dataclasses.dataclass(frozen=True)
class _SearchProgram:
    """The static argument of a jitted search: what its program depends on besides the model's
    graph and the array shapes. It is part of jax's compile cache key, so it holds nothing the
    program does not read."""

    settings: SearchConfig  # with the fields in _UNREAD_SETTINGS[strategy] at their defaults
    max_len: int            # output positions: the limit for a source of the padded width


def _search_program(config: SearchConfig, max_len: int) -> _SearchProgram:
    """`config`'s static argument, unread settings reset so that they cause no recompile."""
    defaults = SearchConfig()
    unread = {name: getattr(defaults, name) for name in _UNREAD_SETTINGS[config.strategy]}
    return _SearchProgram(dataclasses.replace(config, **unread), max_len)


# ----------------------------------------------------------------------------- public entry


def search(model: Transformer | Ensemble, src_ids: np.ndarray | Array, config: SearchConfig,
           rng: Array | None = None, compact: bool = False) -> SearchResult:
    """Translate a padded batch of source ids [batch, src_len] (EOS included, PAD after).

    `config.strategy` picks greedy, sampling or beam search; beam search with beam_size 1 is
    run as beam search (use strategy="greedy" for greedy). `compact`: see `search_with_state`.
    """
    graphdef, state = nnx.split(model)
    return search_with_state(graphdef, state, src_ids, config, rng, compact)


def search_with_state(graphdef: nnx.GraphDef, state: nnx.State, src_ids: np.ndarray | Array,
                      config: SearchConfig, rng: Array | None = None, compact: bool = False
                      ) -> SearchResult:
    """`search` for a model already split with `nnx.split` (what training loops hold).

    With `compact`, the search leaves finished sentences behind as it goes
    (`_search_in_stages`): a third less work on real text, for a few more programs to compile
    (one per row count), which pays over many batches of a shape (`nmt.models.translator`
    decides). Without, every row computes until the batch's last sentence ends. The
    hypotheses are the same either way.
    """
    if config.strategy == "sample" and rng is None:
        raise ValueError("strategy='sample' needs an rng (jax.random.key(seed)).")
    rng = rng if rng is not None else jax.random.key(0)
    started = _start(_programs(graphdef, state), state, src_ids, config, rng)
    return _search_in_stages(started, state, rng, compact)


def compile_search(graphdef: nnx.GraphDef, state: nnx.State, batch_shape: tuple[int, int],
                   config: SearchConfig, halvings: bool = True) -> None:
    """Compile (or load from the compilation cache) the programs a search of a batch of
    `batch_shape` (rows, padded source length) runs, without running them: its start and its
    loop, and with `halvings` the loop and compaction at every halving of the rows
    (`compact`). Thread-safe: a later search of that shape finds them compiled."""
    rows, width = batch_shape
    programs = _programs(graphdef, state)
    strategy, program = programs.planned(config, width)
    rng = jax.random.key(0)
    int32 = functools.partial(jax.ShapeDtypeStruct, dtype=jnp.int32)
    start = strategy.start.compile(program, state, int32((rows, width)), int32((rows,)), rng)
    sentences, searched = _shapes_of(start.out_info)
    while True:
        strategy.resume.compile(program, state, sentences, searched, int32(()), rng)
        if not halvings or rows == 1:
            return
        rows //= 2
        compacted = _compact.compile(sentences, searched, int32((rows,)))
        sentences, searched = _shapes_of(compacted.out_info)


def _shapes_of(out_info):
    """A program's outputs as plain shapes and dtypes, as the arrays a search passes on
    present them (without the executable's placement, which would key another program)."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=x.weak_type), out_info)


@dataclasses.dataclass(frozen=True)
class _Started:
    """A search after its start program: what its stages continue from."""

    strategy: "_Strategy"
    program: _SearchProgram
    sentences: "_Sentences"
    searched: "_GreedyState | _BeamState"
    limits: np.ndarray  # [batch], each sentence's output limit
    pad_id: int


def _start(programs: "_Programs", state, src_ids, config: SearchConfig, rng: Array
           ) -> _Started:
    """Output limits, the static program, and the strategy's start program run on src_ids."""
    model_config = programs.model_config
    src_np = np.asarray(src_ids, dtype=np.int32)
    limits, _ = output_limits(src_np, config, model_config.pad_id, model_config.max_len)
    strategy, program = programs.planned(config, src_np.shape[1])
    sentences, searched = strategy.start(program, state, src_np, limits, rng)
    return _Started(strategy, program, sentences, searched, limits, model_config.pad_id)


class _Programs:
    """The jitted search and scoring programs of one model graph, the graph closed over.

    jit hashes its static arguments at every call, and hashing a GraphDef walks every node of
    the model (a third of a small batch's search time was spent so, and as much again merging
    the model to read its config). With the graph closed over, a call hashes only the small
    `_SearchProgram`. Equal graphs share one `_Programs` (`_programs`), and so their compiled
    programs, as they shared jit's cache entries when the graph was a static argument.
    """

    def __init__(self, graphdef: nnx.GraphDef, state: nnx.State):
        self.model_config: ModelConfig = nnx.merge(graphdef, state).config
        self.strategies = {
            name: _Strategy(
                start=_jit_with_graph(strategy.start, graphdef, static_args=1),
                resume=_jit_with_graph(strategy.resume, graphdef, static_args=1,
                                       donate_argnums=(3,)),  # the search state
                outputs=strategy.outputs)
            for name, strategy in (("beam", _BEAM), ("greedy", _GREEDY))}
        self.reference_logprobs = _jit_with_graph(_reference_logprobs, graphdef)

    def planned(self, config: SearchConfig, width: int) -> tuple["_Strategy", _SearchProgram]:
        """The jitted strategy and static program of a search over sources padded to
        `width`: output positions for the limit of a source that long (`output_limits`'
        static length)."""
        program = _search_program(config, config.max_output_len(width,
                                                                 self.model_config.max_len))
        return self.strategies["beam" if config.strategy == "beam" else "greedy"], program


def _jit_with_graph(fn: Callable, graphdef: nnx.GraphDef, **jit_options) -> StoredJit:
    """jax.jit of `fn(graphdef, *args)` as a function of args, named as fn (compile logs
    and the compilation cache's file names say which program it is), its compiled programs
    kept on disk where `transformer.stored` is told where."""
    def with_graph(*args):
        return fn(graphdef, *args)
    with_graph.__name__ = with_graph.__qualname__ = fn.__name__
    return StoredJit(with_graph, identity=lambda: stable_repr(graphdef), **jit_options)


# Graphs seen lately, by identity (a dict lookup per call) and by equality (a reloaded model
# finds its compiled programs); a process that loads many models keeps the newest few.
_PROGRAMS_KEPT = 32
_programs_by_id: collections.OrderedDict[int, tuple[nnx.GraphDef, _Programs]] = \
    collections.OrderedDict()
_programs_by_graph: collections.OrderedDict[nnx.GraphDef, _Programs] = collections.OrderedDict()
_programs_lock = threading.Lock()


def _programs(graphdef: nnx.GraphDef, state: nnx.State) -> _Programs:
    """The `_Programs` of `graphdef` (made on first use; any thread)."""
    seen = _programs_by_id.get(id(graphdef))
    if seen is not None and seen[0] is graphdef:
        return seen[1]
    with _programs_lock:
        programs = _programs_by_graph.get(graphdef)
        if programs is None:
            programs = _programs_by_graph[graphdef] = _Programs(graphdef, state)
        _programs_by_graph.move_to_end(graphdef)
        _programs_by_id[id(graphdef)] = (graphdef, programs)
        for kept in (_programs_by_id, _programs_by_graph):
            while len(kept) > _PROGRAMS_KEPT:
                kept.popitem(last=False)
    return programs


def reference_logprobs(model: Transformer | Ensemble, src_ids: np.ndarray | Array,
                       tgt_ids: np.ndarray | Array) -> np.ndarray:
    """log p(reference | source) of each row, teacher-forced (force decoding, for scoring).

    src_ids [batch, src_len] and tgt_ids [batch, tgt_len] are padded with PAD and end with
    EOS (tgt_ids without BOS); returns float32 [batch], the sum of the log-probabilities of
    every target token, EOS included. Nothing is banned here: a reference is scored as it is.
    """
    graphdef, state = nnx.split(model)
    return reference_logprobs_with_state(graphdef, state, src_ids, tgt_ids)


def reference_logprobs_with_state(graphdef: nnx.GraphDef, state: nnx.State,
                                  src_ids: np.ndarray | Array, tgt_ids: np.ndarray | Array
                                  ) -> np.ndarray:
    """`reference_logprobs` for a model already split with `nnx.split`."""
    score = _programs(graphdef, state).reference_logprobs
    return np.asarray(score(state, jnp.asarray(src_ids, jnp.int32),
                            jnp.asarray(tgt_ids, jnp.int32)))


def _reference_logprobs(graphdef, state, src, tgt):
    """log p(tgt | src) [batch] of src [batch, src_len] and tgt [batch, tgt_len] (no BOS)."""
    model = nnx.merge(graphdef, state)
    config = model.config
    tgt_in = jnp.concatenate([jnp.full((tgt.shape[0], 1), config.bos_id, jnp.int32),
                              tgt[:, :-1]], axis=1)
    # An ensemble returns log-probabilities already; log_softmax leaves them unchanged.
    logprobs = jax.nn.log_softmax(model(src, tgt_in), axis=-1)  # [batch, tgt_len, vocab]
    picked = jnp.take_along_axis(logprobs, tgt[..., None], axis=-1)[..., 0]
    return jnp.where(tgt != config.pad_id, picked, 0.0).sum(axis=1)


# ----------------------------------------------------------------------------- shared pieces


def _banned_ids(min_len: int, config) -> tuple[int, ...]:
    """The tokens a search may never produce at some step: PAD, BOS, and EOS while min_len
    forbids it."""
    ids = [config.pad_id, config.bos_id] + ([config.eos_id] if min_len > 0 else [])
    return tuple(dict.fromkeys(ids))


def _is_banned(token: Array, step: Array, at_limit: Array, min_len: int, config) -> Array:
    """bool, token's shape [rows, ...]: `token` may not be produced at `step`.

    at_limit [rows]: rows whose output limit is this step may end whatever min_len says (the
    caller then lets them produce nothing but EOS).
    """
    eos_allowed = at_limit | (step + 1 >= min_len)
    eos_allowed = eos_allowed.reshape(eos_allowed.shape + (1,) * (token.ndim - 1))
    return ((token == config.pad_id) | (token == config.bos_id)
            | ((token == config.eos_id) & ~eos_allowed))


def _allowed_scores(logits: Array, step: Array, at_limit: Array, min_len: int, config
                    ) -> Array:
    """logits [rows, vocab] with PAD and BOS banned, and EOS banned before min_len (sampling
    draws from all of them; the searches take `_best_allowed`). One elementwise pass:
    edits of single columns (`.at[:, id].set`) each made XLA copy the whole array."""
    column = jnp.arange(logits.shape[-1])[None, :]
    return jnp.where(_is_banned(column, step, at_limit, min_len, config), NEG_INF, logits)


def _best_allowed(logits: Array, k: int, step: Array, at_limit: Array, min_len: int, config
                  ) -> tuple[Array, Array]:
    """`top_k_over_vocab(_allowed_scores(logits, ...), k)` without the pass over the vocabulary.

    logits [rows, vocab] -> (values [rows, k], int32 tokens [rows, k]), ties and banned
    entries included as there. At most `len(_banned_ids)` tokens are banned, so the k best
    allowed ones are among the k + that many best of all: only those are masked and ranked
    again. Saves writing and re-reading a [rows, vocab] array at every step (a few percent of
    a beam step on a CPU).
    """
    vocab = logits.shape[-1]
    wide = min(k + len(_banned_ids(min_len, config)), vocab)
    values, tokens = top_k_over_vocab(logits, wide)
    values = jnp.where(_is_banned(tokens, step, at_limit, min_len, config), NEG_INF, values)
    if wide == vocab:
        # Every token is a candidate: rank banned ones by id, as a masked top-k over the
        # vocabulary does for its equal NEG_INF entries.
        order = jnp.argsort(tokens, axis=-1)
        values = jnp.take_along_axis(values, order, axis=-1)
        tokens = jnp.take_along_axis(tokens, order, axis=-1)
    values, order = jax.lax.top_k(values, k)
    return values, jnp.take_along_axis(tokens, order, axis=-1)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _Sentences:
    """What a search reads of each sentence and never changes: it moves with the sentence's
    row when the batch is compacted."""

    memory: Array | tuple[Array, ...]  # [batch, src_len, d_model] (one per ensemble member)
    src_mask: Array                    # [batch, 1, 1, src_len]
    limits: Array                      # [batch], each sentence's output limit


def _encode(graphdef, state, src, limits) -> tuple[Transformer | Ensemble, _Sentences]:
    model = nnx.merge(graphdef, state)
    return model, _Sentences(model.encode(src), model.source_mask(src), limits)


def _searching(max_len: int, stop_at: Array):
    """The search loops' condition: positions are left and more than `stop_at` sentences
    (rows whose `done` is False) are still searching."""
    def cond(s) -> Array:
        return (s.step < max_len) & ((~s.done).sum() > stop_at)
    return cond


# ----------------------------------------------------------------------------- compaction


@dataclasses.dataclass(frozen=True)
class _Strategy:
    """A search as the stages see it: `start` (encode, the state before the loop) and
    `resume` (steps until done or few enough sentences search), jitted per graph by
    `_Programs`, and host `outputs`."""

    start: Callable
    resume: Callable
    outputs: Callable  # (state, pad_id, nbest) -> host tokens, scores, lengths per row


def _search_in_stages(started: _Started, state, rng: Array, compact: bool) -> SearchResult:
    """Run a started search to its end, leaving finished sentences behind on the way.

    A batch's sentences end at different steps, and a finished sentence's row costs as much
    to decode as a searching one. So the loop stops once at most half of its rows still
    search; their rows are gathered into a batch of half the rows (or a quarter, ...: the row
    counts `Translator` also uses for smaller calls, so no new shapes), the finished ones are
    copied out, and the loop resumes. Filler rows of a compacted batch repeat a finished
    sentence, frozen.
    """
    strategy, program, sentences, searched = (started.strategy, started.program,
                                              started.sentences, started.searched)
    limits, pad = started.limits, started.pad_id
    nbest = program.settings.nbest if program.settings.strategy == "beam" else 1
    max_len = program.max_len
    rows = len(limits)
    tokens = np.full((rows, nbest, max_len), pad, np.int32)
    scores = np.zeros((rows, nbest), np.float32)
    lengths = np.zeros((rows, nbest), np.int32)
    sentence_of_row = np.arange(rows)  # -1: a filler row, or a sentence already copied out
    step, row_steps, stage_rows = 0, 0, []
    while True:
        batch_rows = len(sentence_of_row)
        stage_rows.append(batch_rows)
        stop_at = batch_rows // 2 if compact and batch_rows > 1 else 0
        searched = strategy.resume(program, state, sentences, searched, np.int32(stop_at), rng)
        done, new_step = (np.asarray(x) for x in jax.device_get((searched.done, searched.step)))
        row_steps += batch_rows * (int(new_step) - step)
        step = int(new_step)
        finished = done | (step >= max_len)
        leaving = np.flatnonzero(finished & (sentence_of_row >= 0))
        if len(leaving):
            out_tokens, out_scores, out_lengths = strategy.outputs(searched, pad, nbest)
            where = sentence_of_row[leaving]
            tokens[where], scores[where] = out_tokens[leaving], out_scores[leaving]
            lengths[where] = out_lengths[leaving]
            sentence_of_row[leaving] = -1
        staying = np.flatnonzero(~finished)
        if not len(staying):
            return SearchResult(tokens, scores, lengths, limits, step, row_steps,
                                tuple(stage_rows))
        # The smallest halving of the rows that holds the sentences still searching.
        new_rows = batch_rows
        while new_rows // 2 >= len(staying):
            new_rows //= 2
        filler = np.flatnonzero(finished)[0]
        keep = np.concatenate([staying, np.full(new_rows - len(staying), filler)])
        sentences, searched = _compact(sentences, searched, keep.astype(np.int32))
        sentence_of_row = np.concatenate(
            [sentence_of_row[staying], np.full(new_rows - len(staying), -1)])


def _compact_rows(sentences: _Sentences, searched, keep: Array):
    """The rows `keep` [new_batch] of every per-sentence array (scalars such as the step are
    shared by all rows and stay; the cache takes its own rows, `SearchCache.take_rows`)."""
    def take(x):
        if _is_cache(x):
            return x.take_rows(keep)
        return x[keep] if x.ndim else x
    return jax.tree.map(take, sentences), jax.tree.map(take, searched, is_leaf=_is_cache)


def _is_cache(x) -> bool:
    return hasattr(x, "take_rows")


_compact = StoredJit(_compact_rows)


# ----------------------------------------------------------------------------- greedy / sampling


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _GreedyState:
    step: Array
    cache: SearchCache
    tokens: Array        # [batch, max_len], PAD after EOS
    logprob_sum: Array   # [batch]
    done: Array          # [batch], EOS produced
    last: Array          # [batch], the token decoded next


def _greedy_start(graphdef, program: _SearchProgram, state, src, limits, rng
                  ) -> tuple[_Sentences, _GreedyState]:
    """Encode src [batch, src_len]; the search state before the first step."""
    del rng  # drawn from at every step (`_greedy_resume`)
    model, sentences = _encode(graphdef, state, src, limits)
    config, batch, max_len = model.config, src.shape[0], program.max_len
    return sentences, _GreedyState(
        step=jnp.zeros((), jnp.int32), cache=model.init_cache(sentences.memory, max_len),
        tokens=jnp.full((batch, max_len), config.pad_id, jnp.int32),
        logprob_sum=jnp.zeros((batch,), jnp.float32), done=jnp.zeros((batch,), bool),
        last=jnp.full((batch,), config.bos_id, jnp.int32))


def _greedy_resume(graphdef, program: _SearchProgram, state, sentences: _Sentences,
                   s: _GreedyState, stop_at: Array, rng: Array) -> _GreedyState:
    """Greedy or sampling steps (rng is read when sampling) until every sentence is done, the
    output positions run out, or no more than `stop_at` sentences are still searching."""
    model = nnx.merge(graphdef, state)
    config, settings = model.config, program.settings

    def body(s: _GreedyState) -> _GreedyState:
        logits, cache = model.decode(sentences.memory, sentences.src_mask, s.last[:, None],
                                     s.cache)
        # log p = logit - logsumexp(logits): the choice needs only the logits, the score
        # only the chosen token's log-probability, so log_softmax is never materialised.
        normalizer = jax.nn.logsumexp(logits[:, 0], axis=-1)  # [batch]
        at_limit = s.step + 1 >= sentences.limits
        if settings.strategy == "sample":
            scores = _allowed_scores(logits[:, 0], s.step, at_limit, settings.min_len, config)
            next_token = _sample(scores - normalizer[:, None], float(settings.temperature),
                                 settings.top_k, jax.random.fold_in(rng, s.step))
            score = jnp.take_along_axis(scores, next_token[:, None], axis=-1)[:, 0]
        else:
            score, next_token = (x[:, 0] for x in _best_allowed(
                logits[:, 0], 1, s.step, at_limit, settings.min_len, config))
        # At its limit a row ends, with EOS's logit (always allowed there).
        next_token = jnp.where(at_limit, config.eos_id, next_token)
        score = jnp.where(at_limit, logits[:, 0, config.eos_id], score)
        chosen = score - normalizer
        next_token = jnp.where(s.done, config.pad_id, next_token)
        tokens = jax.lax.dynamic_update_slice_in_dim(s.tokens, next_token[:, None], s.step, 1)
        return _GreedyState(s.step + 1, cache, tokens,
                            s.logprob_sum + jnp.where(s.done, 0.0, chosen),
                            s.done | (next_token == config.eos_id), next_token)

    return jax.lax.while_loop(_searching(program.max_len, stop_at), body, s)


def _greedy_outputs(s: _GreedyState, pad_id: int, nbest: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Host copies of tokens [batch, 1, max_len], log-probabilities and lengths [batch, 1]."""
    tokens, scores = (np.asarray(x) for x in jax.device_get((s.tokens, s.logprob_sum)))
    return (tokens[:, None], scores[:, None],
            (tokens != pad_id).sum(axis=1).astype(np.int32)[:, None])


def _sample(logprobs: Array, temperature: float, top_k: int, rng: Array) -> Array:
    """Draw one token per row from softmax(logprobs / temperature), optionally among the top k."""
    scaled = logprobs / temperature
    if top_k > logprobs.shape[-1]:
        raise ValueError(f"top_k {top_k} is larger than the vocabulary ({logprobs.shape[-1]} "
                         "tokens); use a smaller top_k, or 0 for no limit.")
    if top_k > 0:
        kth_best = jax.lax.top_k(scaled, top_k)[0][:, -1:]
        scaled = jnp.where(scaled < kth_best, NEG_INF, scaled)
    return jax.random.categorical(rng, scaled, axis=-1).astype(jnp.int32)


# ----------------------------------------------------------------------------- beam search


def _beam_start(graphdef, program: _SearchProgram, state, src, limits, rng
                ) -> tuple[_Sentences, _BeamState]:
    """Encode src [batch, src_len]: the state before the first beam step, which
    `_beam_resume` takes from BOS like every other (the start program stays an encoder, a
    third of the compilation it took when it decoded the first position itself).

    Live ("alive") hypotheses and finished ones are kept apart: a hypothesis that produces EOS
    moves to the finished set with score logprob / length_penalty and is never extended again.
    Each step expands every live beam, takes the best 2k candidates (so at least k are not EOS),
    moves the EOS ones that may finish into the finished set (keeping its best k) and continues
    with the best k non-EOS ones (`_advance_beams`). When a sentence is done is
    `SearchConfig.beam_rules` (`_can_improve`): by default once k hypotheses have finished.
    """
    del rng  # beam search draws nothing
    model, sentences = _encode(graphdef, state, src, limits)
    config, max_len = model.config, program.max_len
    batch, k = src.shape[0], program.settings.beam_size
    return sentences, _BeamState(
        step=jnp.zeros((), jnp.int32),
        cache=model.init_cache(sentences.memory, max_len, beam_size=k),
        alive_tokens=jnp.full((batch, k, max_len), config.pad_id, jnp.int32),
        # Only beam 0 is live at the start, so the first expansion does not repeat itself k times.
        alive_logprob=jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1), jnp.float32), (batch, 1)),
        finished_tokens=jnp.full((batch, k, max_len), config.pad_id, jnp.int32),
        finished_score=jnp.full((batch, k), NEG_INF, jnp.float32),
        done=jnp.zeros((batch,), bool),
    )


def _beam_resume(graphdef, program: _SearchProgram, state, sentences: _Sentences,
                 s: _BeamState, stop_at: Array, rng: Array) -> _BeamState:
    """Beam steps until every sentence is done, the output positions run out, or no more than
    `stop_at` sentences are still searching."""
    del rng
    model = nnx.merge(graphdef, state)
    batch, k = s.alive_logprob.shape
    rules = _BeamRules(limits=sentences.limits, settings=program.settings, model=model.config)

    def body(s: _BeamState) -> _BeamState:
        # The first step decodes BOS (index -1 then reads a PAD slot, never used).
        last = jnp.where(s.step == 0, model.config.bos_id, s.alive_tokens[:, :, s.step - 1])
        last = last.reshape(batch * k, 1)
        logits, cache = model.decode(sentences.memory, sentences.src_mask, last, s.cache)
        return _advance_beams(s, logits[:, 0], cache, rules)

    return jax.lax.while_loop(_searching(program.max_len, stop_at), body, s)


def _beam_outputs(s: _BeamState, pad_id: int, nbest: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Host copies of the n best finished hypotheses: tokens [batch, nbest, max_len], scores
    and lengths [batch, nbest]."""
    tokens, scores = jax.device_get((s.finished_tokens, s.finished_score))
    tokens, scores = np.asarray(tokens)[:, :nbest], np.asarray(scores)[:, :nbest]
    return tokens, scores, (tokens != pad_id).sum(axis=2).astype(np.int32)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _BeamState:
    step: Array
    cache: SearchCache
    alive_tokens: Array     # [batch, k, max_len]
    alive_logprob: Array    # [batch, k]
    finished_tokens: Array  # [batch, k, max_len]
    finished_score: Array   # [batch, k], best first
    done: Array             # [batch]


@dataclasses.dataclass(frozen=True)
class _BeamRules:
    """What stays fixed during one beam search."""

    limits: Array           # [batch], each sentence's output limit
    settings: SearchConfig  # the search settings (beam size, penalty, rules, ...)
    model: ModelConfig      # the model's pad, bos and eos ids

    @property
    def transformers_rules(self) -> bool:
        return self.settings.beam_rules == "transformers"

    @property
    def eos_among_best_k(self) -> bool:
        """Only an EOS among a step's k best candidates finishes (every rule but exact)."""
        return self.settings.beam_rules != "exact"

    def penalty(self, length: Array) -> Array:
        return length_penalty(length, float(self.settings.alpha),
                              self.settings.length_penalty == "power")


def _advance_beams(s: _BeamState, logits: Array, cache: SearchCache, rules: _BeamRules
                   ) -> _BeamState:
    """One search step given the step's logits [batch * k, vocab] and updated cache."""
    k = s.alive_logprob.shape[1]
    top_logprob, token, beam_index, top_tokens = _best_extensions(s, logits, rules)
    is_eos = token == rules.model.eos_id
    # A candidate of a dead beam (NEG_INF) must not enter either set.
    valid = top_logprob > NEG_INF / 2
    # exact: any EOS of the 2k candidates finishes; the other rules: only among the best k.
    finishes = is_eos & valid
    if rules.eos_among_best_k:
        finishes = finishes & (jnp.arange(2 * k) < k)[None, :]

    # Finished set: the best k of the old finished and this step's EOS candidates.
    eos_score = jnp.where(finishes, top_logprob / rules.penalty(s.step + 1), NEG_INF)
    eos_score = jnp.where(s.done[:, None], NEG_INF, eos_score)  # done sentences are frozen
    finished_score, finished_tokens = _top_k_by(
        jnp.concatenate([s.finished_score, eos_score], axis=1),
        jnp.concatenate([s.finished_tokens, top_tokens], axis=1), k)

    # Alive set: the best k candidates that did not end.
    alive_logprob, order = jax.lax.top_k(jnp.where(is_eos, NEG_INF, top_logprob), k)
    alive_tokens = jnp.take_along_axis(top_tokens, order[:, :, None], axis=1)
    parent = jnp.take_along_axis(beam_index, order, axis=1)  # [batch, k]

    can_improve = _can_improve(alive_logprob[:, 0], finished_score, s.step, rules)
    done = s.done | ~can_improve | (s.step + 1 >= rules.limits)
    return _BeamState(s.step + 1, cache.follow_parents(parent), alive_tokens, alive_logprob,
                      finished_tokens, finished_score, done)


def _best_extensions(s: _BeamState, logits: Array, rules: _BeamRules
                     ) -> tuple[Array, Array, Array, Array]:
    """A sentence's 2k best extensions of its live beams: the step's costliest part, on its own.

    Found without forming log-probabilities over the vocabulary (see below).
    logits [batch * k, vocab] -> log-probabilities [batch, 2k], tokens [batch, 2k], the beams
    they extend [batch, 2k] and the extended hypotheses [batch, 2k, max_len].
    """
    batch, k = s.alive_logprob.shape
    limits_k = jnp.repeat(rules.limits, k)  # [batch * k], beams of a sentence adjacent
    normalizer = jax.nn.logsumexp(logits, axis=-1)  # [rows]
    at_limit = s.step + 1 >= limits_k
    # Each row's best 2k tokens hold every candidate the best 2k of the whole sentence can
    # take (log p differs from the logit by a per-row constant), so the full [rows, vocab]
    # log-probabilities are never formed.
    per_row = min(2 * k, logits.shape[-1])
    row_score, row_token = _best_allowed(logits, per_row, s.step, at_limit,
                                         rules.settings.min_len, rules.model)
    row_logprob = row_score - normalizer[:, None]
    # A row at its output limit may only end: its one candidate is EOS, scored with its
    # log-probability (transformers' rules: with 0, as its forced EOS is).
    eos_id = rules.model.eos_id
    eos_logprob = (jnp.zeros_like(normalizer) if rules.transformers_rules
                   else logits[:, eos_id] - normalizer)
    first = (jnp.arange(per_row) == 0)[None]
    row_logprob = jnp.where(at_limit[:, None],
                            jnp.where(first, eos_logprob[:, None], NEG_INF), row_logprob)
    row_token = jnp.where(at_limit[:, None], eos_id, row_token).astype(jnp.int32)
    # [batch, k * per_row]: live beams extended by their best tokens.
    candidates = (s.alive_logprob[:, :, None] + row_logprob.reshape(batch, k, per_row)
                  ).reshape(batch, k * per_row)
    top_logprob, top_index = jax.lax.top_k(candidates, 2 * k)  # [batch, 2k]
    beam_index = top_index // per_row
    token = jnp.take_along_axis(row_token.reshape(batch, k * per_row), top_index, axis=1)
    top_tokens = jnp.take_along_axis(s.alive_tokens, beam_index[:, :, None], axis=1)
    top_tokens = jax.lax.dynamic_update_slice_in_dim(
        top_tokens, token[:, :, None], s.step, 2)  # [batch, 2k, max_len]
    return top_logprob, token, beam_index, top_tokens


def _can_improve(best_alive: Array, finished_score: Array, step: Array, rules: _BeamRules
                 ) -> Array:
    """The stopping rule on its own: where the beam rules differ most.

    best_alive [batch] (log-probability), finished_score [batch, k] -> may still win [batch].
    """
    rule = rules.settings.beam_rules
    if rule == "exact":
        # log-probabilities only fall as a hypothesis grows and the penalty only grows, so a
        # live beam at best ends at its limit with its current log-probability.
        return (best_alive / rules.penalty(rules.limits)
                > finished_score[:, rules.settings.nbest - 1])
    if rule == "k-finished":
        # fairseq, Marian and CTranslate2 (patience 1): done once k hypotheses have finished.
        return finished_score[:, -1] <= NEG_INF / 2
    # heuristic and transformers (its generate with early_stopping=False): the best live beam,
    # scored as if it ended now, against the k-th finished hypothesis. Exact when alpha = 0.
    return best_alive / rules.penalty(step + 1) > finished_score[:, -1]


def _top_k_by(scores: Array, tokens: Array, k: int) -> tuple[Array, Array]:
    """The k best (score, tokens) rows per sentence: scores [batch, n], tokens [batch, n, len]."""
    best, order = jax.lax.top_k(scores, k)
    return best, jnp.take_along_axis(tokens, order[:, :, None], axis=1)


_GREEDY = _Strategy(_greedy_start, _greedy_resume, _greedy_outputs)
_BEAM = _Strategy(_beam_start, _beam_resume, _beam_outputs)


def hypotheses_to_lists(result: SearchResult, eos_id: int) -> list[list[list[int]]]:
    """[batch][nbest] token lists without EOS and padding."""
    out: list[list[list[int]]] = []
    for tokens, lengths in zip(result.tokens, result.lengths):
        sentence = []
        for row, length in zip(tokens, lengths):
            ids = row[:length].tolist()
            if ids and ids[-1] == eos_id:
                ids = ids[:-1]
            sentence.append(ids)
        out.append(sentence)
    return out

