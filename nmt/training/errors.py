"""Why training cannot go on, in words that say what to do about it."""

from __future__ import annotations

import re
from typing import Any

import jax

from nmt.rundir.checkpoints import Checkpointer
from nmt.runtime.distributed import PeerFailed, peer_failure
from nmt.runtime.memory import device_memory, gib
from nmt.settings.config import RunConfig


class TrainingError(RuntimeError):
    """Training cannot go on (diverged, bad settings); the message says what to do."""


class RunMismatch(TrainingError):
    """The run directory holds a run that these settings cannot continue (another model,
    tokenizer, seed or --init-from): train.py exits 2, as for a bad flag."""


class BudgetTooShort(TrainingError):
    """--max-minutes leaves no time for a step once the run has started and the closing work
    is reserved: train.py exits 2, as for a bad flag, naming the least that fits."""


def out_of_memory(err: BaseException, run: RunConfig) -> TrainingError | None:
    """The error for XLA running out of memory (RESOURCE_EXHAUSTED): how much it asked for,
    how much there is, and the settings that lower it; None for any other error."""
    text = str(err)
    if not isinstance(err, jax.errors.JaxRuntimeError) or (
            "RESOURCE_EXHAUSTED" not in text and "Out of memory" not in text):
        return None
    asked = re.search(r"(\d+) bytes", text)
    amount = (f"XLA asked for {gib(int(asked.group(1)))} ({asked.group(1)} bytes)" if asked
              else "XLA could not allocate a buffer")
    batching = run.batching
    width = f"--max-tokens-per-sentence (now {min(batching.max_len, run.model.max_len)})"
    if batching.packing and batching.pack_width:
        width += f" or --pack-width (now {batching.pack_width})"
    halves = max(batching.batch_tokens // 2, 1)
    return TrainingError(
        f"out of memory while training: {amount}, and {device_memory().describe()}. Lower "
        f"--batch-tokens (now {batching.batch_tokens}), or the width of the widest batch, "
        f"{width}: attention's memory grows with its square; --batch-tokens {halves} --accum "
        f"{2 * run.optimizer.accum_steps} keeps the update's size in about half the memory.")


# How a collective reports a process that went away: Gloo's "Connection reset/closed by
# peer", NCCL's "remote process exited or there was a network error", the runtime's
# UNAVAILABLE. A fault of this process's own device (a CUDA error) is not one of them.
_LOST = re.compile(r"(reset|closed) by peer|remote process exited|network error|"
                   r"broken pipe|UNAVAILABLE", re.IGNORECASE)


def lost_process(err: BaseException, checkpoints: Checkpointer) -> PeerFailed | None:
    """With several processes, the error for another that failed (its own line, when it
    published one) or died in a collective, naming the last checkpoint left intact; None
    for any other error."""
    if isinstance(err, PeerFailed):
        return err
    text = " ".join(str(err).split())
    if (jax.process_count() == 1 or not isinstance(err, jax.errors.JaxRuntimeError)
            or "RESOURCE_EXHAUSTED" in text or not _LOST.search(text)):
        return None
    latest = checkpoints.latest_step()
    intact = (f"the last intact checkpoint is step {latest} in {checkpoints.directory}"
              if latest is not None else "no checkpoint was saved yet")
    cause = peer_failure() or (f"another process of the run died or lost its connection "
                               f"({text[:200]})")
    return PeerFailed(f"{cause}; {intact}: start all processes again with the same command "
                      "to resume from it")


def divergence(checkpoints: Checkpointer, resumed_from: int | None, bad_step: int,
               metrics: dict[str, Any], why: str) -> TrainingError:
    """The error for a loss that stopped being finite or jumped at `bad_step`: which
    checkpoint to resume from, and which settings to change first."""
    checkpoints.wait()  # a save in flight holds an earlier, finite state
    latest = checkpoints.latest_step()
    loss, norm = float(metrics["loss"]), float(metrics["grad_norm"])
    what = (f"the loss or gradient norm became {loss}/{norm}" if why == "not finite"
            else f"the loss jumped to {loss:.4g}, {why}")
    if resumed_from is not None and bad_step == resumed_from + 1:
        return TrainingError(
            f"Training diverged at step {bad_step}, the first after resuming from "
            f"checkpoint {resumed_from}: {what}. That checkpoint itself is the likely "
            f"cause: move {checkpoints.directory / str(resumed_from)} away and rerun "
            "the same command to resume from the checkpoint before it.")
    where = (f"the newest checkpoint is step {latest} in {checkpoints.directory}"
             if latest is not None else "no checkpoint was saved yet")
    return TrainingError(
        f"Training diverged: {what} at step {bad_step} (learning rate "
        f"{float(metrics['learning_rate']):.3g}); {where}. Lower --lr-scale/--peak-lr, "
        "raise --warmup or set --clip-norm 1.0, then rerun (it resumes from that "
        "checkpoint).")
