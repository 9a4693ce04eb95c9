"""What a command cost the host: CPU time in user space and in the kernel, page faults, peak RSS.

    python -m bench.host_usage OUT.json -- python train.py --config configs/multi30k_gpu.yaml

Runs the command, passes its output through, writes one JSON object to OUT.json and exits
with the command's status. A kernel share (system_s / user_s) of more than a few percent or
hundreds of thousands of minor page faults a second mean the host process stalls on memory
that is mapped and unmapped again (nmt/runtime/allocator.py says why and what prevents it).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path


def measure(command: list[str]) -> dict:
    """Run `command`; its exit status and the resources it and its children used."""
    start = time.perf_counter()
    status = subprocess.call(command)
    if status < 0:  # killed by a signal: the status a shell gives
        status = 128 - status
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"command": command, "status": status, "wall_s": round(wall, 1),
            "user_s": round(usage.ru_utime, 1), "system_s": round(usage.ru_stime, 1),
            "system_over_user": round(usage.ru_stime / max(usage.ru_utime, 1e-9), 4),
            "minor_faults": usage.ru_minflt, "major_faults": usage.ru_majflt,
            "minor_faults_per_s": round(usage.ru_minflt / max(wall, 1e-9)),
            "max_rss_mib": round(usage.ru_maxrss / 1024),  # Linux reports KiB
            "allocator_setting": os.environ.get("NMT_ALLOCATOR") or "(default)"}


USAGE = "usage: python -m bench.host_usage OUT.json -- COMMAND [ARG ...]"


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(f"{USAGE}\n\n{__doc__}")
        return 0
    if len(argv) < 3 or argv[1] != "--":
        print(USAGE, file=sys.stderr)
        return 2
    record = measure(argv[2:])
    Path(argv[0]).write_text(json.dumps(record) + "\n")
    print(json.dumps(record), file=sys.stderr)
    return record["status"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
