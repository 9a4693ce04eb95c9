"""Whether the host CPU multiplies bfloat16 natively: on one that does not, XLA converts
bfloat16 operands on the way into every product, and `--dtype bfloat16` can run slower than
float32. Read from Linux's /proc/cpuinfo, where the kernel lists the CPU's instruction sets.

    warning = bfloat16_warning("cpu", "bfloat16")   # one line, or None where it is fine
"""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")

# Linux's names for the instruction sets with bfloat16 products: AVX512-BF16 (Intel Cooper
# Lake and later, AMD Zen 4 and later), AMX-BF16 (Intel Sapphire Rapids and later); on Arm
# the "bf16" feature (Armv8.6 and later).
X86_BFLOAT16 = ("avx512_bf16", "amx_bf16")
ARM_BFLOAT16 = ("bf16",)


def cpu_flags(cpuinfo: str) -> set[str]:
    """The instruction-set names of /proc/cpuinfo's "flags" (x86) or "Features" (Arm) lines."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return flags


def has_bfloat16_products(cpuinfo: str | None = None) -> bool | None:
    """Whether the CPU has bfloat16 product instructions; None where /proc/cpuinfo cannot be
    read or lists no instruction sets (another OS, a sandbox), so nothing can be said."""
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO.read_text()
        except OSError:
            return None
    flags = cpu_flags(cpuinfo)
    if not flags:
        return None
    return any(name in flags for name in X86_BFLOAT16 + ARM_BFLOAT16)


def bfloat16_warning(platform: str, dtype: str, cpuinfo: str | None = None) -> str | None:
    """One line when bfloat16 products are asked of a CPU without the instructions for them;
    None on other platforms, in float32, or where the CPU has them (or cannot be read)."""
    if platform != "cpu" or dtype != "bfloat16" or has_bfloat16_products(cpuinfo) is not False:
        return None
    return ("compute dtype bfloat16 on a CPU without bfloat16 instructions (/proc/cpuinfo lists "
            f"none of {', '.join(X86_BFLOAT16 + ARM_BFLOAT16)}): XLA converts every product's "
            "operands, which can be slower than float32; --dtype float32 computes natively")
