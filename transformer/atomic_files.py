"""Files written whole or not at all: the one way this project writes a file that must never
be seen half-written, and the one durability rule for it.

The content goes to a temporary beside the file, is flushed and fsynced, renamed onto the
file, and the directory is fsynced so that the rename itself survives a crash; any failure
(an error, Ctrl-C, the SystemExit of a SIGTERM handler) removes the temporary and leaves the
earlier file as it was. Only the standard library: every layer may use it (`data` too).
`nmt.runtime.files` wraps it with temporaries that survive their writer being killed and a
check that nobody else wrote the file meanwhile.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from pathlib import Path
from typing import IO, Callable, Iterator

DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_TEXT = {"encoding": "utf-8", "newline": "\n"}
_NAMES_TRIED = 100


def new_temporary(path: Path) -> tuple[int, Path]:
    """(open descriptor, name) of a new file beside `path`, created with the permissions of
    any new file (mkstemp's are 0600, which a file shared with other users must not get)."""
    for _ in range(_NAMES_TRIED):
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), temporary
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"{_NAMES_TRIED} temporary names were all taken",
                          str(path))


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
    while it is still open. A full disk, which names no file, is raised naming `path`."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_file writes with mode 'w' or 'wb', not {mode!r}")
    path = Path(path)
    fd, written = temporary(path)
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
        if isinstance(err, OSError) and not err.filename and err.errno in DISK_FULL:
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise
    with contextlib.suppress(OSError):  # synced and in place: closing cannot change that
        handle.close()


def write_atomically(path: str | Path, data: str | bytes) -> None:
    """Replace `path` with `data` (text as UTF-8), whole or not at all."""
    with atomic_file(path, "wb" if isinstance(data, bytes) else "w") as out:
        out.write(data)
