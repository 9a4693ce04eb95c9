"""Shared test set-up: the repository root on sys.path, where the real corpora are, and the order.

The recipes read their corpora from $MULTI30K and $ENJA (by default data/multi30k and data/enja,
where `python -m data.download` puts them); the tests point those variables at the copies in
../shared/data unless they are set already, so that the tests and the processes they start
read the same folders. Tests that need a corpus skip when its folder is absent.

The suite runs on two pytest-xdist workers, one file per worker at a time, in collection order
(pyproject.toml: `-n 2 --dist loadfile --no-loadscope-reorder`). The files are collected
slowest first, by the seconds recorded in tests/file_seconds.json, so that the short ones fill
in at the end: in alphabetical order a long file could start last and leave a core idle for
a minute. `pytest --record-file-seconds` rewrites the record.
"""

import atexit
import collections
import fcntl
import importlib
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

os.environ.setdefault("MULTI30K", str(SHARED_DATA / "multi30k"))
os.environ.setdefault("ENJA", str(SHARED_DATA / "small_parallel_enja"))

# What the tests compile and encode goes to one new folder per run (shared by the
# pytest-xdist workers, which inherit this environment), never to the user's cache
# (~/.cache/flax-nmt): a rerun then compiles what a clean machine compiles, and a user's cache
# gains none of the tests' thousands of tiny programs. Set $FLAX_NMT_CACHE to keep one.
if not os.environ.get("FLAX_NMT_CACHE"):
    os.environ["FLAX_NMT_CACHE"] = tempfile.mkdtemp(prefix="flax-nmt-tests-")
    atexit.register(shutil.rmtree, os.environ["FLAX_NMT_CACHE"], ignore_errors=True)

# A shell starts a background job (`pytest &`, a script's `... &`) with SIGINT ignored, which
# every process it starts inherits: the tests of Ctrl-C would then send a signal nobody gets
# (a write waiting on a reader hung for good). The tests, and through exec the commands they
# start, take SIGINT as a terminal's Ctrl-C.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# One OpenMP thread per process (torch, CTranslate2, OpenBLAS), for the tests and the processes
# they start: the two workers share two cores, and a pool of two threads in each spins against
# the other worker (a tiny torch Linear took 2 ms instead of 0.05 ms, and transformers' beam
# search half a minute instead of seconds). JAX does not use OpenMP. $OMP_NUM_THREADS is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def worker_cpus(cpus: list[int], worker: int, workers: int) -> list[int] | None:
    """The CPUs pytest-xdist worker `worker` of `workers` runs on: its own contiguous share of
    `cpus`, or None (no pinning) when there are fewer CPUs than workers."""
    if workers < 2 or len(cpus) < workers:
        return None
    return cpus[worker * len(cpus) // workers:(worker + 1) * len(cpus) // workers]


def suite_cpus() -> list[int]:
    """The CPUs the suite was started on (the workers inherit $NMT_TESTS_CPUS from pytest)."""
    return [int(cpu) for cpu in os.environ["NMT_TESTS_CPUS"].split(",")]


def _pin_this_worker() -> None:
    """Each worker, every thread of it and every process it starts, on its own share of the
    CPUs. Unpinned, the two workers' runtimes each size their thread pools to both cores and
    contend for them: the suite took 586 s against 524 s pinned (docs/contributing.md), though
    the tests that start two processes at once run them on one core. What sizes itself by
    the cores (CTranslate2's translators at once, the threads compiling a server's shapes)
    then takes its one-core path, except where a test gives the count."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not name.startswith("gw"):
        return
    share = worker_cpus(suite_cpus(), int(name[2:]),
                        int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")))
    if share is None:
        return
    for thread in os.listdir("/proc/self/task"):  # threads started before this one too
        try:
            os.sched_setaffinity(int(thread), share)
        except OSError:  # a thread that has ended, or a system that refuses: left as it was
            pass


if hasattr(os, "sched_getaffinity"):  # Linux
    os.environ.setdefault("NMT_TESTS_CPUS", ",".join(map(str, sorted(os.sched_getaffinity(0)))))
    _pin_this_worker()

# The suite starts Python about two hundred times (the commands it runs, servers, pytest-xdist
# workers). Where $PYTHONDONTWRITEBYTECODE is set, as many container images set it, every start
# would compile this repository's modules from source again (0.6 s of CPU for the trainer's and
# translate.py's) and each pytest would rewrite every test module: the processes the suite
# starts, its pytest-xdist workers included, write bytecode into the clone's __pycache__
# folders (ignored by git).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# A new environment installed with `--no-compile` (the README's test command) holds no
# bytecode, and the peers the benchmarks compare against run with $PYTHONDONTWRITEBYTECODE
# (bench/common.py: they must not write into their own folder), so each would compile torch
# and transformers from source (11.5 CPU-s an import instead of 4.8), and the two workers,
# starting together, would each compile JAX's. Imported once here, their bytecode is written
# once: JAX's side before the workers start, the peers' side at the same time on the other
# core, finishing while the workers start (the first peer runs tens of seconds later).
PREWARMED = {"workers": ("jax", "flax.nnx", "optax", "orbax.checkpoint", "datasets"),
             # the peers' model's module, which `transformers.MarianMTModel` imports lazily
             "peers": ("ctranslate2", "torch", "transformers",
                       "transformers.models.marian.modeling_marian")}


def _byte_compiled(package: str) -> bool:
    spec = importlib.util.find_spec(package)  # a top-level name: nothing is imported
    return spec is None or not spec.origin or os.path.exists(
        importlib.util.cache_from_source(spec.origin))


def _import_quietly(names: tuple[str, ...]) -> subprocess.Popen:
    """A process importing the modules `names`, for the bytecode it writes."""
    script = f"""
import importlib
for name in {names!r}:
    try:
        importlib.import_module(name)
    except ImportError:
        pass
"""
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _write_bytecode_once() -> None:
    pending = {side: _import_quietly(names) for side, names in PREWARMED.items()
               if not all(_byte_compiled(name.split(".")[0]) for name in names)}
    if "workers" in pending:
        pending["workers"].wait(timeout=600)
    if "peers" in pending:  # reaped at exit; never left running past the tests
        atexit.register(_finish, pending["peers"])


def _finish(process: subprocess.Popen) -> None:
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()


if not os.environ.get("PYTEST_XDIST_WORKER"):
    _write_bytecode_once()

# The suite's models are tiny, so compiling their programs, not running them, is most of its
# time. Two settings of XLA's CPU compiler make that much cheaper (docs/contributing.md): LLVM
# optimisation level 0, and the elemental emitters for fused loops instead of the MLIR fusion
# emitters. Neither changes what a program computes (fast-math stays off); both make the
# machine code slower, which tiny models do not feel, so the product keeps XLA's defaults. A
# third runs XLA's Eigen operations on the calling thread: the two workers share two cores, and
# a pool of two threads in each spun against the other (the suite took 10% longer). Set
# in the environment before JAX is imported, so that the processes the tests start inherit
# them. A setting given in $XLA_FLAGS already is kept; on another platform than the CPU, or
# with a jaxlib that does not know them, they are left out (pytest's header says so).
# Each setting: (the tests' value, XLA's default).
TEST_COMPILER_SETTINGS = {"xla_backend_optimization_level": (0, 3),
                          "xla_cpu_use_fusion_emitters": (False, True),
                          "xla_cpu_multi_thread_eigen": (False, True)}
# What the processes of a user's machine run with, kept for the pytest-xdist workers (which
# inherit this environment) and for the test that runs as users do.
os.environ.setdefault("NMT_TESTS_USER_XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
USER_XLA_FLAGS = os.environ["NMT_TESTS_USER_XLA_FLAGS"]


def _names(flags: str) -> set[str]:
    return {flag.split("=")[0].lstrip("-") for flag in flags.split()}


def _backend_with(flags: str) -> str | None:
    """The platform JAX picks here with these XLA flags, or None where it does not start (an
    unknown flag aborts every process)."""
    probe = subprocess.run([sys.executable, "-c", "import jax; print(jax.default_backend())"],
                           env={**os.environ, "XLA_FLAGS": flags}, capture_output=True,
                           text=True, timeout=300)
    words = probe.stdout.split()
    return words[-1] if probe.returncode == 0 and words else None


_missing = [f"--{name}={str(value).lower()}"
            for name, (value, _) in TEST_COMPILER_SETTINGS.items()
            if name not in _names(os.environ.get("XLA_FLAGS", ""))]
COMPILER_NOTE = ""
if _missing:
    _flags = " ".join([os.environ.get("XLA_FLAGS", ""), *_missing]).strip()
    _backend = _backend_with(_flags)
    if _backend == "cpu":
        os.environ["XLA_FLAGS"] = _flags
    else:  # measured on the CPU only; elsewhere the tests compile as users' processes do
        COMPILER_NOTE = (f" ({' '.join(_missing)} not used: JAX "
                         + (f"runs on {_backend}" if _backend else "does not start with them")
                         + ")")
COMPILER_NOTE = f"XLA_FLAGS: {os.environ.get('XLA_FLAGS', '')!r}{COMPILER_NOTE}"
# XLA's own values of the settings set here, as compiler options (`compiled_to_run`).
XLA_DEFAULT_OPTIONS = {
    name: default for name, (_, default) in TEST_COMPILER_SETTINGS.items()
    if name in _names(os.environ.get("XLA_FLAGS", "")) - _names(USER_XLA_FLAGS)}


def xla_flags(devices: int | None = None) -> str:
    """$XLA_FLAGS for a process a test starts: the suite's compiler settings kept, with
    `devices` CPU devices (None: as many as the process asks for itself)."""
    kept = [flag for flag in os.environ.get("XLA_FLAGS", "").split()
            if not flag.startswith("--xla_force_host_platform_device_count")]
    if devices is not None:
        kept.append(f"--xla_force_host_platform_device_count={devices}")
    return " ".join(kept)


def compiled_to_run(jitted, *args):
    """`jitted` compiled for `args` with XLA's default settings, not the suite's cheap ones:
    for a program a test runs hundreds of times, whose running then costs more than its
    compiling (tests/test_learning.py, tests/test_convert.py), or whose compiled form a test
    reads (tests/test_mixed_precision.py)."""
    return jitted.lower(*args).compile(compiler_options=XLA_DEFAULT_OPTIONS)


# The tests of the trainer's bookkeeping (saving, resuming, schedules, faults, allocators), of
# the train step's loss in chunks and of the translator's batching run the tiny preset with one
# encoder and one decoder layer: nothing they check depends on depth, and a second layer makes
# each program take about 60% longer to compile. The tests of the model, its caches, the
# search, the exports and the multi-device steps (tests/multiprocess_worker.py) keep the
# preset's two layers.
SHALLOW = {"encoder_layers": 1, "decoder_layers": 1}
SHALLOW_FLAGS = [part for name, value in SHALLOW.items()
                 for part in (f"--{name.replace('_', '-')}", str(value))]

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_report_header(config):
    return COMPILER_NOTE


FILE_SECONDS = ROOT / "tests" / "file_seconds.json"


def pytest_addoption(parser):
    parser.addoption("--record-file-seconds", action="store_true",
                     help=f"record the seconds of each test file run (set-up, call and "
                          f"tear-down of its tests) in {FILE_SECONDS.relative_to(ROOT)}, which "
                          f"orders the files, slowest first")


def recorded_file_seconds() -> dict[str, float]:
    """The record of tests/file_seconds.json ({} where there is none); a damaged one stops
    the run with one line (pytest.UsageError)."""
    if not FILE_SECONDS.exists():
        return {}
    try:
        seconds = {str(name): float(value)
                   for name, value in json.loads(FILE_SECONDS.read_text()).items()}
        if not all(map(math.isfinite, seconds.values())):
            raise ValueError("a value is not a finite number")
    except (ValueError, TypeError, AttributeError) as err:
        raise pytest.UsageError(f"{FILE_SECONDS}: not a record of seconds per test file "
                                f"({err}); delete it or rerun pytest --record-file-seconds"
                                ) from None
    return seconds


_FILE_SECONDS_KEY = pytest.StashKey[dict]()


def pytest_configure(config):
    config.stash[_FILE_SECONDS_KEY] = recorded_file_seconds()  # read once, checked at start
    if config.getoption("record_file_seconds") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(FileSecondsRecorder(), "file-seconds-recorder")


def pytest_collection_modifyitems(config, items):
    slowest_files_first(items, config.stash[_FILE_SECONDS_KEY])


def slowest_files_first(items: list, seconds: dict[str, float]) -> None:
    """Sorts `items` in place: the files with the most recorded seconds first, each file's
    tests in their order, unrecorded files last."""
    items.sort(key=lambda item: -seconds.get(_file_of(item.nodeid), 0.0))  # stable


def _file_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


class FileSecondsRecorder:
    """Sums the reports' durations per test file (in the controller, which receives the
    workers' reports) and records them, slowest first, when the run ends."""

    def __init__(self):
        self.seconds: dict[str, float] = collections.defaultdict(float)

    def pytest_runtest_logreport(self, report):
        self.seconds[_file_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self):
        """The files this run ran replace their records; the others keep theirs."""
        recorded = recorded_file_seconds()
        recorded.update(self.seconds)
        ordered = sorted(recorded.items(), key=lambda item: (-item[1], item[0]))
        FILE_SECONDS.write_text(json.dumps({name: round(value, 1) for name, value in ordered},
                                           indent=1) + "\n")


@pytest.fixture(autouse=True)
def _programs_stored_only_where_a_test_asks():
    """A test that runs the trainer or translate.py's set-up in this process turns on the
    stored search programs (transformer.stored) for the rest of the worker's life; turned
    off again after each test, so that the next one compiles as it expects."""
    yield
    stored = sys.modules.get("transformer.stored")
    if stored is not None:
        stored.keep_programs_in(None)


class Deferred:
    """A module imported at the first use of one of its attributes. torch and transformers
    take about 4 s of CPU to import, which each pytest-xdist worker would pay for collecting
    the test files that use them; deferred, only the worker that runs those tests pays."""

    def __init__(self, name: str):
        self.module_name = name

    def __getattr__(self, attribute: str):
        if attribute.startswith("_"):  # what pytest asks of every name while collecting
            raise AttributeError(attribute)
        return getattr(importlib.import_module(self.module_name), attribute)


def deferred_or_skip(*names: str) -> tuple[Deferred, ...]:
    """`Deferred` modules for a test file's module level, which is skipped where one of them
    is not installed (as pytest.importorskip would, without importing them)."""
    missing = [name for name in names if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}", allow_module_level=True)
    return tuple(Deferred(name) for name in names)


def built_once(tmp_path_factory, name: str, build: Callable[[Path], object]) -> Path:
    """The folder `name`, filled by `build(folder)` once per test run and shared by every
    module and pytest-xdist worker that asks for it: a worker that finds another building it
    waits for the build (a file lock). A build that raised is started again by the next
    caller. The folder must then only be read: copy it to change it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # this run's folder, above each worker's own
    folder, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A tiny exported model (tests/translate_model.py) for the translate.py tests."""
    from translate_model import make_model

    return make_model(tmp_path_factory.mktemp("run"))


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    """The environment of a command run by a test, no buffering, and the compilation cache
    of the run's commands: the modules' `run_dir` models are alike, so their programs compile
    once per run, whichever module and worker gets there first. A test that counts what a
    command compiles or stores gives it a cache of its own."""
    cache = built_once(tmp_path_factory, "commands_cache", lambda folder: None)
    return {**os.environ, "FLAX_NMT_CACHE": str(cache), "PYTHONUNBUFFERED": "1"}
