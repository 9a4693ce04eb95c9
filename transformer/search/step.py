"""The seam between a search and the model: one decoder step over the cache.

A search sees the model only as a `StepFn`: the tokens each row decoded last and the cache
in, each row's next-token logits and the updated cache out (Flax's decode.py calls it
`tokens_to_logits`). `model_step` makes one from a `Transformer` or an `Ensemble` and the
encoded sources; tests make their own to script the distributions a search sees. The
cache is any pytree with the two operations the searches need: `follow_parents(parent)`
(beam search: each beam continues from the beam it extends) and `take_rows(rows)` (a batch
leaves its finished sentences behind), as `transformer.cache.SearchCache` has.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax

Array = jax.Array

# (tokens [rows] decoded last, cache) -> (logits [rows, vocab] of the next token, cache)
StepFn = Callable[[Array, Any], tuple[Array, Any]]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class EncodedSources:
    """What a search reads of each sentence and never changes: it moves with the sentence's
    row when the batch is compacted."""

    memory: Array | tuple[Array, ...]  # [batch, src_len, d_model] (one per ensemble member)
    src_mask: Array                    # [batch, 1, 1, src_len]
    limits: Array                      # [batch], each sentence's output limit (EOS included)


def encode_sources(model, src: Array, limits: Array) -> EncodedSources:
    """src [batch, src_len] through the encoder, with each sentence's output limit."""
    return EncodedSources(model.encode(src), model.source_mask(src), limits)


def model_step(model, sources: EncodedSources, candidates: Array | None = None) -> StepFn:
    """The model's decoder as a search step (the beams of a sentence are adjacent rows; the
    cache holds the encoder output's keys and values once per sentence).

    With `candidates` (int32 [K], ascending token ids: a shortlist) the search runs over the
    K candidates: tokens are positions in `candidates` and logits are [rows, K]. A candidate
    list starts with every special id (`transformer.shortlist`), so PAD, BOS and EOS keep
    their ids and the search needs no other change.
    """
    def step(last: Array, cache) -> tuple[Array, Any]:
        ids = last if candidates is None else candidates[last]
        logits, cache = model.decode(sources.memory, sources.src_mask, ids[:, None], cache,
                                     candidates=candidates)
        return logits[:, 0], cache
    return step


def while_searching(max_len: int, stop_at: Array) -> Callable[[Any], Array]:
    """The search loops' condition: output positions are left and more than `stop_at`
    sentences (rows whose `done` is False) are still searching."""
    def cond(s) -> Array:
        return (s.step < max_len) & ((~s.done).sum() > stop_at)
    return cond
