"""Shared test set-up: the repository root on sys.path and the shared data folder."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Tests that call train.py's or translate.py's main in this process (and the command-line
# tests' subprocesses) keep glibc's malloc defaults: transformer.host_memory's settings trade
# memory for speed, which a test suite does not need. tests/test_host_memory.py checks them.
os.environ.setdefault("NMT_KEEP_HOST_MEMORY", "0")
