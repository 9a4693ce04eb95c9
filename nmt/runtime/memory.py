"""How much memory the first device has, and has free: a GPU's or TPU's own, or for a CPU the
host's. Errors say it beside what was asked for; checks refuse what cannot fit before it is
tried (on a CPU the kernel kills a process that asks for too much, with no message)."""

from __future__ import annotations

import dataclasses
import os

import jax


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
    """where: "the GPU", "the host"...; total and free in bytes, None where unknown."""

    where: str
    total: int | None
    free: int | None

    def describe(self) -> str:
        """e.g. "the host has 23.4 GiB of memory (20.1 GiB free)"."""
        if self.total is None:
            return f"{self.where}'s memory is unknown"
        free = f" ({gib(self.free)} free)" if self.free is not None else ""
        return f"{self.where} has {gib(self.total)} of memory{free}"


def device_memory() -> DeviceMemory:
    """The first local device's memory, as its runtime reports it, or the host's for a CPU."""
    device = jax.local_devices()[0]
    try:
        stats = device.memory_stats() or {}
    except Exception:  # noqa: BLE001 - a platform without memory statistics
        stats = {}
    if "bytes_limit" in stats:
        limit = int(stats["bytes_limit"])
        return DeviceMemory(f"the {device.platform.upper()}", limit,
                            limit - int(stats.get("bytes_in_use", 0)))
    return host_memory()


def host_memory() -> DeviceMemory:
    """The host's memory; free is what the kernel says it can give without swapping
    (MemAvailable, which counts the page cache it would drop), else its free pages."""
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        total, free = page * os.sysconf("SC_PHYS_PAGES"), page * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError):
        return DeviceMemory("the host", None, None)
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass  # not Linux: the free pages
    return DeviceMemory("the host", total, free)


def gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"
