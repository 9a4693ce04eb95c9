"""The benchmarks read test sets as translate.py does."""

from __future__ import annotations

import argparse

from bench.common import read_test_set


def test_a_test_set_is_split_on_line_feeds_only(tmp_path):
    """U+2028 and a lone \\r sit inside real sentences: splitting there would shift every
    later pair against its reference."""
    (tmp_path / "t.de").write_text("Ein\u2028Mann.\nZwei\rHunde.\nDrei.\n", encoding="utf-8")
    (tmp_path / "t.en").write_text("A man.\r\nTwo dogs.\nThree.\n", encoding="utf-8")
    args = argparse.Namespace(test_prefix=str(tmp_path / "t"), src="de", tgt="en")
    assert read_test_set(args) == (["Ein\u2028Mann.", "Zwei\rHunde.", "Drei."],
                                   ["A man.", "Two dogs.", "Three."])
    assert read_test_set(args, limit=2) == (["Ein\u2028Mann.", "Zwei\rHunde."],
                                            ["A man.", "Two dogs."])
