"""transformer.host_memory (NMT_KEEP_HOST_MEMORY=1): big freed blocks stay mapped for reuse.

The effect is measured in a fresh Python process, because the settings only work before any
thread allocates (and would leak into the rest of the suite).
"""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

from nmt.runtime.host_memory import has_glibc_malloc

glibc_only = pytest.mark.skipif(not has_glibc_malloc(),
                                reason="the malloc settings exist only in glibc")

# A worker thread (as XLA's are) allocates a 300 MiB block, fills it and frees it, three
# times; prints the page faults of each fill.
_PROBE = """
import ctypes, json, resource, sys, threading
sys.path.insert(0, {root!r})
from nmt.runtime.host_memory import reuse_freed_host_memory
applied = reuse_freed_host_memory()
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
print(json.dumps({{"applied": applied, "pages": SIZE // 4096, "faults": faults}}))
"""


def _probe(keep: str) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "NMT_KEEP_HOST_MEMORY": keep}
    done = subprocess.run([sys.executable, "-c", _PROBE.format(root=str(ROOT))],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@glibc_only
def test_freed_big_blocks_are_reused_without_page_faults():
    plain, kept = _probe("0"), _probe("1")
    pages = plain["pages"]
    # glibc's default: each block is a fresh mapping, every fill faults all its pages in.
    assert plain["applied"] is False
    assert all(faults > 0.9 * pages for faults in plain["faults"]), plain
    # Kept: the first fill faults, later ones reuse pages that are already mapped.
    assert kept["applied"] is True
    assert kept["faults"][0] > 0.9 * pages, kept
    assert all(faults < 0.01 * pages for faults in kept["faults"][1:]), kept


@pytest.mark.parametrize("name, value", [("NMT_KEEP_HOST_MEMORY", "0"),
                                         ("JAX_PLATFORMS", "cuda,cpu"), ("JAX_PLATFORMS", "tpu")])
def test_settings_stay_off_unless_asked_for_on_cpu(monkeypatch, name, value):
    # Safe in this process: each case returns before calling mallopt.
    from nmt.runtime import host_memory

    monkeypatch.setattr(host_memory, "_applied", False)
    monkeypatch.setenv("NMT_KEEP_HOST_MEMORY", "1")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv(name, value)
    assert host_memory.reuse_freed_host_memory() is False
    monkeypatch.delenv("NMT_KEEP_HOST_MEMORY")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert host_memory.reuse_freed_host_memory() is False  # off by default


def test_train_py_applies_the_settings_first_and_refuses_a_bad_value(monkeypatch, capsys,
                                                                    tmp_path):
    import train
    from nmt.runtime import host_memory

    calls = []
    monkeypatch.setattr(host_memory, "reuse_freed_host_memory", lambda: calls.append(1))
    # --resume of a directory without checkpoints stops after the call, before training.
    assert train.main(["--resume", "--output-dir", str(tmp_path / "none")]) == 2
    assert calls == [1]

    monkeypatch.undo()
    monkeypatch.setattr(host_memory, "_applied", False)
    monkeypatch.setenv("NMT_KEEP_HOST_MEMORY", "yes")
    assert train.main([]) == 2
    assert "NMT_KEEP_HOST_MEMORY='yes': expected 1" in capsys.readouterr().err
