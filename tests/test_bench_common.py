"""The benchmarks read test sets as translate.py does, and their wrappers exit as a shell would."""

from __future__ import annotations

import argparse

import pytest

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



def test_a_test_set_whose_files_differ_in_length_is_refused_whatever_the_limit(tmp_path):
    """A missing line shifts every later pair against another sentence's reference; --limit
    cutting both to the same length must not hide it."""
    from data.config import DataError

    (tmp_path / "t.de").write_text("Ein Mann.\nDie Katze.\nZwei Kinder.\n", encoding="utf-8")
    (tmp_path / "t.en").write_text("A man.\nThe cat.\n", encoding="utf-8")
    args = argparse.Namespace(test_prefix=str(tmp_path / "t"), src="de", tgt="en")
    for limit in (0, 1, 2):
        with pytest.raises(DataError, match=f"^{tmp_path / 't.de'} has 3 lines but "
                                            f"{tmp_path / 't.en'} has 2; "):
            read_test_set(args, limit=limit)

def test_host_usage_passes_on_the_status_a_shell_gives_and_answers_help(capsys):
    from bench import host_usage

    assert host_usage.measure(["bash", "-c", "exit 3"])["status"] == 3
    assert host_usage.measure(["bash", "-c", "kill -9 $$"])["status"] == 128 + 9
    assert host_usage.main(["--help"]) == 0
    assert "usage: python -m bench.host_usage" in capsys.readouterr().out


def test_peer_gpu_answers_help():
    from bench import peer_gpu

    with pytest.raises(SystemExit) as exited:
        peer_gpu.parse_args(["--help"])
    assert exited.value.code == 0
