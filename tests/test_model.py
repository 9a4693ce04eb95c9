"""The Transformer's shapes, sizes, masks, attention and incremental decoding."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from transformer.cache import BLOCK, DecoderCache
from transformer.config import PRESETS, ModelConfig, OptimizerConfig, SearchConfig, get_preset
from transformer.kernels import dropout
from transformer.layers import (
    AddNorm,
    FeedForward,
    MultiHeadAttention,
    PositionalEncoding,
    cache_prefixes,
    causal_mask,
    padding_mask,
    reference_attention,
    sinusoidal_positions,
)
from transformer.model import Transformer, count_parameters

PAD = 0


def make_model(**overrides) -> Transformer:
    config = get_preset("tiny", **overrides)
    return Transformer(config, rngs=nnx.Rngs(0))


class Compiled:
    """A model whose calls each run as one compiled program (one per method, static keyword
    values and shapes), its parameters read at every call. Run eagerly, each of a forward
    pass's hundreds of operations is compiled on its own, which was most of this file's time;
    any other attribute is the model's own."""

    METHODS = ("encode", "decode", "init_cache", "cross_attention_weights")

    def __init__(self, model: Transformer):
        self.model = model
        self._programs = {}

    def __call__(self, *args, **kwargs):
        return self._compiled("__call__")(*args, **kwargs)

    def __getattr__(self, name):
        if name in self.METHODS:
            return self._compiled(name)
        return getattr(self.model, name)

    def _compiled(self, name):
        def call(*args, **kwargs):
            static = tuple(sorted((key, value) for key, value in kwargs.items()
                                  if isinstance(value, int)))
            traced = {key: value for key, value in kwargs.items() if not isinstance(value, int)}
            if (name, static) not in self._programs:
                self._programs[name, static] = nnx.jit(
                    lambda model, *a, **k: getattr(model, name)(*a, **k, **dict(static)))
            return self._programs[name, static](self.model, *args, **traced)
        return call


def compiled_model(**overrides) -> Compiled:
    return Compiled(make_model(**overrides))


def random_batch(rng: np.random.Generator, batch: int, length: int, vocab: int,
                 lengths: list[int] | None = None) -> jnp.ndarray:
    ids = rng.integers(4, vocab, size=(batch, length)).astype(np.int32)
    for row, n in enumerate(lengths or []):
        ids[row, n:] = PAD
    return jnp.asarray(ids)


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize("name, low, high", [("base", 63e6, 65e6), ("big", 210e6, 215e6)])
def test_paper_parameter_counts_with_37k_shared_vocabulary(name, low, high):
    config = get_preset(name, vocab_size=37_000)
    model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    assert low <= count_parameters(model) <= high


def test_presets_match_the_paper():
    base, big = PRESETS["base"], PRESETS["big"]
    assert (base.encoder_layers, base.decoder_layers, base.d_model, base.num_heads, base.d_ff,
            base.dropout) == (6, 6, 512, 8, 2048, 0.1)
    assert (big.d_model, big.num_heads, big.d_ff, big.dropout) == (1024, 16, 4096, 0.3)
    assert base.norm == "post" and base.positional == "sinusoidal" and base.share_embeddings


@pytest.mark.parametrize("overrides, field", [
    ({"d_model": 30, "num_heads": 4}, "num_heads"),
    ({"dropout": 1.5}, "dropout"),
    ({"encoder_layers": -1}, "encoder_layers"),
    ({"norm": "middle"}, "norm"),
    ({"dtype": "float16"}, "dtype"),
    ({"attention_impl": "cudnn"}, "attention_impl"),  # float32 by default
    ({"attention_impl": "cudnn", "dtype": "bfloat16", "activation_dtype": "float32"},
     "attention_impl"),
])
def test_invalid_model_config_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(PRESETS["tiny"], **overrides)


def test_unknown_preset_lists_the_choices():
    with pytest.raises(ValueError, match="tiny"):
        get_preset("huge")


@pytest.mark.parametrize("overrides, field", [
    ({"beam_size": 2, "nbest": 3}, "nbest"),
    ({"max_len_b": -1}, "max_len_b"),
    ({"beam_size": 0}, "beam_size"),
    ({"temperature": 0.0}, "temperature"),
    ({"strategy": "greedy", "nbest": 2}, "nbest"),
    ({"strategy": "sample", "nbest": 2}, "nbest"),
])
def test_invalid_search_config_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        SearchConfig(**overrides)


def _wrongly_typed(cls):
    """(field, value) for each of `cls`'s fields declared int, float or bool, with values of
    other types that Python would let through: true for 1, "no" as truthy, "0.1" and null."""
    wrong = {"int": (2.5, True, "4", None), "float": ("0.1", True, None), "bool": ("no", 1, None)}
    for field in dataclasses.fields(cls):
        kind, _, optional = field.type.partition(" | ")
        for value in wrong.get(kind, ()):
            if not (value is None and optional == "None"):
                yield field.name, value


@pytest.mark.parametrize("cls, field, value", [
    (cls, field, value) for cls in (ModelConfig, OptimizerConfig, SearchConfig)
    for field, value in _wrongly_typed(cls)])
def test_wrongly_typed_config_value_names_the_field(cls, field, value):
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.{field} must be"):
        cls(**{field: value})


def test_integers_do_for_float_config_fields():
    assert SearchConfig(alpha=1, max_len_a=0, temperature=2).max_len_a == 0
    assert ModelConfig(dropout=0, layer_norm_epsilon=1).dropout == 0
    assert OptimizerConfig(label_smoothing=0, clip_norm=1, lr_scale=2).label_smoothing == 0


def test_config_round_trips_through_json_dict():
    config = get_preset("small", vocab_size=1234, norm="pre")
    assert ModelConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="colour"):
        ModelConfig.from_dict({**config.to_dict(), "colour": "red"})


# ----------------------------------------------------------------------------- masks


def test_masks_match_literal_matrices():
    ids = jnp.array([[5, 6, 0], [7, 0, 0]])
    np.testing.assert_array_equal(padding_mask(ids, PAD)[:, 0, 0],
                                  [[True, True, False], [True, False, False]])
    np.testing.assert_array_equal(causal_mask(3)[0, 0],
                                  [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
    # Queries at absolute positions 2 and 3 over a cache made for 5 positions, which holds
    # one block of 16.
    kv = (jnp.zeros((1, 1, 1, 3)), jnp.zeros((1, 1, 3, 1)))
    cache = DecoderCache.create([kv], max_len=5, beam=1, num_heads=1, head_dim=1,
                                dtype=jnp.float32).replace(index=jnp.array(2))
    assert cache.max_len == BLOCK == 16
    np.testing.assert_array_equal(cache.causal_mask(2)[0, 0],
                                  [[1, 1, 1] + [0] * 13, [1, 1, 1, 1] + [0] * 12])


def test_sinusoidal_positions_follow_the_formula():
    table = sinusoidal_positions(50, 6)
    pos, i = 7, 1
    assert table[pos, 2 * i] == pytest.approx(np.sin(pos / 10000 ** (2 * i / 6)), abs=1e-6)
    assert table[pos, 2 * i + 1] == pytest.approx(np.cos(pos / 10000 ** (2 * i / 6)), abs=1e-6)


def test_embedding_is_scaled_by_sqrt_d_model():
    """Guards the paper's sqrt(d_model) scaling of the embeddings (Sec. 3.4); the initialiser
    is chosen for it, and without it the positions swamp the tokens."""
    model = make_model()                                          # tiny: d_model 24
    ids = jnp.array([[5, 9, 0], [63, 4, 4]])
    table = np.asarray(model.src_embedding.table.embedding[...])
    np.testing.assert_allclose(model.src_embedding(ids), table[np.asarray(ids)] * np.sqrt(24),
                               rtol=1e-6)


def test_positional_encoding_adds_the_table_from_position_zero():
    """Guards positions counted from 0 (PE(0) = [0, 1, 0, 1, ...]) and the cache offset: a
    shift by one is invisible to the cache/teacher-forcing parity tests, which shift both."""
    config = get_preset("tiny")
    positional = PositionalEncoding(config, rngs=nnx.Rngs(0))
    table = sinusoidal_positions(config.max_len, config.d_model)
    zeros = jnp.zeros((2, 5, config.d_model))
    np.testing.assert_allclose(positional(zeros)[1], table[:5], atol=1e-6)
    np.testing.assert_allclose(positional(zeros)[0, 0], [0.0, 1.0] * (config.d_model // 2),
                               atol=1e-6)
    np.testing.assert_allclose(positional(zeros, jnp.array(3))[0], table[3:8], atol=1e-6)


# ----------------------------------------------------------------------------- attention


def _numpy_layer_norm(x: np.ndarray, norm, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    scale, bias = np.asarray(norm.scale[...]), np.asarray(norm.bias[...])
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def test_multi_head_attention_follows_the_paper_formula():
    """Guards softmax(Q K^T / sqrt(d_head)) V per head, then W_O (Sec. 3.2.2), for the module
    itself: a wrong scale applied alike to the fused and the cached path keeps every parity
    test passing (the fused-vs-reference test calls jax.nn directly)."""
    config = get_preset("tiny")                                   # 3 heads of 8
    attention = MultiHeadAttention(config, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(11)
    for dense in (attention.query, attention.key, attention.value, attention.output):
        dense.bias[...] = jnp.asarray(rng.normal(size=dense.bias.shape), jnp.float32)
    x = rng.normal(size=(2, 4, 24)).astype(np.float32)
    context = rng.normal(size=(2, 6, 24)).astype(np.float32)
    mask = padding_mask(jnp.array([[5, 5, 5, 5, 5, 5], [5, 5, 5, 0, 0, 0]]), PAD)

    def project(dense, a):
        return a @ np.asarray(dense.kernel[...]) + np.asarray(dense.bias[...])

    def heads(a):
        return a.reshape(a.shape[0], a.shape[1], 3, 8)

    q, k, v = (heads(project(attention.query, x)), heads(project(attention.key, context)),
               heads(project(attention.value, context)))
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(8)
    scores = np.where(np.asarray(mask), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    expected = project(attention.output,
                       np.einsum("bhqk,bkhd->bqhd", weights, v).reshape(2, 4, 24))
    np.testing.assert_allclose(attention(jnp.asarray(x), jnp.asarray(context), mask), expected,
                               atol=1e-5)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_add_norm_puts_the_layer_norm_where_the_config_says(norm):
    """Guards post-norm LayerNorm(x + Sublayer(x)) and pre-norm x + Sublayer(LayerNorm(x)):
    a swapped or missing norm still passes every parity and masking test."""
    config = get_preset("tiny", norm=norm)
    add_norm = AddNorm(config, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(12)
    add_norm.norm.scale[...] = jnp.asarray(rng.uniform(0.5, 2.0, size=24), jnp.float32)
    add_norm.norm.bias[...] = jnp.asarray(rng.normal(size=24), jnp.float32)
    x, y = (rng.normal(size=(2, 3, 24)).astype(np.float32) * 3 for _ in range(2))
    eps = config.layer_norm_epsilon
    sublayer_input = add_norm.sublayer_input(jnp.asarray(x))
    residual = add_norm.residual(jnp.asarray(x), jnp.asarray(y), None)
    if norm == "post":
        np.testing.assert_array_equal(sublayer_input, x)
        np.testing.assert_allclose(residual, _numpy_layer_norm(x + y, add_norm.norm, eps),
                                   atol=1e-5)
    else:
        np.testing.assert_allclose(sublayer_input, _numpy_layer_norm(x, add_norm.norm, eps),
                                   atol=1e-5)
        np.testing.assert_allclose(residual, x + y, atol=1e-6)


def test_pre_norm_stacks_end_with_their_final_layer_norm():
    """Guards the final encoder and decoder LayerNorms of a pre-norm model: with their scale
    zeroed, their bias alone must set the memory and the logits at every position."""
    model = compiled_model(norm="pre")
    rng = np.random.default_rng(13)
    src, tgt = random_batch(rng, 2, 5, 64, lengths=[5, 3]), random_batch(rng, 2, 4, 64)
    memory_bias, output_bias = (jnp.asarray(rng.normal(size=24), jnp.float32) for _ in range(2))
    for norm, bias in ((model.encoder_norm, memory_bias), (model.decoder_norm, output_bias)):
        norm.scale[...] = jnp.zeros(24)
        norm.bias[...] = bias
    np.testing.assert_allclose(model.encode(src), np.broadcast_to(memory_bias, (2, 5, 24)),
                               atol=1e-6)
    expected = np.asarray(model.src_embedding.table.embedding[...]) @ np.asarray(output_bias)
    np.testing.assert_allclose(model(src, tgt), np.broadcast_to(expected, (2, 4, 64)),
                               atol=1e-4)


def test_separate_target_embedding_is_what_the_decoder_reads():
    """Guards share_embeddings=False: the decoder embeds target ids with its own table (and
    projects with its own matrix), so the source table must not change the decoder's logits."""
    model = compiled_model(share_embeddings=False)
    rng = np.random.default_rng(14)
    src, tgt = random_batch(rng, 2, 5, 64), random_batch(rng, 2, 4, 64)
    memory, src_mask = model.encode(src), model.source_mask(src)
    logits, _ = model.decode(memory, src_mask, tgt)
    source_table = model.src_embedding.table.embedding
    source_table[...] = source_table[...] * 3.0
    np.testing.assert_allclose(model.decode(memory, src_mask, tgt)[0], logits, atol=1e-6)
    target_table = model.tgt_embedding.table.embedding
    target_table[...] = target_table[...] * 3.0
    assert not np.allclose(model.decode(memory, src_mask, tgt)[0], logits, atol=1e-3)


def test_fused_attention_equals_reference_attention():
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.normal(size=(3, L, 5, 7)), jnp.float32) for L in (4, 6, 6))
    mask = jnp.asarray(rng.random((3, 1, 4, 6)) > 0.3).at[:, :, :, 0].set(True)
    fused = jax.nn.dot_product_attention(q, k, v, mask=mask)
    reference, weights = reference_attention(q, k, v, mask)
    np.testing.assert_allclose(fused, reference, atol=1e-5)
    # softmax(QK^T/sqrt(d) + mask)V written out in numpy.
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(7)
    scores = np.where(mask, scores, -np.inf)
    expected = np.exp(scores - scores.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(weights, expected, atol=1e-6)


def test_cudnn_attention_gets_masks_spelled_out_over_queries(monkeypatch):
    """cuDNN's fused kernel takes the mask as a bias with the full query axis: a padding mask
    [batch, 1, 1, k_len] made JAX 0.11.2 on an H100 raise "Bias must have same seq length as
    QKV, got 1 and 32". The layer broadcasts it; the logits stay those of XLA's attention."""
    rng = np.random.default_rng(11)
    src = random_batch(rng, 2, 7, 64, lengths=[7, 4])
    tgt = random_batch(rng, 2, 5, 64)
    overrides = {"dtype": "bfloat16", "activation_dtype": "bfloat16"}
    expected = make_model(**overrides)(src, tgt)
    seen = []
    fused = jax.nn.dot_product_attention

    def cudnn_stand_in(query, key, value, mask=None, implementation=None):
        assert implementation == "cudnn"
        seen.append((query.shape[1], mask.shape))
        return fused(query, key, value, mask=mask)  # cuDNN's kernel needs a GPU: XLA's here

    monkeypatch.setattr(jax.nn, "dot_product_attention", cudnn_stand_in)
    logits = make_model(attention_impl="cudnn", **overrides)(src, tgt)
    layers = PRESETS["tiny"].encoder_layers + 2 * PRESETS["tiny"].decoder_layers
    assert len(seen) == layers
    assert all(mask[2] == q_len for q_len, mask in seen), seen
    np.testing.assert_array_equal(np.asarray(logits, np.float32), np.asarray(expected, np.float32))


def test_attention_weights_on_source_padding_are_exactly_zero():
    model = compiled_model()
    rng = np.random.default_rng(2)
    src = random_batch(rng, 3, 9, 64, lengths=[9, 4, 6])
    tgt = random_batch(rng, 3, 5, 64)
    weights = model.cross_attention_weights(src, tgt)  # [layers, batch, heads, tgt, src]
    assert np.all(np.asarray(weights[:, 1, :, :, 4:]) == 0.0)
    assert np.all(np.asarray(weights[:, 2, :, :, 6:]) == 0.0)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)


# ----------------------------------------------------------------------------- masking behaviour


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_future_target_tokens_do_not_change_earlier_logits(norm):
    model = compiled_model(norm=norm)
    rng = np.random.default_rng(3)
    src = random_batch(rng, 2, 7, 64, lengths=[7, 3])
    tgt = random_batch(rng, 2, 8, 64)
    logits = model(src, tgt)
    for t in range(8):
        changed = tgt.at[:, t + 1:].set(random_batch(rng, 2, 8, 64)[:, t + 1:])
        np.testing.assert_allclose(model(src, changed)[:, : t + 1], logits[:, : t + 1], atol=1e-5)
        if t < 7:  # the change must be visible later, or the test proves nothing
            assert not np.allclose(model(src, changed)[:, t + 1:], logits[:, t + 1:], atol=1e-3)


def test_source_padding_ids_and_extra_padding_do_not_change_outputs():
    model = compiled_model()
    rng = np.random.default_rng(4)
    src = random_batch(rng, 2, 6, 64, lengths=[6, 3])
    tgt = random_batch(rng, 2, 5, 64)
    logits = model(src, tgt)
    # Other ids in padded positions change nothing while the mask says they are padding.
    memory, src_mask = model.encode(src), model.source_mask(src)
    garbage = src.at[1, 3:].set(17)
    garbage_memory = model.encode(garbage, src_mask=src_mask)
    decoded, _ = model.decode(garbage_memory, src_mask, tgt)
    np.testing.assert_allclose(decoded, logits, atol=1e-5)
    np.testing.assert_allclose(garbage_memory[0], memory[0], atol=1e-5)
    np.testing.assert_allclose(garbage_memory[1, :3], memory[1, :3], atol=1e-5)
    # Appending more padding changes nothing.
    longer = jnp.pad(src, ((0, 0), (0, 5)), constant_values=PAD)
    np.testing.assert_allclose(model(longer, tgt), logits, atol=1e-5)


# ----------------------------------------------------------------------------- incremental decoding


@pytest.mark.parametrize("overrides", [{}, {"norm": "pre"}, {"positional": "learned"},
                                       {"share_embeddings": False}])
def test_cached_step_by_step_logits_equal_teacher_forced_logits(overrides):
    model = compiled_model(**overrides)
    rng = np.random.default_rng(5)
    src = random_batch(rng, 3, 7, 64, lengths=[7, 2, 5])
    tgt = random_batch(rng, 3, 9, 64)
    memory, src_mask = model.encode(src), model.source_mask(src)
    full, _ = model.decode(memory, src_mask, tgt)

    step = jax.jit(lambda state, token, cache: nnx.merge(graphdef, state).decode(
        memory, src_mask, token, cache))
    graphdef, state = nnx.split(model.model)
    cache = model.init_cache(memory, max_len=12)
    config = model.config  # one query per key row: keys positions-major, as values
    assert cache.self_key[0].shape == cache.self_value[0].shape == (
        1, 3, config.num_heads, BLOCK, config.head_dim)  # [blocks, batch, heads, slots, hd]
    stepwise = []
    for t in range(tgt.shape[1]):
        logits, cache = step(state, tgt[:, t:t + 1], cache)
        stepwise.append(logits)
    np.testing.assert_allclose(jnp.concatenate(stepwise, axis=1), full, atol=1e-5, rtol=0)
    assert int(cache.index) == tgt.shape[1]


@pytest.mark.parametrize("beam", [1, 2])
def test_cache_prefill_of_several_positions_equals_teacher_forcing(beam):
    """Several positions written at once, the second call across the cache's first block
    boundary (positions 13-18 of blocks of 16)."""
    model = compiled_model()
    rng = np.random.default_rng(6)
    src, tgt = random_batch(rng, 2, 5, 64), random_batch(rng, 2 * beam, 20, 64)
    memory, src_mask = model.encode(src), model.source_mask(src)
    full, _ = model.decode(jnp.repeat(memory, beam, axis=0), jnp.repeat(src_mask, beam, axis=0),
                           tgt)
    cache = model.init_cache(memory, max_len=20, beam_size=beam)
    pieces = []
    for start, end in ((0, 13), (13, 19), (19, 20)):
        logits, cache = model.decode(memory, src_mask, tgt[:, start:end], cache)
        pieces.append(logits)
    np.testing.assert_allclose(jnp.concatenate(pieces, 1), full, atol=1e-5)


def test_decoding_past_the_cache_is_refused():
    """A cache made for 4 positions holds one block of 16; a 17th would overwrite its last
    slots and give wrong logits. A known index past them is refused, and so is a step
    longer than the whole cache under jit, where the index is traced."""
    model = compiled_model()
    rng = np.random.default_rng(3)
    src, tgt = random_batch(rng, 1, 4, 64), random_batch(rng, 1, 17, 64)
    memory, src_mask = model.encode(src), model.source_mask(src)
    cache = model.init_cache(memory, max_len=4)
    _, full = model.decode(memory, src_mask, tgt[:, :16], cache)
    with pytest.raises(ValueError, match="from position 16 .* holds 16; .*max_len=17"):
        model.model.decode(memory, src_mask, tgt[:, 16:], full)
    with pytest.raises(ValueError, match="needs a cache of 17 positions, but this one holds 16"):
        model.decode(memory, src_mask, tgt, cache)


def test_beam_cache_follows_parents_without_copying_keys():
    """After beams change parents, each beam attends over its new history exactly."""
    model = compiled_model()
    rng = np.random.default_rng(9)
    batch, beam = 2, 3
    src = random_batch(rng, batch, 5, 64, lengths=[5, 3])
    memory, src_mask = model.encode(src), model.source_mask(src)
    cache = model.init_cache(memory, max_len=6, beam_size=beam)
    beams = random_batch(rng, batch * beam, 4, 64)            # row b*beam + j: beam j of b
    for t in range(2):
        _, cache = model.decode(memory, src_mask, beams[:, t:t + 1], cache)
    parent = jnp.array([[2, 2, 0], [1, 0, 1]], jnp.int32)     # [batch, beam]
    cache = cache.follow_parents(parent)
    rows = (parent + jnp.arange(batch)[:, None] * beam).reshape(-1)
    prefix = beams[rows, :2]
    for t in range(2, 4):                                     # two more steps after the move
        step_logits, cache = model.decode(memory, src_mask, beams[:, t:t + 1], cache)
        prefix = jnp.concatenate([prefix, beams[:, t:t + 1]], axis=1)
    sources = jnp.repeat(memory, beam, axis=0), jnp.repeat(src_mask, beam, axis=0)
    full, _ = model.decode(*sources, prefix)
    np.testing.assert_allclose(step_logits[:, 0], full[:, -1], atol=1e-5)
    # The move matters: each row's own unmoved history gives other logits.
    assert not np.allclose(full[:, -1], model.decode(*sources, beams[:, :4])[0][:, -1],
                           atol=1e-3)


def test_beams_that_start_alike_then_part_and_follow_parents_continue_exactly():
    """Beam search decodes the first positions in every beam's own slots, the same tokens in
    each, then the beams part and take new parents: each beam, fed its own tokens, must get
    teacher forcing's logits of its own history."""
    model = compiled_model()
    rng = np.random.default_rng(10)
    batch, beam = 2, 3
    src = random_batch(rng, batch, 5, 64, lengths=[5, 4])
    memory, src_mask = model.encode(src), model.source_mask(src)
    shared = random_batch(rng, batch, 2, 64)                      # positions 0, 1 of every beam
    cache = model.init_cache(memory, max_len=6, beam_size=beam)
    assert cache.self_key[0].shape == (1, batch, model.config.num_heads,
                                       model.config.head_dim, BLOCK * beam)
    _, cache = model.decode(memory, src_mask, jnp.repeat(shared, beam, axis=0), cache)
    own = random_batch(rng, batch * beam, 3, 64)                  # then each beam its own
    for t in range(2):
        _, cache = model.decode(memory, src_mask, own[:, t:t + 1], cache)
    cache = cache.follow_parents(jnp.array([[1, 1, 0], [2, 0, 0]], jnp.int32))
    rows = np.array([1, 1, 0, 5, 3, 3])
    step_logits, _ = model.decode(memory, src_mask, own[:, 2:3], cache)
    histories = jnp.concatenate([jnp.repeat(shared, beam, axis=0), own[rows, :2], own[:, 2:3]],
                                axis=1)
    full, _ = model.decode(jnp.repeat(memory, beam, axis=0), jnp.repeat(src_mask, beam, axis=0),
                           histories)
    np.testing.assert_allclose(step_logits[:, 0], full[:, -1], atol=1e-5)


@pytest.mark.parametrize("beam", [1, 2])
def test_steps_on_both_sides_of_each_attention_prefix_equal_teacher_forcing(beam):
    """Self-attention over the cache runs over the shortest of a few fixed prefixes (16, 32,
    then all 48 positions of the cache's three blocks) that holds every written position:
    each step, just before and just after every boundary, must still see its whole history,
    in beam search (beam 2) and greedy search (beam 1)."""
    model = compiled_model()
    rng = np.random.default_rng(11)
    batch, max_len = 2, 40
    assert cache_prefixes(max_len) == (16, 32, 48)
    src = random_batch(rng, batch, 5, 64, lengths=[5, 4])
    memory, src_mask = model.encode(src), model.source_mask(src)
    tokens = random_batch(rng, batch * beam, max_len, 64)     # row b*beam + j: beam j of b
    full, _ = model.decode(jnp.repeat(memory, beam, axis=0), jnp.repeat(src_mask, beam, axis=0),
                           tokens)
    graphdef, state = nnx.split(model.model)

    @jax.jit
    def step(ids, cache):
        return nnx.merge(graphdef, state).decode(memory, src_mask, ids, cache)

    cache = model.init_cache(memory, max_len=max_len, beam_size=beam)
    for t in range(max_len):
        logits, cache = step(tokens[:, t:t + 1], cache)
        if t in (0, 14, 15, 16, 30, 31, 32, 39):
            np.testing.assert_allclose(logits[:, 0], full[:, t], atol=1e-5,
                                       err_msg=f"position {t}")


def test_dropout_is_active_only_with_an_rng():
    model = compiled_model(dropout=0.3)
    rng = np.random.default_rng(7)
    src, tgt = random_batch(rng, 2, 5, 64), random_batch(rng, 2, 4, 64)
    np.testing.assert_array_equal(model(src, tgt), model(src, tgt))
    a = model(src, tgt, rng=jax.random.key(0))
    b = model(src, tgt, rng=jax.random.key(1))
    assert not np.allclose(a, b)
    np.testing.assert_array_equal(a, model(src, tgt, rng=jax.random.key(0)))


@pytest.mark.parametrize("rate", [0.1, 0.3])
def test_dropout_keeps_each_element_with_probability_one_minus_rate(rate):
    x = jnp.ones((256, 64, 64), jnp.float32)                      # 2^20 elements
    y = np.asarray(dropout(x, rate, jax.random.key(3)))
    kept = y != 0
    np.testing.assert_allclose(y[kept], 1.0 / (1.0 - rate), rtol=1e-6)
    sigma = np.sqrt(rate * (1 - rate) / x.size)
    assert abs(1.0 - kept.mean() - rate) < 5 * sigma
    # Neighbours along every axis, and the same element under another key, are dropped
    # together as often as independent draws would be (rate^2).
    dropped = ~kept
    other = np.asarray(dropout(x, rate, jax.random.key(4))) == 0
    for both in (dropped[..., 1:] & dropped[..., :-1], dropped[:, 1:] & dropped[:, :-1],
                 dropped[1:] & dropped[:-1], dropped & other):
        assert abs(both.mean() - rate ** 2) < 5 * np.sqrt(rate ** 2 / both.size)


def test_dropout_masks_follow_the_key_and_not_the_values():
    x = jnp.arange(1, 4097, dtype=jnp.float32).reshape(64, 64)
    key = jax.random.key(5)
    a, b = dropout(x, 0.5, key), dropout(2 * x, 0.5, key)
    np.testing.assert_array_equal(a == 0, b == 0)
    assert not np.array_equal(a == 0, dropout(x, 0.5, jax.random.fold_in(key, 1)) == 0)
    np.testing.assert_array_equal(dropout(x, 0.5, None), x)


def test_bfloat16_compute_keeps_float32_parameters_and_logits():
    model = make_model(dtype="bfloat16")
    params = nnx.state(model, nnx.Param)
    assert {x.dtype for x in jax.tree_util.tree_leaves(params)} == {jnp.dtype("float32")}
    rng = np.random.default_rng(8)
    src, tgt = random_batch(rng, 2, 5, 64), random_batch(rng, 2, 4, 64)
    logits = model(src, tgt)
    assert logits.dtype == jnp.float32
    reference = Transformer(get_preset("tiny"), rngs=nnx.Rngs(0))(src, tgt)
    np.testing.assert_allclose(logits, reference, atol=0.1)


def test_a_sequence_longer_than_the_positions_is_refused_with_the_limit():
    model = Transformer(get_preset("tiny", max_len=16), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="17 positions.*max_len 16"):
        model.encode(jnp.full((1, 17), 5, jnp.int32))
    # Decoding one token at a time cannot check its (traced) position: the cache refuses
    # to hold more positions than the table has.
    memory = model.encode(jnp.full((1, 4), 5, jnp.int32))
    with pytest.raises(ValueError, match="cache of 17 target positions.*max_len 16"):
        model.init_cache(memory, max_len=17)
    model.init_cache(memory, max_len=16)


def test_decoding_past_the_positions_is_refused_where_the_cache_has_room():
    """A cache holds whole blocks of 16: made for a model of 20 positions it has room for
    32, and positions 20 to 31 read the table's last row. Refused by position, as a full
    forward refuses them."""
    model = Transformer(get_preset("tiny", max_len=20), rngs=nnx.Rngs(0))
    src = jnp.full((1, 4), 5, jnp.int32)
    memory, src_mask = model.encode(src), model.source_mask(src)
    cache = model.init_cache(memory, max_len=20)
    assert cache.max_len == 32
    _, cache = model.decode(memory, src_mask, jnp.full((1, 19), 6, jnp.int32), cache)
    _, cache = model.decode(memory, src_mask, jnp.full((1, 1), 6, jnp.int32), cache)
    with pytest.raises(ValueError, match="1 position.* from position 20 passes the model's "
                                         "max_len 20"):
        model.decode(memory, src_mask, jnp.full((1, 1), 6, jnp.int32), cache)


def test_swish_feed_forward_is_x_sigmoid_x_between_the_projections():
    config = get_preset("tiny", activation="swish", dropout=0.0)
    ffn = FeedForward(config, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (2, 5, config.d_model))
    hidden = x @ ffn.inner.kernel[...] + ffn.inner.bias[...]
    expected = (hidden * jax.nn.sigmoid(hidden)) @ ffn.outer.kernel[...] + ffn.outer.bias[...]
    np.testing.assert_allclose(ffn(x), expected, rtol=1e-5, atol=1e-5)
    relu = FeedForward(dataclasses.replace(config, activation="relu"), rngs=nnx.Rngs(0))
    assert not np.allclose(relu(x), expected, atol=1e-3)  # the setting is what acts


def test_output_bias_is_added_to_every_logit_and_only_there():
    config = get_preset("tiny", vocab_size=50, output_bias=True, dropout=0.0)
    model = Transformer(config, rngs=nnx.Rngs(0))
    src = jnp.array([[5, 6, 7, 3]])
    tgt = jnp.array([[2, 8, 9]])
    before = model(src, tgt)
    bias = jax.random.normal(jax.random.key(2), (50,))
    model.output_bias[...] = bias
    np.testing.assert_allclose(model(src, tgt) - before, jnp.broadcast_to(bias, before.shape),
                               rtol=1e-5, atol=1e-5)
    plain = Transformer(dataclasses.replace(config, output_bias=False), rngs=nnx.Rngs(0))
    assert not hasattr(plain, "output_bias")
    np.testing.assert_allclose(plain(src, tgt), before, rtol=1e-6, atol=1e-6)


def test_a_model_with_swish_and_an_output_bias_travels_through_its_directory(tmp_path):
    from data.tokenizer import TokenizerConfig, train_tokenizer
    from nmt.models.model_dir import export_model, load_model
    from translate_model import sentences

    tokenizer = train_tokenizer(sentences(400, seed=1), TokenizerConfig(vocab_size=300))
    config = get_preset("tiny", vocab_size=tokenizer.vocab_size, activation="swish",
                        output_bias=True)
    model = Transformer(config, rngs=nnx.Rngs(0))
    model.output_bias[...] = jax.random.normal(jax.random.key(3), (config.vocab_size,))
    export_model(tmp_path / "model", nnx.state(model, nnx.Param), config, tokenizer)
    loaded, _, values = load_model(tmp_path / "model")
    assert values["model"].activation == "swish" and values["model"].output_bias
    src, tgt = jnp.array([[5, 6, 7, 3]]), jnp.array([[2, 8, 9]])
    np.testing.assert_allclose(loaded(src, tgt), model(src, tgt), rtol=1e-6, atol=1e-6)
