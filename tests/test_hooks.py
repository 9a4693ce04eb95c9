"""The loop's periodic work (nmt.training.hooks): intervals, the order at a shared step, early
stopping within a step, the work at stop; and the trainer's own registrations, whose order and
intervals decide what metrics.jsonl and the checkpoints hold."""

from __future__ import annotations

import types

import pytest

from nmt.settings.config import TrainerConfig
from nmt.training.hooks import Hooks, Periodic
from nmt.training.trainer import Trainer


def _recording(ran: list, every: dict[str, int], stop_at: dict[str, int] | None = None,
               at_stop: tuple[str, ...] = (), when_interrupted: tuple[str, ...] = ()
               ) -> tuple[Hooks, list[int]]:
    """Hooks named as `every`'s keys, in its order, that append (name, step) to `ran`; the
    one named in `stop_at` says "early_stop" at that step."""
    step = [0]

    def action(name):
        def run():
            ran.append((name, step[0]))
            return "early_stop" if (stop_at or {}).get(name) == step[0] else None
        return run

    hooks = Hooks(Periodic(name, n, action(name),
                           at_stop=(lambda name=name: ran.append((name, "stop")))
                           if name in at_stop else None,
                           when_interrupted=name in when_interrupted)
                  for name, n in every.items())
    return hooks, step


def _steps(hooks: Hooks, step: list[int], last: int) -> str | None:
    for step[0] in range(1, last + 1):
        stopped = hooks.run_due(step[0])
        if stopped:
            return stopped
    return None


def test_each_runs_after_every_multiple_of_its_interval():
    ran: list = []
    hooks, step = _recording(ran, {"every": 1, "log": 3, "eval": 4})
    assert _steps(hooks, step, 12) is None
    assert [s for name, s in ran if name == "every"] == list(range(1, 13))
    assert [s for name, s in ran if name == "log"] == [3, 6, 9, 12]
    assert [s for name, s in ran if name == "eval"] == [4, 8, 12]


def test_at_a_shared_step_they_run_in_registration_order():
    ran: list = []
    hooks, step = _recording(ran, {"log": 2, "validate": 4, "save": 4})
    _steps(hooks, step, 4)
    assert ran == [("log", 2), ("log", 4), ("validate", 4), ("save", 4)]
    ran.clear()
    hooks, step = _recording(ran, {"save": 4, "validate": 4, "log": 2})
    _steps(hooks, step, 4)
    assert ran == [("log", 2), ("save", 4), ("validate", 4), ("log", 4)]


def test_a_reason_to_stop_skips_the_rest_of_its_step():
    ran: list = []
    hooks, step = _recording(ran, {"log": 2, "validate": 2, "save": 2}, stop_at={"validate": 4})
    assert _steps(hooks, step, 10) == "early_stop"
    assert ran == [("log", 2), ("validate", 2), ("save", 2), ("log", 4), ("validate", 4)]


@pytest.mark.parametrize("interrupted, expected", [
    (False, [("log", "stop"), ("validate", "stop"), ("save", "stop")]),
    (True, [("save", "stop")])])
def test_at_stop_in_order_and_only_the_interrupt_safe_after_a_signal(interrupted, expected):
    ran: list = []
    hooks, _ = _recording(ran, {"forecast": 1, "log": 3, "validate": 4, "save": 5},
                          at_stop=("log", "validate", "save"), when_interrupted=("save",))
    hooks.run_at_stop(interrupted=interrupted)
    assert ran == expected


def test_bad_registrations_are_refused():
    with pytest.raises(ValueError, match="'log'.*>= 1, got 0"):
        Periodic("log", 0, lambda: None)
    hooks = Hooks([Periodic("log", 1, lambda: None)])
    with pytest.raises(ValueError, match="'log' is registered already"):
        hooks.add(Periodic("log", 2, lambda: None))


def _trainer_hooks(ran: list, **settings) -> Hooks:
    """The hooks the trainer registers for `settings`, on a stand-in for the trainer whose
    periodic work appends (method, keyword arguments) to `ran`."""
    trainer = types.SimpleNamespace(run=types.SimpleNamespace(trainer=TrainerConfig(**settings)))
    for name in ("_fit_schedule", "_forecast_budget", "log_window", "validate",
                 "_validate_unless_done", "save"):
        setattr(trainer, name, lambda name=name, **kwargs: ran.append((name, kwargs)))
    return Trainer._periodic_work(trainer)


def test_the_trainer_fits_the_schedule_forecasts_logs_validates_then_saves():
    """At a step that is a multiple of every interval: the schedule's fit, the forecast, the
    log line, the validation, the checkpoint; at stop the closing log line, validation and a
    synchronous save, and after a signal only the save."""
    ran: list = []
    hooks = _trainer_hooks(ran, log_every=3, eval_every=4, save_every=6)
    assert hooks.names == ["schedule", "forecast", "log", "validate", "save"]
    assert [hook.every for hook in hooks] == [1, 1, 3, 4, 6]
    assert [hook.every for hook in _trainer_hooks(ran, eval_every=5)][-1] == 5  # save_every
    for step in (11, 12):
        hooks.run_due(step)
    assert [name for name, _ in ran] == ["_fit_schedule", "_forecast_budget", "_fit_schedule",
                                         "_forecast_budget", "log_window", "validate", "save"]
    ran.clear()
    hooks.run_at_stop(interrupted=False)
    assert ran == [("log_window", {}), ("_validate_unless_done", {}),
                   ("save", {"at_stop": True})]
    ran.clear()
    hooks.run_at_stop(interrupted=True)
    assert ran == [("save", {"at_stop": True})]
