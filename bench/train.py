"""Train-step throughput: `python -m bench.train [--preset base] [--compare --rounds 3]`.

Times the real training step of transformer/training.py (forward, backward, Adam, dropout 0.1,
label smoothing 0.1) on random batches: ids uniform in 2 .. vocab-2, no padding, a new batch
every step, as the peer benchmark (../shared/tools/peers/hf_train_step.py) does. Batches are
made and put on the device before the timer starts; each timed step runs from the call to
the step until its loss is ready. After --warmup steps, the median of --steps steps gives:

  rows           rows per update: batch * accum_steps
  tokens_per_s   target tokens (rows * tgt_len) / median step time
  step_s         median step time; step_s_min / step_s_max
  compile_s      lowering + compiling the step (jit(...).lower(...).compile())
  peak_mem_bytes GPU: peak_bytes_in_use of device 0; CPU: the process's max RSS
  mfu            model FLOP per step / step_s / peak FLOP/s. The FLOP count is the peers'
                 formula (see bench/common.py); the peak is a table figure for known GPUs and
                 the best jitted 2048^3 matmul measured so far (after every round) on
                 CPU, with operands in --dtype.
  loadavg_1m     the machine's 1-minute load average: figures taken while other jobs
                 run are slower, the peer's (2 torch threads) more so than ours.
  allocator      mimalloc (the default, as for train.py) or system (NMT_ALLOCATOR=system);
                 the peer runs on the C library's malloc, as its users do.

With --compare, each of --rounds rounds times our step and then the peer's (one subprocess
running hf_train_step.py with the same model and work flags, --threads 2), prints both lines
and the ratio of tokens/s; a final line gives the median ratio over rounds and the ratio of
the tokens/s of the two systems' fastest steps over all rounds (the figure least disturbed by
other work on a shared machine). The model must be the one the peer builds: post-norm, ReLU,
sinusoidal positions, shared embeddings, dropout 0.1 (the peers' common.marian_config), with
the preset's widths and encoder and decoder layers; --compare refuses a preset that differs
(big and compact: dropout 0.3; the students: pre-norm). The peer takes all of our rows per
update in one batch (batch * accum_steps).
With --dtype bfloat16 the peer runs under torch.autocast(bfloat16) (bench/peer_autocast.py),
PyTorch's CPU mixed precision, the same split of work as ours: products in bfloat16,
everything else and the master weights in float32.

With --rdrop A every row runs twice and R-Drop's KL term is added (train.py's --rdrop);
tokens_per_s still counts the batch's own tokens once. The peer has no such step, so --compare
refuses it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import numpy as np

from bench import common
from nmt.runtime import allocator
from transformer import training
from transformer.config import PRESETS, get_preset


def parse_args(argv=None) -> argparse.Namespace:
    """The flags, with `config`: the model they describe (one line and exit status 2 for
    a value it cannot take)."""
    ap = common.bench_parser(__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="base", choices=sorted(PRESETS))
    ap.add_argument("--d-model", type=int)
    ap.add_argument("--layers", type=int, help="encoder and decoder layers, each")
    ap.add_argument("--heads", type=int)
    ap.add_argument("--ffn", type=int)
    ap.add_argument("--vocab", type=common.positive_int, default=8000)
    ap.add_argument("--batch", type=common.positive_int, default=32)
    ap.add_argument("--src-len", type=common.positive_int, default=32)
    ap.add_argument("--tgt-len", type=common.positive_int, default=32)
    ap.add_argument("--steps", type=common.positive_int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=common.non_negative_int, default=2,
                    help="untimed steps after compiling")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--accum-steps", type=common.positive_int, default=1)
    ap.add_argument("--rdrop", type=common.non_negative_float, default=0.0,
                    help="R-Drop weight (train.py's --rdrop): every row run twice and the KL "
                         "term added; tokens_per_s counts the batch's own tokens once")
    ap.add_argument("--attention-impl", choices=["xla", "cudnn"],
                    help="training attention: XLA's, or cuDNN's fused kernel (NVIDIA GPUs, "
                         "bfloat16 only); default: the model's (XLA)")
    ap.add_argument("--compare", action="store_true",
                    help="also run the peer (transformers) step, alternating with ours")
    ap.add_argument("--rounds", type=common.positive_int, default=1, help="rounds of ours (+ peer)")
    ap.add_argument("--threads", type=common.positive_int, default=2, help="peer torch threads")
    args = ap.parse_args(argv)
    if args.compare and args.rdrop:
        ap.error("--rdrop: the peer's step has no R-Drop to compare with; drop --compare")
    if args.vocab < 4:
        ap.error(f"--vocab {args.vocab}: ids 0 to 3 are the model's special tokens (3 ends a "
                 "sentence); give 4 or more")
    devices = jax.local_device_count()
    if args.batch % devices:  # every device takes an equal share of the rows
        ap.error(f"--batch {args.batch} is not a multiple of the {devices} devices here; give "
                 f"a multiple of {devices}")
    with common.usage_errors(ValueError):  # the config names the setting it cannot take
        args.config = model_config(args)
    differences = peer_differences(args.config)
    if args.compare and differences:
        ap.error(f"--compare: preset {args.preset} has {', '.join(differences)}, which the "
                 f"peer's model cannot build; drop --compare or use base, small or tiny")
    return args


# The settings of the one model the peer builds (the peers' common.marian_config).
PEER_MODEL = {"norm": "post", "activation": "relu", "positional": "sinusoidal", "dropout": 0.1,
              "attention_dropout": 0.0, "activation_dropout": 0.0, "share_embeddings": True}


def peer_differences(config) -> list[str]:
    """The settings of `config` the peer's model has otherwise, as 'dropout 0.3 (peer 0.1)':
    a ratio over a different model measures the model, not the implementation."""
    return [f"{name} {getattr(config, name)} (peer {value})" for name, value in PEER_MODEL.items()
            if getattr(config, name) != value]


def model_config(args):
    overrides = {"vocab_size": args.vocab, "dtype": args.dtype,
                 "max_len": max(512, args.src_len, args.tgt_len)}
    if args.d_model is not None:
        overrides["d_model"] = args.d_model
    if args.layers is not None:
        overrides["encoder_layers"] = overrides["decoder_layers"] = args.layers
    if args.heads is not None:
        overrides["num_heads"] = args.heads
    if args.ffn is not None:
        overrides["d_ff"] = args.ffn
    if args.attention_impl is not None:
        overrides["attention_impl"] = args.attention_impl
    return get_preset(args.preset, **overrides)


def random_batch(rng: np.random.Generator, rows: int, src_len: int, tgt_len: int, vocab: int
                 ) -> dict[str, np.ndarray]:
    """Ids uniform in 2 .. vocab-2 and no padding, as the peer's batches."""
    src = rng.integers(2, vocab - 1, (rows, src_len), dtype=np.int32)
    tgt = rng.integers(2, vocab - 1, (rows, tgt_len), dtype=np.int32)
    tgt_in = np.concatenate([np.full((rows, 1), 2, np.int32), tgt[:, :-1]], axis=1)
    return {"src": src, "tgt_in": tgt_in, "tgt_out": tgt}


class OurStep:
    """The compiled step and its state, kept across rounds."""

    def __init__(self, args):
        self.args = args
        self.config = args.config
        self.optimizer_config = training.OptimizerConfig(accum_steps=args.accum_steps,
                                                         rdrop=args.rdrop)
        self.mesh = training.make_mesh()
        graphdef, _, self.state = training.create_train_state(self.config,
                                                              self.optimizer_config, self.mesh)
        self.rows = args.batch * args.accum_steps
        self.rng = np.random.default_rng(1)
        jitted = training.make_train_step(graphdef, self.optimizer_config, self.mesh)
        start = time.perf_counter()
        self.step = jitted.lower(self.state, self._batch()).compile()
        self.compile_s = time.perf_counter() - start
        self.params = sum(x.size for x in jax.tree_util.tree_leaves(self.state.params))

    def _batch(self):
        a = self.args
        return training.shard_batch(
            random_batch(self.rng, self.rows, a.src_len, a.tgt_len, a.vocab), self.mesh)

    def measure(self) -> dict:
        a = self.args
        batches = [self._batch() for _ in range(a.warmup + a.steps)]
        times, metrics = [], None
        for i, batch in enumerate(batches):
            start = time.perf_counter()
            self.state, metrics = self.step(self.state, batch)
            metrics["loss"].block_until_ready()
            if i >= a.warmup:
                times.append(time.perf_counter() - start)
        step_s = statistics.median(times)
        tokens = self.rows * a.tgt_len
        return {"step_s": step_s, "step_s_min": min(times), "step_s_max": max(times),
                "tokens_per_s": tokens / step_s, "last_loss": float(metrics["loss"]),
                "is_finite": bool(metrics["is_finite"])}


def peer_args(args, config) -> list[str]:
    return ["--preset", args.preset if args.preset in ("base", "small") else "base",
            "--d-model", str(config.d_model), "--enc-layers", str(config.encoder_layers),
            "--dec-layers", str(config.decoder_layers),
            "--heads", str(config.num_heads), "--ffn", str(config.d_ff),
            "--vocab", str(config.vocab_size), "--batch", str(args.batch * args.accum_steps),
            "--src-len", str(args.src_len), "--tgt-len", str(args.tgt_len),
            "--len", str(args.tgt_len), "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--threads", str(args.threads)]


def main(argv=None) -> None:
    args = parse_args(argv)
    ours = OurStep(args)
    flops = common.train_flops(ours.config, ours.rows, args.src_len, args.tgt_len)
    peak, peak_source = 0.0, ""
    base = {"preset": args.preset, "d_model": ours.config.d_model,
            "layers": ours.config.encoder_layers, "heads": ours.config.num_heads,
            "ffn": ours.config.d_ff, "vocab": ours.config.vocab_size, "params": ours.params,
            "batch": args.batch, "accum_steps": args.accum_steps, "rows": ours.rows,
            "src_len": args.src_len,
            "tgt_len": args.tgt_len, "dtype": args.dtype, "rdrop": args.rdrop,
            "attention_impl": ours.config.attention_impl or "xla", "steps": args.steps,
            "warmup": args.warmup, "model_gflop_per_step": round(flops / 1e9, 2)}
    ratios, best = [], {"ours": [], "peer": []}
    for round_ in range(args.rounds):
        result = ours.measure()
        # Measured next to every round and the best kept: on a shared CPU a single
        # measurement may catch a busy moment and overstate the MFU.
        round_peak, peak_source = common.peak_flops(args.dtype)
        peak = max(peak, round_peak)
        memory, memory_source = common.peak_memory_bytes()
        ours_line = {
            "system": "ours-jax-flax-nnx-train", "round": round_, **base,
            **{k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()},
            "compile_s": round(ours.compile_s, 2),
            "model_gflops_per_s": round(flops / result["step_s"] / 1e9, 1),
            "peak_gflops": round(peak / 1e9, 1), "peak_source": peak_source,
            "mfu": round(flops / result["step_s"] / peak, 4),
            "peak_mem_bytes": memory, "peak_mem_source": memory_source,
            "loadavg_1m": round(os.getloadavg()[0], 2),
            **common.environment()}
        common.emit(ours_line)
        if args.compare:
            peer = common.run_peer("hf_train_step.py", peer_args(args, ours.config),
                                   dtype=args.dtype)
            peer["round"] = round_
            common.emit(peer)
            best["ours"].append(result["step_s_min"])
            best["peer"].append(peer["step_s_min"])
            peer_tokens = peer["batch"] * peer["tgt_len"]
            ratio = result["tokens_per_s"] / peer["tokens_per_s"]
            ratios.append(ratio)
            common.emit({"system": "ratio", "round": round_, "preset": args.preset,
                         "ours_tokens_per_s": round(result["tokens_per_s"], 1),
                         "peer_tokens_per_s": peer["tokens_per_s"],
                         "ours_over_peer": round(ratio, 3)})
    if ratios:
        # Other work on a shared machine only ever slows a step down, so the fastest step
        # of all rounds is the least disturbed figure of each system.
        common.emit({"system": "summary", "preset": args.preset, "rounds": len(ratios),
                     "median_ours_over_peer": round(statistics.median(ratios), 3),
                     "ratios": [round(r, 3) for r in ratios],
                     "ours_best_step_s": round(min(best["ours"]), 4),
                     "peer_best_step_s": round(min(best["peer"]), 4),
                     # tokens/s, not step times: the ratio stays right should the peer's
                     # step hold other rows than ours
                     "best_ours_over_peer": round(ours.rows * args.tgt_len / min(best["ours"])
                                                  / (peer_tokens / min(best["peer"])), 3)})


if __name__ == "__main__":
    allocator.preload()  # as train.py and translate.py: mimalloc under XLA:CPU
    main()
