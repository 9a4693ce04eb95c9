"""nmt.runtime.allocator: train.py and translate.py run on mimalloc, which keeps XLA:CPU's
freed step buffers mapped; NMT_ALLOCATOR=system turns it off, and results do not change.

The allocator is chosen when a process starts, so the effects are measured in subprocesses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, SHALLOW_FLAGS
from test_train_cli import corpus  # noqa: F401 (the same synthetic corpus fixture)

from nmt.runtime import allocator

needs_mimalloc = pytest.mark.skipif(
    allocator.library() is None and os.environ.get("CI") != "true",
    reason="mimalloc is not installed here (pip install cmeel-mimalloc); CI installs it")

# A worker thread (as XLA's are) allocates a 300 MiB block, fills it and frees it, three times,
# then prints the page faults of each fill and the allocator in effect.
_PROBE = """
import ctypes, json, resource, sys, threading
sys.path.insert(0, {root!r})
from nmt.runtime import allocator
allocator.preload()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
SIZE = 300 << 20
faults = []

def step():
    for _ in range(3):
        block = libc.malloc(SIZE)
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        libc.memset(block, 1, SIZE)
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
        libc.free(block)

worker = threading.Thread(target=step)
worker.start()
worker.join()
print(json.dumps({{"allocator": allocator.status().allocator, "pages": SIZE // 4096,
                  "faults": faults}}))
"""


def _probe(choice: str) -> dict:
    env = {**os.environ, "NMT_ALLOCATOR": choice}
    done = subprocess.run([sys.executable, "-c", _PROBE.format(root=str(ROOT))],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_mimalloc
def test_freed_big_blocks_are_reused_without_page_faults():
    system, ours = _probe("system"), _probe("mimalloc")
    pages = system["pages"]
    # The C library's malloc: each block is a fresh mapping, every fill faults all its pages.
    assert system["allocator"] == "system"
    assert all(faults > 0.9 * pages for faults in system["faults"]), system
    # mimalloc: the first fill faults (in 2 MiB pages where the kernel allows), later ones
    # reuse the pages of the freed block.
    assert ours["allocator"] == "mimalloc"
    assert ours["faults"][0] > 0, ours
    assert all(faults < 0.01 * pages for faults in ours["faults"][1:]), ours


def _train(corpus: dict[str, str], out: Path, env: dict[str, str], choice: str):
    args = ["--preset", "tiny", *SHALLOW_FLAGS, "--train-prefix", corpus["train"],
            "--valid-prefix", corpus["valid"], "--vocab-size", "320", "--batch-tokens", "256",
            "--buckets", "16", "--max-tokens-per-sentence", "16", "--warmup", "20",
            "--max-steps", "100", "--log-every", "10", "--eval-every", "50",
            "--eval-sentences", "8", "--output-dir", str(out)]
    return subprocess.run([sys.executable, "train.py", *args], cwd=ROOT,
                          env={**env, "NMT_ALLOCATOR": choice}, capture_output=True, text=True,
                          timeout=300)


def _results(run_dir: Path) -> list[dict]:
    """metrics.jsonl less what depends on the clock (compile records, speed, time)."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in line.items() if k not in ("tokens_per_s", "elapsed_s",
                                                          "translate_s", "data_wait_s",
                                                          "loader_queue")}
            for line in lines if line["kind"] not in ("compile", "summary")]


@needs_mimalloc
def test_train_py_runs_on_mimalloc_and_gives_the_same_metrics_without_it(corpus, env,
                                                                         tmp_path):
    ours = _train(corpus, tmp_path / "mimalloc", env, "")  # unset: the default
    system = _train(corpus, tmp_path / "system", env, "system")
    assert ours.returncode == 0, ours.stderr[-3000:]
    assert system.returncode == 0, system.stderr[-3000:]
    # The line is read from the process's own memory map: the library is loaded.
    assert f"host memory: mimalloc ({allocator.library()}" in ours.stderr
    assert "MIMALLOC_PURGE_DELAY=10000, transparent huge pages off" in ours.stderr
    assert "host memory: the C library's malloc (NMT_ALLOCATOR=system)" in system.stderr
    assert "mimalloc (" not in system.stderr
    metrics = _results(tmp_path / "mimalloc")
    assert [line["step"] for line in metrics if line["kind"] == "train"][-1] == 100
    assert any(line["kind"] == "eval" and "bleu" in line for line in metrics)
    assert metrics == _results(tmp_path / "system")


@needs_mimalloc
def test_translate_py_runs_on_mimalloc_unless_turned_off(run_dir, env):
    for choice, expected in (("mimalloc", "host memory: mimalloc ("),
                             ("system", "host memory: the C library's malloc")):
        done = subprocess.run([sys.executable, "translate.py", "--model", str(run_dir), "ab"],
                              cwd=ROOT, env={**env, "NMT_ALLOCATOR": choice},
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert expected in done.stderr


@pytest.mark.parametrize("script", ["train.py", "translate.py"])
def test_a_bad_value_is_one_line_naming_the_choices(script, env):
    flags = ["--model", "none"] if script == "translate.py" else []
    done = subprocess.run([sys.executable, script, *flags], cwd=ROOT,
                          env={**env, "NMT_ALLOCATOR": "jemalloc"}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"{script}: error: NMT_ALLOCATOR='jemalloc': expected one of mimalloc, system "
        "(mimalloc, the default, keeps XLA's step buffers mapped between steps; system uses "
        "the C library's malloc)"]


class _Executed(Exception):
    pass


@pytest.fixture
def execv(monkeypatch):
    """Records what preload() would execute, instead of executing it."""
    calls = []

    def record(path, argv):
        calls.append((path, list(argv), dict(os.environ)))
        raise _Executed

    monkeypatch.setattr(allocator.os, "execv", record)
    monkeypatch.setattr(allocator, "loaded_library", lambda: None)
    monkeypatch.setattr(allocator, "library", lambda: Path("/opt/lib/libmimalloc.so"))
    saved = dict(os.environ)  # preload() changes it before executing: restored afterwards
    for name in ("NMT_ALLOCATOR", "LD_PRELOAD", *allocator.SETTINGS, allocator.REEXECUTED):
        os.environ.pop(name, None)
    yield calls
    os.environ.clear()
    os.environ.update(saved)


def test_preload_runs_the_same_command_again_with_the_library_first(execv, monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libother.so")
    monkeypatch.setenv("MIMALLOC_PURGE_DELAY", "100")  # the user's own setting stays
    with pytest.raises(_Executed):
        allocator.preload()
    (path, argv, environment), = execv
    assert path == sys.executable and argv == sys.orig_argv
    assert environment["LD_PRELOAD"] == "/opt/lib/libmimalloc.so /usr/lib/libother.so"
    assert environment["MIMALLOC_PURGE_DELAY"] == "100"
    assert environment[allocator.REEXECUTED] == "1"


def test_preload_runs_again_with_stdout_or_stderr_closed(execv, monkeypatch):
    """Python sets a stream closed at start (`>&-`) to None; there is nothing to flush."""
    monkeypatch.setattr(sys, "stdout", None)
    monkeypatch.setattr(sys, "stderr", None)
    with pytest.raises(_Executed):
        allocator.preload()


def test_preload_sets_mimallocs_purge_delay_and_turns_huge_pages_off(execv):
    with pytest.raises(_Executed):
        allocator.preload()
    assert execv[0][2]["MIMALLOC_PURGE_DELAY"] == "10000"
    assert execv[0][2]["MIMALLOC_ALLOW_THP"] == "0"
    assert execv[0][2]["LD_PRELOAD"] == "/opt/lib/libmimalloc.so"


@pytest.mark.parametrize("text, expected", [("Name:\tpython\nTHP_enabled:\t0\n", "off"),
                                            ("THP_enabled:\t1\nThreads:\t4\n", "on"),
                                            ("Name:\tpython\n", "unknown")])
def test_huge_pages_are_read_from_the_process_status(monkeypatch, tmp_path, text, expected):
    status = tmp_path / "status"
    status.write_text(text)
    monkeypatch.setattr(allocator, "_STATUS", status)
    assert allocator.huge_pages() == expected


@pytest.mark.parametrize("setting", [("NMT_ALLOCATOR", "system"), ("NMT_ALLOCATOR", "bad"),
                                     (allocator.REEXECUTED, "1")])
def test_preload_does_nothing_when_off_bad_or_done_once(execv, monkeypatch, setting):
    monkeypatch.setenv(*setting)
    allocator.preload()  # returns: a bad value is reported by the command
    assert execv == []


def test_without_the_library_training_goes_on_and_says_how_to_install_it(execv, monkeypatch):
    monkeypatch.setattr(allocator, "library", lambda: None)
    allocator.preload()
    assert execv == []
    status = allocator.status()
    assert status.allocator == "system"
    assert "mimalloc is not installed: `pip install cmeel-mimalloc`" in status.line


def test_status_reads_the_library_from_the_process_memory_map(monkeypatch, tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f10 r-xp 00000000 08:01 42 /venv/cmeel.prefix/lib/libmimalloc.so\n"
                    "7f20-7f30 rw-p 00000000 00:00 0 \n")
    monkeypatch.setattr(allocator, "_MAPS", maps)
    assert allocator.loaded_library() == Path("/venv/cmeel.prefix/lib/libmimalloc.so")
    maps.write_text("7f00-7f10 r-xp 00000000 08:01 42 /usr/lib/libc.so.6\n")
    assert allocator.loaded_library() is None
    monkeypatch.delenv("NMT_ALLOCATOR", raising=False)
    monkeypatch.setattr(allocator, "library", lambda: Path("/venv/libmimalloc.so"))
    assert "installed but was not preloaded" in allocator.status().line
