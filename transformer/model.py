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
functions (see transformer/training.py and transformer/search/).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from transformer.cache import DecoderCache
from transformer.config import ModelConfig
from transformer.kernels import Dense, activation_dtype, compute_dtype, dropout, matmul, over_rows
from transformer.layers import (
    AddNorm,
    Embedding,
    FeedForward,
    MultiHeadAttention,
    Packing,
    PositionalEncoding,
    causal_mask,
    padding_mask,
    split_rng,
)

Array = jax.Array


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
             rng: Array | None, written: Array) -> Array:
        """The layer for new positions over cached keys/values (incremental decoding).

        x [rows, new_len, d_model] with rows = batch * beam; self_kv: the cache's keys and
        values of this layer with this step written, in blocks of positions
        (`transformer.cache.DecoderCache`); self_mask [1, 1, new_len, positions];
        beam_slot [batch, beam, positions] (None when beam = 1); cross_kv: keys
        [batch, heads, head_dim, src_len] and values [batch, heads, src_len, head_dim]; with
        beam = 1 keys are [..., positions, head_dim] (`transformer.cache.keys_transposed`);
        src_mask [batch, 1, 1, src_len]; written: the positions in the cache, this step's
        included, so that attention skips the rest (`MultiHeadAttention.attend_over_cache`).
        Attention dropout is not applied on this path.
        """
        rngs = split_rng(rng, 6)

        def attend_self(h):
            query = self.self_attention.project_query(h)
            return self.self_attention.attend_over_cache(query, *self_kv, self_mask, beam_slot,
                                                         written)

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
        if config.output_bias:
            self.output_bias = nnx.Param(jnp.zeros((config.vocab_size,), jnp.float32))
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

    def _logits(self, x: Array, candidates: Array | None = None) -> Array:
        """[batch, len, d_model] -> float32 [batch, len, vocab], or [batch, len, K] of the K
        token ids `candidates` only: a shortlist's output projection and softmax."""
        # float32 straight from the product's accumulator: with bfloat16 activations, logits
        # rounded to bfloat16 would move beam scores by up to ~0.06 nats per token.
        if self.config.share_embeddings:
            logits = self.src_embedding.attend(x, candidates)
        elif candidates is None:
            logits = self.output_projection(x, out_dtype=jnp.float32)
        else:
            projection = self.output_projection
            kernel = jnp.take(projection.kernel[...], candidates, axis=1)
            logits = over_rows(lambda rows: matmul(rows, kernel, projection.dtype or x.dtype,
                                                   out_dtype=jnp.float32), x)
        if self.config.output_bias:
            bias = self.output_bias[...]
            logits = logits + (bias if candidates is None else jnp.take(bias, candidates))
        return logits

    # ------------------------------------------------------------------ encoder

    def source_mask(self, src_ids: Array) -> Array:
        """[batch, src_len] -> [batch, 1, 1, src_len], False on padding."""
        return padding_mask(src_ids, self.config.pad_id)

    def encode(self, src_ids: Array, rng: Array | None = None, src_mask: Array | None = None,
               positions: Array | None = None) -> Array:
        """[batch, src_len] ids -> memory [batch, src_len, d_model] (activation dtype).

        `src_mask` (broadcastable to [batch, 1, src_len, src_len]) defaults to
        `source_mask(src_ids)` (PAD is padding); `positions` [batch, src_len] to 0, 1, ...
        """
        config = self.config
        rngs = split_rng(rng, 1 + config.encoder_layers)
        if src_mask is None:
            src_mask = self.source_mask(src_ids)
        x = self.positional(self.src_embedding(src_ids), positions=positions)
        x = dropout(x, config.dropout, rngs[0])
        for layer, layer_rng in zip(self.encoder_layers, rngs[1:]):
            x = layer(x, src_mask, layer_rng)
        if config.norm == "pre":
            x = self.encoder_norm(x)
        return x

    # ------------------------------------------------------------------ decoder

    def init_cache(self, memory: Array, max_len: int, beam_size: int = 1) -> DecoderCache:
        """Cache for decoding up to `max_len` target positions over `memory`.

        It holds `max_len` rounded up to whole blocks (`transformer.cache.capacity`, the
        cache's `max_len`); every `decode` with it must keep cache.index + tgt_len within that.

        Allocates self-attention keys/values for `beam_size` beams of each sentence (the
        decoder's rows b*k .. b*k+k-1 are the beams of sentence b) and `max_len` positions,
        and projects the encoder output [batch, src_len, d_model] to cross-attention
        keys/values once per sentence: the beams of a sentence share them rather than holding
        k copies.
        """
        config = self.config
        if max_len > config.max_len:
            # Positions past the model's table would silently reuse its last row.
            raise ValueError(f"a cache of {max_len} target positions is longer than the "
                             f"model's max_len {config.max_len}; decode at most "
                             f"{config.max_len} tokens.")
        cross = [layer.cross_attention.project_key_value_for_cache(memory, beam_size)
                 for layer in self.decoder_layers]
        return DecoderCache.create(cross, max_len, beam_size, config.num_heads,
                                   config.head_dim, activation_dtype(config))

    def decode(self, memory: Array, src_mask: Array, tgt_ids: Array,
               cache: DecoderCache | None = None, rng: Array | None = None,
               candidates: Array | None = None) -> tuple[Array, DecoderCache | None]:
        """Target logits given the source.

        memory [batch, src_len, d_model]; src_mask [batch, 1, 1, src_len]; tgt_ids
        [batch, tgt_len] decoder inputs (BOS + target[:-1] in training). Without a cache,
        position i sees target positions <= i (teacher forcing). With a cache, tgt_ids are
        the positions cache.index .. index+tgt_len-1 and the updated cache is returned;
        index + tgt_len must not exceed the cache's max_len (ValueError where the index is
        known; under jit a traced index is not checked, and positions past the cache would
        overwrite its last slots).
        Returns (logits float32 [batch, tgt_len, vocab], cache or None); with `candidates`
        (int32 [K] token ids, a shortlist) the logits are those of the K candidates only.
        """
        logits, cache, _ = self._decode(memory, src_mask, tgt_ids, cache, rng, False,
                                        candidates=candidates)
        return logits, cache

    def cross_attention_weights(self, src_ids: Array, tgt_ids: Array,
                                packing: Packing | None = None) -> Array:
        """Encoder-decoder attention of a teacher-forced pass, for alignment plots (and to
        check that packed pairs never attend to each other).

        Returns float32 [decoder_layers, batch, heads, tgt_len, src_len]; rows sum to 1 and
        source padding (and every other pair of a packed row) gets weight 0.
        """
        _, weights = self._teacher_forced(src_ids, tgt_ids, None, packing, return_weights=True)
        return jnp.stack(weights)

    def _decode(self, memory, src_mask, tgt_ids, cache, rng, return_weights, self_mask=None,
                positions=None, candidates=None, project=True):
        """Teacher-forced over tgt_ids (self_mask: causal unless given), or one step over
        the cache; teacher-forced without `project`, the final states, not their logits."""
        config = self.config
        rngs = split_rng(rng, 1 + config.decoder_layers)
        offset = cache.index if cache is not None else 0
        x = self.positional(self._embed_target(tgt_ids), offset, positions)
        x = dropout(x, config.dropout, rngs[0])
        if cache is not None:
            return self._decode_step(x, memory, src_mask, cache, rngs[1:], candidates)

        if self_mask is None:
            self_mask = causal_mask(tgt_ids.shape[1])
        all_weights = []
        for layer, layer_rng in zip(self.decoder_layers, rngs[1:]):
            h = layer.self_attention_input(x)
            self_kv = layer.self_attention.project_key_value(h)
            cross_kv = layer.cross_attention.project_key_value(memory)
            x, weights = layer(x, self_kv, self_mask, cross_kv, src_mask, layer_rng,
                               return_weights)
            all_weights.append(weights)
        states = self._final_norm(x)
        return (self._logits(states, candidates) if project else states), None, all_weights

    def _decode_step(self, x, memory, src_mask, cache: DecoderCache, rngs, candidates=None):
        """New positions over the cache: each layer writes their keys and values into every
        beam's own slots (in place inside the search loop), then attends over the cache."""
        tgt_len = x.shape[1]
        cache.check_room(tgt_len, self.config.max_len)
        self_mask = cache.causal_mask(tgt_len)
        beam_slot = cache.slots_with_step(tgt_len)
        new_keys, new_values = [], []
        for i, (layer, layer_rng) in enumerate(zip(self.decoder_layers, rngs)):
            h = layer.self_attention_input(x)
            key, value = cache.write(
                i, *layer.self_attention.project_key_value_for_cache(h, cache.beam))
            new_keys.append(key)
            new_values.append(value)
            cross_kv = (cache.cross_key[i], cache.cross_value[i])
            x = layer.step(x, (key, value), self_mask,
                           beam_slot if cache.beam > 1 else None, cross_kv, src_mask, layer_rng,
                           written=cache.index + tgt_len)
        cache = cache.advance(new_keys, new_values, beam_slot, tgt_len)
        return self._logits(self._final_norm(x), candidates), cache, []

    def _final_norm(self, x: Array) -> Array:
        return self.decoder_norm(x) if self.config.norm == "pre" else x

    def __call__(self, src_ids: Array, tgt_in: Array, rng: Array | None = None,
                 packing: Packing | None = None) -> Array:
        """Teacher-forced logits float32 [batch, tgt_len, vocab] for training.

        With `packing`, each row holds several pairs (`data.packing`): attention stays within
        each pair and positions restart at every pair, so each pair's logits are those it
        gets alone.
        """
        return self._teacher_forced(src_ids, tgt_in, rng, packing)[0]

    def decoder_states(self, src_ids: Array, tgt_in: Array, rng: Array | None = None,
                       packing: Packing | None = None) -> Array:
        """`__call__` up to the output projection: the final decoder states [batch, tgt_len,
        d_model], whose `logits` are `__call__`'s. The training loss projects them a chunk
        of tokens at a time (`transformer.training.chunked_loss_sums`)."""
        return self._teacher_forced(src_ids, tgt_in, rng, packing, project=False)[0]

    def logits(self, states: Array) -> Array:
        """float32 logits [..., vocab] of decoder states [..., d_model]."""
        return self._logits(states)

    def _teacher_forced(self, src_ids, tgt_in, rng, packing, return_weights=False,
                        project=True):
        enc_rng, dec_rng = split_rng(rng, 2)
        if packing is None:
            memory = self.encode(src_ids, enc_rng)
            out, _, weights = self._decode(memory, self.source_mask(src_ids), tgt_in, None,
                                           dec_rng, return_weights, project=project)
            return out, weights
        memory = self.encode(src_ids, enc_rng, packing.encoder_mask(), packing.src_positions)
        out, _, weights = self._decode(memory, packing.cross_mask(), tgt_in, None, dec_rng,
                                       return_weights, packing.decoder_mask(),
                                       packing.tgt_positions, project=project)
        return out, weights


def count_parameters(model: nnx.Module) -> int:
    """Number of trainable parameters (shared embeddings counted once)."""
    params = nnx.state(model, nnx.Param)
    return sum(x.size for x in jax.tree_util.tree_leaves(params))
