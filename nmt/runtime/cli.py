"""How train.py and translate.py end on a mistake or a fault: one line, never a traceback.

    PROG: error: WHAT (the value or path), what to do

Exit status 2 for usage errors (a bad flag, value or path given by the user), 1 for faults
met while running (disk full, damaged files), 130 after Ctrl-C (SIGINT) and 143 after SIGTERM,
also when the command saved its work before stopping. Set NMT_DEBUG=1 in the
environment to get the traceback of an unexpected error instead of its one-line summary.
"""

from __future__ import annotations

import argparse
import errno
import gc
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Callable, NoReturn

from nmt.runtime import allocator
from transformer.config import MAX_SEED

EXIT_FAULT, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130
# A command that stopped on a signal after saving its work exits as the shell reports a
# process killed by it: 128 + the signal's number.
EXIT_SIGNALLED = {"SIGINT": EXIT_INTERRUPTED, "SIGTERM": 143}
DEBUG_VARIABLE = "NMT_DEBUG"


class UsageError(Exception):
    """A flag, value or path the user gave cannot be used (exit status 2)."""


class Fault(Exception):
    """Running met a fault the user can fix (disk full, a damaged file; exit status 1)."""


class Terminated(BaseException):
    """SIGTERM outside the trainer's own handling (`stop_on_sigterm`; exit status 143)."""


def stop_on_sigterm() -> None:
    """Take SIGTERM back from JAX's distributed runtime, whose preemption notifier catches it
    and lets the process wait on at a barrier: it raises Terminated, which `guarded` turns
    into one line. The trainer's own handler (saving first) replaces it while training."""
    signal.signal(signal.SIGTERM, _terminated)


def _terminated(signum, frame) -> NoReturn:
    raise Terminated


def debugging() -> bool:
    return os.environ.get(DEBUG_VARIABLE, "") not in ("", "0")


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line naming it (the usage is one `--help` away), and a
    flag is only ever its whole name: argparse would take `--lr` for `--lr-scale`, a setting
    that only the noam schedule reads."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def error(self, message: str) -> NoReturn:
        fail(self.prog, f"{message}; see {self.prog} --help", EXIT_USAGE)


def given(text: str) -> str:
    """An argparse type: a path or a name, not blank (an empty one would read as left out)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is blank; give a value, or leave the flag out")
    return text


def seed(text: str) -> int:
    """An argparse type: a random seed, an unsigned 32-bit integer as SentencePiece and
    train.py's --seed take."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to {MAX_SEED} (2**32 - 1), "
                                         f"got {value}")
    return value


def fail(prog: str, message: str, code: int) -> NoReturn:
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr, flush=True)
    sys.exit(code)


def describe_os_error(err: OSError) -> str:
    """An OSError as WHAT (path), what to do."""
    path = err.filename or "a file"
    advice = {
        errno.ENOSPC: "no space left on the device; free some space (or choose a directory on "
                      "another disk) and run the same command again",
        errno.EDQUOT: "disk quota exceeded; free some space and run the same command again",
        errno.EROFS: "read-only file system; choose a writable directory",
        errno.EACCES: "permission denied; choose a directory you can write to",
        errno.EPERM: "operation not permitted; choose a directory you can write to",
        errno.EEXIST: "exists and is not a directory; choose another path",
        errno.ENOTDIR: "a part of the path is a file, not a directory; choose another path",
        errno.ENOENT: "does not exist; check the path",
        errno.EISDIR: "is a directory; give a file name",
    }.get(err.errno, err.strerror or str(err))
    return f"{path}: {advice}"


def guarded(prog: str, main: Callable[[], int],
            failed: Callable[[str, int], None] | None = None) -> int:
    """Run `main`, turning every error that escapes it into one line and an exit status;
    `failed(line, status)` is then called with the line, less `prog: error: `."""
    try:
        return main()
    except SystemExit:
        raise
    except (KeyboardInterrupt, Terminated) as err:
        line, signal_name = (("interrupted", "SIGINT") if isinstance(err, KeyboardInterrupt)
                             else ("terminated (SIGTERM)", "SIGTERM"))
        status = EXIT_SIGNALLED[signal_name]
        print(f"{prog}: {line}", file=sys.stderr, flush=True)
        if failed is not None:  # the other processes of a run end too, not wait for this one
            failed(line, status)
        return status
    except (UsageError, Fault) as err:
        line, status = str(err), EXIT_USAGE if isinstance(err, UsageError) else EXIT_FAULT
    except OSError as err:
        if debugging():
            raise
        line, status = describe_os_error(err), EXIT_FAULT
    except Exception as err:  # noqa: BLE001 - the last line of defence: one line, not a trace
        if debugging():
            raise
        text = " ".join(str(err).split())[:400]
        line = (f"unexpected {type(err).__name__}: {text}; run again with {DEBUG_VARIABLE}=1 "
                "for the traceback, and report it if the cause is not yours")
        status = EXIT_FAULT
    print(f"{prog}: error: {line}", file=sys.stderr, flush=True)
    if failed is not None:
        failed(line, status)
    return status


_collecting_after_start = False  # start_without_collecting() turned the collector off


def start_without_collecting() -> None:
    """Keep Python's garbage collector off while a command starts, until `done_starting()`.

    Importing JAX and Flax and building a model make hundreds of thousands of objects that live
    as long as the process, and every full collection walks all of them: three such passes took
    0.1 s of a one-sentence translate.py run, 0.4 s of a short train.py run. For a command's
    own process only (the scripts' entry points), never for a library call."""
    global _collecting_after_start
    if gc.isenabled():
        gc.disable()
        _collecting_after_start = True


def done_starting() -> None:
    """What start-up made is kept out of every later collection (`gc.freeze`), and the
    collector runs again; nothing where `start_without_collecting` was not called."""
    global _collecting_after_start
    if _collecting_after_start:
        _collecting_after_start = False
        gc.freeze()
        gc.enable()


def exit_quickly(code: int) -> NoReturn:
    """sys.exit(code), without the garbage collector's last passes over every object JAX
    made (0.2 s of a translate.py run). Nothing waits on them: files are closed by then, and
    atexit handlers and logging's flush still run."""
    gc.freeze()
    sys.exit(code)


class _CurrentStderr(logging.StreamHandler):
    """A handler writing to whatever sys.stderr is now, not to the stream of the first call
    (main() runs many times in one process under tests and notebooks)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


class _NoLibraryTracebacks(logging.Filter):
    """Drops the records of libraries (`names`) that carry an exception: orbax's background
    threads log every failed write of a save with its traceback (dozens when the disk is
    full), and the same failure reaches our code, which reports it in one line."""

    def __init__(self, names: tuple[str, ...]):
        super().__init__()
        self.names = names

    def filter(self, record: logging.LogRecord) -> bool:
        library = any(record.name == n or record.name.startswith(n + ".") for n in self.names)
        return not (library and (record.exc_info or "Traceback" in record.getMessage()))


def _quiet_abandoned_io(default: Callable) -> Callable:
    """An unraisable-exception hook that drops what orbax's abandoned I/O prints, each a
    traceback Python then ignores, for a failure our code reports in one line:
    - "Event loop is closed": after a failed save, TensorStore's write callbacks keep arriving
      at orbax's closed event loop (a hundred when the disk fills);
    - a read coroutine of orbax's that raised after the restore it served had failed (another
      model's shapes: one per array, each with a TensorStore spec of fifty lines)."""

    def hook(unraisable) -> None:
        value = unraisable.exc_value
        if isinstance(value, RuntimeError) and str(value) == "Event loop is closed":
            return
        code = getattr(unraisable.object, "cr_code", None)
        if code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename:
            return
        default(unraisable)

    return hook


def setup_logging(level: int, fmt: str, quiet_loggers: tuple[str, ...]) -> None:
    """The root logger at `level` with one handler on sys.stderr, replacing earlier set-ups.

    `quiet_loggers` (libraries) log warnings and errors only, and without tracebacks unless
    NMT_DEBUG is set; asyncio's, whose only tasks are orbax's writes, are among them."""
    handler = _CurrentStderr()
    handler.setFormatter(logging.Formatter(fmt))
    if not debugging():
        handler.addFilter(_NoLibraryTracebacks((*quiet_loggers, "asyncio")))
        sys.unraisablehook = _quiet_abandoned_io(sys.__unraisablehook__)
    logging.basicConfig(level=level, handlers=[handler], force=True)
    # An earlier set-up in this process (translate.py quiets `data`) must not mute this one's.
    for name in _quieted - set(quiet_loggers):
        logging.getLogger(name).setLevel(logging.NOTSET)
    for name in quiet_loggers:
        logging.getLogger(name).setLevel(logging.WARNING)
    _quieted.clear()
    _quieted.update(quiet_loggers)


_quieted: set[str] = set()  # the loggers the last `setup_logging` set to warnings only


def allocator_status() -> allocator.Status:
    """The malloc in effect (nmt.runtime.allocator); UsageError for a bad NMT_ALLOCATOR."""
    try:
        return allocator.status()
    except allocator.AllocatorError as err:
        raise UsageError(str(err)) from None


def check_jax_platforms() -> None:
    """UsageError where JAX_PLATFORMS names a backend JAX cannot start here, before the first
    device is asked for: JAX's own error is empty (cuda) or names another backend (gpu)."""
    value = os.environ.get("JAX_PLATFORMS", "").strip()
    if not value:
        return
    import jax

    try:
        jax.devices()
    except (AssertionError, RuntimeError) as err:
        names = {name.strip().lower() for name in value.split(",")}
        plugin = ("jax-cuda" if names & {"cuda", "gpu"} else
                  "libtpu" if "tpu" in names else None)
        if plugin is not None and _installed(plugin):  # there, but it found no device
            raise UsageError(
                f"JAX_PLATFORMS={value}: JAX's {plugin} plugin is installed but could not "
                f"start a device ({str(err).strip() or type(err).__name__}); check that one "
                "is visible (nvidia-smi, CUDA_VISIBLE_DEVICES, the driver), or unset "
                "JAX_PLATFORMS to use the devices JAX finds") from None
        if names & {"cuda", "gpu"}:
            fix = ("install JAX for CUDA, pip install -e '.[cuda]' (or '.[cuda12]' for older "
                   "drivers) as the README says")
        elif "tpu" in names:
            fix = "install JAX for TPUs, pip install -e '.[tpu]' as the README says"
        else:
            fix = "name a backend JAX has (cpu; cuda or tpu with their extras)"
        raise UsageError(f"JAX_PLATFORMS={value}: JAX has no such backend on this machine; "
                         f"{fix}, or unset JAX_PLATFORMS to use the devices JAX finds") from None


def _installed(prefix: str) -> bool:
    """Whether a Python distribution whose name starts with `prefix` is installed."""
    from importlib import metadata

    return any((dist.metadata["Name"] or "").lower().startswith(prefix)
               for dist in metadata.distributions())


def writable_directory(path: Path, flag: str) -> None:
    """UsageError unless `path` is, or can be created as, a directory this process can write."""
    problem = unwritable(path)
    if problem is not None:
        raise UsageError(f"{flag} {path}: {problem}; choose another directory.")


def unwritable(path: Path) -> str | None:
    """Why `path` cannot be, or be created as, a directory this process writes; None if it
    can."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        return "exists and is not a directory"
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a directory"
    if _read_only(existing):
        return f"{existing} is on a read-only file system"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable by this user"
    return None


def writable_cache(prog: str) -> None:
    """UsageError unless the cache directory (data.config.default_cache_dir) is writable:
    for a command that keeps what it needs there (train.py: the encoded corpus)."""
    from data.config import default_cache_dir

    path = default_cache_dir()
    problem = unwritable(path)
    if problem is not None:
        raise UsageError(f"the cache directory {path}: {problem}; {prog} keeps the encoded "
                         "corpus and compiled programs there: set FLAX_NMT_CACHE to a writable "
                         "directory.")


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False
