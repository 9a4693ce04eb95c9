"""The Transformer's building blocks as Section 3 of the paper describes them: masks,
embeddings and positional encoding, multi-head attention, the position-wise feed-forward
network, and the residual connection with layer normalisation.

Conventions used throughout:
- Masks are boolean with True = "may attend", shaped to broadcast to [batch, heads, q_len, k_len].
- Activations are [batch, length, d_model]; per-head tensors are [batch, length, heads, head_dim]
  (the layout `jax.nn.dot_product_attention` takes).
- Dropout randomness is explicit: every `__call__` takes `rng`, and `rng=None` means
  deterministic (evaluation and search).

The products, dtypes and dropout bits underneath are in `transformer.kernels`; the decoder's
cache and its slots in `transformer.cache`.
"""

from __future__ import annotations

import functools
import math

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from transformer.cache import BLOCK, attention_over_own_slots, capacity, keys_transposed
from transformer.config import ModelConfig
from transformer.kernels import Dense, activation_dtype, compute_dtype, dropout, matmul, over_rows

Array = jax.Array

# Xavier/Glorot uniform for projections, as in the reference implementation of the paper.
dense_init = nnx.initializers.xavier_uniform()


# ----------------------------------------------------------------------------- masks


def padding_mask(ids: Array, pad_id: int) -> Array:
    """[batch, k_len] token ids -> [batch, 1, 1, k_len] mask, False on padding keys."""
    return (ids != pad_id)[:, None, None, :]


def causal_mask(length: int) -> Array:
    """[1, 1, length, length] lower-triangular mask: query i may attend to keys j <= i."""
    return jnp.tril(jnp.ones((length, length), dtype=bool))[None, None]


def segment_mask(query_segments: Array, key_segments: Array) -> Array:
    """[batch, q_len] and [batch, k_len] segment ids -> [batch, 1, q_len, k_len] mask: a
    query of a pair (segment >= 1) may attend to the keys of its own pair only, never to
    padding (segment 0).

    Packed rows (`data.packing`) hold several pairs; segments keep them apart. Padding
    queries may attend to every key: their outputs are never used, and no query is left
    with no key at all, which a fused kernel may turn into NaN."""
    same = query_segments[:, :, None] == key_segments[:, None, :]
    return (same | (query_segments == 0)[:, :, None])[:, None]


@flax.struct.dataclass
class Packing:
    """Where the pairs of packed rows lie: per-token segment ids (1, 2, ... per pair, 0 on
    padding) and positions within each pair, each [batch, len], for source and target."""

    src_segments: Array
    tgt_segments: Array
    src_positions: Array
    tgt_positions: Array

    @classmethod
    def of(cls, batch: dict[str, Array]) -> "Packing | None":
        """The packing of a batch (`data.packing`'s keys), or None for a padded batch."""
        if "src_segments" not in batch:
            return None
        return cls(batch["src_segments"], batch["tgt_segments"], batch["src_positions"],
                   batch["tgt_positions"])

    def encoder_mask(self) -> Array:
        return segment_mask(self.src_segments, self.src_segments)

    def decoder_mask(self) -> Array:
        """Causal within each pair: row order is each pair's position order."""
        return causal_mask(self.tgt_segments.shape[1]) & segment_mask(self.tgt_segments,
                                                                      self.tgt_segments)

    def cross_mask(self) -> Array:
        return segment_mask(self.tgt_segments, self.src_segments)


# ----------------------------------------------------------------------------- helpers


def split_rng(rng: Array | None, n: int) -> list[Array | None]:
    """n independent keys from `rng`, or n Nones when running deterministically."""
    if rng is None:
        return [None] * n
    return list(jax.random.split(rng, n))


@functools.lru_cache(maxsize=8)
def sinusoidal_positions(max_len: int, d_model: int) -> np.ndarray:
    """[max_len, d_model] table PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...).

    Sines and cosines are interleaved exactly as in the paper (Sec. 3.5).
    """
    positions = np.arange(max_len, dtype=np.float64)[:, None]
    rates = np.power(10000.0, -np.arange(0, d_model, 2, dtype=np.float64) / d_model)
    table = np.zeros((max_len, d_model), dtype=np.float64)
    table[:, 0::2] = np.sin(positions * rates)
    table[:, 1::2] = np.cos(positions * rates[: d_model // 2])
    return table.astype(np.float32)


def reference_attention(query: Array, key: Array, value: Array, mask: Array | None
                        ) -> tuple[Array, Array]:
    """softmax(Q K^T / sqrt(d_k) + mask) V, written out; also returns the weights.

    query [batch, q_len, heads, head_dim], key/value [batch, k_len, heads, head_dim],
    mask broadcastable to [batch, heads, q_len, k_len].
    Returns (context [batch, q_len, heads, head_dim], weights [batch, heads, q_len, k_len]).
    Masked keys get weight exactly 0.
    """
    scale = 1.0 / math.sqrt(query.shape[-1])
    # Accumulated and returned in float32 even for bfloat16 inputs: rounding the scores to
    # bfloat16 before the softmax would cost about two decimal digits of the weights.
    scores = jnp.einsum("bqhd,bkhd->bhqk", query, key,
                        preferred_element_type=jnp.float32) * scale
    if mask is not None:
        scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1)
    if mask is not None:
        # A query whose keys are all masked (an all-padding row) gets zeros, not a uniform
        # spread over padding.
        weights = jnp.where(mask, weights, 0.0)
    context = jnp.einsum("bhqk,bkhd->bqhd", weights.astype(value.dtype), value)
    return context, weights


# ----------------------------------------------------------------------------- modules


class Embedding(nnx.Module):
    """Token embedding scaled by sqrt(d_model); `attend` is the tied output projection."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        # Normal(0, d_model^-0.5) so that the scaled embedding has unit variance.
        init = nnx.initializers.normal(stddev=config.d_model ** -0.5)
        self.table = nnx.Embed(config.vocab_size, config.d_model, dtype=activation_dtype(config),
                               embedding_init=init, rngs=rngs)
        self.scale = math.sqrt(config.d_model)
        self.product_dtype = compute_dtype(config)

    def __call__(self, ids: Array) -> Array:
        """[batch, length] ids -> [batch, length, d_model]."""
        return self.table(ids) * self.scale

    def attend(self, x: Array, candidates: Array | None = None) -> Array:
        """[batch, length, d_model] -> float32 [batch, length, vocab] logits (x @ E^T), or
        [batch, length, K] of the K token ids `candidates` only (a shortlist)."""
        table = self.table.embedding[...]
        if candidates is not None:
            table = jnp.take(table, candidates, axis=0)
        return over_rows(lambda rows: matmul(rows, table, self.product_dtype,
                                             kernel_transposed=True, out_dtype=jnp.float32), x)


class PositionalEncoding(nnx.Module):
    """Adds sinusoidal (paper) or learned position vectors: of positions offset,
    offset+1, ..., or of given per-token `positions` (packed rows restart at every pair)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.max_len, self.d_model = config.max_len, config.d_model
        self.learned = config.positional == "learned"
        if self.learned:
            init = nnx.initializers.normal(stddev=config.d_model ** -0.5)
            self.table = nnx.Param(init(rngs.params(), (config.max_len, config.d_model)))

    def __call__(self, x: Array, offset: Array | int = 0, positions: Array | None = None
                 ) -> Array:
        """x [batch, length, d_model]; positions offset .. offset+length-1, or `positions`
        [batch, length] when given."""
        if positions is None and x.shape[1] > self.max_len:
            raise ValueError(
                f"a sequence of {x.shape[1]} positions is longer than the model's max_len "
                f"{self.max_len}; truncate or split the input, or train with a larger max_len.")
        if self.learned:
            table = self.table[...]
        else:
            # A compile-time constant, not state: never trained, never checkpointed.
            table = jnp.asarray(sinusoidal_positions(self.max_len, self.d_model))
        if positions is not None:
            return x + table[positions].astype(x.dtype)
        rows = jax.lax.dynamic_slice_in_dim(table, offset, x.shape[1], axis=0)
        return x + rows[None].astype(x.dtype)


def cache_prefixes(max_len: int) -> tuple[int, ...]:
    """The position counts that self-attention over the decoder's cache runs over, shortest
    first: powers of two from one cache block (16 positions) below the cache's capacity, then
    the capacity (`transformer.cache.capacity(max_len)`): whole blocks each. A step reads at
    most twice the positions written (16 at the first steps); each count is one more branch
    to compile."""
    positions = capacity(max_len)
    lengths = []
    n = BLOCK
    while n < positions:
        lengths.append(n)
        n *= 2
    return (*lengths, positions)


class MultiHeadAttention(nnx.Module):
    """Multi-head scaled dot-product attention (paper Sec. 3.2.2).

    Used three ways: encoder self-attention (padding mask), decoder masked self-attention
    (causal mask, key/value cache) and encoder-decoder attention (keys and values from the
    encoder output, projected once per sentence during search via `project_key_value`).
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        d, dtype = config.d_model, compute_dtype(config)
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.attention_dropout = config.attention_dropout
        self.implementation = config.attention_impl

        def linear() -> Dense:
            return Dense(d, d, dtype=dtype, kernel_init=dense_init, rngs=rngs)

        self.query = linear()
        self.key = linear()
        self.value = linear()
        self.output = linear()

    def _split_heads(self, x: Array) -> Array:
        batch, length, _ = x.shape
        return x.reshape(batch, length, self.num_heads, self.head_dim)  # [b, len, heads, head_dim]

    def project_query(self, x: Array) -> Array:
        """[batch, q_len, d_model] -> [batch, q_len, heads, head_dim]."""
        return self._split_heads(self.query(x))

    def project_key_value(self, x: Array) -> tuple[Array, Array]:
        """[batch, k_len, d_model] -> keys and values, each [batch, k_len, heads, head_dim]."""
        return self._split_heads(self.key(x)), self._split_heads(self.value(x))

    def project_key_value_for_cache(self, x: Array, group: int) -> tuple[Array, Array]:
        """[batch, k_len, d_model] -> keys [batch, heads, head_dim, k_len] (transposed, for
        `group` > 1 queries per row; else [batch, heads, k_len, head_dim]) and values
        [batch, heads, k_len, head_dim]: the layouts `attend_cached` reads and the decoder's
        cache stores (`transformer.cache.keys_transposed`, `DecoderCache.write`)."""
        key, value = self.project_key_value(x)
        key_order = (0, 2, 3, 1) if keys_transposed(group) else (0, 2, 1, 3)
        return key.transpose(key_order), value.transpose(0, 2, 1, 3)

    def attend(self, query: Array, key: Array, value: Array, mask: Array | None,
               rng: Array | None = None, return_weights: bool = False
               ) -> tuple[Array, Array | None]:
        """Attention over projected heads; returns ([batch, q_len, d_model], weights or None).

        query [batch, q_len, heads, head_dim], key/value [batch, k_len, heads, head_dim],
        mask broadcastable to [batch, heads, q_len, k_len]. The fused
        `jax.nn.dot_product_attention` runs (cuDNN's kernel on GPU with attention_impl="cudnn")
        unless weights are requested or attention dropout is active, which need the
        probabilities themselves.
        """
        needs_weights = return_weights or (rng is not None and self.attention_dropout > 0)
        if needs_weights:
            context, weights = self._attend_with_weights(query, key, value, mask, rng)
        else:
            weights = None
            if self.implementation == "cudnn" and mask is not None:
                # cuDNN takes the mask as a bias with the full query axis; padding masks
                # [batch, 1, 1, k_len] broadcast over it.
                mask = jnp.broadcast_to(mask, (*mask.shape[:2], query.shape[1], mask.shape[3]))
            context = jax.nn.dot_product_attention(
                query, key, value, mask=mask, implementation=self.implementation)
        batch, q_len = context.shape[:2]
        context = context.reshape(batch, q_len, self.num_heads * self.head_dim)
        return self.output(context), weights

    def attend_cached(self, query: Array, key: Array, value: Array, mask: Array) -> Array:
        """Encoder-decoder attention of a few new query positions over the source's keys and
        values, projected once per sentence (`project_key_value_for_cache`).

        query [rows, q_len, heads, head_dim]; key [batch, heads, head_dim, src_len] (group > 1)
        or [batch, heads, src_len, head_dim] (group = 1, `transformer.cache.keys_transposed`);
        value [batch, heads, src_len, head_dim]; mask [batch, 1, 1, src_len]; rows = batch *
        group: consecutive query rows (the beams of one sentence) share a key/value row and
        are folded into the query axis. Returns [rows, q_len, d_model].
        """
        rows, q_len = query.shape[:2]
        batch = key.shape[0]
        group = rows // batch
        query = self._queries_by_sentence(query, batch)
        scores = jnp.einsum("bhqd,bhdk->bhqk" if keys_transposed(group) else "bhqd,bhkd->bhqk",
                            query, key,
                            preferred_element_type=jnp.float32) / math.sqrt(self.head_dim)
        weights = jax.nn.softmax(jnp.where(mask, scores, jnp.finfo(jnp.float32).min), axis=-1)
        context = jnp.einsum("bhqk,bhkd->bhqd", weights.astype(value.dtype), value)
        return self._context_out(context, rows, q_len)

    def attend_over_cache(self, query: Array, key: Array, value: Array, mask: Array,
                          beam_slot: Array | None, written: Array) -> Array:
        """Self-attention of a few new query positions over the decoder's cache
        (`transformer.cache.DecoderCache`), their own keys and values written in it.

        query [rows, q_len, heads, head_dim]; key [blocks, batch, heads, head_dim, slots]
        (group > 1) or [blocks, batch, heads, slots, head_dim] (group = 1); value [blocks,
        batch, heads, slots, head_dim], with slots = BLOCK * group (position t of beam j at
        slot (t % BLOCK) * group + j of block t // BLOCK); rows = batch * group; mask
        [1, 1, q_len, positions] over the cache's positions. Returns [rows, q_len, d_model].

        In beam search (`beam_slot` int32 [batch, group, positions] given), beam i reads
        position t from the slot of beam beam_slot[b, i, t], the beam that computed it (see
        `transformer.cache`). `written` (int32 scalar, the positions written so far, new ones
        included) lets the products skip the cache's unwritten end: they run over the
        shortest of a few fixed prefixes (`cache_prefixes`) that holds every written position,
        its leading blocks, one contiguous piece of each array. Every beam's query meets
        every beam's slots, so in beam search the whole cache would cost beam times a
        position's work for every position at every step; greedy search reads less memory.
        """
        lengths = cache_prefixes(mask.shape[-1])

        def over_prefix(length: int, query, key, value, mask, beam_slot):
            blocks = length // BLOCK
            return self._attend_blocks(query, key[:blocks], value[:blocks], mask[..., :length],
                                       None if beam_slot is None else beam_slot[..., :length])

        branches = [functools.partial(over_prefix, n) for n in lengths]
        which = jnp.searchsorted(jnp.asarray(lengths, jnp.int32), written)
        return jax.lax.switch(which, branches, query, key, value, mask, beam_slot)

    def _attend_blocks(self, query: Array, key: Array, value: Array, mask: Array,
                       beam_slot: Array | None) -> Array:
        """`attend_over_cache` over every block of key and value: one batched product per
        block, so each block is read where it lies; the scores of all blocks meet in one
        softmax (slot order: block after block, which is position order)."""
        rows, q_len = query.shape[:2]
        blocks, batch = key.shape[:2]
        group = rows // batch
        query = self._queries_by_sentence(query, batch)  # [batch, heads, group * q_len, hd]
        query = jnp.broadcast_to(query[None], (blocks, *query.shape))
        scores = jnp.einsum(
            "nbhqd,nbhdk->nbhqk" if keys_transposed(group) else "nbhqd,nbhkd->nbhqk", query, key,
            preferred_element_type=jnp.float32) / math.sqrt(self.head_dim)
        slots = scores.shape[-1]
        scores = jnp.moveaxis(scores, 0, 3).reshape(*scores.shape[1:4], blocks * slots)
        if beam_slot is None:
            scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
            weights = jax.nn.softmax(scores, axis=-1)
        else:
            weights = attention_over_own_slots(scores, beam_slot, mask, q_len)
        weights = jnp.moveaxis(weights.reshape(*weights.shape[:3], blocks, slots), 3, 0)
        context = jnp.einsum("nbhqk,nbhkd->nbhqd", weights.astype(value.dtype), value).sum(0)
        return self._context_out(context, rows, q_len)

    def _queries_by_sentence(self, query: Array, batch: int) -> Array:
        """[rows, q_len, heads, head_dim] -> [batch, heads, group * q_len, head_dim]: the
        queries of a sentence's rows (its beams) side by side."""
        rows, q_len = query.shape[:2]
        query = query.reshape(batch, rows // batch * q_len, self.num_heads, self.head_dim)
        return query.transpose(0, 2, 1, 3)

    def _context_out(self, context: Array, rows: int, q_len: int) -> Array:
        """[batch, heads, group * q_len, head_dim] -> the output projection, [rows, q_len,
        d_model]."""
        context = context.transpose(0, 2, 1, 3).reshape(rows, q_len, self.num_heads * self.head_dim)
        return self.output(context)

    def _attend_with_weights(self, query, key, value, mask, rng):
        _, weights = reference_attention(query, key, value, mask)
        dropped = dropout(weights, self.attention_dropout, rng)
        context = jnp.einsum("bhqk,bkhd->bqhd", dropped.astype(value.dtype), value)
        return context, weights

    def __call__(self, x: Array, context: Array, mask: Array | None, rng: Array | None = None
                 ) -> Array:
        """Queries from x [batch, q_len, d_model]; keys, values from context
        [batch, k_len, d_model]."""
        key, value = self.project_key_value(context)
        out, _ = self.attend(self.project_query(x), key, value, mask, rng)
        return out


ACTIVATIONS = {"relu": jax.nn.relu, "swish": jax.nn.silu}


class FeedForward(nnx.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (paper Sec. 3.3); swish (x * sigmoid(x)) in place of
    max(0, .) for models converted from Marian."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        dtype = compute_dtype(config)
        self.inner = Dense(config.d_model, config.d_ff, dtype=dtype, kernel_init=dense_init,
                           rngs=rngs)
        self.outer = Dense(config.d_ff, config.d_model, dtype=dtype, kernel_init=dense_init,
                           rngs=rngs)
        self.activation_dropout = config.activation_dropout
        self.activation = ACTIVATIONS[config.activation]

    def __call__(self, x: Array, rng: Array | None = None) -> Array:
        hidden = self.activation(self.inner(x))
        return self.outer(dropout(hidden, self.activation_dropout, rng))


class AddNorm(nnx.Module):
    """Residual connection around a sub-layer with layer normalisation, post- or pre-norm.

    post (paper): LayerNorm(x + Dropout(Sublayer(x)));  pre: x + Dropout(Sublayer(LayerNorm(x))).
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.norm = nnx.LayerNorm(config.d_model, epsilon=config.layer_norm_epsilon,
                                  dtype=activation_dtype(config), rngs=rngs)
        self.pre_norm = config.norm == "pre"
        self.rate = config.dropout

    def sublayer_input(self, x: Array) -> Array:
        return self.norm(x) if self.pre_norm else x

    def residual(self, x: Array, sublayer_output: Array, rng: Array | None) -> Array:
        y = x + dropout(sublayer_output, self.rate, rng)
        return y if self.pre_norm else self.norm(y)
