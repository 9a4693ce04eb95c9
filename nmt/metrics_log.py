"""Training metrics: the per-step values kept on the device until a log line, the log line
itself, and where it goes (`metrics.jsonl` and TensorBoard event files in the run directory).
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np

log = logging.getLogger("trainer")

METRICS_FILE = "metrics.jsonl"
TB_DIR = "tb"


class MetricsWriter:
    """metrics.jsonl plus TensorBoard; only process 0 writes.

    On resume from step N, lines after step N (written by the interrupted run after its last
    checkpoint) are dropped so the file reads as one uninterrupted run.
    """

    def __init__(self, run_dir: Path, resume_step: int, enabled: bool):
        self.enabled = enabled
        self.path = run_dir / METRICS_FILE
        self.tb = None
        if not enabled:
            return
        if self.path.exists():
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
            self.path.write_text("".join(line + "\n" for line in kept))
        try:
            from tensorboardX import SummaryWriter

            self.tb = SummaryWriter(str(run_dir / TB_DIR), purge_step=resume_step + 1)
        except ImportError:  # TensorBoard output is optional
            log.warning("tensorboardX is not installed; writing metrics.jsonl only")

    def write(self, kind: str, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"kind": kind, "step": step, **values}
        with self.path.open("a") as f:
            f.write(json.dumps(record, sort_keys=False) + "\n")
        if self.tb is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self.tb.add_scalar(f"{kind}/{key}", value, step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def summarize_window(window: list[dict[str, float]]) -> dict[str, float]:
    """One log line from the per-step metrics of a window: token-weighted means."""
    tokens = np.array([m["tokens"] for m in window], np.float64)
    total = max(float(tokens.sum()), 1.0)

    def weighted(key):
        return float(np.dot([m[key] for m in window], tokens) / total)

    nll = weighted("nll")
    return {
        "loss": weighted("loss"),
        "nll": nll,
        "ppl": float(math.exp(min(nll, 700.0))),
        "accuracy": weighted("accuracy"),
        "lr": float(window[-1]["learning_rate"]),
        "grad_norm": float(np.mean([m["grad_norm"] for m in window])),
        "tokens": int(total),
    }


class MetricsWindow:
    """Per-step metrics between two log lines.

    A step's metrics stay on the device (`add`) until `read_back`, at log intervals and before
    saves: reading them every step would wait for every step. `read_back` calls `on_diverged`
    (which must raise) at the first step whose loss or gradient norm is not finite.
    """

    def __init__(self, restored: list[dict[str, float]], next_step: int,
                 on_diverged: Callable[[int, dict[str, Any]], Exception]):
        self.steps: list[dict[str, float]] = [dict(m) for m in restored]  # read back
        self.tokens_before = sum(m["tokens"] for m in self.steps)  # counted by an earlier run
        self.pending: list[dict[str, jax.Array]] = []  # on the device
        self.pending_first_step = next_step
        self.on_diverged = on_diverged

    def add(self, metrics: dict[str, jax.Array]) -> None:
        self.pending.append(metrics)

    def read_back(self) -> None:
        """Move pending device metrics into the window; raises on a non-finite loss."""
        if not self.pending:
            return
        host = jax.device_get(self.pending)
        for offset, metrics in enumerate(host):
            if not bool(metrics["is_finite"]):
                raise self.on_diverged(self.pending_first_step + offset, metrics)
            self.steps.append({k: float(v) for k, v in metrics.items()})
        self.pending_first_step += len(self.pending)
        self.pending = []

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
