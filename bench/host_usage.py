"""What a command cost the host: CPU time in user space and in the kernel, page faults, peak RSS.

    python -m bench.host_usage OUT.json -- python train.py --config configs/multi30k_gpu.yaml

Runs the command, passes its output through, writes one JSON object to OUT.json and exits
with the command's status. As time(1), it waits out Ctrl-C and SIGTERM while the command runs:
the command gets the terminal's Ctrl-C itself (and a SIGTERM sent to this process alone), so
`train.py` saves as it does on Ctrl-C, and the record is still written. `system_over_user` is
null when the command used under 10 ms of user time (no share to speak of). A command that
cannot be started is one line and exit status 127 (126 if not executable), as a shell gives;
an OUT.json that cannot be written (its directory not there, a directory, no permission) is
refused before the command runs (exit 2).

A kernel share (system_s / user_s) of more than a few percent or hundreds of thousands of
minor page faults a second mean the host process stalls on memory that is mapped and
unmapped again (nmt/runtime/allocator.py says why and what prevents it).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

MIN_USER_S = 0.01  # below it a kernel share is noise over nothing


def measure(command: list[str]) -> dict:
    """Run `command`; its exit status and the resources it and its children used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    process = subprocess.Popen(command)
    # The command shares the terminal's process group, so it gets a Ctrl-C itself; this
    # process lives on to write the record (subprocess.call would SIGKILL the command).
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, lambda *_: None),
                signal.SIGTERM: signal.signal(
                    signal.SIGTERM, lambda *_: process.send_signal(signal.SIGTERM))}
    try:
        status = process.wait()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    if status < 0:  # killed by a signal: the status a shell gives
        status = 128 - status
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # This command's own share, should the caller have run others before (peak RSS is the
    # largest of any child's).
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    minor_faults = after.ru_minflt - before.ru_minflt
    return {"command": command, "status": status, "wall_s": round(wall, 1),
            "user_s": round(user, 1), "system_s": round(system, 1),
            "system_over_user": round(system / user, 4) if user >= MIN_USER_S else None,
            "minor_faults": minor_faults, "major_faults": after.ru_majflt - before.ru_majflt,
            "minor_faults_per_s": round(minor_faults / max(wall, 1e-9)),
            "max_rss_mib": round(after.ru_maxrss / 1024),  # Linux reports KiB
            "allocator_setting": os.environ.get("NMT_ALLOCATOR") or "(default)"}

USAGE = "usage: python -m bench.host_usage OUT.json -- COMMAND [ARG ...]"


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(f"{USAGE}\n\n{__doc__}")
        return 0
    if len(argv) < 3 or argv[1] != "--":
        print(USAGE, file=sys.stderr)
        return 2
    if not Path(argv[0]).parent.is_dir():
        return _refuse(f"OUT.json {argv[0]}: the directory {Path(argv[0]).parent} is not "
                       "there; make it first", 2)
    if (why := unwritable(Path(argv[0]))) is not None:
        return _refuse(f"OUT.json {argv[0]} cannot be written ({why}); give a writable "
                       "file", 2)
    try:
        record = measure(argv[2:])
    except FileNotFoundError:
        return _refuse(f"{argv[2]}: command not found", 127)
    except PermissionError:
        return _refuse(f"{argv[2]}: permission denied (not executable)", 126)
    Path(argv[0]).write_text(json.dumps(record) + "\n")
    print(json.dumps(record), file=sys.stderr)
    return record["status"]


def unwritable(out: Path) -> str | None:
    """Why `out` cannot be written (a directory, no permission), found before the command
    runs rather than after a long run whose record it would lose; None if it can. Leaves no
    file behind."""
    existed = out.exists()
    try:
        out.open("a").close()  # appends nothing: an existing file is kept as it is
    except OSError as error:
        return error.strerror
    if not existed:
        out.unlink()
    return None


def _refuse(message: str, status: int) -> int:
    print(f"host_usage.py: error: {message}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
