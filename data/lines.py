"""Reading UTF-8 text line by line: one reader for corpora, test sets and translate.py input.

Lines are split on "\\n" only (as sacreBLEU reads files): `str.splitlines` would also split on
characters such as U+2028 or \\x1c that occur inside real sentences and break the alignment of
two files. A "\\r" before the "\\n" is dropped, and so is a UTF-8 byte order mark starting the
text (editors on Windows write one; it is not text). A "\\r" anywhere else stays in the line,
and `iter_lines` warns once per file with how many lines hold one and how to convert the file:
a file with old Mac line endings ("\\r" alone) would otherwise be read as one long line.
Invalid UTF-8 raises `DataError` naming the file, the line, the byte and its column (in
characters), and how to convert the file: from the Japanese, Korean or Chinese encoding its
bytes read as, where they do (Shift-JIS, EUC-JP, EUC-KR, GB18030), since converting those
from Latin-1 gives garbage that still reads as text. A line holding a NUL byte is refused the
same way: ASCII in UTF-16 without a byte order mark is valid UTF-8, one NUL per character.

A line longer than `MAX_LINE_BYTES` is a `DataError` naming its number: no sentence is that
long, and such a "line" (a binary file, a file of NUL bytes, a text without line breaks)
would otherwise be held in memory whole. Reading takes time linear in the bytes read, however
long a line is.

A path may name any readable file that is not a directory: a pipe (`<(command)`, a FIFO,
/dev/stdin) is read once, as it comes.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import re
import select
import stat
from pathlib import Path
from typing import Iterator, NamedTuple

from data.config import DataError

log = logging.getLogger("data")

BOM = "\ufeff"  # the UTF-8 byte order mark, as text
# Half of a UTF-16 surrogate pair, which no UTF-8 text holds: what a JSON "\\ud83d" escape
# alone decodes to, or bytes that are not UTF-8 read with errors="surrogateescape".
SURROGATE = re.compile("[\ud800-\udfff]")
MAX_LINE_BYTES = 4 << 20  # 4 MiB: a thousand times a long paragraph
_READ_SIZE = 1 << 16
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def _is_kana(c: str) -> bool:
    return "\u3041" <= c <= "\u30ff"  # full-width: half-width kana is what Latin-1 looks like


def _is_cjk_punctuation(c: str) -> bool:
    return "\u3000" <= c <= "\u303f" or "\uff01" <= c <= "\uff5e"


def _is_cjk(c: str) -> bool:
    return "\u4e00" <= c <= "\u9fff" or _is_cjk_punctuation(c)


def _in_gb2312(c: str) -> bool:
    """GB2312 holds the characters of most Chinese text; GBK's others are rare, and what
    Shift-JIS or Latin-1 bytes read as GBK lands mostly among them."""
    try:
        c.encode("gb2312")
    except UnicodeEncodeError:
        return False
    return True


# Legacy encodings of Japanese, Korean and Chinese that a line's bytes may be in: Python's
# codec, iconv's name, and whether a decoded character belongs to text in that language.
# Shift-JIS is named as Windows writes it, CP932: iconv's SHIFT_JIS reads a backslash as ¥.
_CJK_ENCODINGS = (
    ("cp932", "CP932", lambda c: _is_kana(c) or _is_cjk(c)),
    ("euc_jp", "EUC-JP", lambda c: _is_kana(c) or _is_cjk(c)),
    ("euc_kr", "EUC-KR", lambda c: "\uac00" <= c <= "\ud7a3" or _is_cjk_punctuation(c)),
    ("gb18030", "GB18030", _in_gb2312),
)


def _cjk_encodings(raw: bytes) -> list[str]:
    """iconv's names of the encodings that `raw` (holding bytes past ASCII) reads as text of
    their language: it decodes, and nine in ten of its characters past ASCII are that
    language's (Japanese: with kana; Korean: Hangul; Chinese: GB2312's)."""
    found = []
    for codec, name, belongs in _CJK_ENCODINGS:
        try:
            text = raw.decode(codec)
        except UnicodeDecodeError:
            continue
        wide = [c for c in text if c > "\x7f"]
        if any(map(_is_kana, wide)) != (codec in ("cp932", "euc_jp")):
            continue  # Japanese has kana, Korean and Chinese none (GB2312 has kana too)
        if wide and sum(map(belongs, wide)) >= 0.9 * len(wide):
            found.append(name)
    return found


class Compression(NamedTuple):
    """A compressed format that corpora come in and that is read only once decompressed."""

    name: str
    suffix: str
    magic: bytes  # the first bytes of such a file
    tool: str  # the command that decompresses it

    def decompress_hint(self, path: str | Path) -> str:
        """What to do with `path`, a file of this format named with its suffix."""
        return f"{path} is {self.name}-compressed: decompress it first ({self.tool} -k {path})"


COMPRESSIONS = (
    Compression("gzip", ".gz", b"\x1f\x8b", "gunzip"),
    Compression("xz", ".xz", b"\xfd7zXZ\x00", "unxz"),
    Compression("bzip2", ".bz2", b"BZh", "bunzip2"),
    Compression("zstd", ".zst", b"\x28\xb5\x2f\xfd", "unzstd"),
)


UTF16_HINT = ("it looks like UTF-16: convert it with iconv -f UTF-16 -t UTF-8 (not LATIN1, "
              "which would turn it into garbage that still reads as text)")


def _nul_heavy(raw: bytes) -> bool:
    """True when NUL bytes are a quarter of `raw` or more: UTF-16, whose ASCII characters
    each carry a NUL byte (and so read as valid UTF-8 with no byte order mark)."""
    return raw.count(b"\x00") * 4 >= len(raw) > 0


def _holds_nul(raw: bytes, where: str, line_no: int) -> DataError:
    """The error for a line that decodes but holds NUL bytes, which no text holds."""
    nuls = raw.count(b"\x00")
    column = len(raw[:raw.index(b"\x00")].decode("utf-8")) + 1
    hint = UTF16_HINT if nuls > 1 and _nul_heavy(raw) else (  # one alone: a stray byte
        f"remove {'them' if nuls > 1 else 'it'} (tr -d '\\000' < FILE > FILE.clean), or check "
        "that this is the file you meant")
    return DataError(f"{where} line {line_no}: {nuls} NUL byte{'s' if nuls > 1 else ''} "
                     f"(\\x00), the first at column {column}, and text holds none; {hint}")


def _conversion_hint(raw: bytes, line_no: int) -> str:
    """How to convert text whose bytes are not UTF-8: a compressed file (its first bytes),
    UTF-16 (a byte order mark, or NUL bytes between characters), or the Japanese, Korean or
    Chinese encoding the bytes read as, needs another conversion than a one-byte encoding such
    as Latin-1."""
    compression = next((c for c in COMPRESSIONS if raw.startswith(c.magic)), None)
    if line_no == 1 and compression:
        return (f"it is {compression.name}-compressed, not text: decompress it first "
                f"({compression.tool} -c FILE > TEXT_FILE) and give the text file")
    if (line_no == 1 and raw.startswith(_UTF16_BOMS)) or _nul_heavy(raw):
        return UTF16_HINT
    names = _cjk_encodings(raw)
    if names:
        commands = " or ".join(f"iconv -f {name} -t UTF-8" for name in names)
        which = ", whichever gives readable text" if len(names) > 1 else ""
        shown = " or ".join("Shift-JIS" if name == "CP932" else name for name in names)
        return (f"it looks like {shown}: convert it with {commands}{which}; not "
                "LATIN1, which would turn it into garbage that still reads as text")
    return ("convert it to UTF-8 from its encoding (`file -i` or `uchardet` tells it), e.g. "
            "iconv -f LATIN1 -t UTF-8 if it is Latin-1")


def decode_line(raw: bytes, where: str, line_no: int) -> str:
    """One line as text without its "\\r\\n" or "\\n" ending; DataError naming the line if it is
    not UTF-8 or holds a NUL byte (UTF-16 without a byte order mark, or not text at all)."""
    raw = raw.removesuffix(b"\n").removesuffix(b"\r")
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        # The column counts the characters before the bad byte, the line's byte its bytes.
        column = len(raw[:err.start].decode("utf-8")) + 1
        byte = f", the line's byte {err.start + 1}" if column != err.start + 1 else ""
        raise DataError(
            f"{where} line {line_no}: invalid UTF-8 (byte {raw[err.start]:#04x} at column "
            f"{column}{byte}); {_conversion_hint(raw, line_no)}") from None
    if "\x00" in line:  # valid UTF-8 all the same: ASCII in UTF-16, or binary bytes
        raise _holds_nul(raw, where, line_no)
    return line.removeprefix(BOM) if line_no == 1 else line


def _too_long(where: str, line_no: int, limit: int, carriage_returns: bool = False
              ) -> DataError:
    size = f"{limit} bytes" + (f" ({limit >> 20} MiB)" if limit >= 1 << 20 else "")
    if carriage_returns:  # old Mac line endings: the "\n" this reader splits on never comes
        return DataError(
            f"{where} line {line_no}: longer than {size} without a line break (\\n), and it "
            f"holds carriage returns (\\r): {CR_HINT}")
    return DataError(
        f"{where} line {line_no}: longer than {size} without a line break; give text with "
        "one sentence per line (split that line), or check that this is the file you meant")


CR_HINT = ("lines end in \\r alone (old Mac line endings?) and are split on \\n only; "
            "convert the file with tr '\\r' '\\n' < FILE > FILE.unix (or dos2unix -c mac FILE)")


# The list that `recording_carriage_returns` yields, while inside it.
_CR_RECORD: contextvars.ContextVar[list | None] = contextvars.ContextVar("carriage_returns",
                                                                         default=None)


def warn_carriage_returns(where: str, count: int, first: int) -> None:
    """Warn that `count` lines of file `where`, the first line `first`, hold a carriage return
    ("\\r") that does not end them; recorded too inside `recording_carriage_returns`."""
    log.warning("%s: a carriage return (\\r) inside %d of its lines (the first: line %d), "
                "so each may be several sentences read as one: %s", where, count, first,
                CR_HINT)
    if (record := _CR_RECORD.get()) is not None:
        record.append((where, count, first))


@contextlib.contextmanager
def recording_carriage_returns() -> Iterator[list[tuple[str, int, int]]]:
    """A list that gets (file, lines, first line) of each carriage-return warning given inside
    (`warn_carriage_returns`): a cache of what was read keeps them, to warn again when it is
    read instead of the files."""
    record: list[tuple[str, int, int]] = []
    token = _CR_RECORD.set(record)
    try:
        yield record
    finally:
        _CR_RECORD.reset(token)


def open_text(path: str | Path, missing_hint: str = "check the path"):
    """`path` opened for reading bytes; DataError for a missing path, a directory or a file
    that cannot be read. Pipes and devices are opened like files."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path}: is a directory, not a text file; give a file")
    if not path.exists():
        raise DataError(f"{path}: file not found; {missing_hint}")
    try:
        return path.open("rb")
    except OSError as err:
        raise DataError(f"{path}: cannot read ({err.strerror}).") from None


def iter_lines(path: str | Path, missing_hint: str = "check the path",
               max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[str]:
    """The lines of a UTF-8 text file, streamed. `missing_hint` ends the error for a missing
    file; a line longer than `max_line_bytes` is a DataError."""
    with open_text(path, missing_hint) as handle:
        line_no = with_cr = first_cr = 0
        while True:
            raw = handle.readline(max_line_bytes + 1)  # binary files split on b"\n" only
            if not raw:
                break
            line_no += 1
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                raise _too_long(str(path), line_no, max_line_bytes, b"\r" in raw)
            line = decode_line(raw, str(path), line_no)
            if "\r" in line:
                with_cr += 1
                first_cr = first_cr or line_no
            yield line
    if with_cr:
        warn_carriage_returns(str(path), with_cr, first_cr)


def read_lines(path: str | Path) -> list[str]:
    """Every line of a UTF-8 text file; a final "\\n" ends the last line, it starts no new one."""
    return list(iter_lines(path))


def count_lines(path: str | Path) -> int:
    """Number of lines as `iter_lines` sees them (a last line without "\\n" counts), in
    constant memory however long the lines."""
    count, last = 0, b"\n"
    with Path(path).open("rb") as handle:
        while block := handle.read(1 << 20):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def is_regular_file(path: str | Path) -> bool:
    """True for a file that can be read twice (counted, then read): not a pipe or device."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _readable_now(fd: int) -> bool:
    try:
        return bool(select.select([fd], [], [], 0)[0])
    except (OSError, ValueError):  # no select on this kind of file: read on, batch more
        return True


def stream_chunks(fd: int, max_lines: int, where: str = "<stdin>",
                  max_line_bytes: int = MAX_LINE_BYTES, warn_carriage_return: bool = True
                  ) -> Iterator[tuple[int, list[str]]]:
    """(number of the first line, lines) from file descriptor `fd`, in order.

    A chunk holds every complete line already available, at most `max_lines`; the reader
    blocks only while it has no line at all. So `cat file |` gives full chunks and a terminal
    gives one line per chunk. A line with invalid UTF-8, or longer than `max_line_bytes`,
    raises DataError after the lines before it have been yielded; the first line holding a
    carriage return is warned of (old Mac line endings read as one line), as `iter_lines`
    warns of them all at its end; not with `warn_carriage_return` False, for a file that
    `iter_lines` has read (and warned of) before.
    """
    ready: list[bytes] = []  # complete lines read but not yet handed out
    pending = _PendingLine(max_line_bytes)
    eof = False
    told_carriage_return = not warn_carriage_return
    next_line = 1
    while True:
        while (len(ready) < max_lines and not eof and not pending.too_long
               and (not ready or _readable_now(fd))):
            data = os.read(fd, _READ_SIZE)
            if not data:
                eof = True
                if pending.size:
                    ready.append(pending.take())
                break
            ready.extend(pending.split(data))
        if not ready:
            if pending.too_long:
                raise _too_long(where, next_line, max_line_bytes,
                                any(b"\r" in piece for piece in pending.pieces))
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
            if "\r" in lines[-1] and not told_carriage_return:
                told_carriage_return = True
                log.warning("%s line %d: a carriage return (\\r) inside the line, so it may be "
                            "several sentences read as one (later lines not counted): %s",
                            where, next_line + len(lines) - 1, CR_HINT)
        yield next_line, lines
        next_line += len(lines)


class _PendingLine:
    """The start of a line whose end has not been read yet, kept as a list of pieces: joining
    once when the line ends is linear in its length, where `partial + data` on every read
    would copy it again and again."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.pieces: list[bytes] = []
        self.size = 0

    @property
    def too_long(self) -> bool:
        return self.size > self.max_bytes

    def take(self) -> bytes:
        line, self.pieces, self.size = b"".join(self.pieces), [], 0
        return line

    def split(self, data: bytes) -> list[bytes]:
        """The lines that `data` completes (with their "\\n" removed); the rest is kept. A
        line over the limit ends the split: it is an error, and what follows is not read."""
        *complete, rest = data.split(b"\n")
        lines = []
        for piece in complete:
            self._add(piece)
            if self.too_long:
                return lines
            lines.append(self.take())
        self._add(rest)
        return lines

    def _add(self, piece: bytes) -> None:
        if piece:
            self.pieces.append(piece)
            self.size += len(piece)
