"""A linear schedule without --decay-steps ends where the run's limit of steps or minutes does
(nmt.training.schedule_fit): the fit, and a run whose learning rates follow it exactly."""

from __future__ import annotations

import json
import logging

import pytest
from conftest import SHALLOW

from nmt.rundir.resume import RUN_CONFIG_FILE
from nmt.settings import recipes
from nmt.settings.config import SettingsError
from nmt.training import schedule_fit
from nmt.training.metrics_log import METRICS_FILE
from nmt.training.trainer import train
from synthetic_corpus import write_corpus


def test_the_end_is_the_last_step_the_time_left_allows():
    fit = schedule_fit.EndFit(first_step=0, warmup_steps=400, max_steps=None)
    # Timed from an eighth into the warm-up, fitted a tenth before its end.
    assert [step for step in range(400) if fit.wants_clock(step)] == [50, 360]
    assert fit.after_step(50, now=100.0, seconds_left=1000.0) is None
    assert fit.after_step(100, now=110.0, seconds_left=990.0) is None  # not yet
    end = fit.after_step(360, now=255.0, seconds_left=845.0)  # 0.5 s a step
    assert fit.step_seconds == pytest.approx(0.5)
    assert end == 360 + int(845 * (1 - schedule_fit.RESERVE) / 0.5)

    capped = schedule_fit.EndFit(first_step=0, warmup_steps=400, max_steps=1000)
    capped.after_step(50, 100.0, 1000.0)
    assert capped.after_step(360, 255.0, 845.0) == 1000  # the limit of steps first

    # A resumed run times its own steps; a short warm-up is timed over what it leaves.
    resumed = schedule_fit.EndFit(first_step=300, warmup_steps=310, max_steps=None)
    assert (resumed.timed_from, resumed.fit_at) == (301, 309)
    resumed.after_step(301, 0.0, 100.0)
    assert resumed.after_step(309, 0.0, 100.0) > 309  # never before the fit (or the warm-up)
    past = schedule_fit.EndFit(first_step=500, warmup_steps=400, max_steps=None)
    assert (past.timed_from, past.fit_at) == (501, 502)


def test_what_is_known_before_any_step_is_set_at_once():
    run = recipes.run_from_flat(schedule="linear", warmup=10, max_steps=500)
    assert schedule_fit.resolve(run, None).optimizer.decay_steps == 500
    timed = recipes.run_from_flat(schedule="linear", warmup=10, max_minutes=3.0)
    assert schedule_fit.resolve(timed, None).optimizer.decay_steps is None  # the clock decides
    fitted = schedule_fit.with_end(timed, 777)
    assert schedule_fit.resolve(timed, fitted).optimizer.decay_steps == 777  # a resume
    assert schedule_fit.for_compiling(timed.optimizer).decay_steps == schedule_fit.UNFITTED


@pytest.mark.parametrize("flags, message", [
    ({"max_epochs": 3}, "with only --max-epochs, set --decay-steps"),
    ({"max_steps": 10}, "--max-steps 10, which must be above --warmup 10"),
])
def test_a_linear_schedule_with_nothing_to_end_at_is_refused(flags, message):
    with pytest.raises(SettingsError, match=message):
        recipes.run_from_flat(schedule="linear", warmup=10, **flags)


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

    # Resumed with a limit past the end: the end fitted before stays, and the run stops
    # there at once (its last update was taken).
    with caplog.at_level(logging.INFO, logger="nmt.training.schedule_fit"):
        resumed = train(recipes.run_from_flat(**settings, max_steps=end + 5), out)
    assert f"linear to zero after step {end}, the end this run fitted before" in caplog.text
    assert (resumed["stopped"], resumed["steps"]) == ("decay_steps", end)
    lines = _lines(out)
    assert [line["step"] for line in lines] == list(range(1, end + 1))
    for line in lines:
        assert line["lr"] == pytest.approx(_expected_lr(line["step"], peak, warmup, end),
                                           rel=1e-5, abs=1e-12)
    assert lines[-1]["lr"] == pytest.approx(peak / (end + 1 - warmup), rel=1e-5)
