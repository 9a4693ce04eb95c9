"""Opt-in: keep XLA:CPU's per-step buffers mapped from one step to the next (glibc malloc).

`NMT_KEEP_HOST_MEMORY=1 python train.py ...` trades host memory for CPU training speed.
train.py and the training benchmarks (bench.train, bench.linen_baseline) call
`reuse_freed_host_memory()` first thing, before JAX runs anything; without the variable it
does nothing.

Why: XLA:CPU allocates each execution's temporary buffer with malloc and frees it when the
execution ends. For a train step that buffer holds the activations kept for the backward
pass: about 760 MB for `base` at batch 32 x 32 tokens. glibc serves a block that large with
a fresh mmap and returns it with munmap, so every step faults in new zeroed pages. On the
2-core developer machine (a virtual machine, where faults are dear) that was 190,000 page
faults and 0.3 s of kernel time per `base` step. With the settings below the step ran with
no faults: bfloat16 0.71 -> 0.59 s, float32 1.40 -> 1.32 s.

The settings (glibc `mallopt`):
- M_MMAP_THRESHOLD: blocks smaller than this come from the heap instead of their own mapping.
  Set to the largest value mallopt accepts, 2 GiB - 1. Larger blocks still get a mapping of
  their own; that is only slower.
- M_TRIM_THRESHOLD: the heap is handed back to the system only when more than this much is
  free at its top. Also 2 GiB - 1, so a freed step buffer stays mapped for the next step.
- M_ARENA_MAX = 1: one heap for all threads. Otherwise XLA's worker threads get arenas of
  their own, whose heaps hold at most 64 MiB, and their large blocks are mapped anyway. Small
  blocks are still served from per-thread caches, without the lock.

Why it is not the default: memory. Freed blocks stay in the heap, and XLA allocates with
64-byte alignment, for which glibc (2.36 here) asks for the block plus 96 bytes; a freed
block of exactly the size asked for before is then too small, and the heap grows instead.
How far depends on the order of allocations: the base train step reused its buffer every
step, but the Multi30k small recipe for 300 steps (36 batch shapes, validation and test
translation included) peaked at 9.8 GB resident instead of 5.5 GB, while running 12% faster
(3,145 -> 3,510 target tokens/s over steps 200-300). Rerun in another sitting, that recipe
peaked at 8.7 GB and took 394 s instead of 404 s, with steps 200-300 no faster (101 s against
99 s): on real training, with many batch shapes, the gain is small. Trimming the heap every
20 s (malloc_trim) did not bound the memory (10.5 GB peak) and gave back the speed. The 96 bytes left after an aligned block
go to glibc's per-thread cache and are handed to the next small request, which pins the block
in place; starting Python with GLIBC_TUNABLES=glibc.malloc.tcache_count=0 (no per-thread
cache; it cannot be set at run time) stops that, but that same run then took 428 s instead
of 397 s with a peak of 8.2 GB, so it is no remedy.

Transparent huge pages are no remedy either. Started with GLIBC_TUNABLES=glibc.malloc.hugetlb=1
(glibc 2.35+, kernel mode "madvise"), malloc asks for 2 MiB pages behind its large mappings,
so a step buffer faults 512 times fewer pages in and is still returned when freed. The fixed
shapes of `python -m bench.train` ran 12-17% faster (base float32 1.49 -> 1.33 s per step),
but the Multi30k small recipe did not: over 150 steps page faults fell from 34.3 to 1.3
million, kernel time rose from 64 to 74 s, and steps 150-225 took the same time (about 1.0 s
each).

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
