"""BLEU against speed for a teacher and its students, each with every engine and setting a
user can pick: the frontier of the fastest translation at each quality.

    python -m bench.frontier --model teacher=runs/teacher/averaged \\
        --model student-6-2=runs/student/averaged --test-prefix data/multi30k/test2016 \\
        --src en --tgt de --shortlist 1024 --plot docs/images/frontier.png

For each model, on the same test set, beam search (--beam, the model's alpha and beam rules):
- ours at each --dtypes (float32, bfloat16), without and, where the model stores a
  shortlist (python -m nmt.distillation.shortlist), with --shortlist K candidates per batch;
- CTranslate2 on the model's export at each --compute-types (float32 and int8 on a CPU,
  float16 and int8_float16 with --device cuda), --inter-threads batches at once on --threads
  threads, and with the shortlist as CTranslate2's vocabulary map (`use_vmap`) where the
  model has one.
Each is timed over --passes passes after one warm-up pass (compilation not counted; the
median is reported). One JSON line per measurement, then one naming the frontier (the
measurements no other is both at least as fast as and at least as good as, and better in
one), a table marking it, and with --plot a PNG of BLEU against sentences/s with the frontier
drawn as a line.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import (
    bench_parser,
    emit,
    environment,
    non_negative_int,
    positive_int,
    read_test_set,
    usage_errors,
)
from bench.exported import (
    COMPUTE_TYPES,
    EngineWork,
    ctranslate2_best,
    ctranslate2_export,
    ctranslate2_runs_on_cuda,
)
from transformer.shortlist import Shortlist


@dataclasses.dataclass
class Point:
    model: str
    system: str
    sentences_per_s: float
    bleu: float


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = bench_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", required=True, metavar="NAME=DIR",
                        help="a model to measure, named in the table (give it once per model)")
    parser.add_argument("--test-prefix", required=True, help="PREFIX.SRC and PREFIX.TGT")
    parser.add_argument("--src", required=True)
    parser.add_argument("--tgt", required=True)
    parser.add_argument("--beam", type=positive_int, default=4)
    parser.add_argument("--shortlist", type=int, nargs="+", default=[1024],
                        help="candidates per batch with a model's shortlist, each measured "
                             "(every model is also measured without one)")
    parser.add_argument("--dtypes", nargs="+", choices=("float32", "bfloat16"),
                        default=["float32", "bfloat16"])
    parser.add_argument("--device", choices=sorted(COMPUTE_TYPES), default="cpu",
                        help="CTranslate2's device (ours runs on JAX's default device)")
    parser.add_argument("--compute-types", nargs="*",
                        help="CTranslate2's (default: float32 int8 on cpu, float16 "
                             "int8_float16 on cuda; empty to skip it)")
    parser.add_argument("--threads", type=positive_int, default=2,
                        help="CTranslate2 threads in all")
    parser.add_argument("--inter-threads", type=positive_int, default=2,
                        help="CTranslate2 batches at once, each on --threads / N threads")
    parser.add_argument("--batch-sentences", type=positive_int, default=64,
                        help="CTranslate2 max_batch_size")
    parser.add_argument("--passes", type=positive_int, default=3, help="timed passes (median)")
    parser.add_argument("--limit", type=non_negative_int, default=0,
                        help="first N test pairs (0 = all)")
    parser.add_argument("--plot", help="PNG of BLEU against sentences/s")
    parser.add_argument("--bleu-tokenize", help="sacreBLEU tokenizer (default: by --tgt)")
    args = parser.parse_args(argv)
    for size in args.shortlist:
        if size < 1:  # 0 would measure the search without a shortlist a second time
            parser.error(f"--shortlist {size}: candidates per batch must be >= 1.")
    args.shortlist = list(dict.fromkeys(args.shortlist))
    if args.compute_types is None:
        args.compute_types = list(COMPUTE_TYPES[args.device])
    return args


def median_seconds(fn, passes: int):
    """fn()'s result and the median seconds of `passes` calls, after one untimed call."""
    out = fn()
    times = []
    for _ in range(passes):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return out, statistics.median(times)


def main() -> None:
    args = parse_args()
    from nmt.runtime.compilation import enable_compilation_cache
    from nmt.translation.scoring import MetricError, bleu_settings, evaluate

    enable_compilation_cache()
    with usage_errors(MetricError):  # before the passes: each may take hours
        bleu = bleu_settings(args.tgt, args.bleu_tokenize)
        sources, references = read_test_set(args, args.limit)
        models = read_models(args)
    common = {"sentences": len(sources), "beam": args.beam, **environment()}
    points: list[Point] = []
    for name, path, shortlist in models:
        def report(system: str, hypotheses: list[str], seconds: float, **extra) -> None:
            score = evaluate(hypotheses, references, **bleu).bleu
            point = Point(name, system, len(sources) / seconds, score)
            points.append(point)
            emit({"model": name, "path": path, "system": system, "seconds": round(seconds, 3),
                  "sentences_per_s": round(point.sentences_per_s, 1), "bleu": round(score, 2),
                  **extra, **common})

        measure_ours(args, path, shortlist, sources, report)
        if args.compute_types:
            measure_ctranslate2(args, path, sources, report)
    emit({"frontier": [dataclasses.asdict(p) for p in frontier(points)]})
    print_table(points)
    if args.plot:
        plot(points, args.plot, f"{args.test_prefix}, beam {args.beam}")


def beam_search(args, values: dict):
    """The search every system is measured with: beam search of --beam, one hypothesis,
    the model's other settings."""
    return dataclasses.replace(values["search"], strategy="beam", beam_size=args.beam, nbest=1)


def read_models(args) -> list[tuple[str, str, Shortlist | None]]:
    """(name, path, its shortlist or None) of each --model, before anything is measured.
    SystemExit for a --model that is not NAME=DIR, or a --shortlist size the translator
    refuses for the model's shortlist (its own check, `shortlist_candidates`). A model
    without a usable shortlist gets a "skipped" line saying why."""
    from nmt.models.model_files import ModelDirError, read_model_files, read_shortlist
    from nmt.models.translator import shortlist_candidates
    from transformer.strategies import plan_search

    models = []
    for named in args.model:
        name, _, path = named.partition("=")
        if not path:
            raise SystemExit(f"--model {named}: give NAME=DIR")
        _, tokenizer, values = read_model_files(path)
        try:
            shortlist = read_shortlist(path, tokenizer)
        except ModelDirError as err:
            emit({"model": name, "path": path, "system": "ours shortlist",
                  "skipped": str(err)})
            shortlist = None
        else:
            strategy = plan_search(beam_search(args, values))
            for size in args.shortlist:
                try:
                    shortlist_candidates(shortlist, size, values["model"], strategy)
                except ValueError as err:
                    raise SystemExit(f"--model {named}: {err}") from None
        models.append((name, path, shortlist))
    return models


def measure_ours(args, path: str, shortlist: Shortlist | None, sources: list[str],
                 report) -> None:
    from nmt.models.model_dir import load_model
    from nmt.models.translator import Translator, default_searches
    from transformer.search.programs import forget_programs

    for dtype in args.dtypes:
        model, tokenizer, values = load_model(path, dtype=dtype)
        search = beam_search(args, values)
        sizes = [0] + (args.shortlist if shortlist is not None else [])
        for size in sizes:
            translator = Translator(model, tokenizer, search, searches=default_searches(),
                                    compact_after=0, shortlist=shortlist if size else None,
                                    shortlist_size=size)
            hypotheses, seconds = median_seconds(lambda: translator.translate(sources),
                                                 args.passes)
            report(f"ours {dtype}" + (f" shortlist {size}" if size else ""), hypotheses,
                   seconds)
        forget_programs()  # a process measuring several models would run out of memory maps


def measure_ctranslate2(args, path: str, sources: list[str], report) -> None:
    try:
        import ctranslate2
    except ImportError:
        emit({"model": path, "system": "ctranslate2",
              "skipped": "not installed (pip install -e '.[ct2]')"})
        return

    from nmt.models.model_files import read_model_files

    _, tokenizer, values = read_model_files(path)
    config = values["model"]
    work = EngineWork.of(sources, tokenizer, config, values["search"])
    pieces = [tokenizer.pieces(ids) for ids in work.ids]
    suppress = [[tokenizer.pieces([config.pad_id])[0]], [tokenizer.pieces([config.bos_id])[0]]]
    from nmt.convert.common import ConversionError

    with tempfile.TemporaryDirectory() as tmp:
        try:
            exported = ctranslate2_export(path, Path(tmp))
        except ConversionError as err:  # a model CTranslate2's layout cannot hold
            emit({"model": path, "system": "ctranslate2", "skipped": str(err)})
            return
        if args.device == "cuda" and not ctranslate2_runs_on_cuda(exported):
            return
        vmaps = [False, True] if (exported / "vmap.txt").is_file() else [False]
        for compute in args.compute_types:
            inter = args.inter_threads
            translator = ctranslate2.Translator(str(exported), device=args.device,
                                                compute_type=compute, inter_threads=inter,
                                                intra_threads=max(args.threads // inter, 1))
            for vmap in vmaps:
                def run(vmap=vmap):
                    best = ctranslate2_best(
                        translator, work, pieces, beam_size=args.beam,
                        length_penalty=values["search"].alpha,
                        max_batch_size=args.batch_sentences, suppress_sequences=suppress,
                        use_vmap=vmap)
                    return [tokenizer.processor.decode_pieces(h) for h in best]

                hypotheses, seconds = median_seconds(run, args.passes)
                report(f"ctranslate2 {compute}" + (" vmap" if vmap else ""), hypotheses,
                       seconds, inter_threads=inter)


def dominates(better: Point, other: Point) -> bool:
    """Whether `better` is at least as fast and as good as `other`, and ahead in one."""
    return (better.sentences_per_s >= other.sentences_per_s and better.bleu >= other.bleu
            and (better.sentences_per_s > other.sentences_per_s or better.bleu > other.bleu))


def frontier(points: list[Point]) -> list[Point]:
    """The points no other dominates, slowest (and best) first: the fastest translation at
    each quality. Equal points are all kept, as neither beats the other."""
    kept = [p for p in points if not any(dominates(q, p) for q in points)]
    return sorted(kept, key=lambda p: (p.sentences_per_s, -p.bleu))


def print_table(points: list[Point]) -> None:
    front = frontier(points)
    print("| model | system | sentences/s | BLEU | frontier |")
    print("|---|---|---|---|---|")
    for p in points:
        mark = "yes" if p in front else ""
        print(f"| {p.model} | {p.system} | {p.sentences_per_s:,.1f} | {p.bleu:.2f} | {mark} |")


def plot(points: list[Point], path: str, title: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 5.5))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    # One marker per model, repeated past the nine there are (labels tell them apart).
    markers = dict(zip(dict.fromkeys(p.model for p in points), itertools.cycle("osD^v<>p*")))
    front = frontier(points)
    axes.plot([p.sentences_per_s for p in front], [p.bleu for p in front], color="gray",
              linestyle="--", linewidth=1, zorder=0)
    for p in points:
        color = "tab:blue" if p.system.startswith("ours") else "tab:orange"
        axes.scatter(p.sentences_per_s, p.bleu, marker=markers[p.model], color=color)
        axes.annotate(f"{p.model}: {p.system}", (p.sentences_per_s, p.bleu), fontsize=6,
                      xytext=(3, 3), textcoords="offset points")
    axes.set_xscale("log")
    axes.set_xlabel("sentences/s (log scale)")
    axes.set_ylabel("BLEU")
    axes.set_title(f"BLEU against speed: {title}\n(blue: ours, orange: CTranslate2; dashed: "
                   "the fastest at each BLEU)", fontsize=9)
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
