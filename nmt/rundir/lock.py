"""One trainer per run directory: `RUN/.lock`, held with flock while a trainer runs (and
one distillation per output directory, the same way).

The kernel releases an flock when its process ends, however it ends, so a lock file left by
a killed trainer never blocks the next one; the file's text (pid, host, start time) only
serves the message naming the trainer that holds it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from pathlib import Path

LOCK_FILE = ".lock"


class RunDirectoryInUse(RuntimeError):
    """Another trainer holds the run directory."""


class LockingUnsupported(RuntimeError):
    """The run directory's filesystem refuses file locks (NFS without a lock daemon, say)."""


# What flock raises where a filesystem cannot lock: no lock manager (NFS), or no flock at all.
_NO_LOCKING = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


class RunLock:
    """`with RunLock(run_dir):` holds the directory, or raises RunDirectoryInUse. `user` and
    `flag` name, in that error, what holds the directory and the flag that chose it."""

    def __init__(self, run_dir: str | Path, user: str = "trainer", flag: str = "--output-dir"):
        self.path = Path(run_dir) / LOCK_FILE
        self.user, self.flag = user, flag
        self._fd: int | None = None

    def __enter__(self) -> "RunLock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunDirectoryInUse(
                f"{self.path.parent} is in use by another {self.user} ({holder}); wait for it "
                f"to finish or stop it, or choose another {self.flag}.") from None
        except OSError as err:
            os.close(fd)
            if err.errno not in _NO_LOCKING:
                raise
            raise LockingUnsupported(
                f"cannot lock {self.path}: the filesystem of {self.path.parent} does not "
                f"support file locks ({err.strerror}); put {self.flag} on a local disk or on "
                "a mount with locking enabled.") from None
        os.ftruncate(fd, 0)
        os.write(fd, (f"pid {os.getpid()} on {socket.gethostname()}, started "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n").encode())
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the flock; the file stays, harmlessly
            self._fd = None


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "its process id is not recorded"
