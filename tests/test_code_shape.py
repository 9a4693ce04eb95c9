"""No class of the library or the application grows past what a reader holds in mind: 250
lines, the size the trainer loop and the translator were cut to. A class that needs more is
doing two jobs; split the second out (as the start of a run, its periodic work and the batch
plan were) rather than raise the limit."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("transformer", "data", "nmt")
MAX_CLASS_LINES = 250


def class_lengths(root: Path) -> dict[str, int]:
    """{"package/path.py:Class": lines from `class` to its last line} for every class in the
    package `root`."""
    lengths = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                name = f"{path.relative_to(root.parent)}:{node.name}"
                lengths[name] = node.end_lineno - node.lineno + 1
    return lengths


def test_no_class_is_longer_than_the_limit():
    lengths = {name: lines for package in PACKAGES
               for name, lines in class_lengths(REPO / package).items()}
    assert "nmt/training/trainer.py:Trainer" in lengths  # the walk sees the classes
    too_long = {name: lines for name, lines in lengths.items() if lines > MAX_CLASS_LINES}
    assert not too_long, too_long


def test_the_measure_counts_a_class_from_its_header_to_its_last_line(tmp_path):
    source = "class A:\n    x = 1\n\n    def f(self):\n        return 2\n\n\ny = 3\n"
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(source)
    assert class_lengths(tmp_path / "pkg") == {"pkg/m.py:A": 5}
