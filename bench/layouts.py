"""Train steps on real pairs, packed rows against bucketed batches of the same token budget:
`python -m bench.layouts [--prefix PREFIX] [--preset small] [--steps 40]`.

Reads aligned PREFIX.SRC / PREFIX.TGT (default: Multi30k's training pairs, from $MULTI30K as
the recipes read it, else data/multi30k), trains a SentencePiece model on them, and plans an
epoch of each layout with the trainer's own batching (`data.batching`, `data.packing`). Every
batch shape is compiled first (reported, not timed); then, after --warmup untimed batches,
the next --steps batches of the epoch run one after the other, timed from the first call to
the last loss ready. Prints one JSON line per layout:

  steps, step_s          batches timed (fewer than --steps where the epoch ends first), and
                         seconds per timed batch
  real_tgt_tokens_per_s  target tokens that are not padding / seconds of the timed steps
  padding_waste          padded positions / all positions of the timed batches (src + tgt)
  shapes, compile_s      distinct batch shapes of the whole epoch, and their compile time
"""

from __future__ import annotations

import json
import os
import time

import jax
import numpy as np

from bench import common
from data.batching import batch_arrays, load_examples, plan_batches
from data.config import BatchConfig
from data.corpus import iter_text, read_prefix
from data.encoding import encode_split
from data.packing import fit_width
from data.tokenizer import TokenizerConfig, train_tokenizer
from nmt.runtime import allocator
from nmt.runtime.cli import EXIT_USAGE, fail
from transformer import training
from transformer.config import PRESETS, get_preset

MULTI30K_TRAIN = os.environ.get("MULTI30K", "data/multi30k") + "/train"  # as the recipes


def encoded_pairs(args):
    """The pairs as `data.batching.Examples`, with the tokenizer trained on them."""
    pairs = read_prefix(args.prefix, args.src, args.tgt)
    tokenizer = train_tokenizer(iter_text(pairs), TokenizerConfig(vocab_size=args.vocab))
    encoded = encode_split(pairs, tokenizer)
    return load_examples(encoded, BatchConfig(max_len=args.max_len), "train"), tokenizer


def epoch_plan(name: str, config: BatchConfig, examples, args):
    """(config, the batches of an epoch) of a layout; ends in one line (exit status 2) where
    --warmup leaves no batch of the epoch to time."""
    if config.packing:
        config = fit_width(config, examples.src_len, examples.tgt_len)
    plan = plan_batches(examples, config, epoch=0)
    if len(plan) <= args.warmup:
        fail(common.bench_prog(), f"--warmup {args.warmup} leaves no batch to time: an epoch of "
             f"{args.prefix} holds {len(plan)} {name} batches of --batch-tokens "
             f"{args.batch_tokens}; give a smaller --warmup or --batch-tokens, or more pairs",
             EXIT_USAGE)
    return config, plan


def measure(name: str, config: BatchConfig, plan, examples, args, model_config) -> dict:
    mesh = training.make_mesh()
    optimizer_config = training.OptimizerConfig(warmup_steps=100)
    graphdef, _, state = training.create_train_state(model_config, optimizer_config, mesh)
    step = training.make_train_step(graphdef, optimizer_config, mesh)
    batches = [training.shard_batch(batch_arrays(examples, b), mesh)
               for b in plan[:args.warmup + args.steps]]  # fewer where the epoch ends first
    timed = batches[args.warmup:]
    shapes = {}
    start = time.perf_counter()
    for b in plan:  # every shape of the epoch, as a run compiles them
        key = tuple(sorted((k, v.shape) for k, v in batch_arrays(examples, b).items()))
        if key not in shapes:
            batch = training.shard_batch(batch_arrays(examples, b), mesh)
            shapes[key] = step.lower(state, batch).compile()
    compile_s = time.perf_counter() - start
    for batch in batches[:args.warmup]:
        state, metrics = _run(shapes, state, batch)
    jax.block_until_ready(state)
    real = positions = 0
    start = time.perf_counter()
    for batch in timed:
        state, metrics = _run(shapes, state, batch)
        real += int(np.count_nonzero(np.asarray(batch["tgt_out"])))
        positions += sum(int(batch[k].size) for k in ("src", "tgt_out"))
    metrics["loss"].block_until_ready()
    seconds = time.perf_counter() - start
    real_src = sum(int(np.count_nonzero(np.asarray(b["src"]))) for b in timed)
    return {"layout": name, "preset": args.preset, "batch_tokens": args.batch_tokens,
            "width": config.width if config.packing else None,
            "steps": len(timed), "shapes": len(shapes), "compile_s": round(compile_s, 1),
            "step_s": round(seconds / len(timed), 4),
            "real_tgt_tokens_per_s": round(real / seconds, 1),
            "padding_waste": round(1 - (real + real_src) / positions, 4),
            **common.environment()}


def _run(programs, state, batch):
    key = tuple(sorted((k, v.shape) for k, v in batch.items()))
    return programs[key](state, batch)


def main(argv: list[str] | None = None) -> None:
    parser = common.bench_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--prefix", default=MULTI30K_TRAIN, help="aligned PREFIX.SRC/.TGT")
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument("--vocab", type=common.positive_int, default=8000)
    parser.add_argument("--batch-tokens", type=common.positive_int, default=4096)
    parser.add_argument("--max-len", type=common.positive_int, default=64,
                        help="drop longer pairs; the packed rows' width is at most this")
    parser.add_argument("--steps", type=common.positive_int, default=40,
                        help="timed batches (fewer where the epoch ends first)")
    parser.add_argument("--warmup", type=common.non_negative_int, default=3)
    args = parser.parse_args(argv)
    with common.usage_errors():  # no such --prefix, a --vocab the text cannot fill
        examples, tokenizer = encoded_pairs(args)
    model_config = get_preset(args.preset, vocab_size=tokenizer.vocab_size,
                              max_len=max(512, args.max_len))
    common_config = {"batch_tokens": args.batch_tokens, "max_len": args.max_len,
                     "num_devices": jax.device_count()}
    plans = {name: epoch_plan(name, config, examples, args)  # both checked before timing
             for name, config in (("bucketed", BatchConfig(packing=False, **common_config)),
                                  ("packed", BatchConfig(**common_config)))}
    for name, (config, plan) in plans.items():
        print(json.dumps(measure(name, config, plan, examples, args, model_config)),
              flush=True)


if __name__ == "__main__":
    allocator.preload()  # as train.py and translate.py: mimalloc under XLA:CPU
    main()
