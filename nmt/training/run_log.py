"""What a run reports while it trains, kept apart from the loop: its lines in metrics.jsonl
and TensorBoard, the progress bar, and the time its steps took."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nmt.runtime.compilation import AheadOfTime, CompileLog
from nmt.training.loader import BatchLoader
from nmt.training.metrics_log import MetricsWindow, MetricsWriter
from nmt.training.progress import Progress
from nmt.training.stopping import PausableClock


class RunLog:
    """The "train", "compile", "eval" and "summary" lines of one call of `train` (only process
    0 writes them), and the progress bar they are shown on.

    The log window's clock leaves out validation and saving (inside `clock.paused()`), so that
    a "train" line's tokens/s and the summary's seconds in steps count train steps only.
    """

    def __init__(self, run_dir: Path, step: int, is_main: bool, compile_log: CompileLog):
        self.metrics = MetricsWriter(run_dir, step, is_main)
        self.progress = Progress()
        self.clock = PausableClock()
        self.compile_log = compile_log
        self.compilations_logged = 0
        self.step_seconds = 0.0  # in train steps, validation and saving left out

    def write(self, kind: str, step: int, values: dict[str, Any]) -> None:
        self.metrics.write(kind, step, values)

    def train_line(self, step: int, window: MetricsWindow, started: float,
                   batches: BatchLoader) -> None:
        """One "train" line for the steps of `window` (none when it is empty), after a
        "compile" line for each program compiled since the last one."""
        seconds = self.clock.elapsed()
        self.compilations(step)
        line = window.close(seconds, started)
        if line is None:
            return
        self.step_seconds += seconds
        line.update(batches.window())  # data_wait_s and loader_queue of these steps
        self.write("train", step, line)
        self.progress.show(line)
        self.clock.restart()

    def steps_ended(self, window: MetricsWindow) -> None:
        """After the last step: the seconds of a window left open (a run interrupted between
        two log lines, which keeps the window's steps for the run that resumes it) count in
        the steps' seconds, as a closed window's do."""
        if window.steps or window.pending:
            self.step_seconds += self.clock.elapsed()

    def compilations(self, step: int) -> None:
        """A "compile" line for each program compiled since the last one written."""
        for record in self.compile_log.since(self.compilations_logged):
            self.write("compile", step, record.to_dict())
            self.compilations_logged += 1

    def time_spent(self, train_step: AheadOfTime, batches: BatchLoader) -> dict[str, Any]:
        """Seconds compiling (every program of this process), in train steps (their
        compilations left out) and waiting for data within them, and how many programs were
        compiled or read from the cache."""
        compiled = self.compile_log.summary()
        in_steps = train_step.seconds_compiling_in_calls
        return {**compiled, "steps_s": round(max(self.step_seconds - in_steps, 0.0), 1),
                "data_wait_s": round(batches.wait_seconds, 1), "loader_depth": batches.depth}
