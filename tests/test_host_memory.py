"""transformer.host_memory: XLA:CPU's per-call buffers stay mapped between calls.

Each measurement runs in a fresh Python process, because the settings only work before JAX
starts its threads (and would leak into the rest of the suite).
"""

import json
import platform
import subprocess
import sys

import pytest

from conftest import ROOT

glibc_only = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="the malloc settings exist only in glibc")

# Runs a jitted function whose temporary buffer is ~340 MB (several unfusable [4096, 4096]
# float32 intermediates) and prints its temp size and the page faults of calls 13 to 15.
# (glibc 2.36 needs several calls before freed blocks fit the next aligned request.)
_PROBE = """
import json, resource, sys
sys.path.insert(0, {root!r})
import jax, jax.numpy as jnp
from transformer.host_memory import reuse_freed_host_memory
applied = reuse_freed_host_memory() if {apply} else False

def body(x):
    a = jnp.cumsum(x, axis=0)
    b = jnp.cumsum(a[::-1], axis=1)
    c = jnp.cumsum(b.T, axis=0)
    return (a * c).sum() + (b * c[::-1]).sum()

x = jnp.ones((4096, 4096), jnp.float32)
step = jax.jit(body).lower(x).compile()
for _ in range(12):
    step(x).block_until_ready()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    step(x).block_until_ready()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({{"applied": applied, "faults_per_call": faults / 3,
                  "temp_bytes": step.memory_analysis().temp_size_in_bytes}}))
"""


def _probe(apply: bool) -> dict:
    code = _PROBE.format(root=str(ROOT), apply=apply)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@glibc_only
def test_freed_step_buffers_are_reused_without_page_faults():
    plain, reused = _probe(apply=False), _probe(apply=True)
    pages = plain["temp_bytes"] / 4096
    assert plain["temp_bytes"] > 100e6, plain  # the premise: a buffer glibc would map anew
    # Without the settings every call faults the buffer's pages in again ...
    assert plain["faults_per_call"] > 0.5 * pages, plain
    # ... with them, calls after the first reuse pages that are already mapped.
    assert reused["applied"] is True
    assert reused["faults_per_call"] < 0.02 * pages, reused


@pytest.mark.parametrize("name, value", [("NMT_KEEP_HOST_MEMORY", "0"),
                                         ("JAX_PLATFORMS", "cuda,cpu"), ("JAX_PLATFORMS", "tpu")])
def test_settings_stay_off_when_switched_off_or_not_on_cpu(monkeypatch, name, value):
    # Safe in this process: these cases return before calling mallopt.
    from transformer import host_memory

    monkeypatch.setattr(host_memory, "_applied", False)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv(name, value)
    assert host_memory.reuse_freed_host_memory() is False


def test_entry_points_apply_the_settings_before_jax_runs(monkeypatch):
    """train.py and translate.py call it first thing (here they then stop at a bad flag)."""
    import train
    import translate
    from transformer import host_memory

    calls = []
    monkeypatch.setattr(host_memory, "reuse_freed_host_memory", lambda: calls.append("train"))
    monkeypatch.setattr(translate, "reuse_freed_host_memory",
                        lambda: calls.append("translate"))
    assert train.main(["--preset", "no-such-preset"]) == 2
    assert translate.main(["--model", str(ROOT / "no-such-model"), "Hallo"]) == 1
    assert calls == ["train", "translate"]
