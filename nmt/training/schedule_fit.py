"""The end of a linear learning-rate schedule, fitted to the run's limit of steps or minutes.

`--schedule linear` without `--decay-steps` ends where the run stops: its last update is the
run's last step, and the rate reaches zero just after it. A limit of steps gives that step at
once; one of epochs (and steps) once the data's batches per epoch are known, after the step
compiled. A limit of minutes gives it only once steps have been timed: the warm-up does not depend
on the end, so the run starts with an end far away (`UNFITTED`), times steps of the warm-up,
fixes the end from the time left, and runs the step compiled for that end from the last
update of the warm-up on.

Each step left costs the time of a step timed on the clock that leaves out validation and
saving (`PausableClock.now`), plus its share of the periodic work: the last validation's
seconds over --eval-every and the slowest checkpoint save's over --save-every (as
`ClosingTime` measured them). What is not measured yet counts as nothing, and a validation's
first time includes compiling the search, so the end is refitted once, after the first
validation that follows the fit and is not the process's first (whose compile would be
charged to every later one), where that moves it by more than `REFIT_TOLERANCE`. Where
that comes before the decay begins, the run is the linear schedule to the refitted end
exactly; after, the updates since the warm-up followed the first end, and the rate moves onto
the line to the new one at the next update (the step compiled for it waited for, as long as
the first end's took), a change of at most the share of the shorter line already run (small:
the first validation comes early). Only this schedule has an end to fit: noam and
inverse_sqrt run until the run's limit stops them. config.yaml records the end, and a resume
goes on to it; one that has reached it while its limit now allows more steps is refused
(`nothing_left`): the rate is zero there, and only a new --decay-steps extends the line (one
not after the step reached is refused as well).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import jax
import numpy as np
from jax.experimental import multihost_utils

from nmt.settings.config import RunConfig
from transformer.config import OptimizerConfig

if TYPE_CHECKING:
    from nmt.runtime.compilation import AheadOfTime
    from nmt.training.stopping import Limits, PausableClock

log = logging.getLogger(__name__)

UNFITTED = 1_000_000_000  # the end compiled before the fit: the warm-up is the same for any
RESERVE = 0.03            # of the time left: slack for steps slower than those timed
REFIT_TOLERANCE = 0.02    # of the steps left: a refit that moves the end less keeps it


def needs_fit(optimizer: OptimizerConfig) -> bool:
    return optimizer.schedule == "linear" and optimizer.decay_steps is None


def known_end(optimizer: OptimizerConfig) -> int | None:
    """The last step of a linear schedule, where set (its rate is zero after it)."""
    return optimizer.decay_steps if optimizer.schedule == "linear" else None


def with_end(run: RunConfig, decay_steps: int) -> RunConfig:
    return run.replace(optimizer={"decay_steps": decay_steps})


def for_compiling(optimizer: OptimizerConfig) -> OptimizerConfig:
    """The optimizer to compile before the end is known (its warm-up is the fitted one's)."""
    if not needs_fit(optimizer):
        return optimizer
    return dataclasses.replace(optimizer, decay_steps=max(UNFITTED, optimizer.warmup_steps + 1))


def resolve(run: RunConfig, saved: RunConfig | None) -> RunConfig:
    """`run` with the schedule's end set where it is known before any step: the end the run
    being resumed fitted (`saved`, its config.yaml), or a limit of steps without one of
    minutes. Unchanged where the clock decides (fitted by `EndFit`)."""
    if not needs_fit(run.optimizer):
        return run
    before = saved.optimizer if saved is not None else None
    if (before is not None and before.schedule == "linear" and before.decay_steps is not None
            and before.warmup_steps == run.optimizer.warmup_steps):
        log.info("learning rate: linear to zero after step %d, the end this run fitted before",
                 before.decay_steps)
        return with_end(run, before.decay_steps)
    max_steps, max_minutes = run.trainer.limits()
    if max_minutes is None and max_steps is not None and run.trainer.max_epochs is None:
        return with_end(run, max_steps)
    return run  # the clock decides, or a limit of epochs, once its steps are known (FittedEnd)


def nothing_left(run: RunConfig, saved: RunConfig | None, reached: int,
                 epochs_trained: Callable[[], int], recorded_in: Path) -> str | None:
    """Why a resumed run would train nothing, though its limit now allows more steps: its
    newest checkpoint (step `reached`, past `epochs_trained()` epochs, asked only where a
    limit of epochs decides: counting them may need the epoch's batches) is at or past
    the end of its linear schedule, where the rate is zero: the end config.yaml (`recorded_in`,
    read as `saved`) records, or a --decay-steps given now; None where it trains on. A run
    short of that end goes on to it; one that a limit stops at once (its steps or epochs
    reached), or that is given the run's own limits and end (the finishing command again),
    finishes."""
    end = known_end(run.optimizer)
    if end is None or reached < end:
        return None
    recorded = saved is not None and end == known_end(saved.optimizer)
    if recorded and _limits(run) == _limits(saved):
        return None  # the command that finished the run, run again: it finishes again
    max_steps, max_minutes = run.trainer.limits()
    epochs = run.trainer.max_epochs
    if max_steps is not None and max_steps <= reached:
        return None
    if epochs is not None and epochs <= epochs_trained():
        return None
    limit = (f"--max-steps {max_steps}" if max_steps is not None
             else f"--max-epochs {epochs}" if epochs is not None
             else f"--max-minutes {max_minutes:g}")
    if not recorded:  # an end given now, which the run has already reached
        return (f"--decay-steps {end} is not after step {reached}, where the run's checkpoint "
                f"is: {limit} would train nothing (the linear learning rate is zero after step "
                f"{end}); give a --decay-steps after step {reached}, or use a new --output-dir.")
    extend = (f"--decay-steps {max_steps} extends" if max_steps is not None
              else f"--decay-steps N (a step after {reached}, where it should now end) extends")
    return (f"{limit} trains no further: the run's checkpoint is at step {reached}, and its "
            f"linear learning rate is zero after step {end}, the end it records (decay_steps "
            f"in {recorded_in}, given or fitted to its earlier limit); {extend} the line, or "
            "use a new --output-dir.")


def _limits(run: RunConfig) -> tuple[int | None, float | None, int | None]:
    """The run's limits of steps, minutes and epochs."""
    return (*run.trainer.limits(), run.trainer.max_epochs)


class EndFit:
    """Times steps of the warm-up and fixes the schedule's last step (the rate is zero after it):
    the last step the time left allows (less `RESERVE`), or the step a limit of steps or epochs
    stops the run at (`max_steps`) if sooner.

    The first eighth of the warm-up left is not timed (its steps are slower: memory being
    mapped, caches filling); the fit comes a tenth before the warm-up's end, leaving those
    steps for compiling the step with the end. The times are those of a clock that leaves
    out validation and saving: their cost comes in as `periodic`, seconds a step.
    """

    def __init__(self, first_step: int, warmup_steps: int, max_steps: int | None):
        self.warmup_steps, self.max_steps = warmup_steps, max_steps
        span = max(warmup_steps - first_step, 0)
        self.timed_from = first_step + max(1, span // 8)
        self.fit_at = max(warmup_steps - max(1, span // 10), self.timed_from + 1)
        self._start: float | None = None
        self.step_seconds: float | None = None

    def wants_clock(self, step: int) -> bool:
        """Whether `after_step` needs the time after this step (the device waited for)."""
        return step in (self.timed_from, self.fit_at)

    def after_step(self, step: int, now: float, seconds_left: float,
                   periodic: float) -> int | None:
        """The end, at the step the fit is made; None before and after it."""
        if step == self.timed_from:
            self._start = now
            return None
        if step != self.fit_at or self._start is None:
            return None
        self.step_seconds = (now - self._start) / (step - self.timed_from)
        return self.end_at(step, seconds_left, periodic)

    def end_at(self, step: int, seconds_left: float, periodic: float) -> int:
        """The last step `seconds_left` allows after `step`, each step taking the time timed
        plus `periodic`."""
        cost = max(self.step_seconds + periodic, 1e-9)
        reach = step + int(seconds_left * (1 - RESERVE) / cost)
        end = reach if self.max_steps is None else min(reach, self.max_steps)
        end = max(end, self.warmup_steps + 1, step + 1)
        if jax.process_count() > 1:  # one schedule for all: process 0's clock
            end = int(multihost_utils.broadcast_one_to_all(np.int64(end)))
        return end


class FittedEnd:
    """The end fitted while the run trains: `EndFit` over the warm-up (None where the end is
    known), refitted once after the first validation that follows the fit and is not the
    process's first (that one compiles the search); then the train
    step compiled for the end, which takes over once it is compiled, and at the latest
    before the first update whose rate it changes: the warm-up's end, or for a refit past
    it, the next update (the refit reserves the time the first compile took for the wait)."""

    def __init__(self, run: RunConfig, first_step: int, limits: Limits, clock: PausableClock,
                 batches_per_epoch: int):
        optimizer = run.optimizer
        # No later than a limit of steps or epochs stops the run: the rate is zero there.
        stop = limits.total_steps(batches_per_epoch)
        timed = needs_fit(optimizer) and limits.max_minutes is not None
        self.fit = EndFit(first_step, optimizer.warmup_steps, stop) if timed else None
        # Without a clock the end is where steps or epochs stop the run, known now (the epoch's
        # steps were not when the step compiled); it takes over as a fitted end does. With
        # packing or subword sampling later epochs differ by a few batches from the first, whose
        # count this is: the run then stops at the end (nothing is learned after it), or a few
        # steps before it.
        self.at_stop = (max(stop, optimizer.warmup_steps + 1)
                        if needs_fit(optimizer) and not timed else None)
        if self.at_stop is not None and stop <= optimizer.warmup_steps:
            log.warning("--schedule linear: the run stops at step %d, within its warm-up of %d "
                        "steps, so its rate never decays; lower --warmup", stop,
                        optimizer.warmup_steps)
        self.stop_described = limits.describe(batches_per_epoch)
        self.limits, self.clock = limits, clock
        self.every = (run.trainer.eval_every, run.trainer.save_interval)
        self.warmup_steps = self.wait_from = optimizer.warmup_steps
        self.end: int | None = None        # fitted
        self.replaced: int | None = None   # the end a refit replaced
        self.validations_at_fit, self.refitted = 0, False
        self.compiled: AheadOfTime | None = None  # the step for the fitted end, until it runs
        self.compiling_since = 0.0  # on the monotonic clock
        self.compile_seconds = 0.0  # of the step for the first end, until it took over

    def periodic_seconds(self) -> float:
        """Seconds a step of the validations and checkpoint saves, as measured so far."""
        closing, (eval_every, save_every) = self.limits.closing, self.every
        return ((closing.validation_seconds or 0.0) / eval_every
                + (closing.save_seconds or 0.0) / save_every)

    def end_after(self, step: int, last_loss: jax.Array) -> int | None:
        """The end, after the step that fits it and after the one that refits it to a
        different one; None after any other."""
        if self.at_stop is not None:
            self.end, self.at_stop, self.refitted = self.at_stop, None, True
            self.compiling_since = time.monotonic()
            return self.end
        if self.fit is None or self.refitted:
            return None
        if self.end is None:
            if not self.fit.wants_clock(step):
                return None
            last_loss.block_until_ready()  # the steps timed are finished, not only queued
            self.end = self.fit.after_step(step, self.clock.now(), self.limits.seconds_left(),
                                           self.periodic_seconds())
            self.validations_at_fit = self.limits.closing.validations
            self.compiling_since = time.monotonic()
            return self.end
        if self.limits.closing.validations <= max(self.validations_at_fit, 1):
            return None  # none since the fit, or only the first, which compiled the search
        self.refitted = True
        left, periodic = self.limits.seconds_left(), self.periodic_seconds()
        if abs(self.fit.end_at(step, left, periodic) - self.end) <= REFIT_TOLERANCE * max(
                self.end - step, 0):
            return None
        # A new end: its train step is compiled and waited for, as long as the first's took.
        end = self.fit.end_at(step, max(left - self.compile_seconds, 0.0), periodic)
        self.wait_from = max(step, self.warmup_steps)
        self.replaced, self.end = self.end, end
        self.compiling_since = time.monotonic()
        return end

    def describe(self, end: int, max_minutes: float | None, recorded_in: Path) -> str:
        """The log line of the fitted end: where, and from what."""
        if self.fit is None:
            return (f"learning rate: linear to zero after step {end}, where the run's limit "
                    f"stops it ({self.stop_described}; recorded in {recorded_in})")
        refit = "" if self.replaced is None else (
            f" in place of {self.replaced} (refitted after a validation)")
        return (f"learning rate: linear to zero after step {end}{refit}, the last the run's "
                f"limits allow ({max_minutes:g} minutes at {self.fit.step_seconds:.3g} s a step "
                f"and {self.periodic_seconds():.3g} s more for validation and checkpoints; "
                f"recorded in {recorded_in})")

    def train_step(self, step: int, running: AheadOfTime) -> AheadOfTime:
        """The train step for the updates after `step`: `running`, or the one compiled for
        the end once it is ready (or the updates it changes begin: then after waiting)."""
        if self.compiled is None or (step < self.wait_from and not self.compiled.ready()):
            return running
        self.compiled.wait()
        self.compile_seconds = time.monotonic() - self.compiling_since
        self.compiled.seconds_compiling_in_calls += running.seconds_compiling_in_calls
        fitted, self.compiled = self.compiled, None
        return fitted
