"""bench.decode refuses a flag it cannot measure with one line naming it and exit status 2,
before building a model: no traceback, no run that prints its header and nothing else."""

import sys

import pytest

from bench import decode

BASE = ["--preset", "tiny", "--vocab", "300", "--batch", "4", "--src-len", "6",
        "--out-len", "5", "--beams", "1", "--repeats", "1"]


@pytest.mark.parametrize("flag, value", [
    ("--repeats", "0"), ("--src-len", "0"), ("--batch", "0"), ("--beams", "0"),
    ("--beams", "-2"), ("--out-len", "0"), ("--vocab", "3"), ("--vocab", "4"),
    ("--preset", "nope"), ("--rounds", "0"), ("--threads", "0")])
def test_a_value_it_cannot_measure_is_one_line(flag, value, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["decode", *BASE, flag, value])
    with pytest.raises(SystemExit) as refused:
        decode.main()
    out, err = capsys.readouterr()
    assert refused.value.code == 2
    assert out == ""
    assert len(err.splitlines()) == 1 and f"{flag}" in err, err


def test_compile_seconds_are_reported_for_the_round_that_compiles(monkeypatch, capsys):
    import json

    monkeypatch.setattr(sys, "argv", ["decode", *BASE, "--rounds", "2"])
    decode.main()
    rounds = [json.loads(line) for line in capsys.readouterr().out.splitlines()][1:]
    assert [(r["round"], "compile_s" in r) for r in rounds] == [(0, True), (1, False)]
    assert rounds[1]["batch_s"] > 0
