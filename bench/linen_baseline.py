"""A plain Flax Linen train step, as a yardstick: `python -m bench.linen_baseline [--compare]`.

The question it answers: on this machine, how fast is the most straightforward jit-compiled
Flax step of the same model, next to ours (`bench.train`) and transformers' MarianMTModel?
It is written the way a first Flax implementation would be, with nothing tuned:
flax.linen's MultiHeadDotProductAttention and Dense over [batch, length, features], dropout
from jax.random (threefry), optax.adam and optax's label-smoothed cross entropy, one jit with
donated state, no sharding and no bucketing. The model is the peers' (post-norm, ReLU,
sinusoidal positions, one shared embedding, dropout 0.1, vocab 8000) and the work is
bench.train's: [batch, src_len] and [batch, tgt_len] random ids, a new batch every step,
median of --steps steps after --warmup, the step compiled before them (compile_s).

This is not part of the toolkit and shares no model code with transformer/, on purpose.
"""

from __future__ import annotations

import argparse
import statistics
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bench import common
from bench.train import peer_args, random_batch
from nmt.runtime import allocator
from transformer.config import get_preset

DROPOUT = 0.1
LABEL_SMOOTHING = 0.1


def sinusoids(length: int, width: int) -> jax.Array:
    """[length, width] sine/cosine position table (paper Sec. 3.5)."""
    position = np.arange(length)[:, None]
    rates = 1.0 / np.power(10000.0, 2 * np.arange(width // 2)[None] / width)
    return jnp.asarray(np.concatenate([np.sin(position * rates), np.cos(position * rates)], -1),
                       jnp.float32)


class Block(nn.Module):
    """A post-norm encoder (cross=False) or decoder (cross=True) layer."""

    heads: int
    d_ff: int
    cross: bool

    @nn.compact
    def __call__(self, x, mask, memory=None, train=True):
        drop = nn.Dropout(DROPOUT, deterministic=not train)
        x = nn.LayerNorm()(x + drop(nn.MultiHeadDotProductAttention(self.heads)(x, x, mask=mask)))
        if self.cross:
            x = nn.LayerNorm()(x + drop(nn.MultiHeadDotProductAttention(self.heads)(x, memory)))
        hidden = nn.Dense(x.shape[-1])(nn.relu(nn.Dense(self.d_ff)(x)))
        return nn.LayerNorm()(x + drop(hidden))


class Seq2Seq(nn.Module):
    d_model: int
    heads: int
    d_ff: int
    layers: int
    vocab: int

    @nn.compact
    def __call__(self, src, tgt_in, train=True):
        embed = nn.Embed(self.vocab, self.d_model)
        drop = nn.Dropout(DROPOUT, deterministic=not train)

        def embed_positions(ids):
            return drop(embed(ids) * self.d_model ** 0.5 + sinusoids(ids.shape[1], self.d_model))

        memory = embed_positions(src)
        for _ in range(self.layers):
            memory = Block(self.heads, self.d_ff, cross=False)(memory, None)
        y = embed_positions(tgt_in)
        causal = nn.make_causal_mask(tgt_in)
        for _ in range(self.layers):
            y = Block(self.heads, self.d_ff, cross=True)(y, causal, memory)
        return embed.attend(y)


def parse_args(argv=None) -> argparse.Namespace:
    ap = common.bench_parser(__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="base", choices=["base", "small"])
    ap.add_argument("--vocab", type=common.positive_int, default=8000)
    ap.add_argument("--batch", type=common.positive_int, default=32)
    ap.add_argument("--src-len", type=common.positive_int, default=32)
    ap.add_argument("--tgt-len", type=common.positive_int, default=32)
    ap.add_argument("--steps", type=common.positive_int, default=10)
    ap.add_argument("--warmup", type=common.non_negative_int, default=2)
    ap.add_argument("--threads", type=common.positive_int, default=2, help="peer torch threads")
    ap.add_argument("--compare", action="store_true", help="also run the transformers step")
    args = ap.parse_args(argv)
    try:
        args.config = get_preset(args.preset, vocab_size=args.vocab)
    except ValueError as error:  # no room for the special tokens
        ap.error(f"--vocab {args.vocab}: {error}")
    return args


def measure(args, config) -> dict:
    model = Seq2Seq(config.d_model, config.num_heads, config.d_ff, config.encoder_layers,
                    args.vocab)
    b, s, t = args.batch, args.src_len, args.tgt_len
    key = jax.random.key(0)
    params = model.init({"params": key, "dropout": key}, jnp.zeros((b, s), jnp.int32),
                        jnp.zeros((b, t), jnp.int32))["params"]
    optimizer = optax.adam(1e-4, b1=0.9, b2=0.98, eps=1e-9)
    opt_state = optimizer.init(params)

    def train_step(params, opt_state, batch, dropout_key):
        def loss_fn(p):
            logits = model.apply({"params": p}, batch["src"], batch["tgt_in"],
                                 rngs={"dropout": dropout_key})
            labels = optax.smooth_labels(jax.nn.one_hot(batch["tgt_out"], args.vocab),
                                         LABEL_SMOOTHING)
            return optax.softmax_cross_entropy(logits, labels).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    # Compiled before the timed loop, as bench.train's step: with --warmup 0 the first
    # timed step would otherwise be mostly compilation.
    example = jax.device_put(random_batch(np.random.default_rng(0), b, s, t, args.vocab))
    start = time.perf_counter()
    step = jax.jit(train_step, donate_argnums=(0, 1)).lower(
        params, opt_state, example, jax.random.key(0)).compile()
    compile_s = time.perf_counter() - start
    rng = np.random.default_rng(1)
    times = []
    for i in range(args.warmup + args.steps):
        batch = jax.device_put(random_batch(rng, b, s, t, args.vocab))
        start = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, batch, jax.random.key(i))
        loss.block_until_ready()
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    return {"system": "plain-flax-linen-train", "preset": args.preset,
            "tokens_per_s": round(b * t / step_s, 1), "step_s": round(step_s, 4),
            "step_s_min": round(min(times), 4), "compile_s": round(compile_s, 2),
            "last_loss": round(float(loss), 3),
            **common.environment()}


def main(argv=None) -> None:
    args = parse_args(argv)
    config = args.config
    ours = measure(args, config)
    common.emit(ours)
    if args.compare:
        peer = common.run_peer("hf_train_step.py", peer_args(args, config))
        common.emit(peer)
        common.emit({"system": "ratio", "preset": args.preset,
                     "linen_over_transformers": round(ours["tokens_per_s"]
                                                      / peer["tokens_per_s"], 3)})


if __name__ == "__main__":
    allocator.preload()  # as train.py and translate.py: mimalloc under XLA:CPU
    main()
