"""Opt-in: keep XLA:CPU's per-step buffers mapped from one step to the next (glibc malloc).

`NMT_KEEP_HOST_MEMORY=1 python train.py ...` trades host memory for CPU training speed.
train.py and the training benchmarks (bench.train, bench.linen_baseline) call
`reuse_freed_host_memory()` first thing, before JAX runs anything; without the variable it
does nothing.

Why: XLA:CPU allocates each execution's temporary buffer (a train step's saved activations,
hundreds of megabytes) with malloc and frees it when the execution ends. glibc serves a block
that large with a fresh mmap and returns it with munmap, so every step faults in new zeroed
pages. The settings (glibc `mallopt`):
- M_MMAP_THRESHOLD: blocks smaller than this come from the heap instead of their own mapping.
  Set to the largest value mallopt accepts, 2 GiB - 1.
- M_TRIM_THRESHOLD: the heap is handed back to the system only when more than this much is
  free at its top. Also 2 GiB - 1, so a freed step buffer stays mapped for the next step.
- M_ARENA_MAX = 1: one heap for all threads. Otherwise XLA's worker threads get arenas of
  their own, whose heaps hold at most 64 MiB, and their large blocks are mapped anyway.

Why it is not the default: memory. XLA allocates with 64-byte alignment, for which glibc asks
for the block plus 96 bytes, so a freed block of exactly the earlier size may not be reused
and the heap grows instead; with many batch shapes the gain is small. The measurements are in
docs/performance.md ("Host memory on CPU").

Only for CPU runs: with a GPU or TPU the step's buffers live in device memory, so nothing is
changed when JAX_PLATFORMS names another platform, or a CUDA, ROCm or TPU plugin is installed
and JAX_PLATFORMS is not "cpu". A thread keeps the arena it first allocated from, so the
settings only work before XLA's threads start. Only glibc (Linux) has them.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import platform

ENV_VAR = "NMT_KEEP_HOST_MEMORY"

# From glibc's malloc.h.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
# mallopt takes a C int.
_LARGEST = 2**31 - 1
SETTINGS = ((M_ARENA_MAX, 1), (M_MMAP_THRESHOLD, _LARGEST), (M_TRIM_THRESHOLD, _LARGEST))

_ACCELERATOR_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin",
                        "jax_rocm7_plugin", "libtpu")

_applied = False


def reuse_freed_host_memory() -> bool:
    """Apply the malloc settings above if NMT_KEEP_HOST_MEMORY=1; True if they are in effect.

    Call it before JAX runs anything. Calling it again does nothing more.
    """
    global _applied
    if not _applied and _wanted():
        libc = ctypes.CDLL(None)  # the C library this process already uses
        _applied = all(libc.mallopt(option, value) == 1 for option, value in SETTINGS)
    return _applied


def _wanted() -> bool:
    setting = os.environ.get(ENV_VAR, "0")
    if setting not in ("0", "1"):
        raise ValueError(f"{ENV_VAR}={setting!r}: expected 1 (keep step buffers mapped) or 0")
    return setting == "1" and has_glibc_malloc() and _runs_on_cpu_only()


def has_glibc_malloc() -> bool:
    """Whether this process allocates with glibc (Linux), the only malloc with these settings."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def _runs_on_cpu_only() -> bool:
    """Whether JAX will run on the CPU, judged without starting it."""
    platforms = os.environ.get("JAX_PLATFORMS", "").strip().lower()
    if platforms:
        return platforms == "cpu"
    return not any(importlib.util.find_spec(name) for name in _ACCELERATOR_PLUGINS)
