"""The suite's file order (tests/conftest.py): the slowest recorded files are collected first,
so that the two workers end together."""

from __future__ import annotations

from types import SimpleNamespace

from conftest import ROOT, recorded_file_seconds, slowest_files_first


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
