"""bench/train.py's command line: what the train-step benchmark refuses and passes on."""

import pytest

from bench import train as bench_train


@pytest.mark.parametrize("weight", ["-1", "nan", "inf", "five"])
def test_a_bad_rdrop_weight_is_refused_in_one_line_naming_the_flag(weight, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_train.parse_args(["--rdrop", weight])
    assert exit_.value.code == 2
    [message] = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert "--rdrop" in message and weight in message


def test_rdrop_is_refused_beside_the_peer_that_has_none(capsys):
    with pytest.raises(SystemExit):
        bench_train.parse_args(["--rdrop", "5", "--compare"])
    assert "--rdrop" in capsys.readouterr().err


def test_the_rdrop_weight_reaches_the_step_that_is_timed():
    args = bench_train.parse_args(["--preset", "tiny", "--layers", "1", "--rdrop", "5",
                                   "--batch", "2", "--src-len", "4", "--tgt-len", "4"])
    step = bench_train.OurStep(args)
    assert step.optimizer_config.rdrop == 5.0
    result = step.measure()
    assert result["is_finite"]
