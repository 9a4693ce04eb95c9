"""python -m nmt.distillation.shortlist: a vocabulary shortlist for a model, from a corpus.

    python -m nmt.distillation.shortlist --model runs/student/averaged \\
        --train-prefix data/multi30k-distilled/train
    python translate.py --model runs/student/averaged --shortlist 512 ...

Estimates IBM Model 1's p(target token | source token) on the corpus's token ids (a student's
distilled corpus is the one its translations come from) and stores each source token's
likeliest target tokens, and the target tokens by frequency, as MODEL/shortlist.npz
(`transformer.shortlist`). translate.py --shortlist K then searches each batch over K
candidate tokens instead of the whole vocabulary. With --ctranslate2-map FILE it also writes
the table as a CTranslate2 vocabulary map (source token TAB target tokens; the first line,
with no source token, lists the tokens always included).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from data.config import DataError
from data.lines import count_lines, is_regular_file, iter_lines
from nmt.runtime import cli
from nmt.runtime.cli import UsageError
from nmt.translation.errors import InputError

PROG = "python -m nmt.distillation.shortlist"
log = logging.getLogger("shortlist")


def build_parser() -> argparse.ArgumentParser:
    parser = cli.OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0],
                               epilog=f"Set {cli.DEBUG_VARIABLE}=1 for a traceback on errors.")
    # A blank path or language would read as one left out, or as the current directory.
    parser.add_argument("--model", required=True, metavar="MODEL", type=cli.given,
                        help="model or run directory: its tokenizer encodes the corpus and the "
                             "shortlist is stored in it")
    parser.add_argument("--train-prefix", required=True, metavar="PREFIX", type=cli.given,
                        help="the corpus: PREFIX.SRC and PREFIX.TGT")
    parser.add_argument("--src", type=cli.given, help="source language (default: the model's)")
    parser.add_argument("--tgt", type=cli.given, help="target language (default: the model's)")
    parser.add_argument("--per-source", type=int, default=50, metavar="N",
                        help="target tokens kept per source token (default 50)")
    parser.add_argument("--always", type=int, default=100, metavar="N",
                        help="most frequent target tokens every batch gets (default 100)")
    parser.add_argument("--iterations", type=int, default=5,
                        help="EM iterations of IBM Model 1 (default 5)")
    parser.add_argument("--ctranslate2-map", metavar="FILE", type=cli.given,
                        help="also write the table as a CTranslate2 vocabulary map")
    return parser


def check_args(args: argparse.Namespace) -> None:
    """UsageError for a count out of bounds, or a --ctranslate2-map that cannot be written
    (or is a link, pipe or device): found before any work, and before MODEL's shortlist.npz
    is replaced."""
    for flag, value, least, most in (("--per-source", args.per_source, 1, 10_000),
                                     ("--always", args.always, 0, 10_000),
                                     ("--iterations", args.iterations, 1, 100)):
        if not least <= value <= most:
            raise UsageError(f"{flag} must be >= {least} and <= {most:,}, got {value}.")
    if args.ctranslate2_map:
        path = Path(args.ctranslate2_map)
        if path.is_dir():
            raise UsageError(f"--ctranslate2-map {path} is a directory; give a file's path.")
        # The map is written beside the path and renamed onto it: a link, pipe or device
        # there would be replaced by a regular file, not written through.
        if path.is_symlink() or (path.exists() and not is_regular_file(path)):
            kind = "a symbolic link" if path.is_symlink() else "not a regular file"
            raise UsageError(f"--ctranslate2-map {path} is {kind}; give the path of a regular "
                             "file, or of a new one.")
        if not path.parent.is_dir():
            raise UsageError(f"--ctranslate2-map {path}: the directory {path.parent} does not "
                             "exist; create it, or give a path in an existing one.")


def read_pairs(prefix: str, src: str, tgt: str, tokenizer) -> list[tuple[list[int],
                                                                          list[int]]]:
    """The corpus's pairs as token ids; InputError naming a missing or misaligned file, or a
    corpus without a pair of tokens (empty lines only), which would build an empty table."""
    paths = [Path(f"{prefix}.{lang}") for lang in (src, tgt)]
    for path in paths:
        if not path.is_file():
            raise InputError(f"{path} does not exist; --train-prefix PREFIX reads PREFIX.{src} "
                             f"and PREFIX.{tgt}.")
    counts = [count_lines(path) for path in paths]
    if counts[0] != counts[1]:
        raise InputError(f"{paths[0]} has {counts[0]:,} lines but {paths[1]} {counts[1]:,}; "
                         "the sides of a corpus align line for line.")
    try:
        sources = tokenizer.encode(list(iter_lines(paths[0])), "source")
        targets = tokenizer.encode(list(iter_lines(paths[1])), "target")
    except DataError as err:
        raise InputError(str(err)) from None
    pairs = list(zip(sources, targets))
    if not any(source and target for source, target in pairs):
        raise InputError(f"{paths[0]} and {paths[1]} hold no pair of non-empty lines: there is "
                         "nothing to build a shortlist from; give --train-prefix a corpus with "
                         "lines.")
    return pairs


def run(args: argparse.Namespace) -> int:
    from nmt.distillation.command import languages_to_use
    from nmt.models.model_files import ModelDirError, read_model_files, stored_languages
    from transformer.shortlist import SHORTLIST_FILE, build_shortlist

    check_args(args)
    try:
        model_dir, tokenizer, values = read_model_files(args.model)
    except (ModelDirError, DataError) as err:
        raise InputError(str(err)) from None
    src, tgt = languages_to_use(args.src, args.tgt, stored_languages(values),
                                (f"--model {args.model}",) * 2, "build the shortlist with the "
                                "model's languages (leave --src and --tgt out)")
    config = values["model"]
    special = max(config.pad_id, config.unk_id, config.bos_id, config.eos_id) + 1
    if special > len({config.pad_id, config.unk_id, config.bos_id, config.eos_id}):
        raise InputError(f"{model_dir}: its special ids (pad {config.pad_id}, unk "
                         f"{config.unk_id}, eos {config.eos_id}) are not its first ids, as in "
                         "a model imported from Marian; a shortlist needs them first, so it "
                         "cannot be built for this model.")
    start = time.perf_counter()
    pairs = read_pairs(args.train_prefix, src, tgt, tokenizer)
    shortlist = build_shortlist(pairs, config.vocab_size, special, tokenizer.fingerprint,
                                args.per_source, args.always, args.iterations)
    shortlist.save(model_dir / SHORTLIST_FILE)
    log.info("%s: %d pairs, %d target tokens per source token, %d always, in %.1f s",
             model_dir / SHORTLIST_FILE, len(pairs), args.per_source, args.always,
             time.perf_counter() - start)
    if args.ctranslate2_map:
        from nmt.convert.ctranslate2 import write_vocabulary_map

        write_vocabulary_map(shortlist, tokenizer, args.ctranslate2_map)
        log.info("wrote %s", args.ctranslate2_map)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cli.setup_logging(logging.INFO, "%(name)s: %(message)s", ("absl", "jax", "datasets"))
    return cli.guarded(PROG, lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
