"""translate.py's input and output: sentences from arguments, a file or stdin, read in chunks
and translated as they come; translations (or n-best lists) written as lines, flushed after
every chunk."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import IO, Callable, Sequence

from tqdm import tqdm

from data.config import DataError
from data.lines import iter_lines, read_lines as read_text_lines, stream_chunks
from nmt.translation.errors import InputError

log = logging.getLogger("translate.py")


def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file; InputError naming the file and line if unreadable."""
    try:
        return read_text_lines(path)
    except DataError as err:
        raise InputError(str(err)) from None


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


def progress_bar(total: int, quiet: bool):
    return tqdm(total=total, unit="sent", file=sys.stderr, disable=quiet or total <= 1,
                dynamic_ncols=True)


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
            from nmt.translation.plotting import save_attention_plot  # JAX

            save_attention_plot(model, tokenizer, translator, args.sentences[0],
                                results[0][0], args)
    elif input_line_count is not None:
        with progress_bar(input_line_count, args.quiet) as bar:
            count = translate_chunks(translator, file_chunks(args.input, args.chunk_lines), out,
                                     args.input, nbest, progress=bar.update)
    else:
        chunks = stream_chunks(sys.stdin.fileno(), args.chunk_lines)
        count = translate_chunks(translator, chunks, out, "<stdin>", nbest)
    seconds = time.perf_counter() - start
    log.info("translated %d line%s in %.3f s", count, "" if count == 1 else "s", seconds)


