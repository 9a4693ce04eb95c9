"""A linear schedule without --decay-steps ends where the run's limit of steps or minutes does
(nmt.training.schedule_fit): the fit, and a run whose learning rates follow it exactly."""

from __future__ import annotations

import json
import logging
import types
from pathlib import Path

import pytest
from conftest import SHALLOW

from nmt.rundir.checkpoints import epochs_trained
from nmt.rundir.resume import RUN_CONFIG_FILE
from nmt.settings import recipes
from nmt.settings.config import SettingsError
from nmt.training import schedule_fit
from nmt.training.errors import RunMismatch
from nmt.training.metrics_log import METRICS_FILE
from nmt.training.stopping import Limits, PausableClock
from nmt.training.trainer import train
from synthetic_corpus import write_corpus


def test_the_end_is_the_last_step_the_time_left_allows():
    fit = schedule_fit.EndFit(first_step=0, warmup_steps=400, max_steps=None)
    # Timed from an eighth into the warm-up, fitted a tenth before its end.
    assert [step for step in range(400) if fit.wants_clock(step)] == [50, 360]
    assert fit.after_step(50, now=100.0, seconds_left=1000.0, periodic=0.0) is None
    assert fit.after_step(100, now=110.0, seconds_left=990.0, periodic=0.0) is None  # not yet
    end = fit.after_step(360, now=255.0, seconds_left=845.0, periodic=0.0)  # 0.5 s a step
    assert fit.step_seconds == pytest.approx(0.5)
    assert end == 360 + int(845 * (1 - schedule_fit.RESERVE) / 0.5)
    # Validation and checkpoints add their share to each step left.
    assert fit.end_at(360, 845.0, periodic=0.25) == 360 + int(845 * (1 - schedule_fit.RESERVE)
                                                              / 0.75)

    capped = schedule_fit.EndFit(first_step=0, warmup_steps=400, max_steps=1000)
    capped.after_step(50, 100.0, 1000.0, 0.0)
    assert capped.after_step(360, 255.0, 845.0, 0.0) == 1000  # the limit of steps first

    # A resumed run times its own steps; a short warm-up is timed over what it leaves.
    resumed = schedule_fit.EndFit(first_step=300, warmup_steps=310, max_steps=None)
    assert (resumed.timed_from, resumed.fit_at) == (301, 309)
    resumed.after_step(301, 0.0, 100.0, 0.0)
    assert resumed.after_step(309, 0.0, 100.0, 0.0) > 309  # never before the fit (or warm-up)
    past = schedule_fit.EndFit(first_step=500, warmup_steps=400, max_steps=None)
    assert (past.timed_from, past.fit_at) == (501, 502)


class _Compiling:
    """The train step for a fitted end, compiled `seconds` after it was asked for."""

    def __init__(self, now: list[float], seconds: float):
        self.now, self.ready_at = now, now[0] + seconds
        self.seconds_compiling_in_calls = 0.0

    def ready(self) -> bool:
        return self.now[0] >= self.ready_at

    def wait(self) -> None:
        self.now[0] = max(self.now[0], self.ready_at)


class _Run:
    """Steps of a fake clock through `FittedEnd`, with the trainer's order of work after a
    step: the fit (or the switch to the step compiled for its end), then a validation and a
    checkpoint where due (the clock paused)."""

    def __init__(self, monkeypatch, eval_every: int, step_s: float, warmup: int = 20,
                 compile_s: float = 3.0):
        self.now = [1000.0]
        monkeypatch.setattr("nmt.training.stopping.time.monotonic", lambda: self.now[0])
        run = recipes.run_from_flat(schedule="linear", warmup=warmup, max_minutes=1.0,
                                    eval_every=eval_every)
        self.limits = Limits(run.trainer, started=1000.0)
        self.clock = PausableClock()
        self.fitted = schedule_fit.FittedEnd(run, 0, self.limits, self.clock,
                                             batches_per_epoch=1000)
        self.eval_every, self.step_s, self.compile_s, self.step = eval_every, step_s, compile_s, 0
        self.ends: dict[int, int] = {}  # step: the end fitted after it
        self.switched: list[int] = []   # the steps after which a compiled step took over
        self.running = _Compiling(self.now, 0.0)

    def steps(self, last: int, validation_s: float, save_s: float = 0.5) -> None:
        while self.step < last:
            self.step += 1
            self.now[0] += self.step_s
            fitted = self.fitted
            if fitted.compiled is not None:
                running, self.running = self.running, fitted.train_step(self.step, self.running)
                if self.running is not running:
                    self.switched.append(self.step)
            elif (end := fitted.end_after(self.step, types.SimpleNamespace(
                    block_until_ready=lambda: None))) is not None:
                self.ends[self.step] = end
                fitted.compiled = _Compiling(self.now, self.compile_s)
            if self.step % self.eval_every == 0:
                with self.clock.paused():
                    self.now[0] += validation_s
                    self.limits.closing.validated(validation_s)
                    self.now[0] += save_s
                    self.limits.closing.saved(save_s)

    def expected(self, step: int, periodic: float, compile_s: float = 0.0) -> int:
        left = self.limits.seconds_left() - compile_s
        return step + int(left * (1 - schedule_fit.RESERVE) / (self.step_s + periodic))


def test_the_fit_counts_validations_and_saves_and_refits_once_after_one(monkeypatch):
    # The first validation comes after the warm-up: the fit counts none. That validation
    # compiles the search (9 s), so no refit follows it: its time would be charged to every
    # later one. The refit after the second counts that one's time (1.5 s) and the
    # checkpoint's, one each --eval-every (40) steps, and reserves the time the first end's
    # step took to compile (waited for at the warm-up's end).
    run = _Run(monkeypatch, eval_every=40, step_s=0.02)
    run.steps(18, validation_s=1.5)
    assert run.ends == {18: run.expected(18, 0.0)}
    assert run.fitted.fit.step_seconds == pytest.approx(0.02)
    run.steps(40, validation_s=9.0)
    assert run.ends.keys() == {18} and run.switched == [20]
    assert run.fitted.compile_seconds == pytest.approx(3.0)
    run.steps(80, validation_s=1.5)
    assert run.ends.keys() == {18}  # not after the first validation
    run.steps(81, validation_s=1.5)
    assert run.ends[81] == run.expected(81, (1.5 + 0.5) / 40, 3.0) < run.ends[18] - 100
    assert "in place of" in run.fitted.describe(run.ends[81], 1.0, Path("config.yaml"))
    # The updates since the warm-up followed the first end: the step for the new one takes
    # over at the next, after waiting for its compile.
    run.steps(82, validation_s=1.5)
    assert run.switched == [20, 82] and run.fitted.replaced == run.ends[18]
    run.steps(200, validation_s=3.0)
    assert run.ends.keys() == {18, 81}  # once


def test_a_validation_in_the_timed_steps_is_not_a_step_and_its_compile_is_refitted(
        monkeypatch):
    # A validation at step 19, inside the steps timed (5 to 36), takes 4 s (an untrained
    # model translates to the length limit): the steps' time leaves it out, the fit counts it
    # once in 19 steps, and the next validation's 0.4 s replaces it before the decay begins
    # (after step 40): the schedule is then the linear one to the refitted end, the step
    # compiled for it waited for at the warm-up's end.
    run = _Run(monkeypatch, eval_every=19, step_s=0.05, warmup=40, compile_s=0.02)
    run.steps(36, validation_s=4.0, save_s=0.2)
    assert run.fitted.fit.step_seconds == pytest.approx(0.05)
    assert run.ends == {36: run.expected(36, (4.0 + 0.2) / 19)}
    run.steps(39, validation_s=0.4, save_s=0.2)
    assert run.switched == [37]
    assert run.ends[39] == run.expected(39, (0.4 + 0.2) / 19, 0.05) > run.ends[36] + 100
    run.steps(40, validation_s=0.4, save_s=0.2)
    assert run.switched == [37, 40] and run.fitted.wait_from == 40


def test_a_refit_that_moves_the_end_little_keeps_it(monkeypatch):
    # Measured before the fit and the same after: no second compile, nor its time reserved.
    run = _Run(monkeypatch, eval_every=5, step_s=0.05, compile_s=0.0)
    run.steps(60, validation_s=0.3, save_s=0.1)
    assert len(run.ends) == 1 and run.fitted.refitted and run.fitted.replaced is None


def test_what_is_known_before_any_step_is_set_at_once():
    run = recipes.run_from_flat(schedule="linear", warmup=10, max_steps=500)
    assert schedule_fit.resolve(run, None).optimizer.decay_steps == 500
    timed = recipes.run_from_flat(schedule="linear", warmup=10, max_minutes=3.0)
    assert schedule_fit.resolve(timed, None).optimizer.decay_steps is None  # the clock decides
    fitted = schedule_fit.with_end(timed, 777)
    assert schedule_fit.resolve(timed, fitted).optimizer.decay_steps == 777  # a resume
    assert schedule_fit.for_compiling(timed.optimizer).decay_steps == schedule_fit.UNFITTED


def test_a_resume_at_the_end_is_refused_only_where_its_limit_allows_more_steps():
    """At the end the rate is zero: a limit past it would train nothing; short of the end,
    where a limit stops the run at once, or given the run's own limits, it goes on or
    finishes."""
    config = Path("run/config.yaml")
    saved = schedule_fit.with_end(
        recipes.run_from_flat(schedule="linear", warmup=2, max_steps=4), 4)

    def refusal(reached: int, before: object = saved, epochs_trained: int = 0, **limits
                ) -> str | None:
        run = recipes.run_from_flat(schedule="linear", warmup=2, **limits)
        return schedule_fit.nothing_left(schedule_fit.resolve(run, before), before, reached,
                                         lambda: epochs_trained, config)

    assert refusal(4, max_steps=8) == (
        "--max-steps 8 trains no further: the run's checkpoint is at step 4, and its linear "
        "learning rate is zero after step 4, the end it records (decay_steps in "
        "run/config.yaml, given or fitted to its earlier limit); --decay-steps 8 extends the "
        "line, or use a new --output-dir.")
    assert refusal(3, max_steps=8) is None  # goes on to step 4
    assert refusal(4, max_steps=4) is None  # finished: a rerun of the same command
    # The limits that fitted the end, given again: the finished run finishes again.
    for limits in ({"max_minutes": 3.0}, {"max_minutes": 3.0, "max_steps": 100},
                   {"max_steps": 6, "max_epochs": 1}):
        before = schedule_fit.with_end(recipes.run_from_flat(schedule="linear", warmup=2,
                                                             **limits), 4)
        assert refusal(4, before, **limits) is None
    timed = schedule_fit.with_end(recipes.run_from_flat(schedule="linear", warmup=2,
                                                        max_minutes=3.0), 4)
    assert "--max-minutes 5 trains no further" in refusal(4, timed, max_minutes=5.0)
    assert "--max-minutes 3 trains no further" in refusal(4, max_minutes=3.0)
    assert "--decay-steps N (a step after 4, where it should now end)" in refusal(
        4, max_minutes=3.0)
    # A limit of epochs is spent only where the checkpoint has trained that many, whatever
    # the earlier limit was (it may not be what stopped the run).
    assert refusal(4, epochs_trained=2, max_epochs=2) is None
    assert "--max-epochs 2 trains no further" in refusal(4, epochs_trained=1, max_epochs=2)
    steps_and_epoch = schedule_fit.with_end(recipes.run_from_flat(
        schedule="linear", warmup=2, max_steps=4, max_epochs=1), 4)
    assert "--max-steps 12 trains no further" in refusal(4, steps_and_epoch, max_steps=12,
                                                         max_epochs=1)
    assert refusal(4, steps_and_epoch, epochs_trained=1, max_steps=12, max_epochs=1) is None
    given = recipes.run_from_flat(schedule="linear", warmup=2, max_steps=8, decay_steps=8)
    assert schedule_fit.nothing_left(given, saved, 4, lambda: 0, config) is None  # extended
    assert schedule_fit.nothing_left(given, None, 4, lambda: 0, config) is None


def test_a_decay_steps_not_after_the_step_reached_is_refused_where_a_limit_allows_more():
    """The rate is zero after a --decay-steps the checkpoint has reached: a limit that allows
    more steps would train nothing, whatever end config.yaml records; one that stops the run
    at once finishes it."""
    config = Path("run/config.yaml")
    saved = schedule_fit.with_end(
        recipes.run_from_flat(schedule="linear", warmup=2, max_epochs=1), 19)

    def refusal(decay_steps: int, before: object = saved, epochs_trained: int = 1, **limits
                ) -> str | None:
        run = recipes.run_from_flat(schedule="linear", warmup=2, decay_steps=decay_steps,
                                    **limits)
        return schedule_fit.nothing_left(run, before, 19, lambda: epochs_trained, config)

    assert refusal(10, max_epochs=2) == (
        "--decay-steps 10 is not after step 19, where the run's checkpoint is: --max-epochs 2 "
        "would train nothing (the linear learning rate is zero after step 10); give a "
        "--decay-steps after step 19, or use a new --output-dir.")
    assert refusal(19, None, max_steps=30).startswith("--decay-steps 19 is not after step 19")
    assert refusal(19, max_steps=30).startswith("--max-steps 30 trains no further")  # recorded
    assert "--max-minutes 3 would train nothing" in refusal(10, max_minutes=3.0)
    assert "--max-epochs 2 would train nothing" in refusal(10, None, max_epochs=2)
    assert refusal(20, max_epochs=2) is None      # goes on to step 20
    assert refusal(10, max_epochs=1) is None      # the epoch limit stops it at once
    assert refusal(10, max_steps=19) is None
    # Recorded by a run that finished at once with it: a new end must still come after 19.
    recorded = schedule_fit.with_end(saved, 10)
    run = schedule_fit.resolve(recipes.run_from_flat(schedule="linear", warmup=2, max_epochs=2),
                               recorded)
    assert "--decay-steps N (a step after 19, where it should now end)" in (
        schedule_fit.nothing_left(run, recorded, 19, lambda: 1, config))


def test_a_linear_schedule_that_would_end_in_its_warm_up_is_refused():
    with pytest.raises(SettingsError, match="--max-steps 10, which must be above --warmup 10"):
        recipes.run_from_flat(schedule="linear", warmup=10, max_steps=10)


@pytest.mark.parametrize("flags", [{"max_epochs": 2}, {"max_epochs": 2, "max_steps": 500}])
def test_a_limit_of_epochs_ends_the_line_where_it_stops_the_run_without_a_clock(flags, caplog):
    """2 epochs of 39 batches stop the run at step 78, before any --max-steps 500: the line
    ends there, known once the epoch's batches are (after the step compiled), not at 500."""
    run = recipes.run_from_flat(schedule="linear", warmup=10, **flags)
    assert schedule_fit.resolve(run, None).optimizer.decay_steps is None
    limits = Limits(run.trainer)
    fitted = schedule_fit.FittedEnd(run, 0, limits, PausableClock(), batches_per_epoch=39)
    assert fitted.fit is None  # nothing timed
    assert fitted.end_after(1, None) == 78
    assert fitted.end_after(2, None) is None  # once
    assert "linear to zero after step 78, where the run's limit stops it (" in fitted.describe(
        78, None, Path("config.yaml"))
    # Epochs shorter than the warm-up: the run stops before any decay, and is warned of.
    with caplog.at_level(logging.WARNING, logger="nmt.training.schedule_fit"):
        short = schedule_fit.FittedEnd(run, 0, limits, PausableClock(), batches_per_epoch=3)
    assert short.end_after(1, None) == 11
    assert "the run stops at step 6, within its warm-up of 10 steps" in caplog.text


def _lines(run_dir) -> list[dict]:
    lines = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]
    return [line for line in lines if line["kind"] == "train"]


def _expected_lr(step: int, peak: float, warmup: int, end: int) -> float:
    """The linear schedule at the update that made `step` (update number s = step): zero
    just after `end`, its last update."""
    return peak * max(min(step / warmup, (end + 1 - step) / (end + 1 - warmup)), 0.0)


def test_a_run_on_a_time_budget_follows_the_linear_schedule_to_the_fitted_end(
        tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("FLAX_NMT_CACHE", str(tmp_path / "cache"))
    train_prefix = write_corpus(tmp_path, 200, 0, "train")
    warmup, peak = 24, 2e-3
    settings = {"preset": "tiny", **SHALLOW, "train_prefix": train_prefix, "valid_prefix": None,
                "vocab_size": 320, "batch_tokens": 256, "buckets": (16,), "warmup": warmup,
                "schedule": "linear", "peak_lr": peak, "log_every": 1, "eval_every": 10_000,
                "eval_sentences": 0, "save_every": 10_000, "progress": False, "samples": 0}
    out = tmp_path / "run"
    # Minutes to spare, so that the step limit ends the fitted line whatever the machine's
    # speed: the end is still fitted (from the clock and the limit) and swapped in.
    with caplog.at_level(logging.INFO, logger="nmt.training.trainer"):
        summary = train(recipes.run_from_flat(**settings, max_minutes=5.0, max_steps=80), out)
    end = recipes.load_saved(out / RUN_CONFIG_FILE).optimizer.decay_steps
    assert end == 80
    assert (f"linear to zero after step {end}, the last the run's limits allow (5 minutes at"
            in caplog.text)
    lines = _lines(out)
    assert (summary["stopped"], summary["steps"]) == ("max_steps", end)
    # Every update, before and after the program compiled for the end took over (by the end
    # of the warm-up), used the schedule to that end; the last one still learns.
    for line in lines:
        assert line["lr"] == pytest.approx(_expected_lr(line["step"], peak, warmup, end),
                                           rel=1e-5, abs=1e-12), line["step"]

    # Resumed with a limit past the end, which it reached: the end fitted before stays, its
    # rate is zero, so the run is refused, naming the --decay-steps that extends the line.
    with caplog.at_level(logging.INFO, logger="nmt.training.schedule_fit"), pytest.raises(
            RunMismatch, match=rf"--max-steps {end + 5} trains no further.*--decay-steps "
                               rf"{end + 5} extends the line"):
        train(recipes.run_from_flat(**settings, max_steps=end + 5), out)
    assert f"linear to zero after step {end}, the end this run fitted before" in caplog.text
    # A --decay-steps the checkpoint has passed would train nothing too.
    with pytest.raises(RunMismatch, match=rf"--decay-steps {end - 10} is not after step {end}, "
                       rf"where the run's checkpoint is: --max-steps {end + 5} would train "
                       rf"nothing .*give a --decay-steps after step {end}"):
        train(recipes.run_from_flat(**settings, max_steps=end + 5, decay_steps=end - 10), out)
    lines = _lines(out)
    assert [line["step"] for line in lines] == list(range(1, end + 1))
    for line in lines:
        assert line["lr"] == pytest.approx(_expected_lr(line["step"], peak, warmup, end),
                                           rel=1e-5, abs=1e-12)
    assert lines[-1]["lr"] == pytest.approx(peak / (end + 1 - warmup), rel=1e-5)


def test_a_run_of_epochs_follows_the_linear_schedule_to_their_last_step(tmp_path, monkeypatch,
                                                                         caplog):
    """--max-epochs with --max-steps farther: the line ends at the epochs' last step (it
    ended at --max-steps, so the rate was far from zero when the run stopped)."""
    monkeypatch.setenv("FLAX_NMT_CACHE", str(tmp_path / "cache"))
    warmup, peak = 6, 2e-3
    settings = {"preset": "tiny", **SHALLOW, "vocab_size": 320, "batch_tokens": 256,
                "train_prefix": write_corpus(tmp_path, 200, 0, "train"), "valid_prefix": None,
                "buckets": (16,), "warmup": warmup, "schedule": "linear", "peak_lr": peak,
                "log_every": 1, "eval_every": 10_000, "eval_sentences": 0, "save_every": 10_000,
                "progress": False, "samples": 0}
    out = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="nmt.training.trainer"):
        summary = train(recipes.run_from_flat(**settings, max_epochs=2, max_steps=10_000), out)
    end = recipes.load_saved(out / RUN_CONFIG_FILE).optimizer.decay_steps
    assert (summary["stopped"], summary["steps"]) == ("max_epochs", end)
    assert f"linear to zero after step {end}, where the run's limit stops it" in caplog.text
    lines = _lines(out)
    assert [line["step"] for line in lines] == list(range(1, end + 1))
    for line in lines:
        assert line["lr"] == pytest.approx(_expected_lr(line["step"], peak, warmup, end),
                                           rel=1e-5, abs=1e-12), line["step"]

    # The checkpoint at the second epoch's end saved its last position in it: both epochs
    # count as trained, so a limit added to --max-epochs 2 finishes the run as it stands.
    for more in ({"max_minutes": 30.0}, {"max_steps": end + 100}):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="data"):
            summary = train(recipes.run_from_flat(**settings, max_epochs=2, **more), out)
        assert (summary["stopped"], summary["steps"]) == ("max_epochs", end)
        # Counting the epoch's batches for that check does not log the plan a second time.
        assert caplog.text.count("batches per epoch:") == 1, caplog.text
    with pytest.raises(RunMismatch, match="--max-epochs 3 trains no further"):
        train(recipes.run_from_flat(**settings, max_epochs=3), out)
    # One stopped inside its first epoch by its steps has not trained it: the epoch's
    # batches, known once the data is, tell so (before, an epoch begun counts).
    inside = tmp_path / "inside"
    assert train(recipes.run_from_flat(**settings, max_steps=warmup + 2), inside)["steps"] == (
        warmup + 2) < end // 2
    with pytest.raises(RunMismatch, match="--max-epochs 1 trains no further"):
        train(recipes.run_from_flat(**settings, max_epochs=1), inside)


def test_an_epoch_counts_as_trained_where_the_saved_position_is_at_its_end(tmp_path):
    data = tmp_path / "7" / "data"
    data.mkdir(parents=True)
    batches = {0: 19, 1: 18}.__getitem__  # sampled segmentations vary them by epoch
    for (epoch, position), trained in {(0, 0): 0, (0, 5): 0, (0, 19): 1, (1, 18): 2,
                                       (1, 17): 1}.items():
        (data / "metadata").write_text(json.dumps(
            {"iterator": {"epoch": epoch, "position": position}}))
        assert epochs_trained(data.parent, batches) == trained, (epoch, position)
        # Without the batches, an epoch begun counts (at most one too many).
        assert epochs_trained(data.parent) == epoch + (position > 0)
    (data / "metadata").write_text("{")
    assert epochs_trained(data.parent, batches) == 0


def test_a_limit_of_epochs_caps_the_end_fitted_to_the_minutes(monkeypatch):
    # 2 epochs of 39 batches stop the run at step 78, long before 10 minutes do: the line
    # must reach zero there, not at the step the minutes would allow.
    monkeypatch.setattr("nmt.training.stopping.time.monotonic", lambda: 1000.0)
    run = recipes.run_from_flat(schedule="linear", warmup=10, max_minutes=10.0, max_epochs=2)
    limits = Limits(run.trainer, started=1000.0)
    fitted = schedule_fit.FittedEnd(run, 0, limits, PausableClock(), batches_per_epoch=39)
    fit = fitted.fit
    assert fit.after_step(fit.timed_from, 0.0, limits.seconds_left(), 0.0) is None
    assert fit.after_step(fit.fit_at, 0.1, limits.seconds_left(), 0.0) == 78
