"""Greedy search and sampling: one hypothesis per sentence, one token chosen per step.

Each step runs the decoder on every row's last token (`StepFn`), chooses the next token (the
likeliest allowed one, or a draw for `Sample`), and adds its log-probability to the row's
score. At its output limit a row ends with EOS; after EOS it is padded with PAD and its score
stays as it is.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from transformer.cache import SearchCache
from transformer.search.step import StepFn, while_searching
from transformer.search.tokens import NEG_INF, allowed_scores, best_allowed
from transformer.strategies import Greedy, Sample

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class GreedyState:
    step: Array          # [], output positions written
    cache: SearchCache   # the decoder's (a scripted step's own in tests)
    tokens: Array        # [batch, max_len], PAD after EOS
    logprob_sum: Array   # [batch]
    done: Array          # [batch], EOS produced
    last: Array          # [batch], the token decoded next
    sentence: Array      # [batch], the sentence each row holds: its draws are its own


def greedy_state(cache, batch: int, max_len: int, ids) -> GreedyState:
    """The state before the first step: every row decodes BOS next."""
    return GreedyState(
        step=jnp.zeros((), jnp.int32), cache=cache,
        tokens=jnp.full((batch, max_len), ids.pad_id, jnp.int32),
        logprob_sum=jnp.zeros((batch,), jnp.float32), done=jnp.zeros((batch,), bool),
        last=jnp.full((batch,), ids.bos_id, jnp.int32),
        sentence=jnp.arange(batch, dtype=jnp.int32))


def greedy_steps(step: StepFn, s: GreedyState, strategy: Greedy | Sample, ids, limits: Array,
                 max_len: int, stop_at: Array, rng: Array) -> GreedyState:
    """Steps until every sentence is done, the `max_len` output positions run out, or no more
    than `stop_at` sentences are still searching. limits [batch]: each sentence's output
    limit; rng is read when sampling (folded with the step)."""

    def body(s: GreedyState) -> GreedyState:
        logits, cache = step(s.last, s.cache)
        # log p = logit - logsumexp(logits): the choice needs only the logits, the score
        # only the chosen token's log-probability, so log_softmax is never materialised.
        normalizer = jax.nn.logsumexp(logits, axis=-1)  # [batch]
        at_limit = s.step + 1 >= limits
        next_token, score = _choose(strategy, logits, normalizer, s.step, at_limit, ids, rng,
                                    s.sentence)
        # At its limit a row ends, with EOS's logit (always allowed there).
        next_token = jnp.where(at_limit, ids.eos_id, next_token)
        score = jnp.where(at_limit, logits[:, ids.eos_id], score)
        chosen = score - normalizer
        next_token = jnp.where(s.done, ids.pad_id, next_token)
        tokens = jax.lax.dynamic_update_slice_in_dim(s.tokens, next_token[:, None], s.step, 1)
        return GreedyState(s.step + 1, cache, tokens,
                           s.logprob_sum + jnp.where(s.done, 0.0, chosen),
                           s.done | (next_token == ids.eos_id), next_token, s.sentence)

    return jax.lax.while_loop(while_searching(max_len, stop_at), body, s)


def _choose(strategy: Greedy | Sample, logits: Array, normalizer: Array, step: Array,
            at_limit: Array, ids, rng: Array, sentence: Array) -> tuple[Array, Array]:
    """Each row's next token [batch] and its logit [batch]. A draw reads `rng` folded with
    the step, then with the row's sentence [batch]: no two steps or sentences share random
    numbers, and a sentence draws the same whichever row it is in (compaction moves rows)."""
    if isinstance(strategy, Sample):
        scores = allowed_scores(logits, step, at_limit, strategy.min_len, ids)
        keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.fold_in(rng, step),
                                                               sentence)
        token = _draw(scores - normalizer[:, None], strategy, keys)
        return token, jnp.take_along_axis(scores, token[:, None], axis=-1)[:, 0]
    score, token = (x[:, 0] for x in best_allowed(logits, 1, step, at_limit,
                                                  strategy.min_len, ids))
    return token, score


def _draw(logprobs: Array, strategy: Sample, keys: Array) -> Array:
    """One token per row from softmax(logprobs / temperature), among the top k if k > 0,
    each row drawn with its own key (keys [batch]). Banned tokens (`allowed_scores`) stay
    at -inf whatever the temperature: dividing their NEG_INF by a large one would let them be
    drawn. Scores are scaled from the row's best, which a tiny temperature keeps at 0."""
    banned = logprobs <= NEG_INF / 2
    best = jnp.max(jnp.where(banned, -jnp.inf, logprobs), axis=-1, keepdims=True)
    scaled = jnp.where(banned, -jnp.inf, (logprobs - best) / strategy.temperature)
    if strategy.top_k > 0:
        kth_best = jax.lax.top_k(scaled, strategy.top_k)[0][:, -1:]
        scaled = jnp.where(scaled < kth_best, -jnp.inf, scaled)
    return jax.vmap(jax.random.categorical)(keys, scaled).astype(jnp.int32)


def greedy_outputs(s: GreedyState, pad_id: int, nbest: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Host copies of tokens [batch, 1, max_len], log-probabilities and lengths [batch, 1]."""
    del nbest  # always one
    tokens, scores = (np.asarray(x) for x in jax.device_get((s.tokens, s.logprob_sum)))
    return (tokens[:, None], scores[:, None],
            (tokens != pad_id).sum(axis=1).astype(np.int32)[:, None])
