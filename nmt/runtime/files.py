"""Files and directories written whole or not at all: a reader never sees half of one, and any
failure (an error, Ctrl-C, the SystemExit of a SIGTERM handler) leaves the earlier one as it
was and no temporary beside it. The one way this project writes a file that must not be seen
half-written."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import IO, Iterator

PARTIAL_SUFFIX = ".partial"
_TEXT = {"encoding": "utf-8", "newline": "\n"}


def partial_path(path: str | Path) -> Path:
    """Where `atomic_file` writes `path` until it is complete: `PATH.partial`."""
    path = Path(path)
    return path.with_name(path.name + PARTIAL_SUFFIX)


def staging_path(path: str | Path) -> Path:
    """Where `atomic_directory` builds `path` until it is complete: `.NAME.partial`."""
    path = Path(path)
    return path.with_name(f".{path.name}{PARTIAL_SUFFIX}")


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w") -> Iterator[IO]:
    """An open file ("w": UTF-8 text with "\\n" line ends, "wb": bytes), written into
    `partial_path(path)` and, when the block ends without error, synced to disk and renamed
    onto `path`: even a crash leaves the old file or the whole new one."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_file writes with mode 'w' or 'wb', not {mode!r}")
    path = Path(path)
    partial = partial_path(path)
    handle = None
    try:
        handle = open(partial, mode, **({} if mode == "wb" else _TEXT))
        yield handle
        handle.flush()
        os.fsync(handle.fileno())
        handle.close()
        os.replace(partial, path)
    except BaseException:
        if handle is not None:
            with contextlib.suppress(OSError):  # a full disk again: the first error is the one
                handle.close()
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        raise


def write_atomically(path: str | Path, data: str | bytes) -> None:
    """Replace `path` with `data` (text as UTF-8), whole or not at all."""
    with atomic_file(path, "wb" if isinstance(data, bytes) else "w") as out:
        out.write(data)


@contextlib.contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """A new empty directory, `staging_path(path)`, to fill. When the block ends without error
    its files are synced and it replaces `path` (one already there is renamed aside to
    `.NAME.old`, then removed); on any failure it is removed and `path` stays as it was."""
    path = Path(path)
    staging = staging_path(path)
    aside = path.with_name(f".{path.name}.old")
    # What a process killed with SIGKILL here left behind:
    _remove_tree(staging)
    _restore(aside, path)
    _remove_tree(aside)
    try:
        staging.mkdir(parents=True)
        yield staging
        _sync_tree(staging)
        if path.exists() or path.is_symlink():
            path.rename(aside)
        staging.rename(path)
    except BaseException:
        _remove_tree(staging)
        with contextlib.suppress(OSError):  # else the earlier one stays at `aside`
            _restore(aside, path)
        raise
    finally:
        if path.exists():
            _remove_tree(aside)


def _restore(aside: Path, path: Path) -> None:
    """Put the earlier directory back where a failure (or a kill) took it away."""
    if aside.exists() and not path.exists():
        aside.rename(path)


def _remove_tree(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


def _sync_tree(directory: Path) -> None:
    """fsync every file and directory under `directory`, so that the rename publishes
    complete files even across a crash."""
    for root, _, names in os.walk(directory):
        for name in names:
            if not os.path.islink(os.path.join(root, name)):
                _sync(os.path.join(root, name))
        _sync(root)


def _sync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
