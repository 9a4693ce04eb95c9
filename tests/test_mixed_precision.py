"""bfloat16 compute (`ModelConfig.dtype`): the products' custom gradient, which keeps every
product of the CPU train step on XLA's bfloat16 fast path, and the model under both
activation dtypes."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import compiled_to_run
from flax import nnx

from transformer.config import get_preset
from transformer.kernels import Dense, low_precision_matmul, matmul
from transformer.model import Transformer

BF16 = jnp.bfloat16


def rounded(x):
    """x rounded to bfloat16 and back: the operands the bfloat16 products see."""
    return x.astype(BF16).astype(jnp.float32)


@pytest.mark.parametrize("kernel_transposed", [False, True])
def test_low_precision_matmul_and_its_gradients_equal_float32_math_on_rounded_operands(
        kernel_transposed):
    rng = np.random.default_rng(0)
    rows, n_in, n_out = 6, 5, 7  # all different, so a wrong transpose cannot pass
    x = jnp.asarray(rng.standard_normal((rows, n_in)), jnp.float32)
    kernel_shape = (n_out, n_in) if kernel_transposed else (n_in, n_out)
    kernel = jnp.asarray(rng.standard_normal(kernel_shape), jnp.float32)
    cotangent = jnp.asarray(rng.standard_normal((rows, n_out)), jnp.float32)

    # float32 math on the operands the bfloat16 products see; the backward products see the
    # cotangent rounded as well. Gradients are not rounded afterwards.
    x_r, k_r, ct_r = rounded(x), rounded(kernel), rounded(cotangent)
    k_in_out = k_r.T if kernel_transposed else k_r                       # [in, out]
    dkernel_in_out = x_r.T @ ct_r                                        # [in, out]

    y, vjp = jax.vjp(lambda x, k: low_precision_matmul(x, k, BF16, kernel_transposed), x, kernel)
    dx, dkernel = vjp(cotangent)
    np.testing.assert_allclose(y, x_r @ k_in_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx, ct_r @ k_in_out.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        dkernel, dkernel_in_out.T if kernel_transposed else dkernel_in_out, rtol=1e-5, atol=1e-5)
    assert y.dtype == dx.dtype == dkernel.dtype == jnp.float32


def test_matmul_returns_the_dtype_of_its_input_whatever_the_operand_dtype():
    x = jnp.ones((3, 4), BF16)
    kernel = jnp.ones((4, 2), jnp.float32)
    assert matmul(x, kernel, jnp.float32).dtype == BF16
    assert matmul(x.astype(jnp.float32), kernel, BF16).dtype == jnp.float32
    np.testing.assert_array_equal(matmul(x, kernel, BF16), jnp.full((3, 2), 4, BF16))


def _dot_operand_dtypes(hlo_text: str) -> list[tuple[str, str]]:
    """(lhs dtype, rhs dtype) of every dot in optimized HLO text."""
    dtype_of = dict(re.findall(r"%(\S+) = (\w+)\[", hlo_text))
    dots = re.findall(r"= \w+\[[^\]]*\]\S* dot\(%([^,\s]+), %([^)\s]+)\)", hlo_text)
    return [(dtype_of[lhs], dtype_of[rhs]) for lhs, rhs in dots]


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="a property of XLA's CPU compiler")
def test_backward_pass_of_a_bfloat16_projection_keeps_every_product_in_bfloat16():
    # Autodiff of a plain product contracts the input over its row axis for the kernel
    # gradient; XLA:CPU then upcasts that product to float32 (5x slower). Ours must not.
    layer = Dense(64, 48, dtype=BF16, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(layer)

    def loss(params, x):
        return jnp.sum(nnx.merge(graphdef, params)(x) ** 2)

    x = jnp.ones((32, 64), jnp.float32)
    # compiled as a user's process compiles it: the suite's settings take another path
    hlo = compiled_to_run(jax.jit(jax.grad(loss, argnums=(0, 1))), params, x).as_text()
    dtypes = _dot_operand_dtypes(hlo)
    assert len(dtypes) == 3, hlo  # forward, input gradient, kernel gradient
    assert set(dtypes) == {("bf16", "bf16")}, dtypes


def _loss_and_grads(config, params, src, tgt):
    graphdef = nnx.graphdef(Transformer(config, rngs=nnx.Rngs(0)))

    def loss(params):
        logits = nnx.merge(graphdef, params)(src, tgt)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tgt[..., None], -1))

    return jax.jit(jax.value_and_grad(loss))(params)  # eager autodiff took 5-13 s here


@pytest.mark.parametrize("activation_dtype", ["auto", "float32", "bfloat16"])
def test_bfloat16_model_gradients_follow_the_float32_model(activation_dtype):
    reference_config = get_preset("tiny")
    config = get_preset("tiny", dtype="bfloat16", activation_dtype=activation_dtype)
    params = nnx.state(Transformer(reference_config, rngs=nnx.Rngs(0)), nnx.Param)
    rng = np.random.default_rng(3)
    src = jnp.asarray(rng.integers(4, 64, (4, 9)), jnp.int32)
    tgt = jnp.asarray(rng.integers(4, 64, (4, 7)), jnp.int32)
    loss_ref, grads_ref = _loss_and_grads(reference_config, params, src, tgt)
    loss, grads = _loss_and_grads(config, params, src, tgt)
    assert abs(float(loss) - float(loss_ref)) < 0.02 * float(loss_ref)
    flat, flat_ref = jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(grads_ref)
    assert {g.dtype for g in flat} == {jnp.dtype("float32")}  # master weights stay float32
    # bfloat16's 8-bit mantissa puts 2-6% error on a leaf of this tiny model; a wrong or
    # missing gradient term is off by 100% or more. Some gradients are zero in exact
    # arithmetic (the key projection's bias: softmax ignores a constant added to every
    # score), hence the allowance relative to the whole gradient.
    scale = float(jnp.sqrt(sum(jnp.sum(g ** 2) for g in flat_ref)))
    for (path, g), g_ref in zip(jax.tree_util.tree_leaves_with_path(grads), flat_ref):
        error = float(jnp.linalg.norm(g - g_ref))
        assert error < 0.15 * float(jnp.linalg.norm(g_ref)) + 1e-3 * scale, (path, error)


@pytest.mark.parametrize("activation_dtype, expected", [
    ("float32", jnp.float32), ("bfloat16", BF16),
    ("auto", jnp.float32 if jax.default_backend() == "cpu" else BF16)])
def test_activation_dtype_sets_what_flows_between_products(activation_dtype, expected):
    model = Transformer(get_preset("tiny", dtype="bfloat16", activation_dtype=activation_dtype),
                        rngs=nnx.Rngs(0))
    src = jnp.full((2, 5), 7, jnp.int32)
    memory = model.encode(src)
    assert memory.dtype == expected
    cache = model.init_cache(memory, max_len=4)
    assert {k.dtype for k in cache.self_key} == {jnp.dtype(expected)}


def test_unknown_activation_dtype_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="activation_dtype.*auto"):
        get_preset("tiny", activation_dtype="float16")


def test_bfloat16_activations_still_give_logits_with_float32_precision():
    # The logits come from the product's float32 accumulator, not from a bfloat16 result
    # cast up: with bfloat16 activations they must not all be bfloat16 numbers.
    model = Transformer(get_preset("tiny", dtype="bfloat16", activation_dtype="bfloat16"),
                        rngs=nnx.Rngs(0))
    src = jnp.asarray(np.random.default_rng(0).integers(4, 64, (2, 6)), jnp.int32)
    logits = model(src, src)
    assert logits.dtype == jnp.float32
    assert np.mean(np.asarray(logits) != np.asarray(rounded(logits))) > 0.5


def test_attention_weights_of_bfloat16_inputs_are_computed_in_float32():
    from transformer.layers import reference_attention

    keys = jax.random.split(jax.random.key(0), 3)
    query, key, value = (jax.random.normal(k, (2, 5, 2, 16), BF16) * 3 for k in keys)
    _, weights = reference_attention(query, key, value, None)
    scores = jnp.einsum("bqhd,bkhd->bhqk", rounded(query), rounded(key)) / 4.0
    np.testing.assert_allclose(weights, jax.nn.softmax(scores, axis=-1), atol=1e-5)


def test_a_model_is_translated_in_the_dtype_asked_for_throughout_and_cudnn_only_where_it_runs():
    """--dtype float32 kept a model's stored bfloat16 activations (scores up to 2.8 nats off
    float32's), and a model trained with cuDNN attention failed on a CPU ("cuDNN is not
    detected"), or in float32 with an unexpected ValueError."""
    from nmt.models.model_dir import inference_config

    mixed = get_preset("tiny", dtype="bfloat16", activation_dtype="bfloat16")
    assert inference_config(mixed, None, "cpu") == mixed
    float32 = inference_config(mixed, "float32", "cpu")
    assert (float32.dtype, float32.activation_dtype) == ("float32", "auto")
    assert inference_config(mixed, "bfloat16", "cpu").activation_dtype == "bfloat16"
    cudnn = get_preset("tiny", dtype="bfloat16", attention_impl="cudnn")
    assert inference_config(cudnn, None, "gpu").attention_impl == "cudnn"
    assert inference_config(cudnn, "bfloat16", "gpu").attention_impl == "cudnn"
    assert inference_config(cudnn, None, "cpu").attention_impl is None
    on_gpu_in_float32 = inference_config(cudnn, "float32", "gpu")
    assert (on_gpu_in_float32.dtype, on_gpu_in_float32.attention_impl) == ("float32", None)
    xla = get_preset("tiny", attention_impl="xla")
    assert inference_config(xla, "bfloat16", "cpu").attention_impl == "xla"
