"""The end of a linear learning-rate schedule, fitted to the run's limit of steps or minutes.

`--schedule linear` without `--decay-steps` ends where the run stops: its last update is the
run's last step, and the rate reaches zero just after it. A limit of steps gives that step at
once. A limit of minutes gives it only once steps have been timed: the warm-up does not depend
on the end, so the run starts with an end far away (`UNFITTED`), times steps of the warm-up,
fixes the end from the time left, and runs the step compiled for that end from the last
update of the warm-up on. The run is then the linear schedule to that step, exactly;
config.yaml records the step, and a resume goes on to the same one.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import jax
import numpy as np
from jax.experimental import multihost_utils

from nmt.settings.config import RunConfig
from transformer.config import OptimizerConfig

if TYPE_CHECKING:
    from nmt.runtime.compilation import AheadOfTime
    from nmt.training.stopping import Limits

log = logging.getLogger(__name__)

UNFITTED = 1_000_000_000  # the end compiled before the fit: the warm-up is the same for any
RESERVE = 0.03            # of the time left, kept for validation, checkpoints and the export


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
    if max_minutes is None and max_steps is not None:
        return with_end(run, max_steps)
    return run


class EndFit:
    """Times steps of the warm-up and fixes the schedule's last step (the rate is zero after it):
    the last step the time left allows (less `RESERVE`), or the limit of steps if sooner.

    The first eighth of the warm-up left is not timed (its steps are slower: memory being
    mapped, caches filling); the fit comes a tenth before the warm-up's end, leaving those
    steps for compiling the step with the end.
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

    def after_step(self, step: int, now: float, seconds_left: float) -> int | None:
        """The end, at the step the fit is made; None before and after it."""
        if step == self.timed_from:
            self._start = now
            return None
        if step != self.fit_at or self._start is None:
            return None
        self.step_seconds = (now - self._start) / (step - self.timed_from)
        reach = step + int(seconds_left * (1 - RESERVE) / max(self.step_seconds, 1e-9))
        end = reach if self.max_steps is None else min(reach, self.max_steps)
        end = max(end, self.warmup_steps + 1, step + 1)
        if jax.process_count() > 1:  # one schedule for all: process 0's clock
            end = int(multihost_utils.broadcast_one_to_all(np.int64(end)))
        return end


class FittedEnd:
    """The end fitted while the run trains: `EndFit` over the warm-up (None where the end is
    known), then the train step compiled for the end, which takes over once it is compiled,
    and at the latest before the first update whose rate the end sets."""

    def __init__(self, optimizer: OptimizerConfig, first_step: int, max_steps: int | None):
        self.fit = (EndFit(first_step, optimizer.warmup_steps, max_steps)
                    if needs_fit(optimizer) else None)
        self.warmup_steps = optimizer.warmup_steps
        self.step_seconds: float | None = None  # of the steps timed, once fitted
        self.compiled: AheadOfTime | None = None  # the step for the fitted end, until it runs

    def end_after(self, step: int, last_loss: jax.Array, limits: Limits) -> int | None:
        """The end, after the step that fits it (once); None after any other."""
        if self.fit is None or not self.fit.wants_clock(step):
            return None
        last_loss.block_until_ready()  # the steps timed are finished, not only queued
        end = self.fit.after_step(step, time.monotonic(), limits.seconds_left())
        if end is not None:
            self.step_seconds, self.fit = self.fit.step_seconds, None
        return end

    def describe(self, end: int, max_minutes: float, recorded_in: Path) -> str:
        """The log line of the fitted end: where, and from what."""
        return (f"learning rate: linear to zero after step {end}, the last the run's limits "
                f"allow ({max_minutes:g} minutes at {self.step_seconds:.3g} s a step; "
                f"recorded in {recorded_in})")

    def train_step(self, step: int, running: AheadOfTime) -> AheadOfTime:
        """The train step for the updates after `step`: `running`, or the one compiled for
        the end once it is ready (or the warm-up is over: then after waiting for it)."""
        if self.compiled is None or (step < self.warmup_steps and not self.compiled.ready()):
            return running
        self.compiled.wait()
        self.compiled.seconds_compiling_in_calls += running.seconds_compiling_in_calls
        fitted, self.compiled = self.compiled, None
        return fitted
