"""When the training loop stops: step, epoch and time limits, SIGINT and SIGTERM.

Several processes agree on the time budget and signals (a collective every 10 steps), so
they stop at the same step.
"""

from __future__ import annotations

import contextlib
import enum
import signal
import sys
import time
from typing import Any

import jax

from nmt.runtime.distributed import any_process
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
    """Seconds since `restart()`, less the time spent inside `paused()` blocks (they nest)."""

    def __init__(self):
        self._depth = 0
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
                self._paused += time.monotonic() - begin

    def elapsed(self) -> float:
        return time.monotonic() - self._start - self._paused


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


class Limits:
    """The run's limits of steps, epochs and minutes, from the start of this process."""

    def __init__(self, trainer: TrainerConfig):
        self.started = time.monotonic()
        self.max_steps, self.max_minutes = trainer.limits()
        self.max_epochs = trainer.max_epochs
        self.schedule_end: int | None = None  # a linear schedule's zero: nothing to learn after
        self.deadline = (self.started + self.max_minutes * 60
                         if self.max_minutes is not None else None)

    def reached(self, step: int, epochs_completed: int, signals: StopSignal
                ) -> StopReason | None:
        """Why to stop before the next step, or None."""
        if self.max_steps is not None and step >= self.max_steps:
            return StopReason.MAX_STEPS
        if self.schedule_end is not None and step >= self.schedule_end:
            return StopReason.DECAY_STEPS
        if self.max_epochs is not None and epochs_completed >= self.max_epochs:
            return StopReason.MAX_EPOCHS
        if jax.process_count() > 1 and step % 10:
            return None
        want = signals.received is not None or (self.deadline is not None
                                                and time.monotonic() >= self.deadline)
        if any_process(want):
            return signals.received or StopReason.MAX_MINUTES
        return None

    def seconds_left(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def minutes_so_far(self) -> float:
        return round((time.monotonic() - self.started) / 60, 2)

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
