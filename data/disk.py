"""Free disk space, checked before work that writes a corpus-sized file, not after an hour."""

from __future__ import annotations

import shutil
from pathlib import Path

from data.config import DataError


def _existing(path: Path) -> Path:
    """`path`, or its nearest ancestor that exists (the cache may not be created yet)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def gib(n_bytes: float) -> str:
    return f"{n_bytes / (1 << 30):.1f} GiB"


def check_free_space(directory: str | Path, needed: float, what: str) -> None:
    """DataError naming the estimate and the free space when `what` would need `needed`
    bytes in `directory` and the filesystem has fewer free."""
    directory = Path(directory)
    free = shutil.disk_usage(_existing(directory)).free
    if needed > free:
        raise DataError(
            f"{what} needs about {gib(needed)} in {directory} but only {gib(free)} is free; "
            "free some space, or set FLAX_NMT_CACHE to a directory on a larger disk")


# Disk per byte of input text, with a margin over what the recombined 4.5M- and 36M-pair
# corpora took (docs/performance.md): its copy as Arrow strings (1.0), and its encoding
# (`data.encoding`), the ids twice while the store is written from the workers' Arrow files
# (2.1).
TEXT_BYTES_PER_TEXT_BYTE = 1.1
ENCODED_BYTES_PER_TEXT_BYTE = 2.5
