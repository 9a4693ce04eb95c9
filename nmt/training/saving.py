"""When the loop writes its checkpoints, kept apart from the loop: neither a signal nor the
log window's clock cuts into a save, and a step is not saved twice with the same
bookkeeping."""

from __future__ import annotations

import time
from typing import Any, Callable

from nmt.rundir.bookkeeping import Bookkeeping
from nmt.rundir.checkpoints import Checkpointer
from nmt.training.starting import checkpoint_items
from nmt.training.stopping import PausableClock, StopSignal


class CheckpointWriter:
    """checkpoints/<N>/ and best/<N>/ (through `checkpoints`), each written whole: a signal
    that arrives meanwhile waits for the end of the save, and the save's time is left out of
    `clock` (the log window's tokens/s); `timed` is told each save's seconds.

    saved: (step, bookkeeping fingerprint) of the checkpoint written last (or restored), None
    before one; a save of the same step with the same bookkeeping is skipped.
    """

    def __init__(self, checkpoints: Checkpointer, saved: tuple[int, str] | None,
                 signals: StopSignal, clock: PausableClock,
                 timed: Callable[[float], None] = lambda seconds: None):
        self.checkpoints, self.saved = checkpoints, saved
        self.signals, self.clock, self.timed = signals, clock, timed

    def save(self, step: int, state: Any, bookkeeping: Bookkeeping,
             force_sync: bool = False) -> None:
        """Checkpoint `step`, unless it was written with this bookkeeping; `force_sync`: wait
        until it is on disk."""
        current = bookkeeping.fingerprint()
        if self.saved == (step, current):
            return
        began = time.monotonic()
        with self.clock.paused(), self.signals.critical():
            self.checkpoints.save(step, state.params, checkpoint_items(state),
                                  bookkeeping.to_json())
            if force_sync:
                self.checkpoints.wait()
        self.timed(time.monotonic() - began)
        self.saved = (step, current)

    def save_best(self, step: int, params: Any, bookkeeping: Bookkeeping) -> None:
        """best/<step>, the parameters of the best validation score so far."""
        with self.signals.critical():
            self.checkpoints.save_best(step, params, {bookkeeping.best_metric:
                                                      bookkeeping.best_score, "step": step})
