"""How the suite shares the machine (tests/conftest.py): the slowest recorded files are
collected first, so that the two workers end together, and each worker runs on its own CPUs."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from conftest import (
    ROOT,
    recorded_file_seconds,
    slowest_files_first,
    suite_cpus,
    worker_cpus,
)


def test_every_recorded_file_exists():
    recorded = recorded_file_seconds()
    assert recorded, "tests/file_seconds.json is missing or empty"
    missing = [name for name in recorded if not (ROOT / name).is_file()]
    assert not missing, f"{missing}: renamed or removed; rerun pytest --record-file-seconds"


def test_slowest_recorded_files_first_and_each_files_tests_in_order():
    recorded = recorded_file_seconds()
    slow, fast = list(recorded)[:2]
    items = [SimpleNamespace(nodeid=nodeid) for nodeid in (
        "tests/test_unrecorded.py::test_a", f"{fast}::test_b", f"{slow}::test_c",
        f"{fast}::test_a", f"{slow}::test_a")]
    slowest_files_first(items, recorded)
    assert [item.nodeid for item in items] == [
        f"{slow}::test_c", f"{slow}::test_a", f"{fast}::test_b", f"{fast}::test_a",
        "tests/test_unrecorded.py::test_a"]


def test_each_worker_gets_its_own_contiguous_share_of_the_cpus():
    assert [worker_cpus([0, 1], i, 2) for i in range(2)] == [[0], [1]]
    assert [worker_cpus(list(range(7)), i, 2) for i in range(2)] == [[0, 1, 2], [3, 4, 5, 6]]
    assert [worker_cpus([2, 5, 9], i, 3) for i in range(3)] == [[2], [5], [9]]
    assert worker_cpus([0], 0, 2) is None      # fewer CPUs than workers: not pinned
    assert worker_cpus([0, 1], 0, 1) is None   # one worker: the whole machine


@pytest.mark.skipif(not os.environ.get("PYTEST_XDIST_WORKER") or not hasattr(
    os, "sched_getaffinity"), reason="a run without pytest-xdist workers, or not on Linux")
def test_this_worker_and_what_it_starts_run_on_its_share():
    worker = int(os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw"))
    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    share = worker_cpus(suite_cpus(), worker, workers) or suite_cpus()
    assert sorted(os.sched_getaffinity(0)) == share
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
        capture_output=True, text=True, timeout=60)
    assert child.stdout.strip() == str(share)
