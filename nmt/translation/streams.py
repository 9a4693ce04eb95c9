"""translate.py's input and output: sentences from arguments, a file or stdin, read in chunks
and translated as they come; translations (or n-best lists) written as lines, flushed after
every chunk."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import stat
import sys
import time
from pathlib import Path
from typing import IO, Callable, Sequence

from data.config import DataError
from data.lines import is_regular_file, iter_lines, read_lines as read_text_lines, stream_chunks
from nmt.runtime.cli import UsageError
from nmt.runtime.files import FileState, file_state, is_stream, output_target
from nmt.runtime.progress import LineCounter, on_terminal
from nmt.translation.errors import InputError

log = logging.getLogger("translate.py")


STDIN = "<stdin>"  # how messages name standard input


def read_lines(path: str | Path, flag: str = "the flag") -> list[str]:
    """The lines of a UTF-8 text file, or of stdin for "-" (given by `flag`); InputError
    naming the file (or <stdin>) and line if unreadable."""
    try:
        if str(path) != "-":
            return read_text_lines(path)
        check_stdin(f"give {flag} a file name, or pipe the text into translate.py.")
        return [line for _, lines in stream_chunks(sys.stdin.fileno(), 1 << 16)
                for line in lines]
    except DataError as err:
        raise InputError(str(err)) from None


def shown(path: str | Path) -> str:
    """An input path as messages name it: "-" is <stdin>."""
    return STDIN if str(path) == "-" else str(path)


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
    """`Translations` of `lines`; warnings name `where` and the line numbers from
    `first_line`."""
    return translator.translate_all(lines, progress=progress, first_line=first_line,
                                    source=where)


@dataclasses.dataclass(frozen=True)
class Paragraphs:
    """How translate.py cuts each line into sentences: by the rules of `language`, as HTML
    (every tag kept, inline ones placed by the model's alignment) or as text; and joins
    them, with the spaces between sentences that `target` writes (None: the source's)."""

    language: str
    html: bool = False
    target: str | None = None


def translate_paragraphs(translator, lines: Sequence[str], where: str, first_line: int,
                         language: str, progress: Callable[[int], None] | None = None,
                         html: bool = False, target: str | None = None
                         ) -> tuple[list[str], list[int]]:
    """Each line translated as a paragraph: cut into sentences for `language`
    (`nmt.translation.paragraphs.split_text`), the sentences of all lines searched in one
    call, and each line joined back around its translations with its whitespace as it was,
    but for the space between sentences, which follows the `target` language
    (`Document.join`). With `html`, the lines are one HTML document (`split_html`, by line):
    a script, comment or translate="no" element spans lines, and each line still gives one
    output line. A sentence without letters is its own translation, as on the server. Also
    the lines with a translation that reached the output limit."""
    from nmt.translation.paragraphs import readable as readable_positions

    documents, line_of = _documents(lines, language, html)
    sentences = [sentence for document in documents for sentence in document.sentences]
    readable = readable_positions(sentences)  # the rest are their own translations
    translations, reached_limit = list(sentences), []
    if readable:
        done = translator.translate_all([sentences[n] for n in readable], source=where,
                                        line_numbers=[first_line + line_of[n] for n in readable])
        for n, nbest in zip(readable, done.nbest):
            translations[n] = nbest[0].text
        reached_limit = done.reached_limit
    joined, start = [], 0
    for document, alignments in zip(documents, _alignments(translator, documents,
                                                           translations)):
        mine = translations[start:start + len(document.sentences)]
        whole = len(mine) == 1 and document.between == ["", ""] and not document.markup
        # A line that is one sentence, nothing around it, comes out as the model wrote it,
        # as without splitting.
        joined.append(mine[0] if whole else document.join(mine, alignments, target))
        start += len(document.sentences)
    if progress is not None:
        progress(len(lines))
    return (joined[0].split("\n") if html else joined), reached_limit


def _documents(lines: Sequence[str], language: str, html: bool) -> tuple[list, list[int]]:
    """The documents that `translate_paragraphs` translates: a line each, or with `html` one
    of all lines, cut into sentences by line; and the line (from 0) of each sentence."""
    from nmt.translation.paragraphs import split_html, split_text  # sentencex

    if not html:
        documents = [split_text(line, language) for line in lines]
        return documents, [i for i, document in enumerate(documents)
                           for _ in document.sentences]
    document = split_html("\n".join(lines), language, by_line=True)
    line_of, line = [], 0
    for gap, points in zip(document.between, document.points or [()] * len(
            document.sentences)):
        line += gap.count("\n")
        line_of.append(line)
        line += sum(point.markup.count("\n") for point in points)  # a tag across lines
    return [document], line_of


def _alignments(translator, documents, translations: Sequence[str]) -> list[dict]:
    """Per document, the word alignment of each sentence holding inline markup, where the
    engine gives alignments (`Translator.align`; else markup goes by position)."""
    from nmt.translation.paragraphs import alignments_by_document, markup_pairs

    sources, targets = markup_pairs(documents, translations)
    align = getattr(translator, "align", None)
    found = align(sources, targets) if sources and align is not None else None
    return alignments_by_document(documents, translations, found)


def output_text(translator, lines: Sequence[str], where: str, first_line: int, nbest: bool,
                progress: Callable[[int], None] | None = None,
                paragraphs: Paragraphs | None = None) -> tuple[str, list[int]]:
    """The output lines for `lines` (from line number `first_line` of `where`): n-best lists,
    translations, or with `paragraphs` each line translated sentence by sentence; and the
    lines whose translation reached the output limit."""
    if paragraphs is not None:
        translations, reached_limit = translate_paragraphs(
            translator, lines, where, first_line, paragraphs.language, progress,
            paragraphs.html, paragraphs.target)
        return "".join(one_line(text) + "\n" for text in translations), reached_limit
    done = translate_lines(translator, lines, where, first_line, progress)
    return format_hypotheses(done.nbest, first_line - 1, nbest), done.reached_limit


def translate_chunks(translator, chunks, out: IO[str], where: str, nbest: bool,
                     progress: Callable[[int], None] | None = None,
                     paragraphs: Paragraphs | None = None) -> tuple[int, list[int]]:
    """Translate (first line number, lines) chunks, writing and flushing each; returns the
    lines translated, and those whose translation reached the output limit."""
    total, reached_limit = 0, []
    if paragraphs is not None and paragraphs.html:
        chunks = whole_input(chunks)
    for first_line, lines in chunks:
        text, reached = output_text(translator, lines, where, first_line, nbest, progress,
                                    paragraphs)
        out.write(text)
        out.flush()
        total += len(lines)
        reached_limit += reached
    return total, reached_limit


def whole_input(chunks) -> list[tuple[int, list[str]]]:
    """The (first line number, lines) chunks as one: an HTML document is translated whole,
    since its scripts, comments and translate="no" elements span lines (and chunks)."""
    first, lines = None, []
    for start, chunk in chunks:
        first = start if first is None else first
        lines += chunk
    return [] if first is None else [(first, lines)]


def progress_bar(total: int, quiet: bool) -> LineCounter:
    """Sentences done: a bar on a terminal, a plain line every half minute in a log."""
    return LineCounter(total, quiet, "sentences")


OUTPUT_FLAGS = ("output", "hyp_file", "report", "plot_attention")
INPUT_FLAGS = ("input", "src_file", "ref_file", "test_file")
# Every flag naming something translate.py reads, and what to give it.
READ_FLAGS = {"model": "a run or model directory", "input": "a file name, or - for stdin",
              "src_file": "a file name, or - for stdin",
              "ref_file": "a file name, or - for stdin",
              "test_prefix": "a path prefix (PREFIX.SRC and PREFIX.TGT are read)",
              "test_file": "a file name", "dataset": "a dataset name or directory"}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one file: by device and inode when both exist (another path, a
    symbolic or hard link), else by their resolved paths."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_no_empty_paths(args: argparse.Namespace) -> None:
    """UsageError for a path flag given an empty value: as a path it would mean the current
    directory, and the error would not say which flag."""
    wanted = {**READ_FLAGS, **{name: "a file name" for name in OUTPUT_FLAGS}}
    for name, what in wanted.items():
        values = getattr(args, name, None)
        if "" in (values if isinstance(values, list) else [values]):
            raise UsageError(f"{_flag(name)} was given an empty path; give {what}.")


def check_output_paths(args: argparse.Namespace) -> dict[str, FileState | None]:
    """UsageError unless every output file can be created and is neither an input file nor
    another output: a typo in --hyp-file must fail before the model is loaded, not throw
    away a finished evaluation, and `--output` must never replace the text it translates.
    Returns each output's `file_state` now: its writing compares against it at the end, so a
    file another process wrote meanwhile is not replaced silently."""
    states = {}
    outputs = [(name, getattr(args, name)) for name in OUTPUT_FLAGS if getattr(args, name)]
    inputs = [(_flag(name), getattr(args, name)) for name in INPUT_FLAGS
              if getattr(args, name, None) not in (None, "-")]
    stdin_file = _stdin_file() if reads_stdin(args) else None
    for index, (flag, value) in enumerate(outputs):
        path, name = Path(value), _flag(flag)
        if path.is_dir():
            raise UsageError(f"{name} {path}: is a directory; give a file name.")
        _check_writable(name, path)
        check_not_an_input(name, path, inputs)
        if stdin_file is not None and path.exists() and os.path.samestat(path.stat(),
                                                                         stdin_file):
            raise UsageError(f"{name} {path}: is the file standard input reads; writing it "
                             "would replace the text read from there; give another output "
                             "path.")
        for earlier, other in outputs[:index]:
            if _same_file(path, other):
                raise UsageError(f"{name} {path}: is the same file as {_flag(earlier)} "
                                 f"{other}; give each output its own path.")
        states[flag] = file_state(output_target(path))
    return states


def reads_stdin(args: argparse.Namespace) -> bool:
    """Whether the flags read standard input: the text to translate (no sentences, no --input
    or --input -), or a test set's file given as -."""
    if any(getattr(args, name, None) == "-" for name in ("src_file", "ref_file", "test_file")):
        return True
    return (args.input in (None, "-") and not args.sentences
            and not (args.evaluate or args.score))


def _stdin_file() -> os.stat_result | None:
    """The status of the file standard input reads (`< FILE`); None for a pipe, a terminal
    or none: only a file can also be an output."""
    try:
        status = os.fstat(sys.stdin.fileno())
    except (AttributeError, OSError, ValueError):  # None, closed, or replaced by a test
        return None
    return status if stat.S_ISREG(status.st_mode) else None


def _check_writable(name: str, path: Path) -> None:
    """UsageError unless `path` can be written: a stream (pipe, device) as it is; a file
    whole, through a temporary in the directory of the file it names (`atomic_file`)."""
    if is_stream(path):
        if not os.access(path, os.W_OK):
            raise UsageError(f"{name} {path}: not writable; choose another path.")
        return
    target = output_target(path)
    if not target.parent.is_dir():
        raise UsageError(f"{name} {path}: directory {target.parent} does not exist; create "
                         "it or choose another path.")
    if not os.access(target.parent, os.W_OK) or (target.exists()
                                                 and not os.access(target, os.W_OK)):
        raise UsageError(f"{name} {path}: not writable (the file is written whole, through "
                         f"a temporary in {target.parent}); choose another path.")


def check_not_an_input(name: str, output: str | Path, inputs: list[tuple[str, str | Path]]
                       ) -> None:
    """UsageError when the output `output` (given by flag `name`) is one of the `inputs`
    ((flag or description, path) of the files read)."""
    for input_name, path in inputs:
        if _same_file(output, path):
            raise UsageError(
                f"{name} {output}: is the same file as {input_name} {path}; writing it would "
                "replace the text read from there; give another output path.")


def count_valid_lines(path: str) -> int | None:
    """The number of lines of --input, every one checked to be UTF-8 (in constant memory);
    None for a pipe or device (`<(command)`, a FIFO, /dev/stdin), which can be read only
    once: it is then checked as it is translated."""
    if os.path.exists(path) and not os.path.isdir(path) and not is_regular_file(path):
        if not os.access(path, os.R_OK):
            raise InputError(f"{path}: cannot read (permission denied).")
        return None
    try:
        return sum(1 for _ in iter_lines(path))
    except DataError as err:
        raise InputError(str(err)) from None


def check_stdin(advice: str = "give sentences as arguments, --input FILE, or pipe text into "
                                "translate.py.") -> None:
    """InputError when there is no standard input to read (closed with `<&-`)."""
    try:
        if sys.stdin is None:
            raise OSError
        os.fstat(sys.stdin.fileno())
    except (OSError, ValueError):
        raise InputError(f"standard input is closed: {advice}") from None


def file_chunks(path: str, chunk_lines: int, checked: bool = False):
    """(first line number, lines) of a file or pipe, `chunk_lines` at a time; `checked`: the
    file was read before (`count_valid_lines`), which warned of its carriage returns."""
    with open(path, "rb") as handle:
        yield from stream_chunks(handle.fileno(), chunk_lines, where=path,
                                 warn_carriage_return=not checked)


def translate_input(translator, args: argparse.Namespace, input_line_count: int | None,
                    out: IO[str], model, tokenizer, paragraphs: Paragraphs | None = None
                    ) -> list[int]:
    """Translate the SENTENCE arguments, --input (`input_line_count` lines, None for a pipe)
    or stdin to `out`; with `paragraphs` (--split-sentences, --html), each line sentence by
    sentence. Returns the lines whose translation reached the output limit."""
    nbest = args.nbest is not None
    start = time.perf_counter()
    if args.plot_attention:
        done = translate_lines(translator, args.sentences, "argument", 1)
        out.write(format_hypotheses(done.nbest, 0, nbest))
        out.flush()
        count, reached_limit = len(args.sentences), done.reached_limit
        from nmt.translation.plotting import save_attention_plot  # JAX

        save_attention_plot(model, tokenizer, translator, args.sentences[0], done.nbest[0][0],
                            args)
    elif args.sentences:
        count, reached_limit = translate_chunks(translator, [(1, args.sentences)], out,
                                                "argument", nbest, paragraphs=paragraphs)
    elif args.input not in (None, "-"):
        with progress_bar(input_line_count or 0, args.quiet) as bar:  # none for a pipe
            count, reached_limit = translate_chunks(
                translator, file_chunks(args.input, args.chunk_lines,
                                        checked=input_line_count is not None),
                out, args.input, nbest, bar.update, paragraphs)
    else:
        if on_terminal(sys.stdin) and not args.quiet:
            print("translate.py: reading sentences from the terminal, one per line; Ctrl-D "
                  "ends", file=sys.stderr, flush=True)
        chunks = stream_chunks(sys.stdin.fileno(), args.chunk_lines)
        count, reached_limit = translate_chunks(translator, chunks, out, STDIN, nbest,
                                                paragraphs=paragraphs)
    seconds = time.perf_counter() - start
    log.info("translated %d line%s in %.3f s", count, "" if count == 1 else "s", seconds)
    return reached_limit
