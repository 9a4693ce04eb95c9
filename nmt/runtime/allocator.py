"""mimalloc under train.py and translate.py, so that XLA:CPU reuses its step buffers.

Why: XLA:CPU allocates one buffer for all of a program's temporaries at every execution (for a
train step, often over a gigabyte) from its worker threads, and frees it when the execution
ends. glibc's malloc serves a block that large with a fresh mmap and hands it back with
munmap, so every step faults all its pages in again, in the kernel. XLA has no option to keep
the buffer, and glibc's thresholds cannot cover it (its worker-thread arenas map blocks over
64 MiB regardless). mimalloc keeps freed memory mapped for `MIMALLOC_PURGE_DELAY` ms before
handing it back, so the next step reuses it; and it runs without transparent huge pages,
whose first touch costs the kernel more than the faults saved. Measurements:
docs/performance.md, "Host memory on CPU".

How: an allocator can only replace malloc from the start of a process, so `preload()` (first
thing in the scripts, before JAX is imported) re-executes the same command with the library
in LD_PRELOAD. The library comes with the package (the `cmeel-mimalloc` wheel, Linux only).

    NMT_ALLOCATOR=mimalloc   the default
    NMT_ALLOCATOR=system     the C library's malloc; nothing is preloaded

The commands log which allocator is in effect (`status()`). Results do not depend on it.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "NMT_ALLOCATOR"
CHOICES = ("mimalloc", "system")
DEFAULT = "mimalloc"
# mimalloc's own settings, each kept where the user has set it:
# - MIMALLOC_PURGE_DELAY: hand freed memory back to the system after 10 s unused. Shorter
#   delays (its default is 10 ms) let the step buffer be handed back and faulted in again
#   between steps; never (-1) lets the memory that validation and checkpoints fragment pile up
#   (a new step buffer after every validation).
# - MIMALLOC_ALLOW_THP: no transparent huge pages for the process. mimalloc asks the kernel for
#   them by default, and the kernel then compacts and zeroes 2 MiB at a time on first touch,
#   which cost a translate.py run twice the system time of glibc's malloc; training steps
#   are as fast without them (docs/performance.md, "Host memory on CPU").
SETTINGS = {"MIMALLOC_PURGE_DELAY": "10000", "MIMALLOC_ALLOW_THP": "0"}
INSTALL = "pip install cmeel-mimalloc"
_RELATIVE_PATH = "cmeel.prefix/lib/libmimalloc.so"
# Set in the environment of the re-executed command, so that it is not re-executed again.
REEXECUTED = "NMT_ALLOCATOR_REEXECUTED"
_MAPS = Path("/proc/self/maps")
_STATUS = Path("/proc/self/status")


class AllocatorError(ValueError):
    """NMT_ALLOCATOR holds a value other than CHOICES."""


@dataclass(frozen=True)
class Status:
    """Which malloc this process runs on, and why; `line` is what the commands log."""

    allocator: str  # "mimalloc" or "system"
    line: str


def requested() -> str:
    """NMT_ALLOCATOR's value (DEFAULT if unset or empty); AllocatorError for another value."""
    value = os.environ.get(ENV_VAR, "").strip() or DEFAULT
    if value not in CHOICES:
        raise AllocatorError(f"{ENV_VAR}={os.environ[ENV_VAR]!r}: expected one of "
                             f"{', '.join(CHOICES)} (mimalloc, the default, keeps XLA's step "
                             "buffers mapped between steps; system uses the C library's malloc)")
    return value


def library() -> Path | None:
    """The mimalloc shared library installed with the package, or None (not Linux, or absent)."""
    if platform.system() != "Linux":
        return None
    for directory in dict.fromkeys(map(Path, sys.path)):  # site-packages, in import order
        candidate = directory / _RELATIVE_PATH
        if candidate.is_file():
            return candidate
    return None


def loaded_library() -> Path | None:
    """The mimalloc library mapped into this process, or None (read from /proc/self/maps)."""
    try:
        maps = _MAPS.read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)  # address perms offset device inode [path]
        if len(fields) == 6 and Path(fields[5]).name.startswith("libmimalloc"):
            return Path(fields[5])
    return None


def huge_pages() -> str:
    """"on" or "off": whether the kernel may back this process's memory with transparent huge
    pages (THP_enabled in /proc/self/status, which mimalloc clears when MIMALLOC_ALLOW_THP=0);
    "unknown" where the kernel does not say."""
    try:
        status = _STATUS.read_text()
    except OSError:
        return "unknown"
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name == "THP_enabled":
            return {"1": "on", "0": "off"}.get(value.strip(), "unknown")
    return "unknown"


def preload() -> None:
    """Re-execute this command with mimalloc preloaded, if it is wanted, installed and not
    loaded yet; otherwise return and let `status()` say why. Call it before importing JAX.

    A bad NMT_ALLOCATOR is left for the command to report (`status()` raises AllocatorError).
    """
    try:
        wanted = requested() == "mimalloc"
    except AllocatorError:
        return
    path = library()
    if not wanted or path is None or os.environ.get(REEXECUTED) or loaded_library():
        return
    environment = dict(os.environ)
    preloads = os.environ.get("LD_PRELOAD", "")
    os.environ["LD_PRELOAD"] = f"{path} {preloads}".strip()
    for name, value in SETTINGS.items():
        os.environ.setdefault(name, value)
    os.environ[REEXECUTED] = "1"
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:  # None where the descriptor is closed (`>&-`)
            stream.flush()
    try:
        # sys.orig_argv: the interpreter's options and `-m module` as well, as they were given.
        os.execv(sys.executable, sys.orig_argv)
    except OSError:  # this process goes on with the system's malloc; status() says so
        pass
    finally:  # reached only when execv did not replace the process
        os.environ.clear()
        os.environ.update(environment)


def status() -> Status:
    """What is in effect and how to change it; AllocatorError for a bad NMT_ALLOCATOR."""
    wanted = requested()
    loaded = loaded_library()
    if loaded is not None:
        purge = os.environ.get("MIMALLOC_PURGE_DELAY", "(mimalloc's default)")
        return Status("mimalloc", f"host memory: mimalloc ({loaded}, MIMALLOC_PURGE_DELAY="
                                  f"{purge}, transparent huge pages {huge_pages()}); "
                                  f"{ENV_VAR}=system turns it off")
    if wanted == "system":
        return Status("system", f"host memory: the C library's malloc ({ENV_VAR}=system)")
    if platform.system() != "Linux":
        return Status("system", f"host memory: the C library's malloc (mimalloc is preloaded "
                                f"on Linux only; this is {platform.system()})")
    if library() is None:
        return Status("system", "host memory: the C library's malloc; mimalloc is not "
                                f"installed: `{INSTALL}` makes CPU training steps about 1.5x "
                                "as fast")
    return Status("system", "host memory: the C library's malloc; mimalloc is installed but "
                            "was not preloaded (run train.py or translate.py as a script, "
                            f"or start Python with LD_PRELOAD={library()})")


def release_free_memory() -> None:
    """Hand the memory freed but kept for reuse back to the system now: mimalloc's
    `mi_collect(true)` (it keeps freed memory MIMALLOC_PURGE_DELAY ms), glibc's
    `malloc_trim(0)`. Called between phases whose buffers differ (steps, validation, export),
    where what one kept would only add to the next one's peak."""
    import ctypes

    process = ctypes.CDLL(None)
    if loaded_library() is not None:
        process.mi_collect(ctypes.c_bool(True))
    elif hasattr(process, "malloc_trim"):
        process.malloc_trim(ctypes.c_size_t(0))


def peak_resident_gb() -> float:
    """The most memory this process has held resident so far, in GB (10^9 bytes)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return round(peak * (1 if platform.system() == "Darwin" else 1024) / 1e9, 2)
