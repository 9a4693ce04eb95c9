"""translate.py's command line: `python translate.py --model runs/NAME [SENTENCE ...]`.

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

--input may be a pipe (`<(command)`, a FIFO, /dev/stdin): it is then read once, as stdin is,
without the checking pass and the progress bar.

--output OUT is written as the translations come, into a temporary of this run's own
(`nmt.runtime.files.atomic_file`), which replaces OUT only when every line is done: an
interrupted or failed run leaves the earlier OUT as it was, and if another run wrote OUT after
this one started, OUT is kept and this run's output is left beside it (exit status 1). An
output that is one of the input files is refused before anything is read.

Within a call, `nmt.models.translator.Translator` sorts sentences by length into batches of
at most --batch-tokens source tokens and restores input order. An empty line gives an empty
line; a line longer than the model allows is truncated with a warning naming its line number.

With --nbest N each input line gives up to N lines, best first (fairseq/Marian style); fewer
where the search found fewer hypotheses (an output limit of one token leaves EOS alone):

    INDEX<TAB>SCORE<TAB>TRANSLATION

INDEX is the 0-based input line number (Moses/Marian convention), SCORE the search score
(beam search: log-probability divided by the length penalty, GNMT's unless
--length-penalty power; greedy and sampling: log-probability).

Each input line is a paragraph of any length (--split-sentences, on by default): it is cut into
sentences (`nmt.translation.paragraphs`: sentencex's rules for the language of --src, else the
model's source language, else English), the sentences of a chunk are translated in one call,
and each line is joined back from their translations with its whitespace as it was: still one
output line per input line. Truncation and output-limit warnings name the input line. It gives
one translation per line, so it is off with --nbest, --score and --plot-attention (and
refused with them when asked for); --no-split-sentences translates each line as one segment.
--evaluate scores the best hypothesis of each line (fairseq-generate's rule), so there --nbest
changes only the search, never whether lines are split.
--html reads the input as one HTML page (whole, before translating it: a <script>, comment or
translate="no" element may span lines) and does the same for it line by line: every tag is
kept, text is cut at block tags and line breaks, and inline tags (<b>, <a href>, <span>...) go
back around the words they enclosed, by the model's alignment
(`nmt.translation.inline_markup`).

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
flags as --evaluate and works with ensembles; it searches nothing, and refuses the search flags
(--shortlist included: each reference is scored over the whole vocabulary).

Everything but translations and scores goes to stderr. Exit status: 0 on success, 1 for a bad
model directory or input (the message names the file and line), 2 for invalid flags, values
(NaN and infinity, checked before the model loads) and output paths; every error is one line,
and NMT_DEBUG=1 shows the traceback of an unexpected one.
This module parses and checks the flags, loads the model and hands the work on: reading and
writing lines to `nmt.translation.streams`, test sets to `nmt.translation.evaluation`,
translating to `nmt.models.translator`, the heatmap to `nmt.translation.plotting`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Sequence

from data.config import INFERENCE_BATCH_TOKENS, DataError
from nmt.engines import COMPUTE_TYPES, CTRANSLATE2_INSTALL, ENGINES, searches_beyond_threads
from nmt.runtime import cli
from nmt.runtime.cli import UsageError
from nmt.runtime.files import atomic_file
from nmt.runtime.line_output import LineOutput
from nmt.settings import recipes
from nmt.translation import evaluation, streams
from nmt.translation.errors import InputError
from transformer.config import MAX_SEED, check_finite
from transformer.strategies import Beam, Sample, TopKTooLarge, strategy_kind

log = logging.getLogger("translate.py")

EXIT_USAGE = 2
# The reader of stdout went away (`| head`): the status a shell gives a filter that SIGPIPE
# killed (cat, fairseq, Marian), told apart from a fault; translate.py stops quietly.
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
DEFAULT_CHUNK_LINES = 1000
MAX_ENGINE_THREADS = 256  # --threads, and CTranslate2's --searches: past it, only memory grows


def build_parser() -> argparse.ArgumentParser:
    parser = cli.OneLineParser(
        prog="translate.py",
        description="Translate sentences (arguments, stdin or a file) with a trained "
                    "Transformer, or score a test set with sacreBLEU.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog="""\
examples:
  python translate.py --model runs/NAME/averaged "A man rides a bicycle."
  python translate.py --model runs/NAME/averaged < input.en > output.de
  python translate.py --model runs/NAME/averaged --evaluate \\
      --test-prefix data/multi30k/test2016 --src en --tgt de

Search flags default to the values stored with the model. --nbest output:
INDEX<TAB>SCORE<TAB>TRANSLATION, up to N lines per input line, best first,
INDEX 0-based.""")
    parser.add_argument("sentences", nargs="*", metavar="SENTENCE",
                        help="sentences to translate; without any, read --input or stdin")
    parser.add_argument("--model", required=True, action="append",
                        help="run directory (uses its model/) or a model directory; give it "
                             "again for an ensemble, whose models average their next-token "
                             "probabilities (they must share the SentencePiece model)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"),
                        help="compute dtype (default: the model's; --engine jax)")
    add_engine_flags(parser.add_argument_group("engine"))
    _add_input_output_flags(parser.add_argument_group("input and output"))
    search = parser.add_argument_group("search (defaults: the model's stored settings)")
    add_search_flags(search)
    search.add_argument("--shortlist", type=int, metavar="K",
                        help="search each batch over K candidate target tokens chosen for its "
                             "sources from the model's shortlist.npz (built by python -m "
                             "nmt.distillation.shortlist) instead of the whole vocabulary: "
                             "faster, nearly the same translations")
    _add_plot_flags(parser.add_argument_group("attention plot"))
    _add_evaluation_flags(parser.add_argument_group("evaluation"))
    return parser


def add_engine_flags(engine) -> None:
    """--engine and what only CTranslate2 reads (shared with the server)."""
    engine.add_argument("--engine", choices=ENGINES, default="jax",
                        help="what searches: jax (default; exact, on every device JAX runs) "
                             "or ctranslate2 (the model converted on first use and cached; "
                             "int8 on CPUs, starts without JAX; needs "
                             f"{CTRANSLATE2_INSTALL})")
    engine.add_argument("--compute-type", metavar="TYPE",
                        help=f"--engine ctranslate2: {', '.join(COMPUTE_TYPES[1:])} or auto "
                             "(default: auto, the fastest this device runs)")
    engine.add_argument("--threads", type=int,
                        help="--engine ctranslate2: CPU threads in all, shared by the "
                             "--searches batches translated at once (default: every core)")


def _add_input_output_flags(io) -> None:
    io.add_argument("--input", help="file to translate, one sentence per line (- = stdin)")
    io.add_argument("--output", help="write translations here instead of stdout (- = stdout; "
                                     "a file is replaced whole once every line is done)")
    io.add_argument("--batch-tokens", type=int, default=INFERENCE_BATCH_TOKENS,
                    help="source tokens per batch, before dividing by the beam size "
                         f"(default {INFERENCE_BATCH_TOKENS})")
    io.add_argument("--searches", type=int,
                    help="batches searched at once, each on its own thread (default 2 on a "
                         "CPU, where one batch keeps only part of the cores busy; 1 on a GPU "
                         "or TPU; with --engine ctranslate2, its inter_threads: 2 where there "
                         "are 2 cores or more)")
    io.add_argument("--chunk-lines", type=int, default=DEFAULT_CHUNK_LINES,
                    help="translate at most this many lines per call: the waiting lines of "
                         "stdin, the chunks --input is read in "
                         f"(default {DEFAULT_CHUNK_LINES})")
    io.add_argument("--split-sentences", action=argparse.BooleanOptionalAction, default=None,
                    help="treat each input line as a paragraph: translate its sentences (split "
                         "with sentencex for the source language: --src, else the model's, "
                         "else en) and join them back into one output line, whitespace kept "
                         "(default: on, --evaluate included, with or without --nbest; off "
                         "with --nbest, --score and --plot-attention otherwise, which give "
                         "each line's own results)")
    io.add_argument("--html", action="store_true",
                    help="read the input as one HTML page, translated line for line as "
                         "--split-sentences does text: every "
                         "tag kept, the text between block tags translated sentence by "
                         "sentence, inline tags (<b>, <a>, ...) put back around the words "
                         "they enclosed by the model's alignment")
    io.add_argument("-q", "--quiet", action="store_true", help="no progress bar or information")


def add_search_flags(search) -> None:
    """SearchConfig's fields as flags (`nmt.settings.recipes`), and the strategy switches."""
    recipes.add_section_flags(search, "search", exclude=("strategy",),
                              default_note="default: the model's")
    strategy = search.add_mutually_exclusive_group()
    strategy.add_argument("--greedy", action="store_true", help="greedy search")
    strategy.add_argument("--sample", action="store_true",
                          help="sample (see --temperature, --top-k, --seed)")
    search.add_argument("--seed", type=cli.seed, default=0,
                        help=f"sampling seed, 0 to {MAX_SEED} (default 0)")


def _add_plot_flags(plot) -> None:
    plot.add_argument("--plot-attention", metavar="FILE.png",
                      help="save a heatmap of the encoder-decoder attention for the one "
                           "SENTENCE given")
    plot.add_argument("--attention-layer", type=int, default=-1,
                      help="decoder layer, 0-based, negative from the end (default -1: last)")
    plot.add_argument("--attention-head", type=int,
                      help="one head, 0-based (default: mean over heads)")


class _OneReference(argparse.Action):
    """--ref-file given twice is refused: sacrebleu users would read it as two references,
    and argparse would silently score against the last one only."""

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        del option_string  # argparse passes it; the message names the flag itself
        if getattr(namespace, self.dest, None) is not None:
            parser.error(f"--ref-file is given twice ({getattr(namespace, self.dest)}, {value}); "
                         "scores use one reference file: give one")
        setattr(namespace, self.dest, value)


def _add_evaluation_flags(ev) -> None:
    ev.add_argument("--evaluate", action="store_true",
                    help="translate a test set and print BLEU and chrF")
    ev.add_argument("--src-file", help="source sentences, one per line (- = stdin)")
    ev.add_argument("--ref-file", action=_OneReference,
                    help="reference translations, aligned with --src-file (- = stdin)")
    ev.add_argument("--test-prefix", help="read PREFIX.SRC and PREFIX.TGT")
    ev.add_argument("--test-file", help="pairs as .tsv, .jsonl or .parquet (every pair "
                                        "scored, empty ones too)")
    ev.add_argument("--src", type=cli.given, help="source language code (default: the model's)")
    ev.add_argument("--tgt", type=cli.given, help="target language code (default: the model's)")
    ev.add_argument("--dataset", help="Hugging Face dataset name or save_to_disk directory")
    ev.add_argument("--dataset-config", type=cli.given, help="its configuration, e.g. de-en")
    ev.add_argument("--split", type=cli.given, help="dataset split (default test)")
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


def check_args(args: argparse.Namespace) -> None:
    """Flag combinations argparse cannot express; raises UsageError."""
    streams.check_no_empty_paths(args)  # before the checks that read "" as not given
    check_engine_args(args)
    _check_numbers(args)
    _check_inputs(args)
    _check_scoring(args)


def _check_numbers(args: argparse.Namespace) -> None:
    """Counts at least 1, search settings finite."""
    for name in ("batch_tokens", "chunk_lines", "searches", "shortlist"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, "
                             f"got {getattr(args, name)}.")
    for name, (value, origin) in recipes.from_args(args)["search"].items():
        try:  # the rest needs the model's stored settings; NaN and infinity need nothing
            check_finite("SearchConfig", {name: value})
        except ValueError as err:
            raise UsageError(f"{origin}: {name_flags(str(err))} Give a finite number, or leave "
                             "the flag out to use the model's setting.") from None


def _check_inputs(args: argparse.Namespace) -> None:
    """Where the sentences come from and what each line gives; sets --split-sentences's
    default."""
    if args.input is not None and args.sentences:
        raise UsageError("give sentences as arguments or --input FILE, not both.")
    for number, sentence in enumerate(args.sentences, 1):
        try:
            sentence.encode("utf-8")
        except UnicodeEncodeError as err:  # bytes the locale could not decode: surrogates
            raise UsageError(f"sentence argument {number} is not valid UTF-8 (byte "
                             f"{ord(sentence[err.start]) - 0xDC00:#04x} at character "
                             f"{err.start + 1}); give UTF-8 text, or use --input FILE") from None
    if args.plot_attention and len(args.sentences) != 1:
        raise UsageError("--plot-attention needs exactly one SENTENCE argument.")
    if args.plot_attention and len(args.model) > 1:
        raise UsageError("--plot-attention shows one model's attention; give one --model.")
    if args.plot_attention:
        from nmt.translation.plotting import check_plot_path

        check_plot_path(args.plot_attention)
    if args.html and args.split_sentences is False:
        raise UsageError("--html cuts the page's text at its block tags and into sentences; "
                         "--no-split-sentences does not apply with it.")
    # --evaluate scores the best of each n-best list (as fairseq-generate does): --nbest
    # leaves its lines split as they would be without it.
    nbest_lines = bool(args.nbest) and not args.evaluate
    if args.split_sentences or args.html:
        mode = "--html" if args.html else "--split-sentences"
        given = {"nbest": nbest_lines, "score": args.score,
                 "plot_attention": args.plot_attention, "evaluate": args.html and args.evaluate}
        if refused := [flag for flag, on in given.items() if on]:
            raise UsageError(f"{mode} gives one translation per input line and does not "
                             f"apply with --{refused[0].replace('_', '-')}.")
    if args.split_sentences is None:  # on, unless a mode gives each line's own results
        args.split_sentences = not (nbest_lines or args.score or args.plot_attention)


def _check_scoring(args: argparse.Namespace) -> None:
    """--evaluate and --score: one at a time, with exactly one test set; their flags alone
    without them are refused."""
    if args.evaluate and args.score:
        raise UsageError("--evaluate translates and --score does not: give one of them.")
    if args.normalize and not args.score:
        raise UsageError("--normalize only applies with --score.")
    if args.score:
        for flag in ("hyp_file", "report", "plot_attention", "bleu_tokenize"):
            if getattr(args, flag):
                raise UsageError(f"--{flag.replace('_', '-')} does not apply with --score.")
        if search_flags := search_flags_given(args):
            raise UsageError(f"{search_flags[0]} does not apply with --score, which scores each "
                             "reference over the whole vocabulary without searching; drop it.")
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
        if args.src_file == "-" and args.ref_file == "-":
            raise UsageError("--src-file - and --ref-file - would both read standard input; "
                             "give one of them as a file.")
        if args.test_file == "-":  # its format is chosen by its suffix: stdin has none
            raise UsageError("--test-file reads a .tsv, .jsonl or .parquet file, chosen by its "
                             "suffix, and cannot read standard input; give --src-file - with "
                             "--ref-file FILE, or save the pairs to a file.")
        for flag in ("dataset_config", "split"):
            if getattr(args, flag) and not args.dataset:
                raise UsageError(f"--{flag.replace('_', '-')} names a part of a --dataset, and "
                                 "none is given; add --dataset NAME or drop it.")
    else:
        for flag in ("src_file", "ref_file", "test_prefix", "test_file", "dataset",
                     "dataset_config", "split", "hyp_file", "report"):
            if getattr(args, flag):
                raise UsageError(f"--{flag.replace('_', '-')} only applies with --evaluate "
                                 "or --score.")
        if args.bleu_tokenize:
            raise UsageError("--bleu-tokenize only applies with --evaluate.")


def check_engine_args(args: argparse.Namespace, ensembles: bool = True) -> None:
    """Flags only one engine reads, refused with the other (UsageError). `ensembles`: whether
    several --model flags make an ensemble (translate.py), not several pairs (the server)."""
    if args.threads is not None and not 1 <= args.threads <= MAX_ENGINE_THREADS:
        raise UsageError(f"--threads must be 1 to {MAX_ENGINE_THREADS}, got {args.threads}.")
    if (args.engine == "ctranslate2" and args.searches is not None
            and args.searches > MAX_ENGINE_THREADS):
        raise UsageError(f"--searches {args.searches}: CTranslate2 translates at most "
                         f"{MAX_ENGINE_THREADS} batches at once (each is a translator with "
                         "buffers of its own); give fewer.")
    if args.engine == "ctranslate2" and args.searches is not None and args.searches > 1:
        if (refusal := searches_beyond_threads(args.searches, args.threads)) is not None:
            raise UsageError(refusal)
        if args.sample:
            raise UsageError(f"--searches {args.searches} with --sample: CTranslate2 samples "
                             "one batch at a time (its random stream is one per process, so "
                             "that --seed reproduces a run); drop --searches, or use --engine "
                             "jax.")
    if args.engine == "jax":
        for flag in ("compute_type", "threads"):
            if getattr(args, flag) is not None:
                raise UsageError(f"--{flag.replace('_', '-')} applies to --engine ctranslate2; "
                                 "JAX's compute type is --dtype")
        return
    refused = {"dtype": "give --compute-type (CTranslate2's types)",
               "shortlist": "the shortlist is searched by --engine jax",
               "plot_attention": "the attention plot needs --engine jax"}
    for flag, fix in refused.items():
        if getattr(args, flag, None):
            raise UsageError(f"--{flag.replace('_', '-')} does not apply with --engine "
                             f"ctranslate2: {fix}.")
    if ensembles and len(args.model) > 1:
        raise UsageError("--engine ctranslate2 translates with one model: CTranslate2 has no "
                         "ensembles; give one --model, or --engine jax for an ensemble.")


def engine_compute_type(args: argparse.Namespace) -> str:
    """--compute-type as given (an empty one is refused as unknown), else auto."""
    return "auto" if args.compute_type is None else args.compute_type


def given_search_fields(args: argparse.Namespace) -> frozenset[str]:
    """The SearchConfig fields the flags set (the rest are the model's)."""
    given = set(recipes.from_args(args)["search"])
    if args.greedy or args.sample or args.beam is not None or args.nbest is not None:
        given.add("strategy")
    return frozenset(given)


def search_flags_given(args: argparse.Namespace) -> list[str]:
    """The search flags given (--beam, --greedy, --shortlist...), in the order of --help:
    what --score, which searches nothing, refuses rather than ignores."""
    flags = [source.split()[0] for _, source in recipes.from_args(args)["search"].values()]
    return flags + [f"--{name}" for name in ("greedy", "sample", "shortlist")
                    if getattr(args, name)]


def search_config(stored, args: argparse.Namespace):
    """The model's stored SearchConfig with the flags' overrides; ValueError if invalid."""
    changes = {name: value for name, (value, _) in recipes.from_args(args)["search"].items()}
    if args.greedy:
        changes["strategy"] = "greedy"
    elif args.sample:
        changes["strategy"] = "sample"
    elif args.beam is not None or args.nbest is not None:
        changes["strategy"] = "beam"
    kind = strategy_kind(changes.get("strategy", stored.strategy))
    if kind is not Beam:
        if args.nbest is not None and args.nbest > 1:
            raise ValueError(f"--nbest {args.nbest} needs beam search; drop --greedy/--sample.")
        if args.beam is not None and args.beam > 1:
            raise ValueError(f"--beam {args.beam} needs beam search; drop --greedy/--sample.")
        changes.setdefault("nbest", 1)  # a stored n-best setting cannot apply
    if kind is not Sample and (args.temperature is not None or args.top_k is not None):
        raise ValueError("--temperature and --top-k only apply with --sample.")
    return dataclasses.replace(stored, **changes)


def name_flags(message: str) -> str:
    """A SearchConfig error with each `SearchConfig.field` named by its flag, e.g. --beam."""
    for field in recipes.FIELDS:
        if field.section == "search":
            message = message.replace(f"SearchConfig.{field.name}", field.flag)
    return message


def _setup_logging(quiet: bool) -> None:
    # Every line names the command, whichever module logs it (the translator, the readers).
    cli.setup_logging(logging.WARNING if quiet else logging.INFO,
                      "translate.py: %(levelname)s: %(message)s",
                      ("absl", "jax", "jax._src", "datasets", "orbax", "checkpoint", "data"))


def enable_compilation_cache() -> None:
    """JAX's persistent cache: translate.py starts often, and every compiled search shape
    saves time on the next start."""
    from nmt.runtime.compilation import enable_compilation_cache as enable

    enable()


def load(args: argparse.Namespace):
    """(model, tokenizer, stored values, Translator) for the flags; InputError for a bad model
    directory, UsageError for search settings the model cannot take."""
    if args.engine == "ctranslate2":
        return load_ctranslate2(args)
    cli.check_jax_platforms()
    enable_compilation_cache()
    # JAX loads only now: argument and path errors above answer at once.
    from nmt.models.model_dir import ModelDirError, load_models
    from nmt.models.translator import Translator, default_searches

    start = time.perf_counter()
    try:
        model, tokenizer, values = load_models(args.model, dtype=args.dtype)
    except (ModelDirError, DataError) as err:
        raise InputError(str(err)) from None
    try:
        search = search_config(values["search"], args)
    except ValueError as err:
        raise UsageError(f"invalid search settings: {name_flags(str(err))}") from None
    if args.plot_attention:
        from nmt.translation.plotting import check_plot_settings  # matplotlib, JAX

        check_plot_settings(model, args)
    shortlist = (read_shortlist(args.model[0], tokenizer) if args.shortlist is not None
                 else None)
    try:
        translator = Translator(model, tokenizer, search, batch_tokens=args.batch_tokens,
                                seed=args.seed, searches=args.searches or default_searches(),
                                shortlist=shortlist, shortlist_size=args.shortlist or 0)
    except ValueError as err:  # settings only the loaded model can refuse (--top-k, --shortlist)
        raise refused_by_this_model(err, args) from None
    log.info("%s %s loaded in %.2f s; search: %s", "model" if len(args.model) == 1 else
             "ensemble of", ", ".join(args.model), time.perf_counter() - start,
             ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(search).items()))
    log.info(cli.allocator_status().line)
    return model, tokenizer, values, translator


def refused_by_this_model(err: ValueError, args: argparse.Namespace) -> UsageError:
    """A search setting the loaded model refuses (a top-k beyond its vocabulary, a beam its
    memory cannot hold), named as the user knows it: by its flag, or the model's stored top_k
    (library callers read SearchConfig's field names)."""
    message = name_flags(str(err))
    if isinstance(err, TopKTooLarge):
        message = err.naming("--top-k" if args.top_k is not None else "the model's stored top_k")
    return UsageError(f"invalid search settings for this model: {message}")


def read_shortlist(path: str, tokenizer):
    """The model's stored shortlist (--shortlist); InputError if it has none or a bad one."""
    from nmt.models.model_files import ModelDirError, read_shortlist as read

    try:
        return read(path, tokenizer)
    except ModelDirError as err:
        raise InputError(str(err)) from None


def load_ctranslate2(args: argparse.Namespace):
    """`load` for --engine ctranslate2: no model in this process (None), and no JAX."""
    from nmt.engines.ctranslate2 import EngineError, MissingEngine, open_translator
    from nmt.models.model_files import ModelDirError

    start = time.perf_counter()

    def search_for(stored):
        try:
            return search_config(stored, args)
        except ValueError as err:
            raise UsageError(f"invalid search settings: {name_flags(str(err))}") from None

    try:
        translator, values = open_translator(
            args.model[0], search_for, given=given_search_fields(args),
            compute_type=engine_compute_type(args), threads=args.threads or 0,
            searches=args.searches or 0, batch_tokens=args.batch_tokens, seed=args.seed)
    except (ModelDirError, DataError) as err:
        raise InputError(str(err)) from None
    except EngineError as err:
        raise UsageError(str(err)) from None
    except TopKTooLarge as err:
        raise refused_by_this_model(err, args) from None
    except MissingEngine as err:
        raise InputError(str(err)) from None
    log.info("model %s loaded in %.2f s on %s; search: %s", args.model[0],
             time.perf_counter() - start, translator.describe(),
             ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(translator.search).items()))
    return None, translator.tokenizer, values, translator


def run(args: argparse.Namespace) -> int:
    """Check the flags and files, load the model, then translate, evaluate or score."""
    if args.output == "-":
        args.output = None  # stdout, as --input - is stdin
    check_args(args)
    # Check files before the slow model load, so a bad input or output path fails fast.
    outputs_at_start = streams.check_output_paths(args)
    reads_file = args.input not in (None, "-")
    input_line_count = streams.count_valid_lines(args.input) if reads_file else None
    if args.input in (None, "-") and not args.sentences and not (args.evaluate or args.score):
        streams.check_stdin()
    if not args.output and sys.stdout is None:
        raise InputError("standard output is closed: give --output FILE, or redirect it.")
    test_set = _test_set_before_loading(args)
    for path in args.model:  # a path that is not there is the user's to fix (exit status 2)
        if not Path(path).exists():
            raise UsageError(f"--model {path}: no such directory; give a run directory "
                             "(runs/NAME) or a model directory (runs/NAME/averaged).")
    model, tokenizer, values, translator = load(args)
    cli.done_starting()
    evaluation.check_languages(args, values)
    # Checked before --output is opened: a missing MeCab must not cost the file its contents.
    bleu = evaluation.bleu_settings(args, values) if args.evaluate else None
    with contextlib.ExitStack() as stack:
        out = LineOutput(sys.stdout, "standard output")
        if args.output:
            out = LineOutput(stack.enter_context(atomic_file(args.output,
                                                             since=outputs_at_start["output"])),
                             args.output)
        reached_limit = []
        if args.evaluate:
            _, reached_limit = evaluation.run_evaluation(translator, args, values, out,
                                                         test_set, bleu, outputs_at_start)
        elif args.score:
            evaluation.run_scoring(translator, args, values, out, test_set)
        else:
            reached_limit = streams.translate_input(translator, args, input_line_count, out,
                                                    model, tokenizer,
                                                    paragraphs(args, values))
    warn_reached_limit(translator, reached_limit)
    return 0


def _test_set_before_loading(args: argparse.Namespace) -> tuple | None:
    """--evaluate's or --score's test set, read before the model loads wherever its languages
    are known without it: from the flags, or from the model's config.json (its weights
    unread). None where neither tells (the model's files are then read, and named, by
    `load`)."""
    if not (args.evaluate or args.score):
        return None
    if args.src_file or (args.src and args.tgt):
        return evaluation.evaluation_data(args, {})
    from nmt.models.model_files import ModelDirError, read_model_files

    try:
        values = read_model_files(args.model[0])[2]
    except (ModelDirError, DataError, OSError):
        return None
    return evaluation.evaluation_data(args, values)


def paragraphs(args: argparse.Namespace, values: dict) -> streams.Paragraphs | None:
    """How --split-sentences and --html cut lines: for --src, the model's source language,
    else en (English rules also suit most languages written with spaces and ".!?"); and
    join them with the spaces between sentences of --tgt, else the model's target."""
    if not (args.split_sentences or args.html):
        return None
    source, target = evaluation.languages(args, values)
    language = source or "en"
    log.info("%s: lines are split into sentences for language %r",
             "--html" if args.html else "--split-sentences", language)
    return streams.Paragraphs(language, args.html, target)


def warn_reached_limit(translator, lines: list[int], logger: logging.Logger = log) -> None:
    """One warning for every translation whose search reached its output limit (`lines`,
    one per translation): it is kept, and ends where EOS was forced. The distillation
    warns through its own `logger`."""
    if not lines:
        return
    shown_lines = sorted(set(lines))  # --split-sentences: a line's sentences
    search = translator.search
    shown = ", ".join(str(n) for n in shown_lines[:10]) + (", ..." if len(shown_lines) > 10
                                                            else "")
    logger.warning("%d translation(s) reached the output limit (%g x source tokens + %d, at "
                   "most %d tokens with EOS) and end where EOS was forced there: line(s) %s; "
                   "--max-len-a and --max-len-b raise the limit", len(lines), search.max_len_a,
                   search.max_len_b, translator.model_config.max_len, shown)


def main(argv: Sequence[str] | None = None) -> int:
    """translate.py: its exit status (0, 1 for a fault, 2 for a mistake in the flags)."""
    return cli.guarded("translate.py", lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    cli.allocator_status()  # a bad NMT_ALLOCATOR ends here; the line is logged with the model
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
        return EXIT_BROKEN_PIPE
    finally:
        signal.signal(signal.SIGTERM, previous)


