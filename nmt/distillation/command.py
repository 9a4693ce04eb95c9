"""python -m nmt.distillation: sequence-level knowledge distillation (Kim and Rush 2016).

A teacher (one model, or an ensemble of several sharing a SentencePiece model) translates
the source side of a training corpus with beam search; a student then trains on the
teacher's translations instead of the references:

    python -m nmt.distillation --teacher runs/teacher/averaged \\
        --train-prefix data/multi30k/train --src en --tgt de --out data/multi30k-distilled
    python train.py --config configs/multi30k_student.yaml

OUT receives train.SRC and train.TGT, aligned line for line (with --keep-original, the
original pairs come first, then the distilled ones). A source line longer than the teacher's
positions is left out of the distilled pairs, and all such lines are counted in one warning:
the teacher would translate its start only, and a student trained on the pair would learn to
leave the rest of a long sentence untranslated. The work is saved
chunk by chunk: after an interruption the same command continues where it stopped, and once
finished it answers at once. A directory holding a distillation of other teachers, another
corpus, other search settings or (when sampling) another --seed is refused.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import logging
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from data.arrow_text import file_digest
from data.config import DataError
from data.lines import count_lines, iter_lines
from nmt.distillation.output import DistillationDir, OtherDistillation, Recipe, search_recipe
from nmt.rundir.lock import LockingUnsupported, RunDirectoryInUse
from nmt.runtime import cli
from nmt.runtime.cli import UsageError
from nmt.runtime.progress import LineCounter
from nmt.translation.command import (
    add_search_flags,
    name_flags,
    search_config,
    warn_reached_limit,
)
from nmt.translation.errors import InputError
from nmt.translation.streams import count_valid_lines
from transformer.strategies import plan_search

PROG = "python -m nmt.distillation"
log = logging.getLogger("distillation")

# Sentences translated and saved at a time: what an interruption can cost.
DEFAULT_CHUNK_LINES = 8192


def build_parser() -> argparse.ArgumentParser:
    parser = cli.OneLineParser(
        prog=PROG, description=__doc__.split("\n\n")[0],
        epilog="Search flags default to the first teacher's stored settings. Set "
               f"{cli.DEBUG_VARIABLE}=1 for a traceback on errors.")
    # A blank path or language would read as one left out, or as the current directory.
    parser.add_argument("--teacher", required=True, action="append", metavar="MODEL",
                        type=cli.given,
                        help="model or run directory; give it again for an ensemble teacher "
                             "(the models average their next-token probabilities)")
    parser.add_argument("--train-prefix", required=True, metavar="PREFIX", type=cli.given,
                        help="the corpus to distil: PREFIX.SRC (and PREFIX.TGT with "
                             "--keep-original)")
    parser.add_argument("--src", type=cli.given, help="source language (default: the teacher's)")
    parser.add_argument("--tgt", type=cli.given, help="target language (default: the teacher's)")
    parser.add_argument("--out", required=True, metavar="DIR", type=cli.given,
                        help="output directory: new, empty, or this command's earlier output")
    parser.add_argument("--keep-original", action="store_true",
                        help="the student also trains on the original pairs (written before "
                             "the distilled ones)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"),
                        help="the teacher's compute dtype (default: its own)")
    parser.add_argument("--batch-tokens", type=int, default=4096,
                        help="source tokens per batch, before dividing by the beam size "
                             "(default 4096)")
    parser.add_argument("--chunk-lines", type=int, default=DEFAULT_CHUNK_LINES,
                        help="sentences translated and saved at a time: what an interruption "
                             f"can cost (default {DEFAULT_CHUNK_LINES})")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    add_search_flags(parser.add_argument_group("search (defaults: the teacher's settings)"))
    return parser


@dataclasses.dataclass
class Teachers:
    """The teacher models' directories, what they store, and their checksums."""

    paths: list[str]
    values: dict   # the first teacher's stored settings
    checksums: tuple[str, ...]
    dtypes: str    # the stored dtypes they compute in, each once, "+"-joined


def read_teachers(paths: list[str], src: str | None, tgt: str | None) -> tuple[Teachers, str,
                                                                                 str]:
    """The teachers' files (not their parameters) and the languages to distil: InputError
    for a bad directory, UsageError for languages that differ from the flags or between
    teachers, or for teachers of different SentencePiece models, naming both (found here,
    before --out is claimed, rather than when the ensemble loads)."""
    from nmt.engines.conversions import model_checksum
    from nmt.models.model_files import ModelDirError, read_model_files, stored_languages

    checksums, first_values, fingerprint, dtypes, pairs = [], None, None, {}, {}
    for path in paths:
        try:
            model_dir, tokenizer, values = read_model_files(path)
        except (ModelDirError, DataError) as err:
            raise InputError(str(err)) from None
        if fingerprint is not None and tokenizer.fingerprint != fingerprint:
            raise UsageError(f"--teacher {path} has another SentencePiece model than --teacher "
                             f"{paths[0]}; an ensemble's teachers share one spm.model.")
        fingerprint = tokenizer.fingerprint
        pairs[path] = stored_languages(values)
        first_values = first_values or values
        checksums.append(model_checksum(model_dir, list(tokenizer.files())))
        dtypes[values["model"].dtype] = None
    languages, owners = merged_languages(pairs)
    src, tgt = languages_to_use(src, tgt, languages,
                                tuple(f"--teacher {owner or paths[0]}" for owner in owners),
                                "distil with a teacher of the corpus's pair")
    if src == tgt:  # a model that copies or rewrites its language
        raise UsageError(f"source and target are both {src!r}: the distilled corpus's two "
                         f"files would be one, train.{src}; give other --src or --tgt codes.")
    return Teachers(paths, first_values, tuple(checksums), "+".join(dtypes)), src, tgt


def merged_languages(pairs: dict[str, tuple[str | None, str | None]]
                     ) -> tuple[tuple[str | None, str | None], tuple[str | None, str | None]]:
    """(source, target) that the teachers store, each side from the first teacher storing it,
    and (the teacher of each side, None where none stores it): a teacher storing no languages
    must not hide a later one's. UsageError for a teacher contradicting an earlier one,
    naming both."""
    languages: list[str | None] = [None, None]
    owners: list[str | None] = [None, None]
    for path, pair in pairs.items():
        for side, language in enumerate(pair):
            if language and languages[side] and language != languages[side]:
                other = owners[side]
                raise UsageError(f"--teacher {path} translates {arrow(pair)} but --teacher "
                                 f"{other} translates {arrow(pairs[other])}; an ensemble's "
                                 "teachers translate one pair.")
            if language and not languages[side]:
                languages[side], owners[side] = language, path
    return (languages[0], languages[1]), (owners[0], owners[1])


def arrow(pair: tuple[str | None, str | None]) -> str:
    """"de->en", with "?" for a side a model does not store."""
    return "->".join(language or "?" for language in pair)


def languages_to_use(src: str | None, tgt: str | None, stored: tuple[str | None, str | None],
                     models: tuple[str, str], advice: str) -> tuple[str, str]:
    """--src and --tgt, each defaulting to the language stored for it by the model that
    `models` names for that side (a flag and its path); UsageError for a flag contradicting
    it, which would pair the corpus's sides the wrong way round, or for languages neither
    gives."""
    from nmt.models.model_files import contradicted_language

    if contradiction := contradicted_language(src, tgt, stored):
        flag, given, trained = contradiction
        model = models[0 if flag == "--src" else 1]
        raise UsageError(f"{flag} {given}, but {model} was trained with {flag} {trained}; "
                         f"{advice}.")
    src, tgt = src or stored[0], tgt or stored[1]
    if not src or not tgt:
        raise UsageError(f"{models[0 if not src else 1]} stores no languages: give --src and "
                         "--tgt.")
    return src, tgt


def corpus_files(args: argparse.Namespace, src: str, tgt: str) -> tuple[Path, Path | None]:
    """PREFIX.SRC, and PREFIX.TGT with --keep-original (as long as the source); InputError
    naming a missing file, or an empty source (a corpus of nothing to distil)."""
    source = Path(f"{args.train_prefix}.{src}")
    target = Path(f"{args.train_prefix}.{tgt}") if args.keep_original else None
    for path in (source, target):
        if path is not None and not path.is_file():
            raise InputError(f"{path} does not exist; --train-prefix PREFIX reads "
                             f"PREFIX.{src}{f' and PREFIX.{tgt}' if target else ''}.")
    lines = [count_valid_lines(str(path)) for path in (source, target) if path is not None]
    if lines[0] == 0:
        raise InputError(f"{source} is empty: there is nothing to distil; give --train-prefix "
                         "a corpus with lines.")
    if len(lines) == 2 and lines[0] != lines[1]:
        raise InputError(f"{source} has {lines[0]:,} lines but {target} {lines[1]:,}; the "
                         "sides of a corpus align line for line.")
    return source, target


def chunks(path: Path, size: int) -> Iterator[list[str]]:
    lines = iter_lines(path)
    while chunk := list(itertools.islice(lines, size)):
        yield chunk


def make_translator(args: argparse.Namespace, teachers: Teachers):
    """The teachers loaded (an ensemble for several) as one `Translator`, and its search."""
    from nmt.models.model_dir import ModelDirError, load_models
    from nmt.models.translator import Translator, default_searches
    from nmt.translation.command import enable_compilation_cache

    enable_compilation_cache()
    try:
        model, tokenizer, _ = load_models(teachers.paths, dtype=args.dtype)
    except (ModelDirError, DataError) as err:
        raise InputError(str(err)) from None
    search = search_settings(args, teachers)
    try:
        return Translator(model, tokenizer, search, batch_tokens=args.batch_tokens,
                          seed=args.seed, searches=default_searches(), compact_after=0)
    except ValueError as err:  # settings only the loaded teachers can refuse (a beam too large)
        raise UsageError(f"invalid search settings for these teachers: "
                         f"{name_flags(str(err))}") from None


def search_settings(args: argparse.Namespace, teachers: Teachers):
    try:
        search = search_config(teachers.values["search"], args)
    except ValueError as err:
        raise UsageError(f"invalid search settings: {name_flags(str(err))}") from None
    if search.nbest != 1:
        raise UsageError("--nbest: a distillation keeps the teacher's best translation only.")
    return search


def distil(args: argparse.Namespace) -> int:
    for flag, value in (("--chunk-lines", args.chunk_lines), ("--batch-tokens", args.batch_tokens)):
        if value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}.")
    cli.check_jax_platforms()
    teachers, src, tgt = read_teachers(args.teacher, args.src, args.tgt)
    source, target = corpus_files(args, src, tgt)
    search = search_settings(args, teachers)
    recipe = Recipe(teachers.checksums,
                    file_digest([p for p in (source, target) if p], "distillation") or "",
                    src, tgt, search_recipe(search), args.dtype or teachers.dtypes,
                    args.chunk_lines, args.keep_original,
                    args.seed if plan_search(search).draws else None)
    out = DistillationDir(args.out, recipe)
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(out.lock())
            out.claim()
        except (OtherDistillation, LockingUnsupported) as err:
            raise UsageError(str(err)) from None
        except RunDirectoryInUse as err:
            raise cli.Fault(str(err)) from None
        if out.finished():
            log.info("%s holds this distillation already (same teachers, corpus and search)",
                     args.out)
        else:
            translate_chunks(args, teachers, source, out)
            dropped = out.finish(-(-count_lines(source) // args.chunk_lines),
                                 lambda: iter_lines(source),
                                 (lambda: iter_lines(target)) if target else None)
            warn_dropped(source, dropped)
    train = f"python train.py --train-prefix {Path(args.out) / 'train'} --src {src} --tgt {tgt} "
    if args.keep_original:  # the second stage of a model of the teacher's own size
        print(f"{out.source_file} and {out.target_file}: the original pairs, then the "
              "teacher's translations; train a model of the teacher's size on them (as "
              f"configs/multi30k_cpu_distilled.yaml does) with\n  {train}--valid-prefix PREFIX "
              "and the teacher's --preset", file=sys.stderr)
    else:
        print(f"{out.source_file} and {out.target_file}: train a student with\n  {train}"
              "--valid-prefix PREFIX --preset student-6-2", file=sys.stderr)
    return 0


def translate_chunks(args: argparse.Namespace, teachers: Teachers, source: Path,
                     out: DistillationDir) -> None:
    """Every chunk of `source` not yet saved, translated and saved, with progress (a line
    longer than the teacher's positions is left untranslated and recorded as dropped); then
    one warning naming the corpus lines whose translation reached the output limit (in the
    chunks translated by this run), as translate.py's."""
    total = count_lines(source)
    todo = [n for n in range(-(-total // args.chunk_lines))
            if not out.done_part(n, min(args.chunk_lines, total - n * args.chunk_lines))]
    if not todo:
        return
    translator = make_translator(args, teachers)
    log.info("distilling %s: %d of %d chunks to translate (%s)", source, len(todo),
             -(-total // args.chunk_lines), translator.describe())
    start, done, reached_limit = time.perf_counter(), 0, []
    saved = total - sum(min(args.chunk_lines, total - n * args.chunk_lines) for n in todo)
    with LineCounter(total, args.quiet, "sentences", initial=saved) as bar:
        for number, lines in enumerate(chunks(source, args.chunk_lines)):
            if number not in todo:
                continue
            first = number * args.chunk_lines + 1
            ids = translator.tokenizer.encode(lines, "source")
            kept = [i for i, row in enumerate(ids) if len(row) < translator.max_source_len]
            result = translator.translate_all([lines[i] for i in kept], progress=bar.update,
                                              ids=[ids[i] for i in kept],
                                              line_numbers=[first + i for i in kept],
                                              source=str(source), stream=number)
            bar.update(len(lines) - len(kept))
            texts = [""] * len(lines)
            for i, nbest in zip(kept, result.nbest):
                texts[i] = nbest[0].text
            out.write_part(number, texts, sorted(set(range(first, first + len(lines)))
                                                 - {first + i for i in kept}))
            reached_limit.extend(result.reached_limit)  # corpus line numbers
            done += len(lines)
            elapsed = time.perf_counter() - start
            log.info("chunk %d saved: %d sentences in %.0f s (%.1f sentences/s)", number + 1,
                     done, elapsed, done / elapsed)
    warn_reached_limit(translator, reached_limit, log)


def warn_dropped(source: Path, lines: list[int]) -> None:
    """One warning for the corpus `lines` left out of the distilled pairs (too long for the
    teacher), naming the first of them."""
    if not lines:
        return
    shown = ", ".join(map(str, lines[:10])) + (", ..." if len(lines) > 10 else "")
    log.warning("%d line(s) of %s longer than the teacher's positions were left out of the "
                "distilled pairs (the teacher would translate their start only): line(s) %s; "
                "split them into shorter sentences to keep them", len(lines), source, shown)


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status 0, 1 for a fault (a bad file), 2 for a usage error, 130 after Ctrl-C."""
    args = build_parser().parse_args(argv)
    cli.setup_logging(logging.WARNING if args.quiet else logging.INFO,
                      "%(name)s: %(message)s",
                      ("absl", "jax", "jax._src", "datasets", "orbax", "checkpoint", "data"))
    return cli.guarded(PROG, lambda: distil(args))
