"""Compilation: JAX's persistent cache, and a record of every program compiled.

A step takes milliseconds on an accelerator and its compilation tens of seconds, so a run
reports what it compiled (`CompileLog`): each program's function, what the trainer was doing
(its label, e.g. the batch shape), the seconds spent tracing, lowering and compiling it, and
whether the persistent cache served it. Tracked through `jax.monitoring`'s events, so it sees
every compilation in the process, the trainer's own and any other.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import threading
import warnings
from collections import Counter
from pathlib import Path
from typing import Iterator

import jax
from jax import monitoring

from data.config import default_cache_dir
from transformer import stored

log = logging.getLogger(__name__)

# The phases of one compilation, in the order JAX reports them (jax._src.dispatch).
_TRACE = "/jax/core/compile/jaxpr_trace_duration"
_LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
_COMPILE = "/jax/core/compile/backend_compile_duration"
_CACHE_HIT = "/jax/compilation_cache/cache_hits"


def enable_compilation_cache(directory: str | Path | None = None,
                             programs: str | Path | None = None) -> None:
    """Keep every compiled program in `directory` (default: the project's cache directory,
    `$FLAX_NMT_CACHE/jax`): a rerun, a resume or the next translate.py skips compiling. The
    search programs are also kept whole in `programs` (default `$FLAX_NMT_CACHE/programs`,
    `transformer.stored`), so the next translate.py skips tracing them too."""
    from nmt.runtime.cli import unwritable

    directory = default_cache_dir() / "jax" if directory is None else directory
    problem = unwritable(directory)
    if problem is not None:
        log.warning("compiled programs are not kept, so every start compiles them again: the "
                    "cache directory %s: %s; set FLAX_NMT_CACHE to a writable directory",
                    directory, problem)
        return
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    stored.keep_programs_in(default_cache_dir() / "programs" if programs is None else programs)
    global _cache_directory, _show_other
    _cache_directory = directory
    if warnings.showwarning is not _show_warning:
        _show_other, warnings.showwarning = warnings.showwarning, _show_warning


# JAX warns once per program that its cache could not write (a full disk: every program) or
# read (a damaged entry); each is told once, as a logged line naming the directory.
_CACHE_FAILURES = {
    "Error writing persistent compilation cache entry":
        "could not write to the compilation cache {directory} ({reason}), so programs "
        "compiled from now on are not kept for the next start; free some space, or set "
        "FLAX_NMT_CACHE to a writable directory with room",
    "Error reading persistent compilation cache entry":
        "could not read an entry of the compilation cache {directory} ({reason}), so its "
        "program was compiled again; if this repeats, delete that directory",
}
_cache_directory: str | Path | None = None
_show_other = warnings.showwarning
_failures_told: set[str] = set()


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """warnings.showwarning that turns JAX's raw warnings about cache writes and reads into
    one logged line each, naming the directory and the fix; other warnings show as before."""
    failure = next((start for start in _CACHE_FAILURES if str(message).startswith(start)), None)
    if failure is None:
        _show_other(message, category, filename, lineno, file, line)
        return
    if failure not in _failures_told:
        _failures_told.add(failure)
        reason = str(message).split(": ", 1)[-1]  # past "... entry for 'jit_step'"
        log.warning(_CACHE_FAILURES[failure].format(directory=_cache_directory, reason=reason))


@dataclasses.dataclass(frozen=True)
class Compilation:
    function: str       # JAX's name of the program, e.g. "jit_train_step"
    label: str | None   # what the trainer was doing, e.g. "train_step [64, 48]"
    seconds: float      # tracing + lowering + compiling (or reading from the cache)
    cache_hit: bool     # served by the persistent compilation cache

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class CompileLog:
    """Records the compilations made while it is `active()`, from any thread."""

    def __init__(self):
        self.records: list[Compilation] = []
        self._label: contextvars.ContextVar[str | None] = contextvars.ContextVar(
            "compile_label", default=None)
        self._pending = threading.local()  # per thread: seconds and cache hit so far
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def active(self) -> Iterator["CompileLog"]:
        _listeners.append(self)
        try:
            yield self
        finally:
            _listeners.remove(self)

    @contextlib.contextmanager
    def labelled(self, label: str) -> Iterator[None]:
        """Compilations inside carry `label` (threads started inside do not inherit it)."""
        token = self._label.set(label)
        try:
            yield
        finally:
            self._label.reset(token)

    def _on_phase(self, seconds: float) -> None:
        """Tracing or lowering, which come before the compilation they belong to."""
        self._pending.seconds = getattr(self._pending, "seconds", 0.0) + seconds

    def _on_compiled(self, function: str, seconds: float) -> None:
        pending = self._pending
        total = getattr(pending, "seconds", 0.0) + seconds
        hit = getattr(pending, "cache_hit", False)
        pending.seconds, pending.cache_hit = 0.0, False
        with self._lock:
            self.records.append(Compilation(function, self._label.get(), round(total, 3), hit))

    def _on_cache_hit(self) -> None:
        self._pending.cache_hit = True

    def since(self, start: int) -> list[Compilation]:
        with self._lock:
            return self.records[start:]

    def summary(self) -> dict:
        """Programs compiled (not served by the cache), cache hits, seconds, and the
        seconds per function."""
        with self._lock:
            records = list(self.records)
        seconds = Counter()
        for record in records:
            seconds[record.label.split(" ")[0] if record.label else record.function] += \
                record.seconds
        return {"compiled": sum(not r.cache_hit for r in records),
                "cache_hits": sum(r.cache_hit for r in records),
                "compile_s": round(sum(r.seconds for r in records), 2),
                "compile_s_by_function": {k: round(v, 2) for k, v in seconds.most_common()}}


_listeners: list[CompileLog] = []


def _duration_listener(event: str, seconds: float, **kwargs) -> None:
    if event not in (_TRACE, _LOWER, _COMPILE):
        return
    for log in list(_listeners):
        if event == _COMPILE:
            log._on_compiled(kwargs.get("fun_name", "?"), seconds)
        else:
            log._on_phase(seconds)


def _event_listener(event: str, **kwargs) -> None:
    if event == _CACHE_HIT:
        for log in list(_listeners):
            log._on_cache_hit()


monitoring.register_event_duration_secs_listener(_duration_listener)
monitoring.register_event_listener(_event_listener)


class AheadOfTime:
    """A jitted `(state, batch)` step whose program for one batch shape is compiled before
    the first step, in a background thread (`start`), while the caller does other work. Calls
    with that shape run the compiled program; other shapes compile on first use, as jit
    does."""

    def __init__(self, jitted, log: CompileLog, name: str):
        self.jitted, self.log, self.name = jitted, log, name
        self.programs: dict[tuple, object] = {}
        self.seconds_compiling_in_calls = 0.0  # for shapes not compiled ahead of time
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @staticmethod
    def shape_of(batch: dict) -> tuple:
        return tuple(sorted((key, tuple(value.shape)) for key, value in batch.items()))

    @staticmethod
    def describe(batch: dict) -> str:
        return "x".join(map(str, next(iter(batch.values())).shape))

    def start(self, state, batch_spec: dict) -> None:
        """Compile for batches like `batch_spec` (ShapeDtypeStructs with their shardings)."""
        label = f"{self.name} [{self.describe(batch_spec)}]"

        def compile_program():
            try:
                with self.log.labelled(label):
                    self.programs[self.shape_of(batch_spec)] = \
                        self.jitted.lower(state, batch_spec).compile()
            except BaseException as err:  # noqa: BLE001 - handed to the caller in `wait`
                self._error = err

        # Not a daemon: one still compiling when the interpreter exits (a check after the
        # start failed) would be stopped inside XLA, which aborts the process (exit 134, 139).
        self._thread = threading.Thread(target=compile_program, name=label)
        self._thread.start()

    def ready(self) -> bool:
        """Whether the background compilation has ended (`wait` then returns at once)."""
        return self._thread is None or not self._thread.is_alive()

    def wait(self) -> None:
        """Until the background compilation is done; its error, if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise self._error

    def __call__(self, state, batch: dict):
        program = self.programs.get(self.shape_of(batch))
        if program is not None:
            return program(state, batch)
        before = len(self.log.records)
        with self.log.labelled(f"{self.name} [{self.describe(batch)}]"):
            out = self.jitted(state, batch)
        self.seconds_compiling_in_calls += sum(r.seconds for r in self.log.since(before))
        return out
