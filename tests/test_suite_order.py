"""The suite's file order (tests/conftest.py): the slowest recorded files are collected first,
so that the two workers end together."""

from __future__ import annotations

import json
from types import SimpleNamespace

from conftest import FILE_SECONDS, ROOT, pytest_collection_modifyitems


def test_every_recorded_file_exists():
    recorded = json.loads(FILE_SECONDS.read_text())
    missing = [name for name in recorded if not (ROOT / name).is_file()]
    assert not missing, f"{missing}: renamed or removed; rerun pytest --record-file-seconds"


def test_slowest_recorded_files_first_and_each_files_tests_in_order():
    recorded = json.loads(FILE_SECONDS.read_text())
    slow, fast = list(recorded)[:2]
    items = [SimpleNamespace(nodeid=nodeid) for nodeid in (
        "tests/test_unrecorded.py::test_a", f"{fast}::test_b", f"{slow}::test_c",
        f"{fast}::test_a", f"{slow}::test_a")]
    pytest_collection_modifyitems(None, items)
    assert [item.nodeid for item in items] == [
        f"{slow}::test_c", f"{slow}::test_a", f"{fast}::test_b", f"{fast}::test_a",
        "tests/test_unrecorded.py::test_a"]
