"""Shared test set-up: the repository root on sys.path, the shared data folder, and the order.

The suite runs on two pytest-xdist workers, one file per worker at a time, in collection order
(pyproject.toml: `-n 2 --dist loadfile --no-loadscope-reorder`). Tests marked `long` (minutes
of end-to-end training, bounded by the clock rather than by work) are moved to the front, so
that one worker starts them while the other works through the rest; scheduled last, they
would leave a core idle for minutes.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_configure(config):
    config.addinivalue_line("markers", "long: minutes of end-to-end training; scheduled first")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.get_closest_marker("long") is None)  # stable
