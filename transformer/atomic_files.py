"""Files written whole or not at all: the one way this project writes a file that must never
be seen half-written, and the one durability rule for it.

The content goes to a temporary beside the file, is flushed and fsynced, renamed onto the
file, and the directory is fsynced so that the rename itself survives a crash; any failure
(an error, Ctrl-C, the SystemExit of a SIGTERM handler) removes the temporary and leaves the
earlier file as it was. Only the standard library: every layer may use it (`data` too).

A temporary that outlives a call (a directory filled by a long job) is held with an flock by
its writer; the kernel releases that lock however its process ends, so the next writer of the
same path recognises one whose writer was killed (SIGKILL, a crash) and takes it over or
removes it. `nmt.runtime.files` wraps all this with temporaries of its own names and a check
that nobody else wrote the file meanwhile.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator

DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_TEXT = {"encoding": "utf-8", "newline": "\n"}
_NAMES_TRIED = 100
ABANDONED_AFTER = 60.0  # seconds: an unlocked temporary this old has lost its writer


def new_temporary(path: Path) -> tuple[int, Path]:
    """(open descriptor, name) of a new file beside `path`, created with the permissions of
    any new file (mkstemp's are 0600, which a file shared with other users must not get)."""
    return _create_beside(path, f".{path.name}.", ".tmp", lambda name: os.open(
        name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))


def new_directory(path: Path, label: str = "") -> tuple[int, Path]:
    """(open descriptor holding its flock, name) of a new directory `.NAME-LABELRANDOM` beside
    `path` (`create_directory`)."""
    return _create_beside(path, f".{path.name}-{label}", "", create_directory)


def _create_beside(path: Path, prefix: str, suffix: str, create: Callable[[Path], int]
                   ) -> tuple[int, Path]:
    """(`create(name)`, name) for the first free of `_NAMES_TRIED` random names
    PREFIX-RANDOM-SUFFIX beside `path`; `create` raises FileExistsError for a taken one."""
    for _ in range(_NAMES_TRIED):
        name = path.with_name(f"{prefix}{secrets.token_hex(4)}{suffix}")
        with contextlib.suppress(FileExistsError):
            return create(name), name
    raise FileExistsError(errno.EEXIST, f"{_NAMES_TRIED} temporary names were all taken",
                          str(path))


def create_directory(name: Path) -> int:
    """An open descriptor, holding its flock (`hold`), of the new directory `name`
    (FileExistsError where one is there), made with the permissions of any new directory
    (mkdtemp's are 0700, which a cache shared with other users must not get)."""
    name.mkdir()
    return hold(os.open(name, os.O_RDONLY))


def hold(fd: int) -> int:
    """Take the flock of `fd`, a temporary this process has just created, so that the next
    writer of the same path tells it from one whose writer was killed; returns `fd`.

    It waits: another process's `take_over` may hold the lock at this moment, and lets go at
    once (a new temporary is young). Not waiting left the temporary unlocked for good, to be
    removed or emptied by a later look while still being written."""
    with contextlib.suppress(OSError):  # no flock here: then nobody takes it but its creator
        fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def take_over(name: Path, flags: int = os.O_RDONLY) -> int | None:
    """An open descriptor of the temporary `name` (a file opened with `flags`, or a directory
    with O_RDONLY), holding its flock, when its writer is gone (the kernel released its lock);
    None while a writer holds it. One modified within ABANDONED_AFTER seconds is left alone:
    its writer may have created it and not yet locked it."""
    try:
        fd = os.open(name, flags)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        st, named = os.fstat(fd), os.lstat(name)
        if ((st.st_dev, st.st_ino) == (named.st_dev, named.st_ino)  # not replaced meanwhile
                and time.time() - st.st_mtime > ABANDONED_AFTER):
            return fd
    except OSError:  # its writer holds it (or no flock here), or it is gone
        pass
    os.close(fd)
    return None


def remove_abandoned(temporaries: Iterable[Path], flags: int = os.O_RDONLY,
                     removing: Callable[[Path], None] = lambda name: None) -> None:
    """Remove those of `temporaries` whose writers are gone (`take_over`), each announced to
    `removing` first."""
    for name in list(temporaries):
        if (fd := take_over(name, flags)) is not None:
            try:
                removing(name)
                remove_tree(name)
            finally:
                os.close(fd)


def remove_tree(path: Path) -> None:
    """Remove the file, link or directory tree `path`, as much of it as can be removed."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


def sync_directory(directory: Path) -> None:
    """fsync `directory`, so that a rename in it survives a crash."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno != errno.EINVAL:  # a file system that cannot sync a directory says so
            raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "wb", *,
                temporary: Callable[[Path], tuple[int, Path]] = new_temporary,
                publish: Callable[[Path, Path], None] | None = None) -> Iterator[IO]:
    """An open file ("wb": bytes, "w": UTF-8 text with "\\n" line ends) that replaces `path`
    when the block ends without error, and is removed when it does not.

    `temporary(path)` opens the file written (default: a new one beside `path`);
    `publish(temporary, path)` puts it in place once it is synced (default: `os.replace`),
    while it is still open. An error naming the temporary (a read-only directory, a denied
    permission), or a full disk, which names no file, is raised naming `path`."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_file writes with mode 'w' or 'wb', not {mode!r}")
    path = Path(path)
    try:
        fd, written = temporary(path)
    except OSError as err:  # whatever it names, it is about a temporary of `path`
        raise _naming(err, path) from err
    handle, published = None, False
    try:
        handle = open(fd, mode, **({} if mode == "wb" else _TEXT))
        yield handle
        handle.flush()
        os.fsync(handle.fileno())
        (publish or os.replace)(written, path)
        published = True
        sync_directory(path.parent)
    except BaseException as err:
        if not published:  # once published the name may already be another writer's
            with contextlib.suppress(OSError):
                written.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # a full disk again: the first error is the one
            if handle is not None:
                handle.close()
            else:
                os.close(fd)
        if isinstance(err, OSError) and (str(err.filename) == str(written) if err.filename
                                         else err.errno in DISK_FULL):
            raise _naming(err, path) from err
        raise
    with contextlib.suppress(OSError):  # synced and in place: closing cannot change that
        handle.close()


def _naming(err: OSError, path: Path) -> OSError:
    """`err` naming `path`: its temporary's hidden random name means nothing to a reader."""
    return OSError(err.errno, err.strerror, str(path)) if err.errno is not None else err


def write_atomically(path: str | Path, data: str | bytes) -> None:
    """Replace `path` with `data` (text as UTF-8), whole or not at all."""
    with atomic_file(path, "wb" if isinstance(data, bytes) else "w") as out:
        out.write(data)
