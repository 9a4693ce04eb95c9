"""Translate with a trained model: `python translate.py --model runs/NAME [SENTENCE ...]`.

Input, one translation per input line on stdout (or --output), in input order:

    python translate.py --model runs/NAME "Ein Mann fährt Fahrrad."   # the arguments
    cat test.de | python translate.py --model runs/NAME > test.hyp      # stdin
    python translate.py --model runs/NAME --input test.de --output test.hyp

Stdin is read as it arrives: every complete line already waiting (at most --chunk-lines,
default 1000) is translated as one call, so a pipe from a file is batched as efficiently as
--input, while a terminal or a slow producer gets each line translated as soon as it is
entered. Output is flushed after every chunk. --input is checked whole before the model is
loaded (an invalid line is reported at once), then read in chunks of --chunk-lines lines, so
memory does not grow with the file; a progress bar shows the lines done.

--output OUT is written as the translations come, into OUT.partial, which replaces OUT only
when every line is done: an interrupted or failed run leaves the earlier OUT as it was.

Within a call, `transformer.translation.Translator` sorts sentences by length into batches of
at most --batch-tokens source tokens and restores input order. An empty line gives an empty
line; a line longer than the model allows is truncated with a warning naming its line number.

With --nbest N each input line gives N lines, best first (fairseq/Marian style):

    INDEX<TAB>SCORE<TAB>TRANSLATION

INDEX is the 0-based input line number (Moses/Marian convention), SCORE the search score
(beam search: log-probability divided by the length penalty, GNMT's unless
--length-penalty power; greedy and sampling: log-probability).

Search settings default to the model's stored SearchConfig; flags override them.

Several --model flags make an ensemble (`transformer.ensemble`): at every step the next-token
probabilities of the models are averaged, as fairseq does. The models must have been trained
with the same SentencePiece model; search settings and languages come from the first.

    python translate.py --model runs/A --model runs/B --model runs/A/averaged < test.de

    python translate.py --model runs/NAME --evaluate --src-file test.en --ref-file test.de

prints sacreBLEU BLEU and chrF (detokenized, cased) with their signatures; the numbers equal
`sacrebleu test.de -i HYP -m bleu chrf` on the hypotheses written with --hyp-file (except that
a byte order mark starting a file is removed here, where sacreBLEU would score it as text).
BLEU is tokenized as `sacrebleu -l SRC-TGT` would for the target language: zh for Chinese,
ja-mecab for Japanese, ko-mecab for Korean (these two need `pip install -e '.[cjk]'`; region
forms such as ja-JP count too), 13a for the others; --bleu-tokenize picks another (char, intl,
none, ...).
Every test pair counts, also one with an empty side. The test files and the output paths are
checked before the model is loaded, and the scores are printed before --hyp-file and --report
are written, so a bad path costs no translation time.

    python translate.py --model runs/NAME --score --src-file test.en --ref-file test.de

prints the log-probability (natural log, EOS included) the model gives each reference, one
line per pair, without searching (force decoding, as fairseq's --score-reference or
marian-scorer); --normalize divides by the reference's tokens. It takes the same test-set
flags as --evaluate and works with ensembles.

Everything but translations and scores goes to stderr. Exit status: 0 on success, 1 for a bad
model directory or input (the message names the file and line), 2 for invalid flags; every
error is one line, and NMT_DEBUG=1 shows the traceback of an unexpected one.
This file parses arguments and streams lines; translating lives in
`transformer.translation`, scoring in `nmt.scoring`, the heatmap in `nmt.plotting`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import IO, Callable, Sequence

from tqdm import tqdm

from data.config import DataError
from data.lines import iter_lines, read_lines as read_text_lines, stream_chunks
from nmt import cli, recipes, scoring

log = logging.getLogger("translate.py")

EXIT_ERROR, EXIT_USAGE = 1, 2
DEFAULT_CHUNK_LINES = 1000


class UsageError(cli.UsageError):
    """Invalid flags or flag combination (exit status 2)."""


class InputError(cli.Fault):
    """Unreadable input, model or data (exit status 1); the message names what and where."""


PARTIAL_SUFFIX = ".partial"


class AtomicOutput:
    """A text file written as it goes into PATH.partial and moved onto PATH on success only."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.partial = self.path.with_name(self.path.name + PARTIAL_SUFFIX)
        self.handle: IO[str] | None = None

    def __enter__(self) -> IO[str]:
        self.handle = open(self.partial, "w", encoding="utf-8", newline="\n")
        return self.handle

    def __exit__(self, exc_type, exc, tb) -> None:
        assert self.handle is not None
        try:
            self.handle.close()
        except OSError:
            if exc_type is None:
                self.partial.unlink(missing_ok=True)
                raise
        if exc_type is None:
            os.replace(self.partial, self.path)
        else:
            self.partial.unlink(missing_ok=True)


def write_text_atomically(path: str | Path, text: str) -> None:
    with AtomicOutput(path) as out:
        out.write(text)


# ----------------------------------------------------------------------------- arguments


def build_parser() -> argparse.ArgumentParser:
    parser = cli.OneLineParser(
        prog="translate.py",
        description="Translate sentences (arguments, stdin or a file) with a trained "
                    "Transformer, or score a test set with sacreBLEU.",
        epilog="Search flags default to the values stored with the model. --nbest output: "
               "INDEX<TAB>SCORE<TAB>TRANSLATION, N lines per input line, best first, INDEX "
               "0-based.")
    parser.add_argument("sentences", nargs="*", metavar="SENTENCE",
                        help="sentences to translate; without any, read --input or stdin")
    parser.add_argument("--model", required=True, action="append",
                        help="run directory (uses its model/) or a model directory; give it "
                             "again for an ensemble, whose models average their next-token "
                             "probabilities (they must share the SentencePiece model)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"),
                        help="compute dtype (default: the model's)")
    io = parser.add_argument_group("input and output")
    io.add_argument("--input", help="file to translate, one sentence per line (- = stdin)")
    io.add_argument("--output", help="write translations here instead of stdout")
    io.add_argument("--batch-tokens", type=int, default=4096,
                    help="source tokens per batch, before dividing by the beam size "
                         "(default 4096)")
    io.add_argument("--chunk-lines", type=int, default=DEFAULT_CHUNK_LINES,
                    help="stdin: translate at most this many waiting lines per call "
                         f"(default {DEFAULT_CHUNK_LINES})")
    io.add_argument("-q", "--quiet", action="store_true", help="no progress bar or information")

    search = parser.add_argument_group("search (defaults: the model's stored settings)")
    recipes.add_section_flags(search, "search", exclude=("strategy",),
                              default_note="default: the model's")
    strategy = search.add_mutually_exclusive_group()
    strategy.add_argument("--greedy", action="store_true", help="greedy search")
    strategy.add_argument("--sample", action="store_true",
                          help="sample (see --temperature, --top-k, --seed)")
    search.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")

    plot = parser.add_argument_group("attention plot")
    plot.add_argument("--plot-attention", metavar="FILE.png",
                      help="save a heatmap of the encoder-decoder attention for the one "
                           "SENTENCE given")
    plot.add_argument("--attention-layer", type=int, default=-1,
                      help="decoder layer, 0-based, negative from the end (default -1: last)")
    plot.add_argument("--attention-head", type=int,
                      help="one head, 0-based (default: mean over heads)")

    ev = parser.add_argument_group("evaluation")
    ev.add_argument("--evaluate", action="store_true",
                    help="translate a test set and print BLEU and chrF")
    ev.add_argument("--src-file", help="source sentences, one per line")
    ev.add_argument("--ref-file", help="reference translations, aligned with --src-file")
    ev.add_argument("--test-prefix", help="read PREFIX.SRC and PREFIX.TGT")
    ev.add_argument("--test-file", help="pairs as .tsv, .jsonl or .parquet (every pair "
                                        "scored, empty ones too)")
    ev.add_argument("--src", help="source language code (default: the model's)")
    ev.add_argument("--tgt", help="target language code (default: the model's)")
    ev.add_argument("--dataset", help="Hugging Face dataset name or save_to_disk directory")
    ev.add_argument("--dataset-config", help="its configuration, e.g. de-en")
    ev.add_argument("--split", default="test", help="dataset split (default test)")
    ev.add_argument("--hyp-file", help="write the hypotheses here")
    ev.add_argument("--report", help="write scores, signatures and settings as JSON here")
    ev.add_argument("--bleu-tokenize", metavar="NAME",
                    help="sacreBLEU's BLEU tokenizer: 13a, intl, zh, ja-mecab, ko-mecab, char, "
                         "none, spm, flores101, flores200 (default: zh, ja-mecab or ko-mecab "
                         "for a Chinese, Japanese or Korean target, else 13a)")
    ev.add_argument("--score", action="store_true",
                    help="instead of translating, print log p(reference | source) of each pair "
                         "of the test set flags (force decoding), one line per pair")
    ev.add_argument("--normalize", action="store_true",
                    help="--score: divide by the reference's tokens (EOS included)")
    return parser


def check_args(args: argparse.Namespace) -> None:
    """Flag combinations argparse cannot express; raises UsageError."""
    for name in ("batch_tokens", "chunk_lines"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, "
                             f"got {getattr(args, name)}.")
    if args.input is not None and args.sentences:
        raise UsageError("give sentences as arguments or --input FILE, not both.")
    if args.plot_attention and len(args.sentences) != 1:
        raise UsageError("--plot-attention needs exactly one SENTENCE argument.")
    if args.plot_attention and len(args.model) > 1:
        raise UsageError("--plot-attention shows one model's attention; give one --model.")
    if args.evaluate and args.score:
        raise UsageError("--evaluate translates and --score does not: give one of them.")
    if args.normalize and not args.score:
        raise UsageError("--normalize only applies with --score.")
    if args.score:
        for flag in ("hyp_file", "report", "nbest", "plot_attention", "bleu_tokenize"):
            if getattr(args, flag):
                raise UsageError(f"--{flag.replace('_', '-')} does not apply with --score.")
    mode = "--evaluate" if args.evaluate else "--score" if args.score else None
    if mode:
        if args.sentences or args.input is not None:
            raise UsageError(f"{mode} reads --src-file/--ref-file, --test-prefix, "
                             "--test-file or --dataset, not sentences or --input.")
        sources = [bool(args.src_file or args.ref_file), bool(args.test_prefix),
                   bool(args.test_file), bool(args.dataset)]
        if sum(sources) != 1:
            raise UsageError(f"{mode} needs exactly one of: --src-file with --ref-file, "
                             "--test-prefix PREFIX, --test-file FILE, --dataset NAME.")
        if sources[0] and not (args.src_file and args.ref_file):
            raise UsageError(f"{mode} needs both --src-file and --ref-file.")
    else:
        for flag in ("src_file", "ref_file", "test_prefix", "test_file", "dataset", "hyp_file",
                     "report"):
            if getattr(args, flag):
                raise UsageError(f"--{flag.replace('_', '-')} only applies with --evaluate "
                                 "or --score.")
        if args.bleu_tokenize:
            raise UsageError("--bleu-tokenize only applies with --evaluate.")


def search_config(stored, args: argparse.Namespace):
    """The model's stored SearchConfig with the flags' overrides; ValueError if invalid."""
    changes = {name: value for name, (value, _) in recipes.from_args(args)["search"].items()}
    if args.greedy:
        changes["strategy"] = "greedy"
    elif args.sample:
        changes["strategy"] = "sample"
    elif args.beam is not None or args.nbest is not None:
        changes["strategy"] = "beam"
    strategy = changes.get("strategy", stored.strategy)
    if strategy != "beam":
        if args.nbest is not None and args.nbest > 1:
            raise ValueError(f"--nbest {args.nbest} needs beam search; drop --greedy/--sample.")
        changes.setdefault("nbest", 1)  # a stored n-best setting cannot apply
    if strategy != "sample" and (args.temperature is not None or args.top_k is not None):
        raise ValueError("--temperature and --top-k only apply with --sample.")
    return dataclasses.replace(stored, **changes)


def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file; InputError naming the file and line if unreadable."""
    try:
        return read_text_lines(path)
    except DataError as err:
        raise InputError(str(err)) from None


# ----------------------------------------------------------------------------- translating


def one_line(text: str) -> str:
    """A translation as one output line: byte-fallback pieces can decode to line breaks."""
    return text.replace("\r", " ").replace("\n", " ")


def format_hypotheses(results, first_index: int, nbest: bool) -> str:
    """Output text for `results` (n-best lists of consecutive lines from `first_index`)."""
    out = []
    for i, hypotheses in enumerate(results):
        if nbest:
            out.extend(f"{first_index + i}\t{h.score:.4f}\t{one_line(h.text)}\n"
                       for h in hypotheses)
        else:
            out.append(one_line(hypotheses[0].text) + "\n")
    return "".join(out)


def translate_lines(translator, lines: Sequence[str], where: str, first_line: int,
                    progress: Callable[[int], None] | None = None):
    """n-best lists for `lines`; warnings name `where` and the line numbers from `first_line`."""
    return translator.translate_nbest(lines, progress=progress, first_line=first_line,
                                      source=where)


def translate_chunks(translator, chunks, out: IO[str], where: str, nbest: bool,
                     progress: Callable[[int], None] | None = None) -> int:
    """Translate (first line number, lines) chunks, writing and flushing each; returns lines."""
    total = 0
    for first_line, lines in chunks:
        results = translate_lines(translator, lines, where, first_line, progress)
        out.write(format_hypotheses(results, first_line - 1, nbest))
        out.flush()
        total += len(lines)
    return total


def _progress_bar(total: int, quiet: bool):
    return tqdm(total=total, unit="sent", file=sys.stderr, disable=quiet or total <= 1,
                dynamic_ncols=True)


# ----------------------------------------------------------------------------- evaluation


def languages(args: argparse.Namespace, values: dict) -> tuple[str | None, str | None]:
    """(source, target) language codes: --src/--tgt, else those stored with the model."""
    src = args.src or values.get("source_lang") or values.get("data", {}).get("src")
    tgt = args.tgt or values.get("target_lang") or values.get("data", {}).get("tgt")
    return src, tgt


def bleu_settings(args: argparse.Namespace, values: dict) -> dict[str, str | None]:
    """`nmt.scoring.bleu_settings` for the target language; UsageError if the tokenizer is
    unknown or cannot run here (MeCab missing)."""
    try:
        return scoring.bleu_settings(languages(args, values)[1], args.bleu_tokenize)
    except scoring.MetricError as err:
        raise UsageError(f"--bleu-tokenize: {err}" if args.bleu_tokenize else str(err)) from None


def evaluation_data(args: argparse.Namespace, values: dict) -> tuple[list[str], list[str], str]:
    """(sources, references, description) of the test set named by the flags."""
    src, tgt = languages(args, values)
    if args.src_file:
        src_path, ref_path = args.src_file, args.ref_file
    elif args.test_prefix:
        if not (src and tgt):
            raise UsageError("--test-prefix needs --src and --tgt (the model does not "
                             "record its languages).")
        src_path, ref_path = f"{args.test_prefix}.{src}", f"{args.test_prefix}.{tgt}"
    elif args.test_file:
        return _test_file(args.test_file, src, tgt)
    else:
        return _dataset_split(args, src, tgt)
    sources, references = read_lines(src_path), read_lines(ref_path)
    if len(sources) != len(references):
        raise InputError(f"{src_path} has {len(sources)} lines but {ref_path} has "
                         f"{len(references)}; line N of one must translate line N of the other.")
    return sources, references, f"{src_path} -> {ref_path}"


def _test_file(path: str, src: str | None, tgt: str | None
               ) -> tuple[list[str], list[str], str]:
    """Every pair of a .tsv, .jsonl or .parquet test file, kept as written."""
    from data.corpus import read_file_texts  # loads `datasets`: only for these formats

    if Path(path).suffix.lower() != ".tsv" and not (src and tgt):
        raise UsageError(f"--test-file {path} needs --src and --tgt to pick its languages (the "
                         "model does not record them).")
    try:
        sources, references = read_file_texts(path, src, tgt)
    except DataError as err:
        raise InputError(str(err)) from None
    languages = f" {src}->{tgt}" if src and tgt else ""
    return sources, references, f"{path}{languages}"


def _dataset_split(args, src, tgt) -> tuple[list[str], list[str], str]:
    """Every pair of --split, kept as it is: an empty source gives an empty hypothesis that
    is scored against its reference, as with --src-file/--ref-file."""
    from data.corpus import read_hf_split  # loads `datasets`: only for datasets

    if not (src and tgt):
        raise UsageError("--dataset needs --src and --tgt (the model does not record its "
                         "languages).")
    try:
        sources, references, split = read_hf_split(args.dataset, args.dataset_config,
                                                   args.split, src, tgt)
    except DataError as err:
        raise InputError(str(err)) from None
    return sources, references, f"{args.dataset}[{split}] {src}->{tgt}"


def check_output_paths(args: argparse.Namespace) -> None:
    """InputError unless every output file can be created: a typo in --hyp-file must fail
    before the model is loaded, not throw away a finished evaluation."""
    for flag in ("output", "hyp_file", "report", "plot_attention"):
        value = getattr(args, flag)
        if not value:
            continue
        path, name = Path(value), "--" + flag.replace("_", "-")
        if path.is_dir():
            raise InputError(f"{name} {path}: is a directory; give a file name.")
        if not path.parent.is_dir():
            raise InputError(f"{name} {path}: directory {path.parent} does not exist; create "
                             "it or choose another path.")
        if not os.access(path if path.exists() else path.parent, os.W_OK):
            raise InputError(f"{name} {path}: not writable; choose another path.")


def run_evaluation(translator, args: argparse.Namespace, values: dict, out: IO[str],
                   test_set: tuple[list[str], list[str], str] | None = None,
                   bleu: dict[str, str | None] | None = None) -> dict:
    """Translate the test set (`test_set` if already read, else `evaluation_data`), print
    BLEU and chrF (`bleu`: `bleu_settings`, checked here unless given), then write
    --hyp-file and --report."""
    bleu = bleu or bleu_settings(args, values)  # before translating: MeCab may be missing
    sources, references, description = test_set or evaluation_data(args, values)
    log.info("evaluating on %s: %d sentences", description, len(sources))
    start = time.perf_counter()
    with _progress_bar(len(sources), args.quiet) as bar:
        results = translate_lines(translator, sources, args.src_file or description, 1,
                                  progress=bar.update)
    seconds = time.perf_counter() - start
    # Scored exactly as the sacrebleu command reads the files: trailing whitespace removed.
    hypotheses = [one_line(nbest[0].text).rstrip() for nbest in results]
    scores = scoring.evaluate(hypotheses, [r.rstrip() for r in references], **bleu)
    # Scores first: a file that cannot be written must not cost the evaluation.
    out.write(f"{scores.bleu_details}\n"
              f"chrF2 = {scores.chrf:.2f}\n"
              f"BLEU signature: {scores.bleu_signature}\n"
              f"chrF signature: {scores.chrf_signature}\n")
    out.flush()
    if args.hyp_file:
        write_text_atomically(args.hyp_file, "".join(h + "\n" for h in hypotheses))
    models = args.model[0] if len(args.model) == 1 else args.model  # a list: an ensemble
    report = {**scores.to_dict(), "test_set": description, "sentences": len(sources),
              "model": models, "search": dataclasses.asdict(translator.search),
              "translate_seconds": round(seconds, 3), "hyp_file": args.hyp_file}
    if args.report:
        write_text_atomically(args.report,
                              json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    log.info("translated %d sentences in %.2f s", len(sources), seconds)
    return report


def run_scoring(translator, args: argparse.Namespace, values: dict, out: IO[str],
                test_set: tuple[list[str], list[str], str] | None = None) -> None:
    """Print log p(reference | source) of every test pair, one line each, in order."""
    sources, references, description = test_set or evaluation_data(args, values)
    log.info("scoring the references of %s: %d pairs", description, len(sources))
    where = (args.src_file or f"{description} source", args.ref_file or f"{description} reference")
    with _progress_bar(len(sources), args.quiet) as bar:
        try:
            scores = translator.score(sources, references, progress=bar.update, where=where)
        except ValueError as err:  # a side too long to score without truncating it
            raise InputError(str(err)) from None
    out.write("".join(f"{logprob / tokens if args.normalize else logprob:.4f}\n"
                      for logprob, tokens in scores))
    out.flush()
    tokens = sum(n for _, n in scores)
    if tokens:
        per_token = sum(logprob for logprob, _ in scores) / tokens
        log.info("%d reference tokens (EOS included): %.4f nats per token, perplexity %.2f",
                 tokens, per_token, math.exp(-per_token))


# ----------------------------------------------------------------------------- attention plot


def save_attention_plot(model, tokenizer, translator, sentence: str, hypothesis,
                        args: argparse.Namespace) -> None:
    """Heatmap of the attention while the model, teacher-forced, reproduces `hypothesis`."""
    from nmt.plotting import cross_attention, plot_attention  # JAX: loaded after the checks

    config = model.config
    src_ids = tokenizer.encode([sentence])[0][: translator.max_source_len - 1] + [config.eos_id]
    out_ids = list(hypothesis.tokens) + [config.eos_id]
    weights = cross_attention(model, src_ids, out_ids, args.attention_layer,
                              args.attention_head)
    layer = args.attention_layer % config.decoder_layers
    heads = "mean over heads" if args.attention_head is None else f"head {args.attention_head}"
    path = plot_attention(weights, tokenizer.pieces(src_ids), tokenizer.pieces(out_ids),
                          args.plot_attention,
                          title=f"encoder-decoder attention, decoder layer {layer}, {heads}")
    log.info("attention plot written to %s", path)


# ----------------------------------------------------------------------------- main


def _setup_logging(quiet: bool) -> None:
    cli.setup_logging(logging.WARNING if quiet else logging.INFO,
                      "%(name)s: %(levelname)s: %(message)s",
                      ("absl", "jax", "jax._src", "datasets", "orbax", "checkpoint", "data"))


def enable_compilation_cache() -> None:
    """JAX's persistent cache: translate.py starts often, and every compiled search shape
    saves time on the next start."""
    from nmt.compilation import enable_compilation_cache as enable

    enable()


def load(args: argparse.Namespace):
    """(model, tokenizer, stored values, Translator) for the flags; InputError for a bad model
    directory, UsageError for search settings the model cannot take."""
    enable_compilation_cache()
    # JAX loads only now: argument and path errors above answer at once.
    from transformer.ensemble import load_models
    from transformer.model_dir import ModelDirError
    from transformer.translation import Translator

    start = time.perf_counter()
    try:
        model, tokenizer, values = load_models(args.model, dtype=args.dtype)
    except (ModelDirError, DataError) as err:
        raise InputError(str(err)) from None
    try:
        search = search_config(values["search"], args)
    except ValueError as err:
        raise UsageError(f"invalid search settings (--beam, --nbest, ...): {err}") from None
    if args.plot_attention:
        check_plot_settings(model, args)
    try:
        translator = Translator(model, tokenizer, search, batch_tokens=args.batch_tokens,
                                seed=args.seed)
    except ValueError as err:  # settings that only the loaded model can refuse (--top-k)
        raise UsageError(f"invalid search settings for this model: {err}") from None
    log.info("%s %s loaded in %.2f s; search: %s", "model" if len(args.model) == 1 else
             "ensemble of", ", ".join(args.model), time.perf_counter() - start,
             ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(search).items()))
    return model, tokenizer, values, translator


def check_plot_settings(model, args: argparse.Namespace) -> None:
    try:
        import matplotlib  # noqa: F401 - an optional dependency; say so before translating
    except ImportError:
        raise InputError("--plot-attention needs matplotlib: pip install matplotlib "
                         "(or pip install -e '.[plot]').") from None
    from nmt.plotting import check_layer_and_head  # JAX: loaded after the checks

    try:
        check_layer_and_head(model.config, args.attention_layer, args.attention_head)
    except ValueError as err:
        raise UsageError(f"--attention-layer/--attention-head: {err}") from None


def run(args: argparse.Namespace) -> int:
    check_args(args)
    # Check files before the slow model load, so a bad input or output path fails fast.
    check_output_paths(args)
    input_line_count = count_valid_lines(args.input) if args.input not in (None, "-") else None
    if args.input in (None, "-") and not args.sentences and not (args.evaluate or args.score):
        check_stdin()
    if not args.output and sys.stdout is None:
        raise InputError("standard output is closed: give --output FILE, or redirect it.")
    test_set = None
    if (args.evaluate or args.score) and (args.src_file or (args.src and args.tgt)):
        test_set = evaluation_data(args, {})  # else the languages come from the model
    model, tokenizer, values, translator = load(args)
    # Checked before --output is opened: a missing MeCab must not cost the file its contents.
    bleu = bleu_settings(args, values) if args.evaluate else None
    with contextlib.ExitStack() as stack:
        out = sys.stdout
        if args.output:
            out = stack.enter_context(AtomicOutput(args.output))
        if args.evaluate:
            run_evaluation(translator, args, values, out, test_set, bleu)
        elif args.score:
            run_scoring(translator, args, values, out, test_set)
        else:
            translate_input(translator, args, input_line_count, out, model, tokenizer)
    return 0


def count_valid_lines(path: str) -> int:
    """The number of lines of --input, every one checked to be UTF-8 (in constant memory)."""
    try:
        return sum(1 for _ in iter_lines(path))
    except DataError as err:
        raise InputError(str(err)) from None


def check_stdin() -> None:
    """InputError when there is no standard input to read (closed with `<&-`)."""
    try:
        if sys.stdin is None:
            raise OSError
        os.fstat(sys.stdin.fileno())
    except (OSError, ValueError):
        raise InputError("standard input is closed: give sentences as arguments, --input FILE, "
                         "or pipe text into translate.py.") from None


def file_chunks(path: str, chunk_lines: int):
    """(first line number, lines) of a file, `chunk_lines` at a time."""
    with open(path, "rb") as handle:
        yield from stream_chunks(handle.fileno(), chunk_lines, where=path)


def translate_input(translator, args: argparse.Namespace, input_line_count: int | None,
                    out: IO[str], model, tokenizer) -> None:
    """Translate the SENTENCE arguments, --input or stdin to `out`."""
    nbest = args.nbest is not None
    start = time.perf_counter()
    if args.sentences:
        results = translate_lines(translator, args.sentences, "argument", 1)
        out.write(format_hypotheses(results, 0, nbest))
        out.flush()
        count = len(args.sentences)
        if args.plot_attention:
            save_attention_plot(model, tokenizer, translator, args.sentences[0],
                                results[0][0], args)
    elif input_line_count is not None:
        with _progress_bar(input_line_count, args.quiet) as bar:
            count = translate_chunks(translator, file_chunks(args.input, args.chunk_lines), out,
                                     args.input, nbest, progress=bar.update)
    else:
        chunks = stream_chunks(sys.stdin.fileno(), args.chunk_lines)
        count = translate_chunks(translator, chunks, out, "<stdin>", nbest)
    seconds = time.perf_counter() - start
    log.info("translated %d line%s in %.3f s", count, "" if count == 1 else "s", seconds)


def main(argv: Sequence[str] | None = None) -> int:
    return cli.guarded("translate.py", lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.quiet)
    if sys.stdout is not None and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(encoding="utf-8", newline="\n")
    # SIGTERM unwinds like an error: --output's partial file is removed, OUT stays as it was.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        return run(args)
    except DataError as err:
        raise InputError(str(err)) from None
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, as Unix filters do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
