"""Compiled programs kept on disk, so that a new process loads a search instead of tracing it.

JAX's persistent compilation cache skips the compiling, but its key is the lowered program,
so a new process still traces and lowers every program to look it up: for a search of a
small model on a CPU that is most of what a cached program costs (docs/performance.md). A
`StoredJit` keys each compiled executable by what the program is made of, known without
tracing it: the source of this package, the versions of jax, jaxlib and flax, the backend and
CPU, JAX's tracing settings, the function and its closed-over identity (the model's graph),
its static arguments and its arguments' tree, shapes and dtypes. Any of them changing is
another file; a file that cannot be loaded is removed and its program compiled again.

Off unless `keep_programs_in(directory)` is called (translate.py, train.py and the server
call it with their compilation cache). Only single-device arguments are stored: sharded ones
take jax.jit as before. The directory is kept under a size (1 GiB by default): after each
write, the programs least recently loaded or written go first. Loading an executable runs
its code, so the directory must be as trusted as the compilation cache beside it.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import inspect
import logging
import os
import pickle
import re
import threading
from collections.abc import Callable
from pathlib import Path

import jax

from transformer.atomic_files import write_atomically

log = logging.getLogger("transformer.stored")

_directory: Path | None = None
_max_bytes = 1 << 30
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")  # object addresses in reprs: new in every process


def keep_programs_in(directory: str | Path | None, max_bytes: int = 1 << 30) -> None:
    """Store compiled programs in `directory` (created when first written), holding at most
    `max_bytes` of them; None: keep them only in memory, as jax.jit does."""
    global _directory, _max_bytes
    if not max_bytes > 0:
        raise ValueError(f"keep_programs_in: max_bytes must be > 0, got {max_bytes!r}.")
    _directory = None if directory is None else Path(directory)
    _max_bytes = max_bytes


def stable_repr(value) -> str:
    """repr(value) without object addresses: the same in every process."""
    return _ADDRESS.sub("", repr(value))


@functools.cache
def _environment() -> str:
    """What every stored program depends on besides its own function and arguments."""
    import flax
    import jaxlib
    from jax._src import config as jax_config  # tracing settings (x64, matmul precision, ...)

    source = hashlib.sha256()
    package = Path(__file__).parent
    for path in sorted(package.rglob("*.py")):
        source.update(path.relative_to(package).as_posix().encode() + path.read_bytes())
    device = jax.local_devices()[0]
    parts = [source.hexdigest(), jax.__version__, jaxlib.__version__, flax.__version__,
             device.platform, device.client.platform_version, device.device_kind,
             os.environ.get("XLA_FLAGS", ""), stable_repr(jax_config.trace_context()),
             _cpu()]
    return "\n".join(parts)


def _cpu() -> str:
    """The host CPU's model and features: an executable compiled for one CPU may use
    instructions another lacks."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        import platform
        return platform.processor() or platform.machine()
    wanted = [line for line in text.splitlines()
              if line.startswith(("model name", "flags", "Features"))]
    return "\n".join(dict.fromkeys(wanted))  # one line of each kind: every core repeats them


def _leaf_signature(leaf) -> tuple:
    """(shape, dtype, weak type) of an argument leaf: an array, a ShapeDtypeStruct or a
    Python number."""
    if isinstance(leaf, (bool, int, float)):
        return (), type(leaf).__name__, True
    # Once per argument leaf per call (the state's ~170): no conversions, which cost more
    # than jit's own dispatch.
    return leaf.shape, leaf.dtype, getattr(leaf, "weak_type", False)


def _single_device(leaves) -> bool:
    """Whether every leaf is on JAX's default device (or on none yet): a stored executable
    runs there, so arguments placed elsewhere or sharded take jit."""
    default = jax.local_devices()[0]
    for leaf in leaves:
        sharding = getattr(leaf, "sharding", None)
        if sharding is not None and sharding.device_set != {default}:
            return False
    return True


def _origin(fn: Callable) -> str:
    """Where `fn` is defined and a digest of its code, so that two functions of one name (two
    lambdas, a `step` in two modules) are two programs; the source of this package is in
    `_environment` already, but callers may live outside it. Two lambdas on one line share
    their source: the column where the body starts tells them apart, and default values
    two functions made by one expression."""
    try:  # the source, not the code object: a set constant's marshal differs per process
        digest = hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()
    except (OSError, TypeError):  # defined in a string or a prompt: its name only
        digest = ""
    code = getattr(fn, "__code__", None)
    columns = [] if code is None else [col for _, _, col, end in code.co_positions()
                                       if col is not None and end is not None and end > col]
    column = f" col {columns[0]}" if columns else ""
    # One `def` or lambda made with other default values ([lambda y, k=k: ...]) is another
    # function; what it closes over is the caller's `identity` to say.
    defaults = [getattr(fn, name, None) for name in ("__defaults__", "__kwdefaults__")]
    given = f" defaults {stable_repr(defaults)}" if any(defaults) else ""
    name = getattr(fn, "__qualname__", fn.__name__)
    return f"{getattr(fn, '__module__', '')}.{name} {digest}{column}{given}"


class StoredJit:
    """jax.jit of `fn` whose compiled programs are also kept on disk (`keep_programs_in`).

    The first `static_args` positional arguments are static (hashable, with a repr that says
    what they are); `identity` gives the text of what `fn` closes over (e.g. the model's
    graph) for the disk key, called once and only where programs are stored. Calls with the
    same static arguments and argument shapes run one executable, loaded from disk or
    compiled (and stored) once per process. Thread-safe.
    """

    def __init__(self, fn: Callable, *, identity: Callable[[], str] | None = None,
                 static_args: int = 0, donate_argnums: tuple[int, ...] = ()):
        self.name = fn.__name__
        self.origin = _origin(fn)
        self._identity = identity
        self.static_args = static_args
        self.donate_argnums = donate_argnums
        self.jitted = jax.jit(fn, static_argnums=tuple(range(static_args)),
                              donate_argnums=donate_argnums)
        # key -> executable, or None where this key takes jit (not storable, or a stored
        # file that failed).
        self._compiled: dict[tuple, jax.stages.Compiled | None] = {}
        self._unproven: set[tuple] = set()  # keys loaded from disk and not yet run
        self._locks: dict[tuple, threading.Lock] = {}  # one per key: shapes compile in parallel
        self._lock = threading.Lock()

    @functools.cached_property
    def identity(self) -> str:
        return self._identity() if self._identity is not None else ""

    def programs(self) -> int:
        """How many programs this function has compiled or loaded in this process."""
        stored = sum(compiled is not None for compiled in self._compiled.values())
        return self.jitted._cache_size() + stored

    def __call__(self, *args):
        key, compiled = self._lookup(args)
        if compiled is None:
            return self.jitted(*args)
        if key not in self._unproven:
            return compiled(*args[self.static_args:])
        # The first run of a loaded executable, on copies of what it donates (the arguments
        # are still whole if it fails), waited for: its faults surface here, not later.
        dynamic = [jax.tree.map(_copy, arg) if i in self.donate_argnums else arg
                   for i, arg in enumerate(args) if i >= self.static_args]
        try:
            out = jax.block_until_ready(compiled(*dynamic))
            self._unproven.discard(key)
            return out
        except jax.errors.JaxRuntimeError as error:
            # A stored executable that loads but cannot run (a backend's serialization
            # fault): forget it and compile the program as jit would.
            path = self._path(key)
            _discard(path, f"the stored program {path} failed ({error})")
            self._compiled[key] = None
            self._unproven.discard(key)
            return self.jitted(*args)

    def compile(self, *args) -> jax.stages.Compiled:
        """The executable for these arguments (arrays or jax.ShapeDtypeStruct), from memory,
        disk or a compilation, for a later call with arguments of the same shapes."""
        _, compiled = self._lookup(args)
        return compiled if compiled is not None else self.jitted.trace(*args).lower().compile()

    def _lookup(self, args: tuple) -> tuple[tuple | None, jax.stages.Compiled | None]:
        """(key, executable) for these arguments; the executable is None where jit runs them."""
        key = self._key(args)
        return key, None if key is None else self._executable(key, args)

    def _key(self, args: tuple) -> tuple | None:
        """What selects an executable: the static arguments and the others' tree, shapes and
        dtypes; None where programs are not stored (no directory, or arguments on several
        devices)."""
        if _directory is None:
            return None
        static, dynamic = args[:self.static_args], args[self.static_args:]
        leaves, tree = jax.tree.flatten(dynamic)
        if not _single_device(leaves):
            return None
        return static, tree, tuple(_leaf_signature(leaf) for leaf in leaves)

    def _executable(self, key: tuple, args: tuple) -> jax.stages.Compiled | None:
        if key in self._compiled:
            return self._compiled[key]
        with self._lock:
            key_lock = self._locks.setdefault(key, threading.Lock())
        with key_lock:  # one thread compiles a shape; the others wait for its result
            if key not in self._compiled:
                self._compiled[key] = self._load_or_compile(args, key)
        return self._compiled[key]

    def _path(self, key: tuple) -> Path:
        static, tree, signature = key
        text = "\n".join([_environment(), self.origin, self.identity, stable_repr(static),
                          stable_repr(tree), repr(signature)])
        return _directory / f"{self.name}-{hashlib.sha256(text.encode()).hexdigest()[:40]}.exe"

    def _load_or_compile(self, args: tuple, key: tuple) -> jax.stages.Compiled:
        from jax.experimental import serialize_executable

        path = self._path(key)
        if path.exists():
            try:
                payload, in_tree, out_tree = pickle.loads(path.read_bytes())
                compiled = serialize_executable.deserialize_and_load(
                    payload, in_tree, out_tree, execution_devices=jax.local_devices()[:1])
                _touch(path)  # recently used: the last to be pruned
                self._unproven.add(key)
                return compiled
            except Exception as error:  # a truncated or foreign file: compile it again
                _discard(path, f"could not load the stored program {path} "
                               f"({type(error).__name__}: {error})")
        lowered = self.jitted.trace(*args).lower()
        _compilation.served_by_cache = False
        compiled = lowered.compile()
        if _compilation.served_by_cache:
            # XLA:CPU writes an executable that JAX's persistent cache served without some
            # of its kernels (it loads, then fails to run): store a real compilation.
            if not _writable(path.parent):
                return compiled
            compiled = _compile_afresh(lowered)
        try:
            payload, in_tree, out_tree = serialize_executable.serialize(compiled)
            path.parent.mkdir(parents=True, exist_ok=True)
            # Whole or not at all: other processes may load from this directory meanwhile.
            write_atomically(path, pickle.dumps((payload, in_tree, out_tree)))
        except Exception as error:  # a full disk, or a backend that cannot serialize
            _not_stored(path, error)
        else:
            prune(path.parent, _max_bytes)
        return compiled


def _discard(path: Path, problem: str) -> None:
    """Remove a stored program that cannot be used, and say so; in a directory this process
    cannot write the file stays, and its program is compiled in memory instead."""
    try:
        path.unlink(missing_ok=True)
    except OSError as error:
        log.warning("%s; could not remove it (%s), so compiling the program in memory; delete "
                    "the file, or keep programs in a directory this user can write",
                    problem, error.strerror or error)
    else:
        log.warning("%s; removed it and compiling the program again", problem)


_told_disk_full = False  # a full disk fails every store: said once per process


def _not_stored(path: Path, error: Exception) -> None:
    global _told_disk_full
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        if not _told_disk_full:
            _told_disk_full = True
            log.warning("compiled programs are not stored in %s: %s, so the next start "
                        "compiles them again; free some space, or keep programs on another "
                        "disk", path.parent, error.strerror)
        return
    log.debug("did not store %s: %s", path, error)


def _compile_afresh(lowered: jax.stages.Lowered) -> jax.stages.Compiled:
    """`lowered` compiled by XLA, not read from JAX's persistent cache (nor written to it).

    A debug option that only changes how buffer assignments print gives the program another
    cache key, which nothing writes, so the lookup misses; the compiled code is the same.
    """
    from jax._src import config as jax_config

    with jax_config.persistent_cache_min_compile_time_secs(float("inf")):  # this thread only
        return lowered.compile(compiler_options={"xla_debug_buffer_assignment_show_max": 16})


def _writable(directory: Path) -> bool:
    """Whether programs can be stored in `directory` (made if missing)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(directory, os.W_OK)


# Per thread: whether the compilation it ran last was served by JAX's persistent cache.
_compilation = threading.local()


def _on_event(event: str, **_) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _compilation.served_by_cache = True


jax.monitoring.register_event_listener(_on_event)


def _copy(leaf):
    """A copy of an array in new buffers (a transfer, not a compiled program)."""
    return jax.device_put(leaf, may_alias=False)


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:  # a read-only directory, or removed meanwhile by another process
        pass


def prune(directory: Path, max_bytes: int) -> list[Path]:
    """Remove the least recently used programs (oldest modification time; a load touches its
    file) until those left in `directory` take at most `max_bytes`; returns the removed."""
    files = []
    for path in directory.glob("*.exe"):
        try:
            info = path.stat()
        except OSError:  # removed meanwhile by another process
            continue
        files.append((info.st_mtime, info.st_size, path))
    total = sum(size for _, size, _ in files)
    removed = []
    for _, size, path in sorted(files, key=lambda item: item[0]):
        if total <= max_bytes:
            break
        path.unlink(missing_ok=True)
        total -= size
        removed.append(path)
    if removed:
        log.info("removed %d stored programs least recently used from %s, keeping it under "
                 "%d MiB", len(removed), directory, max_bytes >> 20)
    return removed
