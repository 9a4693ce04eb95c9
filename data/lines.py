"""Reading UTF-8 text line by line: one reader for corpora, test sets and translate.py input.

Lines are split on "\\n" only (as sacreBLEU reads files): `str.splitlines` would also split on
characters such as U+2028 or \\x1c that occur inside real sentences and break the alignment of
two files. A "\\r" before the "\\n" is dropped, and so is a UTF-8 byte order mark starting the
text (editors on Windows write one; it is not text). Invalid UTF-8 raises `DataError` naming
the file, the line and the byte, and how to convert the file.
"""

from __future__ import annotations

import os
import select
from pathlib import Path
from typing import Iterator

from data.config import DataError

BOM = "\ufeff"  # the UTF-8 byte order mark, as text
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def _conversion_hint(raw: bytes, line_no: int) -> str:
    """How to convert text whose bytes are not UTF-8: UTF-16 (a byte order mark, or NUL bytes
    between characters) needs another conversion than a one-byte encoding such as Latin-1."""
    if (line_no == 1 and raw.startswith(_UTF16_BOMS)) or raw.count(b"\x00") * 4 >= len(raw) > 1:
        return ("it looks like UTF-16: convert it with iconv -f UTF-16 -t UTF-8 (not LATIN1, "
                "which would turn it into garbage that still reads as text)")
    return ("convert it to UTF-8 from its encoding, e.g. iconv -f LATIN1 -t UTF-8 for Latin-1 "
            "(`file -i` tells the encoding)")


def decode_line(raw: bytes, where: str, line_no: int) -> str:
    """One line as text without its "\\r\\n" or "\\n" ending; DataError naming the line if it is
    not UTF-8."""
    raw = raw.removesuffix(b"\n").removesuffix(b"\r")
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"{where} line {line_no}: invalid UTF-8 (byte {raw[err.start]:#04x} at column "
            f"{err.start + 1}); {_conversion_hint(raw, line_no)}") from None
    return line.removeprefix(BOM) if line_no == 1 else line


def iter_lines(path: str | Path, missing_hint: str = "check the path") -> Iterator[str]:
    """The lines of a UTF-8 text file, streamed. `missing_hint` ends the error for a missing
    file."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found; {missing_hint}")
    try:
        handle = path.open("rb")
    except OSError as err:
        raise DataError(f"{path}: cannot read ({err.strerror}).") from None
    with handle:
        for line_no, raw in enumerate(handle, start=1):  # binary files split on b"\n" only
            yield decode_line(raw, str(path), line_no)


def read_lines(path: str | Path) -> list[str]:
    """Every line of a UTF-8 text file; a final "\\n" ends the last line, it starts no new one."""
    return list(iter_lines(path))


def count_lines(path: str | Path) -> int:
    """Number of lines as `iter_lines` sees them (a last line without "\\n" counts)."""
    with Path(path).open("rb") as handle:
        return sum(1 for _ in handle)


def _readable_now(fd: int) -> bool:
    try:
        return bool(select.select([fd], [], [], 0)[0])
    except (OSError, ValueError):  # no select on this kind of file: read on, batch more
        return True


def stream_chunks(fd: int, max_lines: int, where: str = "<stdin>"
                  ) -> Iterator[tuple[int, list[str]]]:
    """(number of the first line, lines) from file descriptor `fd`, in order.

    A chunk holds every complete line already available, at most `max_lines`; the reader
    blocks only while it has no line at all. So `cat file |` gives full chunks and a terminal
    gives one line per chunk. A line with invalid UTF-8 raises DataError after the lines
    before it have been yielded.
    """
    ready: list[bytes] = []  # complete lines read but not yet handed out
    partial = b""
    eof = False
    next_line = 1
    while True:
        while len(ready) < max_lines and not eof and (not ready or _readable_now(fd)):
            data = os.read(fd, 1 << 16)
            if not data:
                eof = True
                if partial:
                    ready.append(partial)
                    partial = b""
                break
            pieces = (partial + data).split(b"\n")
            partial = pieces.pop()
            ready.extend(pieces)
        if not ready:
            return
        raw, ready = ready[:max_lines], ready[max_lines:]
        lines = []
        for raw_line in raw:
            try:
                lines.append(decode_line(raw_line, where, next_line + len(lines)))
            except DataError:
                if lines:
                    yield next_line, lines
                raise
        yield next_line, lines
        next_line += len(lines)
