"""Decoding throughput: greedy and beam search on a random model with fixed work.

    python -m bench.decode                      # base, 64 sentences x 20 tokens, greedy + beam 4
    python -m bench.decode --preset small --compare --rounds 3

The work matches ../shared/tools/peers/hf_decode.py and ct2_decode.py: one batch of --batch
random source sentences of --src-len tokens (EOS included) and exactly --out-len output
tokens per sentence (min_len = max_len = out_len, EOS included, so no hypothesis ends early).
Length penalty alpha = 1.0 is irrelevant when all hypotheses have the same length.

Reported per mode: compile_s (round 0 only: first call minus a steady call, tracing + XLA
compilation of that shape), batch_s (median of --repeats timed calls after the warm-up),
sentences/s and output tokens/s (batch x out_len / batch_s; beam hypotheses are not
counted). With --compare the peers run in the same invocation, alternating with ours, and
each line of ours carries the ratio to each peer's figure from the same round.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from flax import nnx

from bench.common import (
    bench_parser,
    emit,
    environment,
    on_gpu,
    positive_int,
    run_peer,
    usage_errors,
)
from nmt.runtime import allocator
from transformer.config import PRESETS, SearchConfig, get_preset
from transformer.model import Transformer
from transformer.search import search_with_state

FIRST_WORD = 4  # the lowest id of the random sources: 0-3 are the special tokens


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags, with `config`: the model they describe (one line and exit status 2 for
    a value it cannot take)."""
    parser = bench_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="base", choices=sorted(PRESETS))
    parser.add_argument("--vocab", type=positive_int, default=8000)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--batch", type=positive_int, default=64)
    parser.add_argument("--src-len", type=positive_int, default=20)
    parser.add_argument("--out-len", type=positive_int, default=20)
    parser.add_argument("--beams", type=positive_int, nargs="+", default=[1, 4],
                        help="1 runs greedy search, k > 1 beam search")
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--rounds", type=positive_int, default=1)
    parser.add_argument("--compare", action="store_true",
                        help="also run transformers generate() and CTranslate2 (float32 on a "
                             "CPU; on a GPU generate() in --dtype and CTranslate2 in float16)")
    parser.add_argument("--threads", type=positive_int, default=2,
                        help="threads the peers may use")
    args = parser.parse_args(argv)
    if args.vocab <= FIRST_WORD:
        parser.error(f"--vocab {args.vocab}: the random sources draw from ids {FIRST_WORD} "
                     "and up (below are the special tokens); give more")
    with usage_errors(ValueError):  # the config names the setting it cannot take
        args.config = get_preset(args.preset, vocab_size=args.vocab, dtype=args.dtype,
                                 max_len=max(512, args.src_len, args.out_len))
    return args


def search_config(beam: int, out_len: int) -> SearchConfig:
    strategy = "greedy" if beam == 1 else "beam"
    return SearchConfig(strategy=strategy, beam_size=beam, alpha=1.0, max_len_a=0.0,
                        max_len_b=out_len, min_len=out_len)


def time_ours(args, model_state, beam: int) -> dict:
    graphdef, state, src = model_state
    config = search_config(beam, args.out_len)

    def run() -> float:
        start = time.perf_counter()
        result = search_with_state(graphdef, state, src, config)
        elapsed = time.perf_counter() - start
        assert np.all(result.lengths == args.out_len), result.lengths
        return elapsed

    first = run()
    times = [run() for _ in range(args.repeats)]
    batch_s = statistics.median(times)
    return {"system": "ours", "mode": "greedy" if beam == 1 else f"beam{beam}",
            "compile_s": round(first - batch_s, 3), "batch_s": batch_s,
            "sentences_per_s": args.batch / batch_s,
            "tokens_per_s": args.batch * args.out_len / batch_s}


def peer_args(args) -> list[str]:
    config = get_preset(args.preset)
    return ["--d-model", str(config.d_model), "--enc-layers", str(config.encoder_layers),
            "--dec-layers", str(config.decoder_layers), "--heads", str(config.num_heads),
            "--ffn", str(config.d_ff), "--vocab", str(args.vocab), "--batch", str(args.batch),
            "--src-len", str(args.src_len), "--out-len", str(args.out_len),
            "--repeats", str(args.repeats), "--threads", str(args.threads),
            "--beams", *map(str, args.beams)]


def run_peers(args) -> list[dict]:
    """transformers generate() and CTranslate2, one line per (system, mode): on a CPU both in
    float32; on a GPU generate() with its weights in --dtype and CTranslate2 in float16 (or a
    line saying why CTranslate2 cannot run there)."""
    gpu = on_gpu()
    lines = run_peer("hf_decode.py", peer_args(args), many=True,
                     dtype=args.dtype if gpu else "float32")
    ct2_type = "float16" if gpu else "float32"
    lines += run_peer("ct2_decode.py", peer_args(args) + ["--compute-types", ct2_type], many=True)
    return lines


def main() -> None:
    args = parse_args()
    config = args.config
    model = Transformer(config, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(2)
    src = rng.integers(FIRST_WORD, args.vocab, size=(args.batch, args.src_len)).astype(np.int32)
    src[:, -1] = config.eos_id
    emit({"bench": "decode", **environment(), "preset": args.preset, "vocab": args.vocab,
          "dtype": args.dtype, "batch": args.batch, "src_len": args.src_len,
          "out_len": args.out_len})
    for round_index in range(args.rounds):
        ours = [time_ours(args, (graphdef, state, src), beam) for beam in args.beams]
        try:
            peers = run_peers(args) if args.compare else []
        except RuntimeError as error:  # a peer that failed: keep our figures, say why
            emit({"bench": "decode", "round": round_index, "peer_error": str(error)[-2000:]})
            peers = []
        for line in ours:
            if round_index:  # the programs were compiled in round 0: a later round's ~0
                del line["compile_s"]  # would read as a compile time
            for peer in peers:
                if peer.get("mode") == line["mode"]:
                    name = peer.get("system", "peer").replace(" ", "_")
                    line[f"ratio_vs_{name}"] = round(line["sentences_per_s"]
                                                     / peer["sentences_per_s"], 3)
            emit({"bench": "decode", "round": round_index, "preset": args.preset, **line})
        for peer in peers:
            emit({"bench": "decode", "round": round_index, "peer": True, **peer})


if __name__ == "__main__":
    allocator.preload()  # as train.py and translate.py: mimalloc under XLA:CPU
    main()
