"""A trained model against its own CTranslate2 export: speed and BLEU on a real test set.

    python -m bench.exported --model runs/NAME/averaged --test-prefix data/multi30k/test2016 \\
        --src en --tgt de [--end-to-end]
    python -m bench.exported ... --device cuda        # on a GPU: CTranslate2 float16, int8

Exports the model to CTranslate2 into a temporary folder, then, on the same sentences:
- beam search (--beam, the model's alpha and beam rules) and greedy search with ours (at each
  of --dtypes, the products' operands: float32 and bfloat16 by default) and with
  CTranslate2 at each --compute-types (default float32 and int8 on the CPU, float16 and
  int8_float16 on a GPU): seconds and sentences/s after one warm-up pass (compilation not
  counted), sacreBLEU BLEU and chrF beside each, and for greedy how many outputs are
  identical to ours token for token; every system searches the sentences as translate.py
  --engine ctranslate2 does: cut to the model's positions, each under its own output limit
  (the search's a * source length + b, --max-len-a and --max-len-b where given);
- with transformers and torch installed (CPU only), greedy agreement of transformers'
  `generate` on the MarianMT export;
- with --end-to-end, what a user waits for, each a new process, start to exit:
  `translate.py --evaluate` on the test set with an empty and then a warm compilation cache,
  against a script that loads the CTranslate2 export and does the same work (tokenize,
  translate, detokenize, score); and one sentence from the shell (`echo ... | translate.py`,
  warm cache) against CTranslate2 loading and translating that sentence; and the same two
  with `translate.py --engine ctranslate2` at each compute type (the first run converting the
  model into an empty cache, then cached). Warm runs are repeated (--repeats) and their
  median reported beside each run's seconds. A command that fails is one record with
  "failed" (its last error line); the others still run, and the exit status is then 1.
Ours searches --searches batches at once (translate.py's default unless given); CTranslate2
runs with max_batch_size --batch-sentences and --threads threads, once per --inter-threads N
(N batches at once, each on --threads / N threads); it
divides by length ** alpha where ours uses the model's penalty (GNMT's unless stored
otherwise), so beam outputs may differ by that convention. One JSON line per measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import (
    REPO,
    emit,
    environment,
    non_negative_int,
    peer_environment,
    positive_int,
    read_test_set,
    test_set_parser,
    usage_errors,
    user_environment,
)
from nmt.models.translations import CallSources
from nmt.runtime import allocator
from nmt.translation.scoring import bleu_tokenizer_for
from transformer.config import BEAM_RULES, ModelConfig, SearchConfig

COMPUTE_TYPES = {"cpu": ("float32", "int8"), "cuda": ("float16", "int8_float16")}
SHELL_SENTENCE = "A man in a blue shirt is standing on a ladder cleaning windows."

# The same work as translate.py --evaluate, for CTranslate2: load, tokenize, translate, score
# (BLEU and chrF).
CT2_SCRIPT = """
import sys, time
start = time.perf_counter()
import ctranslate2, sacrebleu, sentencepiece
(model, source, reference, device, compute, threads, beam, alpha, batch, length, inter,
 tokenize, cut) = sys.argv[1:14]
translator = ctranslate2.Translator(model, device=device, compute_type=compute,
                                    inter_threads=int(inter),
                                    intra_threads=max(int(threads) // int(inter), 1))
sp = sentencepiece.SentencePieceProcessor(model_file=model + "/spm.model")
def read(path):  # as translate.py reads lines: ended by "\\n" only, "\\r" and a BOM dropped
    text = open(path, encoding="utf-8-sig", newline="").read().removesuffix("\\n")
    return [line.removesuffix("\\r") for line in text.split("\\n")] if text else []
lines = read(source)
suppress = [[sp.id_to_piece(sp.pad_id())], [sp.id_to_piece(sp.bos_id())]]
# cut to the model's positions, EOS included, as translate.py cuts (past them it aborts)
results = translator.translate_batch(
    [sp.encode(line, out_type=str)[:int(cut)] for line in lines], beam_size=int(beam),
    length_penalty=float(alpha), max_batch_size=int(batch), suppress_sequences=suppress,
    max_decoding_length=int(length), max_input_length=0)
hypotheses = [sp.decode_pieces(r.hypotheses[0]) for r in results]
if reference != "-":
    refs = read(reference)
    bleu = sacrebleu.corpus_bleu(hypotheses, [refs], tokenize=tokenize)
    print(f"BLEU = {bleu.score:.2f}")
    print(f"chrF2 = {sacrebleu.corpus_chrf(hypotheses, [refs]).score:.2f}")  # as translate.py
else:
    print(hypotheses[0])
"""


def parse_args() -> argparse.Namespace:
    parser = test_set_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--beam", type=positive_int, default=4)
    parser.add_argument("--beam-rules", choices=BEAM_RULES,
                        help="our beam rules (default: the model's)")
    parser.add_argument("--max-len-a", type=float, help="our output limit a (default: the "
                                                        "model's)")
    parser.add_argument("--max-len-b", type=int, help="our output limit b (default: the model's)")
    parser.add_argument("--device", choices=sorted(COMPUTE_TYPES), default="cpu",
                        help="CTranslate2's device (ours runs on JAX's default device)")
    parser.add_argument("--compute-types", nargs="+",
                        help="CTranslate2 compute types (default: float32 int8 on cpu, "
                             "float16 int8_float16 on cuda)")
    parser.add_argument("--threads", type=positive_int, default=2, help="CTranslate2 threads")
    parser.add_argument("--inter-threads", type=positive_int, nargs="+", default=[1, 2],
                        help="CTranslate2 batches translated at once, each on --threads / N "
                             "threads (default: 1 and 2, each measured)")
    parser.add_argument("--dtypes", nargs="+", choices=("float32", "bfloat16"),
                        default=["float32", "bfloat16"],
                        help="our compute dtypes (translate.py --dtype), each measured")
    parser.add_argument("--searches", type=positive_int,
                        help="our batches searched at once (default: translate.py's)")
    parser.add_argument("--batch-sentences", type=positive_int, default=64,
                        help="CTranslate2 batch size (max_batch_size)")
    parser.add_argument("--limit", type=non_negative_int, default=0,
                        help="first N test pairs (0 = all)")
    parser.add_argument("--end-to-end", action="store_true",
                        help="also time translate.py and CTranslate2 as new processes")
    parser.add_argument("--bleu-tokenize", help="sacreBLEU tokenizer (default: by --tgt)")
    parser.add_argument("--repeats", type=positive_int, default=3,
                        help="runs of each warm end-to-end command (the median is reported)")
    return parser.parse_args()


def timed(fn, *args):
    """fn(*args) and its seconds, after one warm-up call (compilation, caches)."""
    fn(*args)
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def main() -> None:
    args = parse_args()
    from nmt.models.model_dir import load_model
    from nmt.models.translator import Translator, default_searches
    from nmt.runtime.compilation import enable_compilation_cache
    from nmt.translation.scoring import MetricError, bleu_settings, evaluate

    enable_compilation_cache()  # as translate.py: programs it compiled before are read back
    with usage_errors(MetricError):  # before anything is timed
        bleu = bleu_settings(args.tgt, args.bleu_tokenize)
        sources, references = read_test_set(args, args.limit)
        models = {dtype: load_model(args.model, dtype=dtype) for dtype in args.dtypes}
    _, tokenizer, values = models[args.dtypes[0]]
    beam = dataclasses.replace(values["search"], strategy="beam", beam_size=args.beam, nbest=1,
                               **search_overrides(args))
    greedy = dataclasses.replace(beam, strategy="greedy", beam_size=1)
    common = {"model": str(args.model), "sentences": len(sources), "alpha": beam.alpha,
              **environment()}

    def report(name: str, mode: str, hypotheses: list[str], seconds: float, **extra) -> None:
        scores = evaluate(hypotheses, references, **bleu)
        emit({"system": name, "search": mode, "seconds": round(seconds, 2),
              "sentences_per_s": round(len(sources) / seconds, 1), "bleu": round(scores.bleu, 2),
              "chrf": round(scores.chrf, 2), **extra, "bleu_signature": scores.bleu_signature,
              **common})

    ours = {}
    searches = args.searches or default_searches()
    for dtype, (model, _, _) in models.items():
        for mode, search in ((f"beam {args.beam}", beam), ("greedy", greedy)):
            # compact_after=0: a long job's steady state, where every batch compacts (the
            # warm-up pass compiles the programs at fewer rows).
            translator = Translator(model, tokenizer, search, searches=searches,
                                    compact_after=0)
            nbest, seconds = timed(translator.translate_nbest, sources)
            ours.setdefault(mode, [h[0].tokens for h in nbest])  # the first dtype's
            report(f"ours {dtype}", mode, [h[0].text for h in nbest], seconds,
                   beam_rules=search.beam_rules, max_len_a=search.max_len_a,
                   max_len_b=search.max_len_b, searches=searches)

    work = EngineWork.of(sources, tokenizer, values["model"], greedy)
    with tempfile.TemporaryDirectory() as tmp:
        exported = ctranslate2_export(args.model, Path(tmp))
        if exported is None:
            emit({"system": "ctranslate2", "skipped": "ctranslate2 is not installed", **common})
        elif not compare_ctranslate2(args, exported, work, tokenizer, values, ours, report):
            exported = None  # it cannot run on this device: nothing to time end to end either
        if args.device == "cpu":
            marian_greedy_agreement(args, work, ours["greedy"], values["model"], common,
                                    Path(tmp))
        if args.end_to_end:  # the commands read the pairs timed in process (--limit's)
            prefix = write_test_set(Path(tmp) / "test", args, sources, references)
            failed = end_to_end(argparse.Namespace(**{**vars(args), "test_prefix": prefix}),
                                exported, beam, values, common)
            if failed:  # after every record: the status says that some are "failed" ones
                raise SystemExit(f"bench.exported: {failed} end-to-end command(s) failed; "
                                 f"their records say why")


def write_test_set(prefix: Path, args, sources: list[str], references: list[str]) -> str:
    """PREFIX.SRC and PREFIX.TGT holding `sources` and `references`; returns PREFIX."""
    for lang, lines in ((args.src, sources), (args.tgt, references)):
        Path(f"{prefix}.{lang}").write_text("".join(line + "\n" for line in lines),
                                            encoding="utf-8")
    return str(prefix)


@dataclasses.dataclass(frozen=True)
class EngineWork:
    """The sentences as `translate.py --engine ctranslate2` searches them, for the other
    systems to search alike: each one's ids cut to the model's positions (`CallSources`, with
    the same warning), its output limit in tokens, EOS included (the search's a * source
    length + b, capped at the model's positions), and the groups of sentences that share a
    limit. Empty sentences and limits of one token (EOS at once) translate to nothing."""

    ids: list[list[int]]
    groups: list[tuple[int, list[int]]]  # (limit, indices of its sentences), shortest first

    @classmethod
    def of(cls, sources: list[str], tokenizer, model: ModelConfig, search: SearchConfig
           ) -> EngineWork:
        call = CallSources.of(sources, tokenizer, model.max_len - 1, 1, None, None, 1,
                              "test set", None)
        groups: dict[int, list[int]] = {}
        for i in call.todo:
            limit = search.max_output_len(len(call.ids[i]) + 1, model.max_len)
            if limit > 1:
                groups.setdefault(limit, []).append(i)
        return cls(call.ids, sorted(groups.items()))


def decoding_length(values) -> int:
    """CTranslate2's max_decoding_length: 256, or what the model's positions allow after the
    start token."""
    return min(256, values["model"].max_len - 1)


def search_overrides(args) -> dict:
    """The SearchConfig fields our search flags set."""
    given = {"beam_rules": args.beam_rules, "max_len_a": args.max_len_a,
             "max_len_b": args.max_len_b}
    return {name: value for name, value in given.items() if value is not None}


def search_flags(args) -> list[str]:
    """The same settings as translate.py flags."""
    return [part for name, value in search_overrides(args).items()
            for part in (f"--{name.replace('_', '-')}", str(value))]


def bleu_flags(args) -> list[str]:
    """--bleu-tokenize for translate.py --evaluate, where given."""
    return ["--bleu-tokenize", args.bleu_tokenize] if args.bleu_tokenize else []


def ctranslate2_export(model_path: str, tmp: Path) -> Path | None:
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return None
    from nmt.convert.ctranslate2 import export_ctranslate2

    return export_ctranslate2(model_path, tmp / "ct2", "float32")


def compare_ctranslate2(args, exported: Path, work: EngineWork, tokenizer, values, ours,
                        report) -> bool:
    """CTranslate2 at each compute type (converted when loading): beam and greedy, on `work`.
    False, after one 'unavailable' record, when this build cannot run on the device (a CUDA 12
    build on a CUDA 13 machine fails at its first call, not at import)."""
    import ctranslate2

    if args.device == "cuda" and not ctranslate2_runs_on_cuda(exported):
        return False

    pieces = [tokenizer.pieces(ids) for ids in work.ids]
    suppress = [[tokenizer.processor.id_to_piece(values["model"].pad_id)],
                [tokenizer.processor.id_to_piece(values["model"].bos_id)]]
    alpha = values["search"].alpha
    layouts = [(inter, max(args.threads // inter, 1)) for inter in args.inter_threads]
    for compute, (inter, intra) in itertools.product(
            args.compute_types or COMPUTE_TYPES[args.device], layouts):
        ct2 = ctranslate2.Translator(str(exported), device=args.device, compute_type=compute,
                                     inter_threads=inter, intra_threads=intra)

        def run(beam: int, ct2=ct2):
            return ctranslate2_best(ct2, work, pieces, beam_size=beam, length_penalty=alpha,
                                    max_batch_size=args.batch_sentences,
                                    suppress_sequences=suppress)

        for mode, beam in ((f"beam {args.beam}", args.beam), ("greedy", 1)):
            hypotheses, seconds = timed(run, beam)
            extra = {}
            if beam == 1:
                extra["greedy_identical"] = sum(
                    h == tokenizer.pieces(ids) for h, ids in zip(hypotheses, ours["greedy"]))
            report(f"ctranslate2 {compute}", mode,
                   [tokenizer.processor.decode_pieces(h) for h in hypotheses], seconds,
                   inter_threads=inter, intra_threads=intra,
                   batch_sentences=args.batch_sentences, **extra)
    return True


def ctranslate2_best(ct2, work: EngineWork, pieces: list[list[str]], **options
                     ) -> list[list[str]]:
    """CTranslate2's best hypothesis (pieces, no EOS) of each sentence: each group of `work`
    under its own limit (max_decoding_length does not count EOS), all groups submitted at
    once, as the engine submits them, so that the threads stay busy."""
    submitted = [(rows, ct2.translate_batch([pieces[i] for i in rows], asynchronous=True,
                                            max_decoding_length=limit - 1,
                                            max_input_length=0, **options))
                 for limit, rows in work.groups]
    best: list[list[str]] = [[] for _ in pieces]
    for rows, results in submitted:
        for i, result in zip(rows, results):
            best[i] = result.result().hypotheses[0]
    return best


def ctranslate2_runs_on_cuda(exported: Path) -> bool:
    """Whether CTranslate2 translates one sentence on the GPU; if not, one record says why."""
    import ctranslate2

    try:
        ct2 = ctranslate2.Translator(str(exported), device="cuda")
        ct2.translate_batch([["▁"]], max_decoding_length=2)
    except (RuntimeError, OSError, ValueError) as error:  # e.g. libcublas.so.12 not found
        emit({"system": "ctranslate2", "ctranslate2": ctranslate2.__version__,
              "unavailable": f"{type(error).__name__}: {error}", **environment()})
        return False
    return True


def marian_greedy_agreement(args, work: EngineWork, our_greedy, model_config: ModelConfig,
                            common, tmp: Path) -> None:
    """Greedy outputs of transformers' generate on the MarianMT export against ours, on
    `work` (its ids are the export's: vocab.json maps each piece to our id)."""
    try:
        import torch
        import transformers
    except ImportError as err:
        emit({"system": "transformers", "skipped": f"{err.name} is not installed", **common})
        return
    from nmt.convert.marian import export_marian

    model = transformers.MarianMTModel.from_pretrained(export_marian(args.model, tmp / "marian"))
    model.eval()
    torch.set_num_threads(args.threads)
    eos, pad = model_config.eos_id, model_config.pad_id
    outputs: list[list[int]] = [[] for _ in work.ids]  # empty where `work` searches nothing
    for limit, rows in work.groups:
        for start in range(0, len(rows), 32):
            chunk = rows[start:start + 32]
            sources = [work.ids[i] + [eos] for i in chunk]
            width = max(map(len, sources))
            ids = torch.tensor([row + [pad] * (width - len(row)) for row in sources])
            with torch.no_grad():
                generated = model.generate(input_ids=ids, attention_mask=ids != pad,
                                           num_beams=1, do_sample=False,
                                           max_new_tokens=limit)  # EOS forced there, as ours
            for row, i in zip(generated.tolist(), chunk):
                outputs[i] = row[1:row.index(eos)] if eos in row[1:] else row[1:]
    same = sum(out == list(ours) for out, ours in zip(outputs, our_greedy))
    emit({"system": "transformers", "search": "greedy", "greedy_identical": same,
          "of": len(work.ids), **common})


class CommandFailed(RuntimeError):
    """An end-to-end command that exited with an error: its own record says so."""


def wall(command: list[str], env: dict[str, str], stdin: str | None = None
         ) -> tuple[float, str]:
    """Seconds from process start to exit, and its BLEU and chrF lines (else its last line
    of output); CommandFailed, naming the command and its last error line, if it fails."""
    start = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, env=env, input=stdin, capture_output=True,
                            text=True, timeout=1800, check=False)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise CommandFailed(f"{' '.join(command)} failed ({result.returncode}): "
                            f"{result.stderr.strip().splitlines()[-1:]}")
    lines = result.stdout.strip().splitlines()
    scores = [line for line in lines if line.startswith(("BLEU =", "chrF2 ="))]
    return seconds, " | ".join(scores) if scores else (lines or [""])[-1]


def once(command: list[str], env: dict[str, str]) -> dict:
    """`wall` run once, as record fields."""
    seconds, line = wall(command, env)
    return {"seconds": round(seconds, 2), "output": line}


def emit_measured(record: dict, measure) -> bool:
    """`record` with the fields `measure()` returns, or with "failed" (why) if its command
    failed: a failing command costs its own record, not the others'. Whether it ran."""
    try:
        emit({**record, **measure()})
    except CommandFailed as error:
        emit({**record, "failed": str(error)})
        return False
    return True


def repeated(times: int, command: list[str], env: dict[str, str], stdin: str | None = None
             ) -> dict:
    """`wall` run `times` times: the median seconds, every run's, and the last run's output
    (a new process's time on a small machine moves by tens of percent between runs)."""
    runs = [wall(command, env, stdin) for _ in range(times)]
    return {"seconds": round(statistics.median(s for s, _ in runs), 2),
            "runs": [round(s, 2) for s, _ in runs],
            "output": runs[-1][1]}


def end_to_end(args, exported: Path | None, beam, values, common) -> int:
    """translate.py as a user runs it, cold and warm, against CTranslate2 doing the same;
    the number of commands that failed (each one a "failed" record)."""
    source, reference = f"{args.test_prefix}.{args.src}", f"{args.test_prefix}.{args.tgt}"
    ran = []
    for dtype in args.dtypes:
        with tempfile.TemporaryDirectory() as cache:
            env = {**user_environment(), "FLAX_NMT_CACHE": cache}
            flags = ["--beam", str(args.beam), *search_flags(args), "--dtype", dtype, "-q"]
            evaluate = [sys.executable, "translate.py", "--model", str(args.model),
                        "--evaluate", "--test-prefix", args.test_prefix, "--src", args.src,
                        "--tgt", args.tgt, *bleu_flags(args), *flags]
            system = {"system": f"ours {dtype}"}
            ran.append(emit_measured({**system, "end_to_end": "translate.py --evaluate, empty "
                                      "compilation cache", **common},
                                     lambda: once(evaluate, env)))
            ran.append(emit_measured({**system, "end_to_end": "translate.py --evaluate, warm "
                                      "compilation cache", **common},
                                     lambda: repeated(args.repeats, evaluate, env)))
            one = [sys.executable, "translate.py", "--model", str(args.model), *flags]

            def warm_one(one=one, env=env):
                wall(one, env, stdin=SHELL_SENTENCE + "\n")  # its own shape: compiled, cached
                return repeated(args.repeats, one, env, stdin=SHELL_SENTENCE + "\n")

            ran.append(emit_measured({**system, "end_to_end": "one sentence from the shell, "
                                      "warm cache", **common, "sentences": 1}, warm_one))
    if exported is None:
        return ran.count(False)
    env = peer_environment()
    for compute, inter in itertools.product(args.compute_types or COMPUTE_TYPES[args.device],
                                            args.inter_threads):
        script = [sys.executable, "-c", CT2_SCRIPT, str(exported), source, reference,
                  args.device, compute, str(args.threads), str(args.beam), str(beam.alpha),
                  str(args.batch_sentences), str(decoding_length(values)), str(inter),
                  args.bleu_tokenize or bleu_tokenizer_for(args.tgt),
                  str(values["model"].max_len - 1)]
        layout = {"inter_threads": inter, "intra_threads": max(args.threads // inter, 1)}
        system = {"system": f"ctranslate2 {compute}",
                  "batch_sentences": args.batch_sentences}
        ran.append(emit_measured({**system, "end_to_end": "load, tokenize, translate, score "
                                  "the test set", **layout, **common},
                                 lambda script=script: repeated(args.repeats, script, env)))
        with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8") as one_line:
            one_line.write(SHELL_SENTENCE + "\n")
            one_line.flush()
            one = [*script[:4], one_line.name, "-", *script[6:]]
            ran.append(emit_measured({**system, "end_to_end": "one sentence", **layout,
                                      **common, "sentences": 1},
                                     lambda one=one: repeated(args.repeats, one, env)))
        ran.extend(engine_end_to_end(args, compute, inter, {**layout, **common}))
    return ran.count(False)


def engine_end_to_end(args, compute: str, inter: int, common) -> list[bool]:
    """translate.py --engine ctranslate2 doing what the CTranslate2 script does, with the same
    threads (--searches N is its inter_threads N): the first run (which converts the model
    into an empty cache), then warm runs, and one sentence. Whether each ran."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**user_environment(), "FLAX_NMT_CACHE": cache}
        flags = ["--engine", "ctranslate2", "--compute-type", compute, "--beam", str(args.beam),
                 *search_flags(args), "--threads", str(args.threads), "--searches", str(inter),
                 "-q"]
        evaluate = [sys.executable, "translate.py", "--model", str(args.model), "--evaluate",
                    "--test-prefix", args.test_prefix, "--src", args.src, "--tgt", args.tgt,
                    *bleu_flags(args), *flags]
        system = {"system": f"ours on ctranslate2 {compute}"}
        one = [sys.executable, "translate.py", "--model", str(args.model), *flags]
        return [
            emit_measured({**system, "end_to_end": "translate.py --evaluate, converting into "
                           "an empty cache", **common}, lambda: once(evaluate, env)),
            emit_measured({**system, "end_to_end": "translate.py --evaluate, cached "
                           "conversion", **common},
                          lambda: repeated(args.repeats, evaluate, env)),
            emit_measured({**system, "end_to_end": "one sentence from the shell, cached "
                           "conversion", **common, "sentences": 1},
                          lambda: repeated(args.repeats, one, env,
                                           stdin=SHELL_SENTENCE + "\n"))]


if __name__ == "__main__":
    allocator.preload()  # as train.py and translate.py: mimalloc under XLA:CPU
    main()
