"""Why training cannot go on, in words that say what to do about it."""

from __future__ import annotations

from typing import Any

from nmt.rundir.checkpoints import Checkpointer


class TrainingError(RuntimeError):
    """Training cannot go on (diverged, bad settings); the message says what to do."""


def divergence(saver: Checkpointer, resumed_from: int | None, bad_step: int,
               metrics: dict[str, Any], why: str) -> TrainingError:
    """The error for a loss that stopped being finite or jumped at `bad_step`: which
    checkpoint to resume from, and which settings to change first."""
    saver.wait()  # a save in flight holds an earlier, finite state
    latest = saver.latest_step()
    loss, norm = float(metrics["loss"]), float(metrics["grad_norm"])
    what = (f"the loss or gradient norm became {loss}/{norm}" if why == "not finite"
            else f"the loss jumped to {loss:.4g}, {why}")
    if resumed_from is not None and bad_step == resumed_from + 1:
        return TrainingError(
            f"Training diverged at step {bad_step}, the first after resuming from "
            f"checkpoint {resumed_from}: {what}. That checkpoint itself is the likely "
            f"cause: move {saver.directory / str(resumed_from)} away and rerun "
            "the same command to resume from the checkpoint before it.")
    where = (f"the newest checkpoint is step {latest} in {saver.directory}"
             if latest is not None else "no checkpoint was saved yet")
    return TrainingError(
        f"Training diverged: {what} at step {bad_step} (learning rate "
        f"{float(metrics['learning_rate']):.3g}); {where}. Lower --lr-scale/--peak-lr, "
        "raise --warmup or set --clip-norm 1.0, then rerun (it resumes from that "
        "checkpoint).")
