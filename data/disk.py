"""Free disk space, checked before work that writes a corpus-sized file, not after an hour."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from data.config import DataError
from transformer.atomic_files import DISK_FULL

_MORE_SPACE = "free some space, or set FLAX_NMT_CACHE to a directory on a larger disk"


class DiskFull(DataError):
    """The cache's disk has no room for a corpus: the machine's state, not the command's
    mistake (train.py exits 1, as for a checkpoint that a full disk stops)."""


def _existing(path: Path) -> Path:
    """`path`, or its nearest ancestor that exists (the cache may not be created yet)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def gib(n_bytes: float) -> str:
    return f"{n_bytes / (1 << 30):.1f} GiB"


def free_space(directory: str | Path) -> int:
    """Bytes free on the filesystem that holds, or will hold, `directory`."""
    return shutil.disk_usage(_existing(Path(directory))).free


def check_free_space(directory: str | Path, needed: float, what: str) -> None:
    """DiskFull naming the estimate and the free space when `what` would need `needed`
    bytes in `directory` and the filesystem has fewer free."""
    directory = Path(directory)
    free = free_space(directory)
    if needed > free:
        raise DiskFull(
            f"{what} needs about {gib(needed)} in {directory} but only {gib(free)} is free; "
            f"{_MORE_SPACE}")


def raise_if_disk_full(err: OSError, directory: str | Path, what: str) -> None:
    """DiskFull naming `directory` in place of `err` when `err` says its disk is full (a
    write's error names no file, and the estimate checked before was too low)."""
    if err.errno in DISK_FULL:
        raise DiskFull(f"{what} in {directory}: {os.strerror(err.errno).lower()}; "
                        f"{_MORE_SPACE}") from err


# Disk per byte of input text, checked before it is read (the encoding is checked again with
# the tokenizer's ids, `data.encoding._check_room_to_encode`): its copy as Arrow strings (1.0,
# with a margin), and its encoding at the default 8,000 pieces, the store plus the workers'
# Arrow files beside it: 1.9x the text of Multi30k's train split, 2.2x small_parallel_enja's.
TEXT_BYTES_PER_TEXT_BYTE = 1.1
ENCODED_BYTES_PER_TEXT_BYTE = 2.5
