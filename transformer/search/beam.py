"""Beam search: `size` live hypotheses per sentence, finished ones kept apart.

Live ("alive") hypotheses and finished ones are two sets. Each step expands every live beam
by the decoder's next-token distribution (`StepFn`; the beams of a sentence are adjacent
rows), takes the sentence's best 2k candidates (so that at least k do not end), moves the
EOS ones that may finish into the finished set with score log p / penalty(length), keeping
its best k, and continues with the best k that did not end. Which EOS may finish and when a
sentence is done are the strategy's beam rules (`Beam`, `can_improve`). A finished
hypothesis is never extended again, and a done sentence's sets are frozen.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from transformer.cache import SearchCache
from transformer.search.step import StepFn, while_searching
from transformer.search.tokens import NEG_INF, best_allowed
from transformer.strategies import Beam, Stopping

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class BeamState:
    step: Array             # [], output positions written
    cache: SearchCache      # the decoder's, batch * k rows (a scripted step's own in tests)
    alive_tokens: Array     # [batch, k, max_len]
    alive_logprob: Array    # [batch, k]
    finished_tokens: Array  # [batch, k, max_len]
    finished_score: Array   # [batch, k], best first
    done: Array             # [batch]


def beam_state(cache, batch: int, k: int, max_len: int, ids) -> BeamState:
    """The state before the first step, which decodes BOS."""
    return BeamState(
        step=jnp.zeros((), jnp.int32), cache=cache,
        alive_tokens=jnp.full((batch, k, max_len), ids.pad_id, jnp.int32),
        # Only beam 0 is live at the start, so the first expansion does not repeat itself k times.
        alive_logprob=jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1), jnp.float32), (batch, 1)),
        finished_tokens=jnp.full((batch, k, max_len), ids.pad_id, jnp.int32),
        finished_score=jnp.full((batch, k), NEG_INF, jnp.float32),
        done=jnp.zeros((batch,), bool),
    )


def beam_steps(step: StepFn, s: BeamState, strategy: Beam, ids, limits: Array, max_len: int,
               stop_at: Array) -> BeamState:
    """Steps until every sentence is done, the `max_len` output positions run out, or no more
    than `stop_at` sentences are still searching. limits [batch]: each sentence's output
    limit."""
    batch, k = s.alive_logprob.shape

    def body(s: BeamState) -> BeamState:
        # The first step decodes BOS (index -1 then reads a PAD slot, never used).
        last = jnp.where(s.step == 0, ids.bos_id, s.alive_tokens[:, :, s.step - 1])
        logits, cache = step(last.reshape(batch * k), s.cache)
        return advance(s, logits, cache, strategy, ids, limits)

    return jax.lax.while_loop(while_searching(max_len, stop_at), body, s)


def advance(s: BeamState, logits: Array, cache, strategy: Beam, ids, limits: Array
            ) -> BeamState:
    """One step given its logits [batch * k, vocab] and the cache after it."""
    k = s.alive_logprob.shape[1]
    top_logprob, token, beam_index, top_tokens = best_extensions(s, logits, strategy, ids,
                                                                 limits)
    is_eos = token == ids.eos_id
    # A candidate of a dead beam (NEG_INF) must not enter either set.
    valid = top_logprob > NEG_INF / 2
    finishes = is_eos & valid
    if strategy.eos_among_best_k:
        finishes = finishes & (jnp.arange(2 * k) < k)[None, :]

    # Finished set: the best k of the old finished and this step's EOS candidates.
    eos_score = jnp.where(finishes, top_logprob / penalty(strategy, s.step + 1), NEG_INF)
    eos_score = jnp.where(s.done[:, None], NEG_INF, eos_score)  # done sentences are frozen
    finished_score, finished_tokens = _top_k_by(
        jnp.concatenate([s.finished_score, eos_score], axis=1),
        jnp.concatenate([s.finished_tokens, top_tokens], axis=1), k)

    # Alive set: the best k candidates that did not end.
    alive_logprob, order = jax.lax.top_k(jnp.where(is_eos, NEG_INF, top_logprob), k)
    alive_tokens = jnp.take_along_axis(top_tokens, order[:, :, None], axis=1)
    parent = jnp.take_along_axis(beam_index, order, axis=1)  # [batch, k]

    improvable = can_improve(alive_logprob[:, 0], finished_score, s.step, strategy, limits)
    done = s.done | ~improvable | (s.step + 1 >= limits)
    return BeamState(s.step + 1, cache.follow_parents(parent), alive_tokens, alive_logprob,
                     finished_tokens, finished_score, done)


def best_extensions(s: BeamState, logits: Array, strategy: Beam, ids, limits: Array
                    ) -> tuple[Array, Array, Array, Array]:
    """A sentence's 2k best extensions of its live beams: the step's costliest part.

    logits [batch * k, vocab] -> log-probabilities [batch, 2k], tokens [batch, 2k], the beams
    they extend [batch, 2k] and the extended hypotheses [batch, 2k, max_len].
    """
    batch, k = s.alive_logprob.shape
    limits_k = jnp.repeat(limits, k)  # [batch * k], beams of a sentence adjacent
    normalizer = jax.nn.logsumexp(logits, axis=-1)  # [rows]
    at_limit = s.step + 1 >= limits_k
    # Each row's best 2k tokens hold every candidate the best 2k of the whole sentence can
    # take (log p differs from the logit by a per-row constant), so the full [rows, vocab]
    # log-probabilities are never formed.
    per_row = min(2 * k, logits.shape[-1])
    row_score, row_token = best_allowed(logits, per_row, s.step, at_limit, strategy.min_len,
                                        ids)
    row_logprob = row_score - normalizer[:, None]
    # A row at its output limit may only end: its one candidate is EOS, scored with its
    # log-probability (or with 0, `forced_eos_free`).
    eos_logprob = (jnp.zeros_like(normalizer) if strategy.forced_eos_free
                   else logits[:, ids.eos_id] - normalizer)
    first = (jnp.arange(per_row) == 0)[None]
    row_logprob = jnp.where(at_limit[:, None],
                            jnp.where(first, eos_logprob[:, None], NEG_INF), row_logprob)
    row_token = jnp.where(at_limit[:, None], ids.eos_id, row_token).astype(jnp.int32)
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


def can_improve(best_alive: Array, finished_score: Array, step: Array, strategy: Beam,
                limits: Array) -> Array:
    """Whether a sentence may still find a better hypothesis: its stopping rule.

    best_alive [batch] (log-probability), finished_score [batch, k] -> bool [batch].
    """
    if strategy.stopping is Stopping.BOUND_AT_LIMIT:
        # log-probabilities only fall as a hypothesis grows and the penalty only grows, so a
        # live beam at best ends at its limit with its current log-probability.
        return (best_alive / penalty(strategy, limits)
                > finished_score[:, strategy.nbest - 1])
    if strategy.stopping is Stopping.K_FINISHED:
        # fairseq, Marian and CTranslate2 (patience 1): done once k hypotheses have finished.
        return finished_score[:, -1] <= NEG_INF / 2
    # The best live beam, scored at its length so far (without the EOS it would still need),
    # against the k-th finished hypothesis
    # (transformers' generate with early_stopping=False). Exact when alpha = 0.
    return best_alive / penalty(strategy, step + 1) > finished_score[:, -1]


def length_penalty(length: Array, alpha: float, power: bool = False) -> Array:
    """GNMT's length penalty ((5 + length) / 6) ** alpha (Wu et al. 2016, Eq. 14), or with
    `power` length ** alpha (transformers, CTranslate2, Marian). `length` counts EOS."""
    length = length.astype(jnp.float32)
    return length ** alpha if power else ((5.0 + length) / 6.0) ** alpha


def penalty(strategy: Beam, length: Array) -> Array:
    """The strategy's length penalty of hypotheses of `length` tokens (EOS included)."""
    return length_penalty(length, strategy.alpha, strategy.power_penalty)


def _top_k_by(scores: Array, tokens: Array, k: int) -> tuple[Array, Array]:
    """The k best (score, tokens) rows per sentence: scores [batch, n], tokens [batch, n, len]."""
    best, order = jax.lax.top_k(scores, k)
    return best, jnp.take_along_axis(tokens, order[:, :, None], axis=1)


def beam_outputs(s: BeamState, pad_id: int, nbest: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Host copies of the n best finished hypotheses: tokens [batch, nbest, max_len], scores
    and lengths [batch, nbest]."""
    tokens, scores = jax.device_get((s.finished_tokens, s.finished_score))
    tokens, scores = np.asarray(tokens)[:, :nbest], np.asarray(scores)[:, :nbest]
    return tokens, scores, (tokens != pad_id).sum(axis=2).astype(np.int32)
