"""Files and directories written whole or not at all: a reader never sees half of one, and any
failure (an error, Ctrl-C, the SystemExit of a SIGTERM handler) leaves the earlier one as it
was and no temporary beside it. Files are written by `transformer.atomic_files`, the one way
this project writes a file that must not be seen half-written; this module adds what the
application needs around it.

Each writer of a file has its own temporary, `PATH.partial` (or `PATH.partial.1`, ... while
another process writes the same path), held with an flock while it is written; the kernel
releases that lock however its process ends, so the temporary of a process killed with
SIGKILL is recognised and removed by the next writer of the same path. A writer publishes its
file only if `PATH` is as it was when it began: a file that another process wrote there in the
meantime is kept, and this writer's complete file is kept beside it (`ChangedMeanwhile`).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from pathlib import Path
from typing import IO, Callable, Iterator, NamedTuple

from nmt.runtime.cli import Fault
from transformer import atomic_files

PARTIAL_SUFFIX = ".partial"
KEPT_SUFFIX = ".kept"
_MAX_WRITERS = 100  # temporaries PATH.partial, PATH.partial.1, ... tried
ABANDONED_AFTER = atomic_files.ABANDONED_AFTER  # an unlocked temporary this old is abandoned


class ChangedMeanwhile(Fault):
    """Another process wrote the destination while this one wrote its temporary."""


class FileState(NamedTuple):
    """What identifies one version of a file: replacing it or writing to it changes this."""

    device: int
    inode: int
    size: int
    mtime_ns: int


def file_state(path: str | Path) -> FileState | None:
    """The state of `path` now (of a symbolic link itself, not its target); None if absent."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return FileState(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def partial_path(path: str | Path, number: int = 0) -> Path:
    """Where `atomic_file` writes `path` until it is complete: `PATH.partial`, or with another
    writer of the same path at work, `PATH.partial.NUMBER`."""
    path = Path(path)
    return path.with_name(path.name + PARTIAL_SUFFIX + (f".{number}" if number else ""))


def partial_paths(path: str | Path) -> list[Path]:
    """The temporaries of `path` that exist now (being written, or left by a killed writer)."""
    return _numbered(partial_path(path))


def _numbered(first: Path) -> list[Path]:
    """`first` and its numbered siblings (`first`.1, ...) that exist now."""
    pattern = re.compile(re.escape(first.name) + r"(\.[0-9]+)?")
    with contextlib.suppress(OSError):
        return sorted(p for p in first.parent.iterdir() if pattern.fullmatch(p.name))
    return []


def staging_path(path: str | Path, number: int = 0) -> Path:
    """Where `atomic_directory` builds `path` until it is complete: `.NAME.partial`, or with
    another writer of the same path at work, `.NAME.partial.NUMBER`."""
    path = Path(path)
    return path.with_name(f".{path.name}{PARTIAL_SUFFIX}" + (f".{number}" if number else ""))


def _claim(path: Path) -> tuple[int, Path]:
    """(open descriptor, name) of a temporary for `path` that this process alone writes,
    locked: a new one, or an emptied one whose writer was killed."""
    return _first_free(path, partial_path,
                       lambda name: atomic_files.hold(
                           os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)),
                       os.O_WRONLY, lambda fd, name: os.ftruncate(fd, 0), "temporaries")


def _first_free(path: Path, name_of: Callable[[Path, int], Path],
                create: Callable[[Path], int], flags: int, empty: Callable[[int, Path], None],
                what: str) -> tuple[int, Path]:
    """(open descriptor holding its flock, name) of the first of `name_of(path, 0)`,
    `name_of(path, 1)`, ... this process can have: one `create` makes now, its flock held
    (FileExistsError where one is there), or one whose writer was killed, taken over and
    emptied (`empty`)."""
    for number in range(_MAX_WRITERS):
        candidate = name_of(path, number)
        try:
            fd = create(candidate)
        except FileExistsError:
            fd = atomic_files.take_over(candidate, flags)
            if fd is None:
                continue  # another writer's
            empty(fd, candidate)
        return fd, candidate
    raise Fault(f"{path}: {_MAX_WRITERS} other processes are writing it, or have left their "
                f"{what} {name_of(path, 0)}.N within the last minute; wait for them")


def _remove_abandoned(temporaries: list[Path], keep: Path, flags: int = os.O_WRONLY) -> None:
    """Remove the `temporaries` but `keep` (files, or directories opened with `flags` O_RDONLY)
    whose writers are gone (killed with SIGKILL), by `atomic_files.take_over`'s rule."""
    atomic_files.remove_abandoned((other for other in temporaries if other != keep), flags)


def _keep_aside(partial: Path, path: Path) -> Path:
    """Give the complete temporary a name of its own, `PATH.kept` (or `PATH.kept.N`), without
    replacing anything there."""
    for number in range(_MAX_WRITERS):
        kept = path.with_name(path.name + KEPT_SUFFIX + (f".{number}" if number else ""))
        try:
            os.link(partial, kept)
        except FileExistsError:
            continue
        except OSError:  # no hard links here: a rename, after looking
            if kept.exists() or kept.is_symlink():
                continue
            os.rename(partial, kept)
            return kept
        partial.unlink()
        return kept
    return partial


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w", since: FileState | None | str = "now"
                ) -> Iterator[IO]:
    """An open file ("w": UTF-8 text with "\\n" line ends, "wb": bytes), written into a
    temporary of its own (`partial_path`) and, when the block ends without error, synced to
    disk and renamed onto `path` (`transformer.atomic_files.atomic_file`): even a crash leaves
    the old file or the whole new one.

    `since` is the `file_state` of `path` when the work began ("now": when this is called);
    if `path` changed after it, the result is not renamed onto it but kept beside it, and
    ChangedMeanwhile says where. (Between that last look and the rename another writer could
    still slip in; the window is one system call wide.)

    A symbolic link is followed: the file it names is replaced, not the link. A stream (a
    pipe, a FIFO, a device such as /dev/stdout) is written directly: it has no earlier
    version to keep, and its directory is no place for a temporary."""
    path = Path(path)
    if is_stream(path):
        try:
            with open(path, mode, **({} if "b" in mode else {"encoding": "utf-8",
                                                              "newline": "\n"})) as handle:
                yield handle
        except OSError as err:  # a write names no file: the stream is the one at fault
            err.filename = err.filename or str(path)
            raise
        return
    path = output_target(path)
    if since == "now":
        since = file_state(path)
    kept: list[Path] = []

    def claim(path: Path) -> tuple[int, Path]:
        fd, partial = _claim(path)
        _remove_abandoned(partial_paths(path), keep=partial)
        return fd, partial

    def publish(partial: Path, path: Path) -> None:
        # Called while the temporary is open, its lock held: nobody takes it over.
        if file_state(path) == since:
            with contextlib.suppress(OSError):  # the file keeps its permissions
                os.chmod(partial, stat.S_IMODE(os.stat(path).st_mode))
            os.replace(partial, path)
        else:
            kept.append(_keep_aside(partial, path))

    with atomic_files.atomic_file(path, mode, temporary=claim, publish=publish) as handle:
        yield handle
    if kept:
        raise ChangedMeanwhile(
            f"{path} was written by another process while this one was writing it; that file "
            f"is kept, and this run's complete output is in {kept[0]}: compare the two and "
            f"rename {kept[0]} onto {path} if it is the one you want (or run one command at a "
            "time per output file).")


def is_stream(path: str | Path) -> bool:
    """Whether `path` (links followed) is there and neither a regular file nor a directory."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def output_target(path: str | Path) -> Path:
    """The file that writing `path` replaces: the one a symbolic link names (to be created if
    missing), else `path` itself."""
    path = Path(path)
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def write_atomically(path: str | Path, data: str | bytes,
                     since: FileState | None | str = "now") -> None:
    """Replace `path` with `data` (text as UTF-8), whole or not at all; `since` as for
    `atomic_file`."""
    with atomic_file(path, "wb" if isinstance(data, bytes) else "w", since) as out:
        out.write(data)


@contextlib.contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """A new empty directory, `staging_path(path)`, to fill. When the block ends without error
    its files are synced and it replaces `path` (one already there is renamed aside to
    `.NAME.old`, then removed); on any failure it is removed and `path` stays as it was."""
    path = Path(path)
    aside = path.with_name(f".{path.name}.old")
    staging, lock = _claim_staging(path)
    # What a process killed with SIGKILL between the two renames below left behind:
    _restore(aside, path)
    atomic_files.remove_tree(aside)
    try:
        yield staging
        _sync_tree(staging)
        if path.exists() or path.is_symlink():
            path.rename(aside)
        staging.rename(path)
    except BaseException:
        atomic_files.remove_tree(staging)
        with contextlib.suppress(OSError):  # else the earlier one stays at `aside`
            _restore(aside, path)
        raise
    finally:
        os.close(lock)
        if path.exists():
            atomic_files.remove_tree(aside)


def _claim_staging(path: Path) -> tuple[Path, int]:
    """(a new empty staging directory for `path` that this process alone fills, the open
    descriptor holding its flock): `.NAME.partial`, or the next free number while other
    writers fill theirs; that of a killed writer is emptied and taken over, and the others
    killed writers left are removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, staging = _first_free(path, staging_path, atomic_files.create_directory, os.O_RDONLY,
                              _empty_directory, "staging directories")
    _remove_abandoned(_numbered(staging_path(path)), keep=staging, flags=os.O_RDONLY)
    return staging, fd


def _empty_directory(fd: int, name: Path) -> None:
    for child in list(name.iterdir()):
        atomic_files.remove_tree(child)


def _restore(aside: Path, path: Path) -> None:
    """Put the earlier directory back where a failure (or a kill) took it away."""
    if aside.exists() and not path.exists():
        aside.rename(path)


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
