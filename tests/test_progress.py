"""nmt.runtime.progress: in a log (stderr not a terminal), plain lines at a steady interval and
never a carriage return; the same rule for train.py, translate.py and the distillation."""

from __future__ import annotations

import io

from nmt.runtime import progress
from nmt.settings.config import TrainerConfig
from nmt.training.progress import Progress


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_come_once_per_interval():
    clock, stream = Clock(), io.StringIO()
    lines = progress.PlainLines(lambda elapsed: f"at {elapsed:.0f}", 30, stream, clock)
    for _ in range(10):
        clock.now += 10
        lines.tick()
    assert stream.getvalue() == "at 30\nat 60\nat 90\n"


def test_the_interval_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(progress.INTERVAL_VARIABLE, "2.5")
    assert progress.plain_interval() == 2.5
    for bad in ("often", "nan", "inf"):
        monkeypatch.setenv(progress.INTERVAL_VARIABLE, bad)
        assert progress.plain_interval() == 30.0


def test_a_line_counter_in_a_log_says_how_many_of_how_many_and_the_rate(capsys):
    with progress.LineCounter(10, quiet=False, what="sentences", interval=0) as counter:
        counter.update(3)
        counter.update(4)
    err = capsys.readouterr().err
    assert "\r" not in err
    assert err.splitlines()[-1].startswith("7 of 10 sentences (")
    assert "ETA" in err
    with progress.LineCounter(10, quiet=True) as counter:
        counter.update(5)
    assert capsys.readouterr().err == ""


def test_training_progress_in_a_log_names_step_loss_speed_and_time_left(capsys, monkeypatch):
    monkeypatch.setenv(progress.INTERVAL_VARIABLE, "0")
    shown = Progress()
    shown.open(TrainerConfig(progress=True), total=100, initial=40)
    shown.show({"loss": 2.5, "lr": 1e-3, "tokens_per_s": 12345.0})
    for _ in range(10):
        shown.advance(seconds_left=None)
    shown.close()
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("progress: step 50 of 100, loss 2.500, 12,345 tokens/s, elapsed ")
    assert "ETA" in last
    quiet = Progress()
    quiet.open(TrainerConfig(progress=False), total=100, initial=0)
    quiet.advance(None)
    assert capsys.readouterr().err == ""


def test_the_time_left_is_that_of_the_first_limit_of_steps_or_minutes(monkeypatch):
    # 100 of 400 steps in 10 s: the steps end in 30 s, an hour before the minutes would.
    monkeypatch.setenv(progress.INTERVAL_VARIABLE, "3600")
    shown = Progress()
    shown.open(TrainerConfig(progress=True), total=400, initial=0)
    for _ in range(100):
        shown.advance(seconds_left=3600.0)
    assert shown._line(10.0).endswith(f"ETA {progress.clock_time(30.0)}")
    shown.advance(seconds_left=5.0)  # the minutes first now
    assert shown._line(10.0).endswith(f"ETA {progress.clock_time(5.0)}")
    shown.close()
