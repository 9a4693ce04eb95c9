"""Where the time of translating a test set goes: host work, encoder, search, compilation.

    python -m bench.translate_profile --model runs/NAME/averaged \\
        --test-prefix ../shared/data/multi30k/test2016 --src en --tgt de [--greedy] [--ops]

One process, as translate.py runs: loading the model, tokenizing, then the file twice through
`Translator` (the first pass compiles each batch shape, or loads it from the persistent
cache; the second, a replica that batches and compacts as the first did, runs compiled
programs only). Prints one JSON line per batch of the second
pass (source width, rows, sentences, padding, decoder steps, seconds) and a summary: seconds
in imports, model load, tokenizing, the encoder alone (every batch encoded again by itself),
search, detokenizing, and the first pass's extra seconds (compilation or cache loading).
With --ops, a third pass (another replica) runs under the profiler and one more line says
where the search loop's time goes per decoder step, by kind of XLA operation
(`bench.op_times`).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import time

START = time.perf_counter()

from bench.common import (  # noqa: E402
    emit,
    environment,
    read_test_set,
    test_set_parser,
    usage_errors,
)
from nmt.runtime import allocator  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = test_set_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--beam", type=int, help="beam size (default: the model's)")
    parser.add_argument("--greedy", action="store_true")
    parser.add_argument("--beam-rules", help="beam rules (default: the model's)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"),
                        help="compute dtype (default: the model's)")
    parser.add_argument("--max-len-a", type=float, help="output limit a (default: the model's)")
    parser.add_argument("--max-len-b", type=int, help="output limit b (default: the model's)")
    parser.add_argument("--ops", action="store_true",
                        help="also profile a third pass: the search loop's time by operation")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    import jax
    from flax import nnx

    from nmt.models.model_dir import load_model
    from nmt.models.translator import Translator
    from nmt.runtime.compilation import enable_compilation_cache

    enable_compilation_cache()
    imported = time.perf_counter()
    with usage_errors():
        model, tokenizer, values = load_model(args.model, dtype=args.dtype)
        loaded = time.perf_counter()
        sources, _ = read_test_set(args)
    changes = {"beam_size": args.beam, "max_len_a": args.max_len_a, "max_len_b": args.max_len_b,
               "beam_rules": args.beam_rules}
    search = dataclasses.replace(values["search"], nbest=1,
                                 **{k: v for k, v in changes.items() if v is not None})
    if args.greedy:
        search = dataclasses.replace(search, strategy="greedy", beam_size=1)
    translator = Translator(model, tokenizer, search)

    first_start = time.perf_counter()
    translator.translate(sources)
    first = time.perf_counter() - first_start
    # A translator compacts a width from its 17th batch on, counted over every call, so a
    # second call of the same translator would compile compaction's programs; a new one
    # counts afresh and searches as the first pass did, with the programs compiled (they
    # are kept per model graph).
    second_start = time.perf_counter()
    batches = Translator(model, tokenizer, search).translate_all(sources).batches
    second = time.perf_counter() - second_start

    start = time.perf_counter()
    ids = tokenizer.encode(sources, "source")
    tokenize = time.perf_counter() - start
    encoder = jax.jit(lambda graphdef, state, src: nnx.merge(graphdef, state).encode(src))
    graphdef, state = nnx.split(model)
    plan = translator.plan.call_batches(ids, tokenizer.ids)
    for src, _ in plan:
        encoder(graphdef, state, src).block_until_ready()  # compile each shape
    start = time.perf_counter()
    for src, _ in plan:
        encoder(graphdef, state, src).block_until_ready()
    encode = time.perf_counter() - start
    hypotheses = [list(range(4, 24))] * len(sources)  # 20 ordinary pieces per sentence
    start = time.perf_counter()
    tokenizer.decode(hypotheses)
    detokenize = time.perf_counter() - start

    common = {"model": str(args.model), "search": search.strategy, "beam": search.beam_size,
              "beam_rules": search.beam_rules, "max_len_a": search.max_len_a,
              "max_len_b": search.max_len_b, "dtype": str(model.config.dtype), **environment()}
    for b in batches:
        emit({"batch": dataclasses.asdict(b), "padding": round(1 - b.source_tokens /
                                                                (b.rows * b.width), 3),
              "empty_rows": b.rows - b.sentences, **common})
    search_s = sum(b.seconds for b in batches)
    cells = sum(b.rows * b.width for b in batches)
    emit({"summary": {
        "sentences": len(sources), "imports_s": round(imported - START, 2),
        "model_load_s": round(loaded - imported, 2), "first_pass_s": round(first, 2),
        "second_pass_s": round(second, 2), "compile_or_cache_s": round(first - second, 2),
        "search_s": round(search_s, 2), "encoder_s": round(encode, 2),
        "host_s": round(second - search_s, 2), "tokenize_s": round(tokenize, 3),
        "detokenize_20_tokens_s": round(detokenize, 3), "batches": len(batches),
        "shapes": len({(b.rows, b.width) for b in batches}),
        "source_padding": round(1 - sum(b.source_tokens for b in batches) / cells, 3),
        "decoder_steps": sum(b.steps for b in batches),
        "row_steps": sum(b.row_steps for b in batches),
        "sentences_per_s": round(len(sources) / second, 1)}, **common})
    if args.ops:
        emit({"ops": loop_op_times(Translator(model, tokenizer, search), sources), **common})


def loop_op_times(translator, sources: list[str]) -> dict:
    """One more pass of `translator` under the profiler: milliseconds per decoder step of the
    search loop programs (`*_resume`), in all and by kind of operation, and the seconds of
    every program the pass ran. Kinds, not operations: each batch shape is a program of its
    own, and XLA numbers the operations of each afresh."""
    from bench.op_times import by_kind, traced_op_times

    start = time.perf_counter()
    done = []
    programs = traced_op_times(lambda: done.append(translator.translate_all(sources)))
    traced = time.perf_counter() - start
    steps = sum(b.steps for b in done[0].batches)
    loop = collections.Counter()
    for name, ops in programs.items():
        if name.endswith("_resume"):
            loop.update(ops)
    per_step = sum(loop.values()) * 1e3 / steps
    return {
        "traced_pass_s": round(traced, 2), "decoder_steps": steps,
        "program_s": {name: round(sum(ops.values()), 3) for name, ops in sorted(programs.items())},
        "loop_ms_per_step": round(per_step, 3),
        "loop_kinds": {name: {"ms_per_step": round(seconds * 1e3 / steps, 3),
                              "share": round(seconds * 1e3 / steps / per_step, 3)}
                       for name, seconds in by_kind(loop).items()}}


if __name__ == "__main__":
    allocator.preload()  # as translate.py: mimalloc under XLA:CPU
    main()
