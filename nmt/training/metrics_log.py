"""Training metrics: the per-step values kept on the device until a log line, the log line
itself, and where it goes (`metrics.jsonl` and TensorBoard event files in the run directory).
"""

from __future__ import annotations

import collections
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import numpy as np

from nmt.runtime.files import write_atomically

log = logging.getLogger("trainer")

METRICS_FILE = "metrics.jsonl"
TB_DIR = "tb"
_EVENT_FILES = "events.out.tfevents.*"  # what the run's SummaryWriter writes in TB_DIR


def _summary_writer_class() -> type:
    """tensorboardX's SummaryWriter, imported without torch where torch is not loaded yet.

    tensorboardX imports torch whenever it is installed, only to accept torch tensors; this
    log writes Python floats, and importing torch costs 1.5 to 2 s at every start of train.py.
    A None in sys.modules makes `import torch` fail (tensorboardX then goes on without it) for
    the length of this import only.
    """
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        from tensorboardX import SummaryWriter
    finally:
        if hide and sys.modules.get("torch", False) is None:
            del sys.modules["torch"]
    return SummaryWriter


class MetricsWriteError(RuntimeError):
    """metrics.jsonl or the TensorBoard files could not be written (disk full, say)."""


class MetricsWriter:
    """metrics.jsonl plus TensorBoard; only process 0 writes.

    On resume from step N, lines after step N (written by the interrupted run after its last
    checkpoint) are dropped so the file reads as one uninterrupted run, and the run's
    TensorBoard event files are written anew from the lines kept: TensorBoard buffers its
    events for up to two minutes, so a kill can lose rows that metrics.jsonl holds (other
    files in tb/, and a tb/ that is a link, are left as they are). A failed write is a
    MetricsWriteError naming the file; the checkpoints stay as they were.
    """

    def __init__(self, run_dir: Path, resume_step: int, enabled: bool):
        self.enabled = enabled
        self.path = run_dir / METRICS_FILE
        self.tb = None
        if not enabled:
            return
        kept = self._keep_until(resume_step) if self.path.exists() else None
        tb_dir = run_dir / TB_DIR
        try:
            writer_class = _summary_writer_class()
        except ImportError:  # TensorBoard output is optional
            log.warning("tensorboardX is not installed; writing metrics.jsonl only")
            return
        if kept is None:
            self.tb = writer_class(str(tb_dir), purge_step=resume_step + 1)
            return
        try:
            for events in tb_dir.glob(_EVENT_FILES):  # the run's own; a link is followed
                events.unlink()
            self.tb = writer_class(str(tb_dir))
            for line in kept:
                record = json.loads(line)
                self._add_scalars(record.pop("kind", "train"), record.pop("step", 0), record)
            self.tb.flush()
        except OSError as err:
            self._drop_tensorboard(err)

    def _keep_until(self, resume_step: int) -> list[str]:
        """The lines of metrics.jsonl up to `resume_step`, the file rewritten to hold only them."""
        kept = []
        for number, line in enumerate(self.path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                step = json.loads(line).get("step", 0)
            except (ValueError, AttributeError):  # cut short by a kill, or not an object
                log.warning("%s line %d is not a JSON object (a write cut short?); "
                            "dropping it: %.80r", self.path, number, line)
                continue
            if step <= resume_step:
                kept.append(line)
        try:  # a full disk must not cost the lines already there
            write_atomically(self.path, "".join(line + "\n" for line in kept))
        except OSError as err:
            raise MetricsWriteError(
                f"cannot rewrite {self.path} for the resumed run: {err.strerror}; it is "
                "unchanged: free some space, then run the same command again.") from err
        return kept

    def write(self, kind: str, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"kind": kind, "step": step, **values}
        try:
            with self.path.open("a") as f:
                f.write(json.dumps(record, sort_keys=False) + "\n")
        except OSError as err:
            raise MetricsWriteError(
                f"cannot append to {self.path}: {err.strerror}; the checkpoints are intact: "
                "free some space (or fix the cause), then run the same command again to "
                "resume.") from err
        try:
            self._add_scalars(kind, step, values)
        except OSError as err:
            self._drop_tensorboard(err)

    def _add_scalars(self, kind: str, step: int, values: dict[str, Any]) -> None:
        """TensorBoard's scalars of one record: its finite numbers (not "closing": true)."""
        if self.tb is None:
            return
        for key, value in values.items():
            if (isinstance(value, (int, float)) and not isinstance(value, bool)
                    and math.isfinite(value)):
                self.tb.add_scalar(f"{kind}/{key}", value, step)

    def _drop_tensorboard(self, err: Exception) -> None:
        log.warning("TensorBoard files stopped (%s); metrics.jsonl goes on", err)
        tb, self.tb = self.tb, None
        try:
            tb.close()
        except Exception:  # noqa: BLE001 - a writer that already failed may fail again
            pass

    def close(self) -> None:
        if self.tb is not None:
            try:
                self.tb.close()
            except Exception as err:  # noqa: BLE001 - disk full at exit: a warning, no trace
                log.warning("TensorBoard files may be incomplete: %s", err)
            self.tb = None


def summarize_window(window: list[dict[str, float]]) -> dict[str, float]:
    """One log line from the per-step metrics of a window: token-weighted means."""
    tokens = np.array([m["tokens"] for m in window], np.float64)
    total = max(float(tokens.sum()), 1.0)

    def weighted(key):
        return float(np.dot([m[key] for m in window], tokens) / total)

    nll = weighted("nll")
    summary = {
        "loss": weighted("loss"),
        "nll": nll,
        "ppl": float(math.exp(min(nll, 700.0))),
        "accuracy": weighted("accuracy"),
        "lr": float(window[-1]["learning_rate"]),
        "grad_norm": float(np.mean([m["grad_norm"] for m in window])),
        "tokens": int(total),
    }
    # R-Drop's term, per token, over the steps that had it: a resumed run may turn it on or off
    # within a window the stopped run began.
    with_kl = [(m["kl"], m["tokens"]) for m in window if "kl" in m]
    if with_kl:
        kl, kl_tokens = np.array(with_kl, np.float64).T
        summary["kl"] = float(np.dot(kl, kl_tokens) / max(float(kl_tokens.sum()), 1.0))
    return summary


class MetricsWindow:
    """Per-step metrics between two log lines.

    A step's metrics stay on the device (`add`) until `read_back`, at log intervals and before
    saves: reading them every step would wait for every step. `read_back` calls `on_diverged`
    (which must raise) at the first step whose loss or gradient norm is not finite, or whose
    loss is more than `spike` times the median of the previous `SPIKE_HISTORY` steps' (and
    more than one nat above it; `spike` 0: never). `restored` is the window a resumed run
    left unwritten, `recent` the losses of its last `SPIKE_HISTORY` steps (`Bookkeeping`).
    """

    SPIKE_HISTORY = 50

    def __init__(self, restored: list[dict[str, float]], next_step: int,
                 on_diverged: Callable[[int, dict[str, Any], str], Exception],
                 spike: float = 0.0, recent: Sequence[float] = ()):
        self.steps: list[dict[str, float]] = [dict(m) for m in restored]  # read back
        self.tokens_before = sum(m["tokens"] for m in self.steps)  # counted by an earlier run
        self.pending: list[dict[str, jax.Array]] = []  # on the device
        self.pending_first_step = next_step
        self.latest = self.steps[-1] if self.steps else None  # the last step's, read back
        self.on_diverged = on_diverged
        self.spike = spike
        # A checkpoint written before the history was kept has the window's losses alone.
        self.recent: collections.deque = collections.deque(
            recent or [m["loss"] for m in self.steps], maxlen=self.SPIKE_HISTORY)

    def add(self, metrics: dict[str, jax.Array]) -> None:
        self.pending.append(metrics)

    def read_back(self) -> None:
        """Move pending device metrics into the window; raises on a non-finite loss."""
        if not self.pending:
            return
        host = jax.device_get(self.pending)
        for offset, metrics in enumerate(host):
            if not bool(metrics["is_finite"]):
                raise self.on_diverged(self.pending_first_step + offset, metrics, "not finite")
            loss = float(metrics["loss"])
            if self.spike and len(self.recent) >= 10:
                median = float(np.median(self.recent))
                if loss > self.spike * median and loss > median + 1.0:
                    raise self.on_diverged(
                        self.pending_first_step + offset, metrics,
                        f"{loss / median:.3g} times the median loss of the previous "
                        f"{len(self.recent)} steps ({median:.4g}; --loss-spike "
                        f"{self.spike:g})")
            self.recent.append(loss)
            self.latest = {k: float(v) for k, v in metrics.items()}
            self.steps.append(self.latest)
        self.pending_first_step += len(self.pending)
        self.pending = []

    def not_finite(self, loss: float) -> Exception:
        """The divergence error (`on_diverged`) for a validation `loss` that is not finite after
        the last step read back: its update broke the parameters, its own loss being finite."""
        step = self.pending_first_step - 1
        last = self.latest or {"grad_norm": math.nan, "learning_rate": math.nan}
        return self.on_diverged(step, {**last, "loss": loss}, "not finite")

    def close(self, seconds: float, started: float) -> dict[str, float] | None:
        """The log line of the window (None when empty), then an empty window. `seconds` is
        the time the window's steps took (tokens/s), `started` when the run started."""
        self.read_back()
        if not self.steps:
            return None
        line = summarize_window(self.steps)
        new_tokens = line["tokens"] - self.tokens_before
        line["tokens_per_s"] = round(new_tokens / seconds, 1) if seconds > 0 else 0.0
        line["elapsed_s"] = round(time.monotonic() - started, 1)
        self.steps, self.tokens_before = [], 0
        return line
