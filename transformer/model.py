"""The encoder-decoder Transformer (Vaswani et al. 2017) as Flax NNX modules.

Training and search share one boundary:

    memory = model.encode(src_ids)                                  # [batch, src_len, d_model]
    logits, cache = model.decode(memory, src_mask, tgt_ids, cache)  # [batch, tgt_len, vocab]

With `cache=None`, `decode` runs teacher-forced over the whole target (training). With a
cache from `init_cache`, it runs on the new positions only, reading keys and values of the
earlier positions from the cache and the encoder's projected keys and values, which
`init_cache` computes once per sentence.

Why NNX rather than Linen: NNX is Flax's recommended API for new code, and its modules are
plain Python objects whose state we split once (`nnx.split`) and pass to pure, jitted
functions (see transformer/training.py and transformer/decoding.py).
"""

from __future__ import annotations

from typing import TypedDict

import jax
import jax.numpy as jnp
from flax import nnx

from transformer.config import ModelConfig
from transformer.layers import (AddNorm, Dense, Embedding, FeedForward, MultiHeadAttention,
                                PositionalEncoding, cached_causal_mask, causal_mask,
                                activation_dtype, compute_dtype, dropout, padding_mask, split_rng)

Array = jax.Array


class Cache(TypedDict):
    """Decoder state for incremental decoding: one array per decoder layer in each tuple.

    index:       int32 scalar, the position the next decoded token will occupy.
    self_key:    per layer [batch, heads, head_dim, max_len * beam]: beam j's keys of
                 positions t < index at slot t * beam + j (keys are kept transposed).
    self_value:  per layer [batch, heads, max_len * beam, head_dim], slots as for keys.
    beam_slot:   int32 [batch, beam, max_len]: position t of beam i is in beam
                 beam_slot[b, i, t]'s slots. Each step writes every beam's new position into
                 its own slots; when beam search gives beam i a new parent p, only this small
                 array changes (beam_slot[b, i] = beam_slot[b, p]), never the keys and values.
    cross_key:   per layer [batch, heads, head_dim, src_len], encoder output projected once.
    cross_value: per layer [batch, heads, src_len, head_dim]
    The decoder's rows are batch * beam, beams of a sentence adjacent; beam = 1 outside beam
    search. Heads-major, so attention over the cache needs no transpose (see
    MultiHeadAttention.attend_cached).
    """

    index: Array
    self_key: tuple[Array, ...]
    self_value: tuple[Array, ...]
    beam_slot: Array
    cross_key: tuple[Array, ...]
    cross_value: tuple[Array, ...]


class EncoderLayer(nnx.Module):
    """Self-attention over the source, then the position-wise FFN, each with Add & Norm."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.self_attention = MultiHeadAttention(config, rngs=rngs)
        self.self_attention_norm = AddNorm(config, rngs=rngs)
        self.feed_forward = FeedForward(config, rngs=rngs)
        self.feed_forward_norm = AddNorm(config, rngs=rngs)

    def __call__(self, x: Array, src_mask: Array, rng: Array | None) -> Array:
        """x [batch, src_len, d_model], src_mask [batch, 1, 1, src_len]."""
        rngs = split_rng(rng, 4)
        h = self.self_attention_norm.sublayer_input(x)
        x = self.self_attention_norm.residual(x, self.self_attention(h, h, src_mask, rngs[0]),
                                              rngs[1])
        h = self.feed_forward_norm.sublayer_input(x)
        return self.feed_forward_norm.residual(x, self.feed_forward(h, rngs[2]), rngs[3])


class DecoderLayer(nnx.Module):
    """Masked self-attention, encoder-decoder attention and FFN, each with Add & Norm."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.self_attention = MultiHeadAttention(config, rngs=rngs)
        self.self_attention_norm = AddNorm(config, rngs=rngs)
        self.cross_attention = MultiHeadAttention(config, rngs=rngs)
        self.cross_attention_norm = AddNorm(config, rngs=rngs)
        self.feed_forward = FeedForward(config, rngs=rngs)
        self.feed_forward_norm = AddNorm(config, rngs=rngs)

    def __call__(self, x: Array, self_kv: tuple[Array, Array], self_mask: Array,
                 cross_kv: tuple[Array, Array], src_mask: Array, rng: Array | None,
                 return_weights: bool = False) -> tuple[Array, Array | None]:
        """The layer over a whole target sequence (training, teacher forcing).

        x [batch, tgt_len, d_model]; self_kv: keys/values of x, each
        [batch, tgt_len, heads, head_dim]; self_mask broadcastable to
        [batch, heads, tgt_len, tgt_len]; cross_kv [batch, src_len, heads, head_dim];
        src_mask [batch, 1, 1, src_len]. Returns (x, cross-attention weights or None).
        """
        rngs = split_rng(rng, 6)
        weights = []

        def attend_self(h):
            query = self.self_attention.project_query(h)
            return self.self_attention.attend(query, *self_kv, self_mask, rngs[0])[0]

        def attend_cross(h):
            query = self.cross_attention.project_query(h)
            out, w = self.cross_attention.attend(query, *cross_kv, src_mask, rngs[2],
                                                 return_weights)
            weights.append(w)
            return out

        return self._sublayers(x, attend_self, attend_cross, rngs), weights[0]

    def step(self, x: Array, self_kv: tuple[Array, Array], self_mask: Array,
             beam_slot: Array | None, cross_kv: tuple[Array, Array], src_mask: Array,
             rng: Array | None) -> Array:
        """The layer for new positions over cached keys/values (incremental decoding).

        x [rows, new_len, d_model] with rows = batch * beam; self_kv: the cache with this step
        written, keys [batch, heads, head_dim, max_len * beam] and values
        [batch, heads, max_len * beam, head_dim]; self_mask [1, 1, new_len, max_len];
        beam_slot [batch, beam, max_len] (None when beam = 1); cross_kv: keys
        [batch, heads, head_dim, src_len] and values [batch, heads, src_len, head_dim];
        src_mask [batch, 1, 1, src_len]. Attention dropout is not applied on this path.
        """
        rngs = split_rng(rng, 6)

        def attend_self(h):
            query = self.self_attention.project_query(h)
            return self.self_attention.attend_cached(query, *self_kv, self_mask, beam_slot)

        def attend_cross(h):
            query = self.cross_attention.project_query(h)
            return self.cross_attention.attend_cached(query, *cross_kv, src_mask)

        return self._sublayers(x, attend_self, attend_cross, rngs)

    def _sublayers(self, x, attend_self, attend_cross, rngs):
        """Self-attention, cross-attention and FFN, each inside its Add & Norm."""
        h = self.self_attention_norm.sublayer_input(x)
        x = self.self_attention_norm.residual(x, attend_self(h), rngs[1])
        h = self.cross_attention_norm.sublayer_input(x)
        x = self.cross_attention_norm.residual(x, attend_cross(h), rngs[3])
        h = self.feed_forward_norm.sublayer_input(x)
        return self.feed_forward_norm.residual(x, self.feed_forward(h, rngs[4]), rngs[5])

    def self_attention_input(self, x: Array) -> Array:
        """What the self-attention projects keys and values from (normed under pre-norm)."""
        return self.self_attention_norm.sublayer_input(x)


class Transformer(nnx.Module):
    """Encoder-decoder Transformer with an LM head over a (by default shared) vocabulary."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.src_embedding = Embedding(config, rngs=rngs)
        if not config.share_embeddings:
            self.tgt_embedding = Embedding(config, rngs=rngs)
            self.output_projection = Dense(config.d_model, config.vocab_size, use_bias=False,
                                           dtype=compute_dtype(config), rngs=rngs)
        self.positional = PositionalEncoding(config, rngs=rngs)
        self.encoder_layers = nnx.List(
            [EncoderLayer(config, rngs=rngs) for _ in range(config.encoder_layers)])
        self.decoder_layers = nnx.List(
            [DecoderLayer(config, rngs=rngs) for _ in range(config.decoder_layers)])
        if config.norm == "pre":
            # Pre-norm stacks end un-normalised; the final LayerNorm is part of the design.
            eps, dtype = config.layer_norm_epsilon, activation_dtype(config)
            self.encoder_norm = nnx.LayerNorm(config.d_model, epsilon=eps, dtype=dtype, rngs=rngs)
            self.decoder_norm = nnx.LayerNorm(config.d_model, epsilon=eps, dtype=dtype, rngs=rngs)

    # ------------------------------------------------------------------ embeddings

    def _embed_target(self, ids: Array) -> Array:
        table = self.src_embedding if self.config.share_embeddings else self.tgt_embedding
        return table(ids)

    def _logits(self, x: Array) -> Array:
        """[batch, len, d_model] -> float32 [batch, len, vocab]."""
        # float32 straight from the product's accumulator: with bfloat16 activations, logits
        # rounded to bfloat16 would move beam scores by up to ~0.06 nats per token.
        if self.config.share_embeddings:
            return self.src_embedding.attend(x)
        return self.output_projection(x, out_dtype=jnp.float32)

    # ------------------------------------------------------------------ encoder

    def source_mask(self, src_ids: Array) -> Array:
        """[batch, src_len] -> [batch, 1, 1, src_len], False on padding."""
        return padding_mask(src_ids, self.config.pad_id)

    def encode(self, src_ids: Array, rng: Array | None = None, src_mask: Array | None = None
               ) -> Array:
        """[batch, src_len] ids -> memory [batch, src_len, d_model] (activation dtype).

        `src_mask` [batch, 1, 1, src_len] defaults to `source_mask(src_ids)` (PAD is padding).
        """
        config = self.config
        rngs = split_rng(rng, 1 + config.encoder_layers)
        if src_mask is None:
            src_mask = self.source_mask(src_ids)
        x = dropout(self.positional(self.src_embedding(src_ids)), config.dropout, rngs[0])
        for layer, layer_rng in zip(self.encoder_layers, rngs[1:]):
            x = layer(x, src_mask, layer_rng)
        if config.norm == "pre":
            x = self.encoder_norm(x)
        return x

    # ------------------------------------------------------------------ decoder

    def init_cache(self, memory: Array, max_len: int, beam_size: int = 1) -> Cache:
        """Cache for decoding up to `max_len` target positions over `memory`.

        Allocates self-attention keys/values for `beam_size` beams of each sentence (the
        decoder's rows b*k .. b*k+k-1 are the beams of sentence b) and `max_len` positions,
        every beam starting on its own slots, and projects the encoder output
        [batch, src_len, d_model] to cross-attention keys/values once per sentence: the beams
        of a sentence share them rather than holding k copies.
        """
        config = self.config
        if max_len > config.max_len:
            # Positions past the model's table would silently reuse its last row.
            raise ValueError(f"a cache of {max_len} target positions is longer than the "
                             f"model's max_len {config.max_len}; decode at most "
                             f"{config.max_len} tokens.")
        batch = memory.shape[0]
        slots = max_len * beam_size
        key_shape = (batch, config.num_heads, config.head_dim, slots)
        value_shape = (batch, config.num_heads, slots, config.head_dim)
        layers = range(config.decoder_layers)
        cross = [layer.cross_attention.project_key_value_for_cache(memory)
                 for layer in self.decoder_layers]
        return Cache(
            index=jnp.zeros((), jnp.int32),
            self_key=tuple(jnp.zeros(key_shape, activation_dtype(config)) for _ in layers),
            self_value=tuple(jnp.zeros(value_shape, activation_dtype(config)) for _ in layers),
            beam_slot=_own_slots(batch, beam_size, max_len),
            cross_key=tuple(k for k, _ in cross),
            cross_value=tuple(v for _, v in cross),
        )

    def decode(self, memory: Array, src_mask: Array, tgt_ids: Array, cache: Cache | None = None,
               rng: Array | None = None) -> tuple[Array, Cache | None]:
        """Target logits given the source.

        memory [batch, src_len, d_model]; src_mask [batch, 1, 1, src_len]; tgt_ids
        [batch, tgt_len] decoder inputs (BOS + target[:-1] in training). Without a cache,
        position i sees target positions <= i (teacher forcing). With a cache, tgt_ids are
        the positions cache["index"] .. index+tgt_len-1 and the updated cache is returned.
        Returns (logits float32 [batch, tgt_len, vocab], cache or None).
        """
        logits, cache, _ = self._decode(memory, src_mask, tgt_ids, cache, rng, False)
        return logits, cache

    def cross_attention_weights(self, src_ids: Array, tgt_ids: Array) -> Array:
        """Encoder-decoder attention of a teacher-forced pass, for alignment plots.

        Returns float32 [decoder_layers, batch, heads, tgt_len, src_len]; rows sum to 1 and
        source padding gets weight 0.
        """
        memory = self.encode(src_ids)
        _, _, weights = self._decode(memory, self.source_mask(src_ids), tgt_ids, None, None, True)
        return jnp.stack(weights)

    def _decode(self, memory, src_mask, tgt_ids, cache, rng, return_weights):
        config = self.config
        rngs = split_rng(rng, 1 + config.decoder_layers)
        offset = cache["index"] if cache is not None else 0
        x = self.positional(self._embed_target(tgt_ids), offset)
        x = dropout(x, config.dropout, rngs[0])
        tgt_len = tgt_ids.shape[1]

        if cache is None:
            self_mask = causal_mask(tgt_len)
        else:
            batch, beam, max_len = cache["beam_slot"].shape
            self_mask = cached_causal_mask(offset, tgt_len, max_len)
            # This step's positions are computed by every beam in its own slots.
            beam_slot = jax.lax.dynamic_update_slice_in_dim(
                cache["beam_slot"], _own_slots(batch, beam, tgt_len), offset, 2)
        new_keys, new_values, all_weights = [], [], []
        for i, layer in enumerate(self.decoder_layers):
            h = layer.self_attention_input(x)
            if cache is None:
                self_kv = layer.self_attention.project_key_value(h)
                cross_kv = layer.cross_attention.project_key_value(memory)
                x, weights = layer(x, self_kv, self_mask, cross_kv, src_mask, rngs[1 + i],
                                   return_weights)
                all_weights.append(weights)
            else:
                # Write the new positions' keys/values into each beam's own slots (in place
                # inside the search loop), then attend over the cache.
                key, value = layer.self_attention.project_key_value_for_cache(h)
                key = _write_slots(cache["self_key"][i], key, beam, offset, axis=3)
                value = _write_slots(cache["self_value"][i], value, beam, offset, axis=2)
                new_keys.append(key)
                new_values.append(value)
                cross_kv = (cache["cross_key"][i], cache["cross_value"][i])
                x = layer.step(x, (key, value), self_mask, beam_slot if beam > 1 else None,
                               cross_kv, src_mask, rngs[1 + i])
        if config.norm == "pre":
            x = self.decoder_norm(x)

        if cache is not None:
            cache = Cache(index=cache["index"] + tgt_len, self_key=tuple(new_keys),
                          self_value=tuple(new_values), beam_slot=beam_slot,
                          cross_key=cache["cross_key"],
                          cross_value=cache["cross_value"])
        return self._logits(x), cache, all_weights

    def __call__(self, src_ids: Array, tgt_in: Array, rng: Array | None = None) -> Array:
        """Teacher-forced logits float32 [batch, tgt_len, vocab] for training."""
        enc_rng, dec_rng = split_rng(rng, 2)
        memory = self.encode(src_ids, enc_rng)
        logits, _ = self.decode(memory, self.source_mask(src_ids), tgt_in, None, dec_rng)
        return logits


def expand_cache_to_beams(cache: Cache, beam: int) -> Cache:
    """A one-beam cache [batch rows] as a `beam`-beam cache whose beams share its history.

    Beam search decodes the first position (from BOS, the same for every beam) once per
    sentence and then expands: the positions < index already computed stay in beam 0's slots
    (slot t * beam) and every beam reads them there (beam_slot 0), so nothing is copied k
    times. Positions from index on are written to each beam's own slots by `decode`.
    Cross-attention keys and values are per sentence already and carry over unchanged.
    """
    batch, one_beam, max_len = cache["beam_slot"].shape
    if one_beam != 1:
        raise ValueError(f"expand_cache_to_beams needs a one-beam cache, got {one_beam} beams.")

    def spread(x: Array, axis: int) -> Array:
        # position t -> slot t * beam (beam 0's slot); other beams' slots zero until written.
        x = jnp.expand_dims(x, axis + 1)
        widths = [(0, 0)] * x.ndim
        widths[axis + 1] = (0, beam - 1)
        x = jnp.pad(x, widths)
        return x.reshape(x.shape[:axis] + (max_len * beam,) + x.shape[axis + 2:])

    return Cache(index=cache["index"],
                 self_key=tuple(spread(k, 3) for k in cache["self_key"]),
                 self_value=tuple(spread(v, 2) for v in cache["self_value"]),
                 beam_slot=jnp.zeros((batch, beam, max_len), jnp.int32),
                 cross_key=cache["cross_key"], cross_value=cache["cross_value"])


def _own_slots(batch: int, beam: int, length: int) -> Array:
    """int32 [batch, beam, length] with beam j's own index: positions each beam computed."""
    return jnp.broadcast_to(jnp.arange(beam, dtype=jnp.int32)[None, :, None],
                            (batch, beam, length))


def _write_slots(cached: Array, new: Array, beam: int, offset: Array, axis: int) -> Array:
    """Store new positions in each beam's own slots of one cache array.

    cached [batch, ...] with its slot axis `axis` of size max_len * beam (beam j's position t
    at slot t * beam + j, so one position of all beams is one contiguous run); new
    [batch * beam, ...] with the same axes but new_len positions on `axis`: the keys or values
    of positions offset .. offset+new_len-1, row b*beam + j for beam j of sentence b. Returns
    the updated cache (an in-place update under jit).
    """
    batch, slots = cached.shape[0], cached.shape[axis]
    new = new.reshape(batch, beam, *new.shape[1:])
    # [batch, beam, ..., new_len, ...] -> [batch, ..., new_len, beam, ...]
    new = jnp.moveaxis(new, 1, axis + 1)
    split = cached.shape[:axis] + (slots // beam, beam) + cached.shape[axis + 1:]
    cached = jax.lax.dynamic_update_slice_in_dim(cached.reshape(split), new, offset, axis)
    return cached.reshape(cached.shape[:axis] + (slots,) + cached.shape[axis + 2:])


def count_parameters(model: nnx.Module) -> int:
    """Number of trainable parameters (shared embeddings counted once)."""
    params = nnx.state(model, nnx.Param)
    return sum(x.size for x in jax.tree_util.tree_leaves(params))
