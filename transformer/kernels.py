"""Hardware-minded building blocks under the paper's modules: dtypes, products, dropout bits.

Nothing here changes what the model computes; each piece computes the same thing in a form
that XLA runs faster on some device. Why each exists, with its measurements, is in
docs/design.md ("Kernels").
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from transformer.config import ModelConfig

Array = jax.Array


def compute_dtype(config: ModelConfig) -> jnp.dtype:
    """dtype of the matrix products' operands."""
    return jnp.dtype(config.dtype)


def activation_dtype(config: ModelConfig) -> jnp.dtype:
    """dtype of everything between the matrix products (see ModelConfig.activation_dtype)."""
    if config.activation_dtype != "auto":
        return jnp.dtype(config.activation_dtype)
    return jnp.dtype("float32") if jax.default_backend() == "cpu" else compute_dtype(config)


# ----------------------------------------------------------------------------- products


def over_rows(fn, x: Array) -> Array:
    """Applies a [rows, features] -> [rows, out] function to x [..., features].

    The same result as applying it to x directly; the kernel gradient becomes one plain
    [in, rows] x [rows, out] product instead of a two-axis contraction that XLA:CPU ran with
    a transpose first.
    """
    lead = x.shape[:-1]
    y = fn(x.reshape(-1, x.shape[-1]))
    return y.reshape(*lead, y.shape[-1])


def _transpose_in_memory(a: Array) -> Array:
    """a [r, c] -> a^T [c, r], written out row-major.

    XLA folds a plain transpose into the matrix product that reads it, and then sees the
    [r, c] operand contracted over its major axis. Passing through a third, unit axis keeps the
    copy.
    """
    rows, cols = a.shape
    return a.reshape(rows, cols, 1).transpose(1, 0, 2).reshape(cols, rows)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def low_precision_matmul(x: Array, kernel: Array, operand_dtype, kernel_transposed: bool = False,
                         out_dtype=None) -> Array:
    """x [rows, in] @ kernel [in, out] (or kernel^T when kernel [out, in] is transposed), the
    operands rounded to `operand_dtype` (bfloat16), accumulated in float32; returns
    `out_dtype` (default: x's dtype).

    XLA:CPU runs a bfloat16 product on its fast library path only when it accumulates in
    float32 and neither operand is contracted over its major axis. Plain autodiff breaks the
    second rule for the kernel gradient (x^T dy contracts x over its row axis); the backward
    pass here writes the transposed operand out first, so every product of the step stays on
    the fast path. Gradients come back in the dtypes of x and kernel (float32 master weights)
    without a further rounding.
    """
    return _matmul_forward(x, kernel, operand_dtype, kernel_transposed, out_dtype)[0]


def _matmul_forward(x, kernel, operand_dtype, kernel_transposed, out_dtype):
    x_low, kernel_low = x.astype(operand_dtype), kernel.astype(operand_dtype)
    contract = 1 if kernel_transposed else 0
    y = jax.lax.dot_general(x_low, kernel_low, (((1,), (contract,)), ((), ())),
                            preferred_element_type=jnp.float32)
    dtype_witnesses = (jnp.zeros((), x.dtype), jnp.zeros((), kernel.dtype))
    return y.astype(out_dtype or x.dtype), (x_low, kernel_low, dtype_witnesses)


def _matmul_backward(operand_dtype, kernel_transposed, out_dtype, residuals, dy):
    del out_dtype  # dy arrives in it and is rounded to operand_dtype like the operands
    x_low, kernel_low, (x_witness, kernel_witness) = residuals
    dy = dy.astype(operand_dtype)
    f32 = jnp.float32
    if kernel_transposed:                        # kernel [out, in]
        dx = jnp.dot(dy, kernel_low, preferred_element_type=f32)
        dkernel = jnp.dot(_transpose_in_memory(dy), x_low, preferred_element_type=f32)
    else:                                        # kernel [in, out]
        dx = jax.lax.dot_general(dy, kernel_low, (((1,), (1,)), ((), ())),
                                 preferred_element_type=f32)
        dkernel = jnp.dot(_transpose_in_memory(x_low), dy, preferred_element_type=f32)
    return dx.astype(x_witness.dtype), dkernel.astype(kernel_witness.dtype)


low_precision_matmul.defvjp(_matmul_forward, _matmul_backward)


def matmul(x: Array, kernel: Array, dtype: jnp.dtype, kernel_transposed: bool = False,
           out_dtype: jnp.dtype | None = None) -> Array:
    """x [rows, in] @ kernel [in, out] (kernel [out, in] if transposed) with operands in `dtype`;
    the result has `out_dtype` (default: x's dtype). The product accumulates in float32 when
    the result is float32, so a float32 result of bfloat16 operands is not rounded to
    bfloat16 on the way."""
    dtype = jnp.dtype(dtype)
    out_dtype = jnp.dtype(out_dtype or x.dtype)

    def plain(x, kernel):
        kernel = kernel.T if kernel_transposed else kernel
        accumulate = jnp.float32 if out_dtype == jnp.float32 else None
        return jnp.dot(x.astype(dtype), kernel.astype(dtype),
                       preferred_element_type=accumulate).astype(out_dtype)

    if dtype == jnp.float32:
        return plain(x, kernel)
    return jax.lax.platform_dependent(
        x, kernel, default=plain,
        cpu=lambda x, kernel: low_precision_matmul(x, kernel, dtype, kernel_transposed,
                                                   out_dtype))


class Dense(nnx.Linear):
    """nnx.Linear (same parameters, `kernel` [in, out] and `bias` [out]) applied over rows."""

    def __call__(self, x: Array, out_dtype: jnp.dtype | None = None) -> Array:
        """[..., in] -> [..., out] in `out_dtype` (default x's dtype); the product's operands
        in `self.dtype`."""
        y = over_rows(lambda rows: matmul(rows, self.kernel[...], self.dtype or x.dtype,
                                          out_dtype=out_dtype), x)
        return y if self.bias is None else y + self.bias[...].astype(y.dtype)


# ----------------------------------------------------------------------------- dropout


def _mix32(h: Array) -> Array:
    """MurmurHash3's 32-bit finaliser: a bijection of uint32 with full avalanche."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def random_bits(rng: Array, shape: tuple[int, ...]) -> Array:
    """uint32 bits for every element of `shape`: a hash of (key, element index).

    The counter-based generator behind dropout: a handful of integer operations that XLA
    fuses into the op applying the mask, where `jax.random.bits` (threefry) runs loops of its
    own. Each element's bits depend on its global index only, so a batch split over devices
    draws exactly the mask one device would. Keys come from `jax.random` (split/fold_in), so
    different layers and steps use unrelated streams.
    """
    key = jax.random.key_data(rng) if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) else rng
    key = key.astype(jnp.uint32).reshape(-1)
    index = jnp.zeros(shape, jnp.uint32)
    stride = 1
    for axis in reversed(range(len(shape))):
        index = index + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride)
        stride = (stride * shape[axis]) % (1 << 32)
    # Two rounds, each keyed by one key word: the index alone decides nothing.
    return _mix32(_mix32(index ^ key[0]) + key[-1])


def dropout(x: Array, rate: float, rng: Array | None) -> Array:
    """Inverted dropout; identity when `rng` is None or `rate` is 0.

    An element is kept when its random word is at least round(rate * 2^32), which happens
    with probability 1 - rate up to 2^-32; kept elements are scaled by 1 / (1 - rate).
    """
    if rng is None or rate == 0.0:
        return x
    if x.size >= 1 << 32:
        raise ValueError(f"dropout: {x.shape} has {x.size} elements; the 32-bit element "
                         f"counter covers at most 2^32 - 1. Split the batch.")
    threshold = jnp.uint32(min(round(rate * 2.0 ** 32), 2 ** 32 - 1))
    keep = random_bits(rng, x.shape) >= threshold
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))
