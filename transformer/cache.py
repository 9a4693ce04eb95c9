"""The decoder's cache for incremental decoding, and every operation on its slots.

Search decodes one new position per step. Keys and values of the earlier positions of the
decoder's self-attention come from `DecoderCache`, as do the encoder output's cross-attention
keys and values, projected once per sentence.

Beam search never copies keys or values. The self-attention cache of a sentence has
`max_len * beam` slots per layer, beam j's position t at slot t * beam + j, and each step
writes every beam's new position into its own slots. When beam search gives beam i a new
parent p, only `beam_slot` changes: beam_slot[b, i, t] names the beam whose slot holds
position t of beam i, and `attention_over_own_slots` reads each beam's history from there.

The slots are held in blocks of `BLOCK` positions on the arrays' leading axis, so that the
first n blocks, the prefix attention reads at an early step, are one contiguous piece of
memory that XLA's products read where it lies. With the batch axis leading, such a prefix
was strided, and XLA copied it out for the products at every step, in every layer (a sixth
of a beam step on a CPU, docs/performance.md).

An ensemble decodes with one `DecoderCache` per model, held in an `EnsembleCache`. Both have
the operations search needs, `follow_parents` and `take_rows` (`SearchCache`).
"""

from __future__ import annotations

from typing import Protocol, Sequence

import flax.struct
import jax
import jax.numpy as jnp

Array = jax.Array

# Positions per block of the self-attention cache; the shortest prefix attention reads.
BLOCK = 16


def capacity(max_len: int) -> int:
    """The positions a cache made for `max_len` holds: whole blocks."""
    return -(-max_len // BLOCK) * BLOCK


class SearchCache(Protocol):
    """What beam search does with a cache, whatever model (or ensemble) made it."""

    def follow_parents(self, parent: Array) -> "SearchCache":
        """Give each beam its parent's history; parent int32 [batch, beam]."""

    def take_rows(self, keep: Array) -> "SearchCache":
        """The cache of the sentences `keep` (int32 [new_batch]), in that order."""


@flax.struct.dataclass
class DecoderCache:
    """Decoder state for incremental decoding: one array per decoder layer in each tuple.

    index:       int32 scalar, the position the next decoded token will occupy.
    self_key:    per layer [blocks, batch, heads, head_dim, BLOCK * beam]: beam j's keys of
                 positions t < index in block t // BLOCK at slot (t % BLOCK) * beam + j,
                 kept transposed when beam > 1 (`keys_transposed`); [blocks, batch, heads,
                 BLOCK, head_dim] when beam = 1. The blocks end to end are the slots
                 t * beam + j of `capacity(max_len)` positions.
    self_value:  per layer [blocks, batch, heads, BLOCK * beam, head_dim], slots as for keys.
    beam_slot:   int32 [batch, beam, capacity]: position t of beam i is in beam
                 beam_slot[b, i, t]'s slots.
    cross_key:   per layer [batch, heads, head_dim, src_len], encoder output projected once
                 ([batch, heads, src_len, head_dim] when beam = 1).
    cross_value: per layer [batch, heads, src_len, head_dim]
    The decoder's rows are batch * beam, beams of a sentence adjacent; beam = 1 outside beam
    search. Heads-major, so attention over the cache needs no transpose (see
    `transformer.layers.MultiHeadAttention.attend_over_cache` and `attend_cached`).
    """

    index: Array
    self_key: tuple[Array, ...]
    self_value: tuple[Array, ...]
    beam_slot: Array
    cross_key: tuple[Array, ...]
    cross_value: tuple[Array, ...]

    @classmethod
    def create(cls, cross: Sequence[tuple[Array, Array]], max_len: int, beam: int,
               num_heads: int, head_dim: int, dtype) -> "DecoderCache":
        """An empty cache for `max_len` positions (rounded up to whole blocks, `capacity`)
        of `beam` beams per sentence.

        `cross` holds each layer's cross-attention (keys, values) in the cache's layouts:
        keys [batch, heads, head_dim, src_len] (`keys_transposed(beam)`, else [batch, heads,
        src_len, head_dim]), values [batch, heads, src_len, head_dim]. Every beam starts on
        its own slots.
        """
        batch = cross[0][0].shape[0]
        positions = capacity(max_len)
        blocks, slots = positions // BLOCK, BLOCK * beam
        key_shape = ((blocks, batch, num_heads, head_dim, slots) if keys_transposed(beam)
                     else (blocks, batch, num_heads, slots, head_dim))
        value_shape = (blocks, batch, num_heads, slots, head_dim)
        return cls(index=jnp.zeros((), jnp.int32),
                   self_key=tuple(jnp.zeros(key_shape, dtype) for _ in cross),
                   self_value=tuple(jnp.zeros(value_shape, dtype) for _ in cross),
                   beam_slot=own_slots(batch, beam, positions),
                   cross_key=tuple(k for k, _ in cross),
                   cross_value=tuple(v for _, v in cross))

    @property
    def beam(self) -> int:
        return self.beam_slot.shape[1]

    @property
    def max_len(self) -> int:
        """The positions the cache holds: `capacity` of the max_len it was made for."""
        return self.beam_slot.shape[2]

    def causal_mask(self, q_len: int) -> Array:
        """[1, 1, q_len, max_len] mask over positions for the next `q_len` queries: query i
        (position index + i) may attend to positions <= index + i; later ones are either
        future positions or not written yet."""
        query_pos = self.index + jnp.arange(q_len)[:, None]
        key_pos = jnp.arange(self.max_len)[None, :]
        return (key_pos <= query_pos)[None, None]

    def slots_with_step(self, q_len: int) -> Array:
        """beam_slot once the next `q_len` positions are written: every beam computes them in
        its own slots."""
        batch, beam, _ = self.beam_slot.shape
        return jax.lax.dynamic_update_slice_in_dim(
            self.beam_slot, own_slots(batch, beam, q_len), self.index, 2)

    def check_room(self, q_len: int, positions: int) -> None:
        """ValueError when the next `q_len` positions would not fit in the cache or pass the
        model's `positions`, where that is known without running: writes past `max_len` land
        on the last slots (the update's start is clamped), and positions past the model's
        table read its last row (the cache holds whole blocks, so it can have room past it);
        both give wrong logits without a sign. Under jit the index is traced and only `q_len`
        alone is checked; the search bounds its steps by both instead."""
        index = 0 if isinstance(self.index, jax.core.Tracer) else int(self.index)
        if index + q_len > positions:
            raise ValueError(f"decoding {q_len} position(s) from position {index} passes the "
                             f"model's max_len {positions}: it has no positions after that.")
        if index + q_len > self.max_len:
            raise ValueError(f"decoding {q_len} position(s) from position {index} needs a cache "
                             f"of {index + q_len} positions, but this one holds {self.max_len}; "
                             f"make it with init_cache(memory, max_len={index + q_len}) or more.")

    def write(self, layer: int, key: Array, value: Array) -> tuple[Array, Array]:
        """Layer `layer`'s cached keys and values with the new positions written into each
        beam's own slots (in place under jit).

        key [batch * beam, heads, head_dim, q_len] (`keys_transposed(beam)`, else
        [batch * beam, heads, q_len, head_dim]), value [batch * beam, heads, q_len,
        head_dim]: the new positions index .. index+q_len-1, row b*beam + j for beam j of
        sentence b. Returns the whole (keys, values) of the layer.
        """
        key_axis = 4 if keys_transposed(self.beam) else 3
        return (_write_slots(self.self_key[layer], key, self.beam, self.index, axis=key_axis),
                _write_slots(self.self_value[layer], value, self.beam, self.index, axis=3))

    def advance(self, keys: Sequence[Array], values: Sequence[Array], beam_slot: Array,
                q_len: int) -> "DecoderCache":
        """The cache after a step of `q_len` positions: every layer's written keys and values
        (`write`) and `slots_with_step`'s beam_slot."""
        return self.replace(index=self.index + q_len, self_key=tuple(keys),
                            self_value=tuple(values), beam_slot=beam_slot)

    def follow_parents(self, parent: Array) -> "DecoderCache":
        """Give each beam its parent's history; parent int32 [batch, beam].

        Only the [batch, beam, max_len] map from positions to slots moves, not every layer's
        keys and values as in a reordered cache.
        """
        return self.replace(
            beam_slot=jnp.take_along_axis(self.beam_slot, parent[:, :, None], axis=1))

    def take_rows(self, keep: Array) -> "DecoderCache":
        """The cache of the sentences `keep` (int32 [new_batch]), in that order."""
        return self.replace(self_key=tuple(k[:, keep] for k in self.self_key),
                            self_value=tuple(v[:, keep] for v in self.self_value),
                            beam_slot=self.beam_slot[keep],
                            cross_key=tuple(k[keep] for k in self.cross_key),
                            cross_value=tuple(v[keep] for v in self.cross_value))


@flax.struct.dataclass
class EnsembleCache:
    """The caches of an ensemble's models, one `DecoderCache` each, moved in step."""

    members: tuple[DecoderCache, ...]

    def follow_parents(self, parent: Array) -> "EnsembleCache":
        return EnsembleCache(tuple(c.follow_parents(parent) for c in self.members))

    def take_rows(self, keep: Array) -> "EnsembleCache":
        return EnsembleCache(tuple(c.take_rows(keep) for c in self.members))


def keys_transposed(group: int) -> bool:
    """Whether cached keys are stored [..., head_dim, slots] for `group` queries per key row.

    With a beam's queries sharing each key row, the scores are a small matrix product per
    (sentence, head), which XLA:CPU runs several times faster with the keys transposed. With
    one query per row (greedy search) they are a matrix-vector product, faster over
    [..., slots, head_dim], where each step's write is also one contiguous run per head
    instead of a strided one (docs/design.md, "Kernels").
    """
    return group > 1


def own_slots(batch: int, beam: int, length: int) -> Array:
    """int32 [batch, beam, length] with beam j's own index: positions each beam computed."""
    return jnp.broadcast_to(jnp.arange(beam, dtype=jnp.int32)[None, :, None],
                            (batch, beam, length))


def _write_slots(cached: Array, new: Array, beam: int, offset: Array, axis: int) -> Array:
    """Store new positions in each beam's own slots of one cache array.

    cached [blocks, batch, ...] with its slot axis `axis` of size BLOCK * beam (beam j's
    position t in block t // BLOCK at slot (t % BLOCK) * beam + j, so one position of all
    beams is one contiguous run); new [batch * beam, ...] with the same axes after the
    block axis, but new_len positions on its slot axis (axis - 1). Each new position is one
    update in place of the block it falls in.
    """
    batch, slots = cached.shape[1], cached.shape[axis]
    new = new.reshape(batch, beam, *new.shape[1:])
    # [batch, beam, ..., new_len, ...] -> [batch, ..., new_len, beam, ...]
    new = jnp.moveaxis(new, 1, axis)
    split = cached.shape[:axis] + (slots // beam, beam) + cached.shape[axis + 1:]
    cached = cached.reshape(split)
    for i in range(new.shape[axis - 1]):
        position = offset + i
        start = [position // BLOCK] + [0] * (len(split) - 1)
        start[axis] = position % BLOCK
        update = jax.lax.slice_in_dim(new, i, i + 1, axis=axis - 1)[None]
        cached = jax.lax.dynamic_update_slice(cached, update, start)
    return cached.reshape(cached.shape[:axis] + (slots,) + cached.shape[axis + 2:])


def attention_over_own_slots(scores: Array, beam_slot: Array, mask: Array, q_len: int) -> Array:
    """Attention weights of each beam over its own history in a shared beam cache.

    scores float32 [batch, heads, beam * q_len, max_len * beam]: every query against every
    beam's slots (slot t * beam + j holds beam j's position t); beam_slot int32
    [batch, beam, max_len]: which beam's slot holds position t of beam i; mask
    [1, 1, q_len, max_len] over positions. Returns weights of the same shape as scores, zero
    outside each beam's own slots, so that `weights @ values` reads exactly the keys and
    values of each beam's history. Costs beam times the score work of a reordered cache (a
    few thousand multiply-adds per query) instead of copying the whole cache to its new beams
    at every step.
    """
    batch, heads = scores.shape[:2]
    beam, max_len = beam_slot.shape[1:]
    scores = scores.reshape(batch, heads, beam, q_len, max_len, beam)
    # own[b, 1, i, 1, t, j]: position t of beam i lives in beam j's slot.
    own = beam_slot[:, :, :, None] == jnp.arange(beam)
    own = own[:, None, :, None]
    per_position = jnp.sum(jnp.where(own, scores, 0.0), axis=5)  # [b, h, beam, q_len, max_len]
    per_position = jnp.where(mask[:, :, None], per_position, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(per_position, axis=-1)
    weights = jnp.where(own, weights[..., None], 0.0)
    return weights.reshape(batch, heads, beam * q_len, max_len * beam)


def attention_scores_bytes(sentences: int, beam: int, heads: int, max_len: int) -> int:
    """Bytes one decoder layer's self-attention holds at a search's last step, float32 scores
    and their softmax: each of the sentences * beam queries scores all capacity(max_len) *
    beam slots of its sentence, so this grows with the square of the beam."""
    return 2 * 4 * sentences * beam * heads * capacity(max_len) * beam
