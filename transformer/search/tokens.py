"""Which tokens a search may produce at a step, and the best of them, cheaply.

PAD and BOS are never produced; EOS is not allowed before the strategy's `min_len` unless a
row's output limit is this step (it must end there). `ids` is anything with `pad_id`,
`bos_id` and `eos_id` (a `ModelConfig`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

# A large negative number rather than -inf: scores are added and compared, never subtracted,
# and finite values keep every comparison free of NaN.
NEG_INF = -1.0e9


def banned_ids(min_len: int, ids) -> tuple[int, ...]:
    """The tokens a search may never produce at some step: PAD, BOS, and EOS while min_len
    forbids it."""
    banned = [ids.pad_id, ids.bos_id] + ([ids.eos_id] if min_len > 0 else [])
    return tuple(dict.fromkeys(banned))


def is_banned(token: Array, step: Array, at_limit: Array, min_len: int, ids) -> Array:
    """bool, token's shape [rows, ...]: `token` may not be produced at `step`.

    at_limit [rows]: rows whose output limit is this step may end whatever min_len says (the
    caller then lets them produce nothing but EOS).
    """
    eos_allowed = at_limit | (step + 1 >= min_len)
    eos_allowed = eos_allowed.reshape(eos_allowed.shape + (1,) * (token.ndim - 1))
    return ((token == ids.pad_id) | (token == ids.bos_id)
            | ((token == ids.eos_id) & ~eos_allowed))


def allowed_scores(logits: Array, step: Array, at_limit: Array, min_len: int, ids) -> Array:
    """logits [rows, vocab] with the banned tokens at NEG_INF (sampling draws from all of them;
    the searches take `best_allowed`). One elementwise pass: edits of single columns
    (`.at[:, id].set`) each copy the whole array."""
    column = jnp.arange(logits.shape[-1])[None, :]
    return jnp.where(is_banned(column, step, at_limit, min_len, ids), NEG_INF, logits)


def best_allowed(logits: Array, k: int, step: Array, at_limit: Array, min_len: int, ids
                 ) -> tuple[Array, Array]:
    """`top_k_over_vocab(allowed_scores(logits, ...), k)` without the pass over the vocabulary.

    logits [rows, vocab] -> (values [rows, k], int32 tokens [rows, k]), ties and banned
    entries included as there. At most `len(banned_ids)` tokens are banned, so the k best
    allowed ones are among the k + that many best of all: only those are masked and ranked
    again, and no [rows, vocab] array is written and read back at every step.
    """
    vocab = logits.shape[-1]
    wide = min(k + len(banned_ids(min_len, ids)), vocab)
    values, tokens = top_k_over_vocab(logits, wide)
    values = jnp.where(is_banned(tokens, step, at_limit, min_len, ids), NEG_INF, values)
    if wide == vocab:
        # Every token is a candidate: rank banned ones by id, as a masked top-k over the
        # vocabulary does for its equal NEG_INF entries.
        order = jnp.argsort(tokens, axis=-1)
        values = jnp.take_along_axis(values, order, axis=-1)
        tokens = jnp.take_along_axis(tokens, order, axis=-1)
    values, order = jax.lax.top_k(values, k)
    return values, jnp.take_along_axis(tokens, order, axis=-1)


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
