"""Settings written for another platform: say so before training, then what they cost here.

A recipe's budget of steps and minutes is chosen for one platform's speed (the trainer setting
`written_for`). The GPU recipe's 8,000 steps take minutes on a GPU and hours on a CPU, where
its 7-minute limit would stop it after a few hundred steps. A run on another platform is told
so before its first step, and, once `TIMED_STEPS` steps after the first (which compiles) are
timed, how long the budget takes here and where the time limit will stop it:

    forecast = BudgetForecast("gpu", "cpu", limits, batches_per_epoch=123)
    forecast.at_start()                        # the warning, or None on the platform named
    forecast.after_step(step, time.monotonic(), compile_seconds)   # the forecast, once
"""

from __future__ import annotations

from nmt.training.stopping import Limits

TIMED_STEPS = 10

_NAMES = {"cpu": "the CPU", "gpu": "a GPU", "tpu": "a TPU"}


def _name(platform: str) -> str:
    """"the CPU", "a GPU": JAX's platform name in words."""
    return _NAMES.get(platform, platform)


class BudgetForecast:
    """The warning and the forecast for settings written for another platform."""

    def __init__(self, written_for: str | None, platform: str, limits: Limits,
                 batches_per_epoch: int):
        self.written_for, self.platform = written_for, platform
        self.limits, self.batches_per_epoch = limits, batches_per_epoch
        self.wanted = written_for is not None and written_for != platform
        self.step_seconds: float | None = None  # measured, once TIMED_STEPS steps are timed
        self._start: tuple[int, float, float] | None = None  # step, clock, compile seconds

    @property
    def timing(self) -> bool:
        """Whether steps are still to be timed for the forecast."""
        return self.wanted and self.step_seconds is None

    def at_start(self) -> str | None:
        """The warning before the first step, or None when the settings fit this platform."""
        if not self.wanted:
            return None
        written_for = _name(self.written_for)
        return (f"these settings were written for {written_for} (trainer.written_for: "
                f"{self.written_for}) and this run is on {_name(self.platform)}: their budget "
                f"({self.limits.describe(self.batches_per_epoch)}) was chosen for {written_for}'s "
                f"speed. Timing {TIMED_STEPS} steps for a forecast.")

    def after_step(self, step: int, now: float, compile_seconds: float) -> str | None:
        """Call after every step with the step reached, the monotonic clock and the seconds
        spent compiling so far; returns the forecast once, when enough steps are timed."""
        if not self.timing:
            return None
        if self._start is None:  # timing starts after the first step, which compiled
            self._start = (step, now, compile_seconds)
            return None
        first, then, compiled = self._start
        if step - first < TIMED_STEPS:
            return None
        busy = max(now - then - (compile_seconds - compiled), 0.0)
        self.step_seconds = busy / (step - first)
        return self.forecast(step)

    def forecast(self, step: int) -> str:
        """What the budget takes on this platform at the measured time per step."""
        per_step = self.step_seconds
        assert per_step is not None, "forecast() needs timed steps (after_step)"
        parts = [f"on {_name(self.platform)} a train step takes {per_step:.3g} s"]
        total = self.limits.total_steps(self.batches_per_epoch)
        if total is not None:
            parts.append(f"the budget's {total} steps would take about "
                         f"{_duration(max(total - step, 0) * per_step)} more")
        left = self.limits.seconds_left()
        if left is not None:
            reach = step + int(left / per_step) if per_step > 0 else None
            if reach is not None and (total is None or reach < total):
                parts.append(f"--max-minutes {self.limits.max_minutes:g} stops it by about "
                             f"step {reach}" + (f" of {total}" if total is not None else ""))
        return ("; ".join(parts) + f". Use a recipe written for {_name(self.platform)} "
                f"(trainer.written_for: {self.platform}), or set --max-steps and --max-minutes "
                "for this machine.")


def _duration(seconds: float) -> str:
    """3.2 hours, 14 minutes, 40 seconds."""
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} hours"
    if seconds >= 120:
        return f"{seconds / 60:.0f} minutes"
    return f"{seconds:.0f} seconds"
