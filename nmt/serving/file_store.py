"""Translated files kept in memory until their download: each for `KEEP_SECONDS`, at most
`KEEP_FILES` files and `KEEP_BYTES` bytes, the oldest dropped first; a file larger than
`KEEP_BYTES` is refused (413)."""

from __future__ import annotations

import collections
import dataclasses
import re
import time
import unicodedata
import urllib.parse
import uuid

from nmt.serving.errors import RequestError

KEEP_SECONDS = 30 * 60
KEEP_FILES = 256
KEEP_BYTES = 256 << 20
# Characters a name shows nothing of, or that reorder what it shows (U+202E turns
# "\u202egnp.txt" into "txt.png" on screen): controls, format characters (bidi marks and
# overrides, joiners, soft hyphen, BOM) and line or paragraph separators.
INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})


@dataclasses.dataclass(frozen=True)
class _Kept:
    data: bytes
    media_type: str
    filename: str
    expires: float


class FileStore:
    """Translated files by name, each for `KEEP_SECONDS`, within `KEEP_FILES`/`KEEP_BYTES`."""

    def __init__(self):
        self._files: collections.OrderedDict[str, _Kept] = collections.OrderedDict()
        self._bytes = 0

    def put(self, data: bytes, filename: str, media_type: str) -> str:
        """The name to download `data` by; RequestError 413 if it alone is more than the
        store keeps (refused before any other file is dropped for it)."""
        if len(data) > KEEP_BYTES:
            raise RequestError(413, f"the translated file is {len(data)} bytes, more than "
                                    f"this server keeps for download ({KEEP_BYTES} bytes)")
        self._expire()
        name = f"{uuid.uuid4().hex}.{safe_name(filename)}"
        self._files[name] = _Kept(data, media_type, filename, time.monotonic() + KEEP_SECONDS)
        self._bytes += len(data)
        while len(self._files) > KEEP_FILES or self._bytes > KEEP_BYTES:
            self._drop_oldest()
        return name

    def get(self, name: str) -> _Kept | None:
        self._expire()
        return self._files.get(name)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._files and next(iter(self._files.values())).expires <= now:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        _, kept = self._files.popitem(last=False)
        self._bytes -= len(kept.data)


def safe_name(filename: str) -> str:
    """The file's base name with only letters, digits, '.', '-' and '_' (at most 100)."""
    return re.sub(r"[^\w.-]", "_", _base_name(filename), flags=re.ASCII) or "file"


def content_disposition(filename: str) -> str:
    """The Content-Disposition of a download of `filename`: its `safe_name`, and where that
    differs its base name as sent, in RFC 6266's UTF-8 form (filename*), which browsers
    prefer ("报告 2024.txt" rather than "___2024.txt")."""
    fallback, original = safe_name(filename), _base_name(filename)
    if not original or original == fallback:
        return f'attachment; filename="{fallback}"'
    encoded = urllib.parse.quote(original, safe="!#$&+-.^_`|~", errors="replace")
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{encoded}"


def _base_name(filename: str) -> str:
    """The name without its folders, invisible characters or leading dots (its last 100
    characters). A name of dots and a suffix ("...txt", whose kind is .txt) is "file" and
    that suffix: the download ends in the suffix the upload was read by."""
    base = re.split(r"[\\/]", filename)[-1]
    shown = "".join(char for char in base
                    if unicodedata.category(char) not in INVISIBLE_CATEGORIES)[-100:]
    name = shown.lstrip(".")
    return f"file.{name}" if name and "." not in name and "." in shown else name
