"""--max-minutes holds the whole run: the steps stop in time for the closing validation,
checkpoint and export, whose time is reserved from what the run measured of them."""

from __future__ import annotations

import types

import pytest

from nmt.rundir.bookkeeping import Bookkeeping
from nmt.settings.config import TrainerConfig
from nmt.training.saving import CheckpointWriter
from nmt.training.stopping import (
    ClosingTime,
    Limits,
    PausableClock,
    StopReason,
    StopSignal,
    steps_in_flight,
)
from nmt.training.validation import describe


@pytest.fixture
def clock(monkeypatch) -> list[float]:
    """The monotonic clock the limits read, set by the test: clock[0] = seconds."""
    now = [1000.0]
    monkeypatch.setattr("nmt.training.stopping.time.monotonic", lambda: now[0])
    return now


def test_the_closing_work_is_a_share_of_the_budget_until_measured():
    closing = ClosingTime(600, averaging=True)
    assert closing.seconds() == pytest.approx(30 + 12)  # 5% validating, 2% writing
    closing.validated(7.5)
    closing.saved(2.0)
    closing.saved(1.0)
    # The slowest save, for each of the last checkpoint, model/ and averaged/.
    assert closing.writing() == pytest.approx(6.0)
    assert closing.seconds() == pytest.approx(7.5 + 6.0)
    closing.validated(4.0)  # the last validation's time, not the slowest
    assert closing.seconds() == pytest.approx(4.0 + 6.0)
    # The step the last check lets start and the two still in flight, at a step's time.
    closing.stepped(0.5)
    closing.stepped(1.5)
    assert closing.step_seconds == pytest.approx(0.6)
    assert closing.seconds() == pytest.approx(3 * 0.6 + 4.0 + 6.0)
    # On a CPU each step is waited for before the next is dispatched: only the last started.
    on_cpu = ClosingTime(600, averaging=True, in_flight=steps_in_flight("cpu"))
    on_cpu.stepped(0.5)
    assert on_cpu.seconds() == pytest.approx(0.5 + 30 + 12)
    quick = ClosingTime(30, averaging=False)
    assert quick.seconds() == pytest.approx(5 + 5)  # the least
    quick.saved(0.1)
    assert quick.writing() == pytest.approx(5.0)  # never less


def test_the_clock_of_steps_leaves_out_every_paused_block(clock):
    steps = PausableClock()
    start = steps.now()
    clock[0] += 2.0
    with steps.paused():  # a validation
        clock[0] += 5.0
        with steps.paused():  # the checkpoint of a new best score, inside it
            clock[0] += 1.0
    steps.restart()  # a log line: the window's clock starts again, not the steps'
    clock[0] += 3.0
    assert steps.elapsed() == pytest.approx(3.0)
    assert steps.now() - start == pytest.approx(5.0)


def test_steps_are_queued_ahead_on_accelerators_only():
    """XLA:CPU gives each queued step a buffer of its own, so a CPU waits for every step."""
    assert steps_in_flight("cpu") == 0
    assert steps_in_flight("gpu") == steps_in_flight("tpu") == 2


def test_the_steps_stop_early_enough_for_the_closing_work(clock):
    limits = Limits(TrainerConfig(max_minutes=10), started=1000.0)
    signals = StopSignal()
    reserve = limits.closing.seconds()
    clock[0] = 1600 - reserve - 1
    assert limits.reached(5, 0, signals) is None
    assert limits.seconds_left() == pytest.approx(1.0)
    clock[0] += 1
    assert limits.reached(6, 0, signals) == StopReason.MAX_MINUTES
    # Validation translates until only the writing's time is left.
    assert limits.validation_deadline == pytest.approx(1600 - limits.closing.writing())
    limits.closing.validated(20.0)
    limits.closing.saved(3.0)
    assert limits.steps_deadline == pytest.approx(1600 - 20 - 2 * 3.0)
    assert limits.validation_deadline == pytest.approx(1600 - 2 * 3.0)


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_a_run_of_slow_steps_ends_within_its_minutes(clock, platform):
    """The trainer's loop, with steps of 21 s: the check before a step lets it start only when
    it, the steps in flight and the closing work all end by the deadline."""
    limits = Limits(TrainerConfig(max_minutes=10), started=1000.0,
                    in_flight=steps_in_flight(platform))
    limits.closing.validated(30.0)
    limits.closing.saved(5.0)
    signals, step = StopSignal(), 0
    while limits.reached(step, 0, signals) is None:
        clock[0] += 21.0
        step += 1
        limits.closing.stepped(21.0)
    finished = clock[0] + limits.closing.in_flight * 21.0 + 30.0 + limits.closing.writing()
    assert finished <= limits.deadline
    assert finished > limits.deadline - 2 * 21.0  # and no step is left unused


def test_no_time_limit_reserves_nothing(clock):
    limits = Limits(TrainerConfig(max_steps=10))
    assert limits.steps_deadline is None and limits.validation_deadline is None
    assert limits.seconds_left() is None and limits.too_short() is None


def test_a_budget_that_leaves_no_time_for_steps_names_the_least_that_does(clock):
    limits = Limits(TrainerConfig(max_minutes=0.5), started=1000.0)
    assert limits.closing.seconds() == pytest.approx(10.0)
    clock[0] = 1019.0  # one second left for steps
    assert limits.too_short() is None
    clock[0] = 1025.0
    assert limits.too_short() == (
        "--max-minutes 0.5 is too short for this run: starting took 25 s and the closing "
        "validation, checkpoint and export need about 10 s more; use --max-minutes 0.9 or "
        "more.")


def test_a_validation_cut_short_says_so_instead_of_a_score():
    result = {"loss": 2.0, "ppl": 7.39, "translated": 64, "sentences": 300}
    assert describe(12, result) == ("step 12: valid loss 2.000 ppl 7.39 (no BLEU: --max-minutes "
                                    "ran out after translating 64 of 300 sentences)")


class BackgroundWrites:
    """A Checkpointer whose saves return at once and whose writes end at `wait()`, taking
    `write_seconds` of the clock the writer reads."""

    def __init__(self, clock: list[float], write_seconds: float):
        self.clock, self.write_seconds, self.in_flight = clock, write_seconds, False

    def save(self, step, params, train, data, interim) -> None:
        self.clock[0] += 0.01  # the copy before the background write
        self.in_flight = True

    def wait(self) -> None:
        if self.in_flight:
            self.clock[0] += self.write_seconds
            self.in_flight = False


def test_the_writing_reserve_counts_a_whole_checkpoint_write_not_its_first_copy(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr("nmt.training.saving.time.monotonic", lambda: now[0])
    closing = ClosingTime(600, averaging=False)
    state = types.SimpleNamespace(params={}, step=0, opt_state={}, rng=None)
    writer = CheckpointWriter(BackgroundWrites(now, write_seconds=9.0), None, StopSignal(),
                              PausableClock(), interval=10, timed=closing.saved)
    for step in (10, 20):
        writer.save(step, state, Bookkeeping())
    assert closing.save_seconds == pytest.approx(9.01)  # the first save is waited for
    assert closing.writing() == pytest.approx(2 * 9.01)
    assert writer.checkpoints.in_flight  # later saves write in the background
