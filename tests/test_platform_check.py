"""Settings written for another platform (trainer.written_for): a warning before the first
step, and a forecast of the budget from the timed steps."""

from __future__ import annotations

import logging

import pytest
from conftest import SHALLOW_FLAGS

import train as train_cli
from nmt.settings.config import TrainerConfig
from nmt.training.platform_check import TIMED_STEPS, BudgetForecast
from nmt.training.stopping import Limits
from nmt.training.trainer import train
from synthetic_corpus import write_corpus


def _forecast(written_for, platform, **budget) -> BudgetForecast:
    return BudgetForecast(written_for, platform, Limits(TrainerConfig(**budget)),
                          batches_per_epoch=123)


def _time_steps(forecast: BudgetForecast, seconds_per_step: float, compile_at: dict) -> list:
    """Feed after_step the clock of steps 1.. that take `seconds_per_step`, plus the compile
    seconds of `compile_at` (step -> seconds); the messages it returns."""
    messages, clock, compiled = [], 100.0, 0.0
    for step in range(1, TIMED_STEPS + 5):
        clock += seconds_per_step + compile_at.get(step, 0.0)
        compiled += compile_at.get(step, 0.0)
        messages.append(forecast.after_step(step, clock, compiled))
    return messages


def test_gpu_settings_on_a_cpu_forecast_the_budget_from_timed_steps(monkeypatch):
    monkeypatch.setattr("nmt.training.stopping.time.monotonic", lambda: 1000.0)  # 7 minutes left
    forecast = _forecast("gpu", "cpu", max_steps=8000, max_minutes=7)
    warning = forecast.at_start()
    assert "written for a GPU (trainer.written_for: gpu) and this run is on the CPU" in warning
    assert "(8000 steps or 7 minutes)" in warning
    # a shape compiled at step 5 (30 s) is not a step's time
    messages = _time_steps(forecast, 1.9, compile_at={1: 20.0, 5: 30.0})
    said = [(step, m) for step, m in enumerate(messages, 1) if m]
    assert len(said) == 1 and said[0][0] == 1 + TIMED_STEPS, "once, after the timed steps"
    assert forecast.step_seconds == pytest.approx(1.9)
    step, message = said[0]
    hours = (8000 - step) * 1.9 / 3600
    assert "on the CPU a train step takes 1.9 s" in message
    assert f"the budget's 8000 steps would take about {hours:.1f} hours more" in message
    left = 420 - forecast.limits.closing.seconds()  # the closing work's time is not the steps'
    assert f"--max-minutes 7 stops it by about step {step + int(left / 1.9)} of 8000" in message
    assert "Use a recipe written for the CPU (trainer.written_for: cpu)" in message


def test_a_time_budget_alone_says_where_the_time_stops_it():
    forecast = _forecast("cpu", "gpu", max_minutes=40)
    message = [m for m in _time_steps(forecast, 0.05, {}) if m][0]
    assert "would take" not in message and "stops it by about step" in message
    assert " of " not in message.split("stops it")[1]


def test_epochs_are_counted_in_steps():
    forecast = _forecast("gpu", "cpu", max_epochs=2)
    message = [m for m in _time_steps(forecast, 3.0, {}) if m][0]
    assert f"the budget's 246 steps would take about {(246 - 11) * 3 / 60:.0f} minutes" in message


@pytest.mark.parametrize("written_for, platform", [(None, "cpu"), ("cpu", "cpu"),
                                                   ("gpu", "gpu")])
def test_settings_for_this_platform_say_nothing(written_for, platform):
    forecast = _forecast(written_for, platform, max_steps=100)
    assert forecast.at_start() is None and not forecast.timing
    assert _time_steps(forecast, 1.0, {}) == [None] * (TIMED_STEPS + 4)


def test_a_run_on_another_platform_warns_at_start_and_forecasts(tmp_path, caplog, monkeypatch):
    """The trainer itself: the warning comes before the first step, the forecast after the
    timed steps, both naming this run's budget."""
    monkeypatch.setenv("FLAX_NMT_CACHE", str(tmp_path / "cache"))
    train_prefix = write_corpus(tmp_path, 300, 0, "train")
    valid_prefix = write_corpus(tmp_path, 20, 1, "valid")
    run, _ = train_cli.resolve([
        "--preset", "tiny", *SHALLOW_FLAGS, "--train-prefix", train_prefix,
        "--valid-prefix", valid_prefix,
        "--vocab-size", "320", "--batch-tokens", "256", "--buckets", "16",
        "--max-tokens-per-sentence", "16", "--max-steps", "14", "--eval-every", "100",
        "--eval-sentences", "0", "--no-progress", "--written-for", "tpu",
        "--output-dir", str(tmp_path / "run")])
    with caplog.at_level(logging.WARNING, logger="nmt.training.trainer"):
        summary = train(run, tmp_path / "run")
    said = [r.getMessage() for r in caplog.records if r.name == "nmt.training.trainer"]
    assert summary["steps"] == 14 and len(said) == 2, said
    assert "written for a TPU (trainer.written_for: tpu) and this run is on the CPU" in said[0]
    assert "(14 steps)" in said[0]
    assert said[1].startswith("on the CPU a train step takes ")
    assert "the budget's 14 steps would take about" in said[1]
