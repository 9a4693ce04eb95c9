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
    `clock` (the log window's tokens/s); `timed` is told each save's seconds. The run's
    first save is waited for, so that `timed` hears what writing a checkpoint takes, not just
    the copy before the background write (the closing work's reserve rests on it).

    saved: (step, bookkeeping fingerprint) of the checkpoint written last (or restored), None
    before one; a save of the same step with the same bookkeeping is skipped.
    interval: the steps between scheduled saves (--save-every).
    """

    def __init__(self, checkpoints: Checkpointer, saved: tuple[int, str] | None,
                 signals: StopSignal, clock: PausableClock, interval: int,
                 timed: Callable[[float], None] = lambda seconds: None):
        self.checkpoints, self.saved, self.interval = checkpoints, saved, interval
        self.signals, self.clock, self.timed = signals, clock, timed
        self.write_timed = False  # a save has been waited for, and its whole time told

    def save(self, step: int, state: Any, bookkeeping: Bookkeeping,
             at_stop: bool = False) -> None:
        """Checkpoint `step`, unless it was written with this bookkeeping. `at_stop`: the
        run's last save, waited for. A step off the --save-every schedule (saved for a best
        score, or at a stop) is interim (`Checkpointer.save`): it never counts in
        --keep-last, and a resumed run does not keep it. Step 0 (a stop before the first
        update) is one: its parameters are untrained."""
        current = bookkeeping.fingerprint()
        if self.saved == (step, current):
            return
        began = time.monotonic()
        interim = step == 0 or step % self.interval != 0
        with self.clock.paused(), self.signals.critical():
            self.checkpoints.save(step, state.params, checkpoint_items(state),
                                  bookkeeping.to_json(), interim)
            if at_stop or not self.write_timed:
                self.checkpoints.wait()
                self.write_timed = True
        self.timed(time.monotonic() - began)
        self.saved = (step, current)

    def save_best(self, step: int, params: Any, bookkeeping: Bookkeeping) -> None:
        """best/<step>, the parameters of the best validation score so far."""
        with self.signals.critical():
            self.checkpoints.save_best(step, params, {bookkeeping.best_metric:
                                                      bookkeeping.best_score, "step": step})
