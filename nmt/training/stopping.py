"""When the training loop stops: step, epoch and time limits, SIGINT and SIGTERM.

Several processes agree on the time budget and signals (a collective every 10 steps), so
they stop at the same step.
"""

from __future__ import annotations

import contextlib
import enum
import math
import signal
import sys
import time
from typing import Any

import jax

from nmt.runtime.distributed import max_over_processes
from nmt.settings.config import TrainerConfig


class StopReason(enum.StrEnum):
    """Why training stopped: its value is what the summary records and the last lines say."""

    MAX_STEPS = "max_steps"
    DECAY_STEPS = "decay_steps"  # a linear schedule's zero: nothing to learn after it
    MAX_EPOCHS = "max_epochs"
    MAX_MINUTES = "max_minutes"
    EARLY_STOP = "early_stop"
    SIGINT = "SIGINT"
    SIGTERM = "SIGTERM"

    @property
    def interrupted(self) -> bool:
        """Whether a signal stopped the run (it saves, and a resumed run goes on)."""
        return self in (StopReason.SIGINT, StopReason.SIGTERM)


class PausableClock:
    """Seconds since `restart()`, less the time spent inside `paused()` blocks (they nest);
    `now()` is the monotonic clock less every paused block, across restarts."""

    def __init__(self):
        self._depth = 0
        self._paused_ever = 0.0
        self.restart()

    def restart(self) -> None:
        self._start, self._paused = time.monotonic(), 0.0

    @contextlib.contextmanager
    def paused(self):
        self._depth += 1
        begin = time.monotonic()
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                spent = time.monotonic() - begin
                self._paused += spent
                self._paused_ever += spent

    def elapsed(self) -> float:
        return time.monotonic() - self._start - self._paused

    def now(self) -> float:
        """A time whose differences leave out the paused blocks (validation and saving)."""
        return time.monotonic() - self._paused_ever


class StopSignal:
    """SIGINT/SIGTERM set a flag the loop checks after each step; a second SIGINT aborts.

    Inside `critical()` (a checkpoint save, the export of the model) nothing is cut short: a
    second SIGINT there aborts when the block has finished, so the run directory never holds
    half a checkpoint or half a model.
    """

    def __init__(self):
        self.received: StopReason | None = None
        self._previous: dict[int, Any] = {}
        self._critical = 0
        self._abort_pending = False

    def __enter__(self) -> "StopSignal":
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: signals stay with the caller
                pass
        return self

    def _handle(self, signum, frame) -> None:
        if self.received is not None and signum == signal.SIGINT:
            if self._critical:
                self._abort_pending = True
                print("\nSIGINT received again: aborting once the files being written are "
                      "complete.", file=sys.stderr, flush=True)
                return
            raise KeyboardInterrupt
        if self.received is None:
            self.received = StopReason(signal.Signals(signum).name)
            print(f"\n{self.received} received: finishing the current step and saving "
                  "(press Ctrl-C again to abort without saving).", file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def critical(self):
        """A block that signals never cut short (they take effect after it)."""
        self._critical += 1
        try:
            yield
        finally:
            self._critical -= 1
        if not self._critical and self._abort_pending:
            self._abort_pending = False
            raise KeyboardInterrupt

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}


def steps_in_flight(platform: str) -> int:
    """How many steps the training loop dispatches before it waits for the oldest to end.

    On a GPU or TPU two, so that the host's work for the next steps (the batch, its transfer,
    the dispatch) overlaps the device's. On a CPU none: XLA:CPU gives every step its own buffer
    of temporaries (0.6 GB for the CPU recipe's), so a step queued behind the running one
    holds a second, and queueing makes no step faster there (docs/performance.md, "Host memory
    on CPU")."""
    return 0 if platform == "cpu" else 2


class ClosingTime:
    """How long the work after the last step takes, so that --max-minutes bounds the whole
    run: the step that starts last and those still in flight, the closing validation, then
    the last checkpoint, model/ and averaged/ ("writing").

    Each is reserved from what this run measured: the step a check lets start and the steps
    dispatched ahead (`in_flight`: `steps_in_flight`) at the time a step takes, the last
    validation's wall time, and the slowest checkpoint save (model/ and averaged/ each count
    as one), writing never less than `LEAST_SECONDS`. Before a measurement, a share of the
    budget stands in; a closing validation that still runs out of time stops translating (the
    trainer's `validate`), so the bound holds either way.
    """

    # Until measured: a validation takes 5% of the budget, writing 2% (at least 5 s each).
    # The no-argument run's closing validation takes about 4 s of its 240 (a tenth held back
    # 20 s it could have trained).
    VALIDATION_SHARE, WRITING_SHARE, LEAST_SECONDS = 0.05, 0.02, 5.0

    def __init__(self, budget_seconds: float, averaging: bool, in_flight: int = 2):
        self.in_flight = in_flight
        self.validation_prior = max(self.LEAST_SECONDS, self.VALIDATION_SHARE * budget_seconds)
        self.writing_prior = max(self.LEAST_SECONDS, self.WRITING_SHARE * budget_seconds)
        self.writes = 3 if averaging else 2
        self.validation_seconds: float | None = None
        self.validations = 0  # measured so far (the schedule's fit refits after one)
        self.save_seconds: float | None = None
        self.step_seconds = 0.0

    def validated(self, seconds: float) -> None:
        self.validation_seconds = seconds
        self.validations += 1

    def saved(self, seconds: float) -> None:
        self.save_seconds = max(seconds, self.save_seconds or 0.0)

    def stepped(self, seconds: float) -> None:
        """A step's wall time on the host (dispatch to the wait for the one before it)."""
        self.step_seconds = (seconds if not self.step_seconds
                             else 0.9 * self.step_seconds + 0.1 * seconds)

    def writing(self) -> float:
        """Seconds for the last checkpoint, model/ and averaged/."""
        if self.save_seconds is None:
            return self.writing_prior
        return max(self.LEAST_SECONDS, self.writes * self.save_seconds)

    def seconds(self) -> float:
        """Seconds to reserve for all the closing work."""
        validation = (self.validation_prior if self.validation_seconds is None
                      else self.validation_seconds)
        return (self.in_flight + 1) * self.step_seconds + validation + self.writing()


# the reasons processes agree on, the stronger last: a signal to one stops them all as it
_AGREED = (None, StopReason.MAX_MINUTES, StopReason.SIGINT, StopReason.SIGTERM)


class Limits:
    """The run's limits of steps, epochs and minutes; the minutes count from `started` (the
    command's start, on the monotonic clock) and include the closing work (`ClosingTime`):
    the steps stop early enough for it."""

    def __init__(self, trainer: TrainerConfig, started: float | None = None,
                 averaging: bool = False, in_flight: int = 2, schedule_end: int | None = None):
        self.started = time.monotonic() if started is None else started
        self.max_steps, self.max_minutes = trainer.limits()
        self.max_epochs = trainer.max_epochs
        self.schedule_end = schedule_end  # a linear schedule's zero: nothing to learn after
        self.deadline = (self.started + self.max_minutes * 60
                         if self.max_minutes is not None else None)
        self.closing = ClosingTime((self.max_minutes or 0.0) * 60, averaging, in_flight)

    @property
    def steps_deadline(self) -> float | None:
        """When the steps stop: the deadline less the closing work's time."""
        return None if self.deadline is None else self.deadline - self.closing.seconds()

    @property
    def validation_deadline(self) -> float | None:
        """When a validation stops translating: the deadline less the writing's time."""
        return None if self.deadline is None else self.deadline - self.closing.writing()

    def reached(self, step: int, epochs_completed: int, signals: StopSignal
                ) -> StopReason | None:
        """Why to stop before the next step, or None."""
        if self.max_steps is not None and step >= self.max_steps:
            return StopReason.MAX_STEPS
        if self.max_epochs is not None and epochs_completed >= self.max_epochs:
            return StopReason.MAX_EPOCHS  # a limit asked for, before the end fitted to it
        if self.schedule_end is not None and step >= self.schedule_end:
            return StopReason.DECAY_STEPS
        if jax.process_count() > 1 and step % 10:
            return None
        deadline = self.steps_deadline
        clock = deadline is not None and time.monotonic() >= deadline
        mine = (_AGREED.index(signals.received) if signals.received is not None
                else _AGREED.index(StopReason.MAX_MINUTES) if clock else 0)
        # every process stops for the same reason (it decides what they save and write): a
        # signal any of them received, else the clock
        return _AGREED[max_over_processes(mine)]

    def seconds_left(self) -> float | None:
        """Seconds left for steps."""
        deadline = self.steps_deadline
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    def minutes_so_far(self) -> float:
        return round((time.monotonic() - self.started) / 60, 2)

    def too_short(self) -> str | None:
        """Why --max-minutes cannot hold this run (the time spent starting plus the closing
        work's reserve leave no time for steps), with the least that can; None when it can."""
        if self.deadline is None or self.seconds_left():
            return None
        starting = time.monotonic() - self.started
        least = math.ceil((starting + self.closing.seconds()) / 60 * 1.5 * 10) / 10
        return (f"--max-minutes {self.max_minutes:g} is too short for this run: starting took "
                f"{starting:.0f} s and the closing validation, checkpoint and export need "
                f"about {self.closing.seconds():.0f} s more; use --max-minutes {least:g} or "
                "more.")

    def describe(self, batches_per_epoch: int) -> str:
        """The budget in words: "1000 steps or 40 minutes"."""
        budget = []
        if self.max_steps is not None:
            budget.append(f"{self.max_steps} steps")
        if self.max_epochs is not None:
            budget.append(f"{self.max_epochs} epochs of {batches_per_epoch} steps")
        if self.max_minutes is not None:
            budget.append(f"{self.max_minutes:g} minutes")
        return " or ".join(budget)

    def total_steps(self, batches_per_epoch: int) -> int | None:
        """The step at which a limit of steps or epochs stops the run (None: the clock does)."""
        limits = [n for n in (self.max_steps, self.schedule_end) if n is not None]
        if self.max_epochs is not None:
            limits.append(self.max_epochs * batches_per_epoch)
        return min(limits, default=None)
