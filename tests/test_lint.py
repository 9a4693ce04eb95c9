"""The code reads as pyproject.toml's [tool.ruff] says: lines of at most 100 characters,
imports sorted, no unused or undefined names (ruff's E, F, I and W rules)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RULES = "E,F,I,W"


def ruff(*paths: str | Path, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--select", RULES,
                           "--output-format", "concise", *map(str, paths)],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_repository_passes_the_linter():
    result = ruff(".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_linter_reports_a_long_line_and_an_unused_import(tmp_path):
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    (tmp_path / "bad.py").write_text("import os\n\nx = '" + "a" * 100 + "'\n")
    result = ruff("bad.py", cwd=tmp_path)
    assert result.returncode == 1
    assert "bad.py:1:8: F401" in result.stdout and "bad.py:3:101: E501" in result.stdout
