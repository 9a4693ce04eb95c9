"""Training progress on process 0, kept apart from the loop it reports on: a bar on a
terminal, and in a log (stderr not a terminal) a plain line every half minute with the step,
loss, speed, elapsed time and time left (`nmt.runtime.progress`)."""

from __future__ import annotations

from typing import Any

from nmt.runtime.progress import PlainLines, clock_time, on_terminal
from nmt.settings.config import TrainerConfig


class Progress:
    """Steps done, the time left and the latest log line, shown between `open` and `close`
    (never with --no-progress or off process 0)."""

    def __init__(self):
        self.bar = None
        self.plain: PlainLines | None = None
        self.step, self.total, self.first = 0, None, 0
        self.seconds_left: float | None = None
        self.latest: dict[str, Any] = {}

    def open(self, trainer: TrainerConfig, total: int | None, initial: int) -> None:
        """Show progress from step `initial` of `total` (None: no step limit)."""
        if not trainer.progress:
            return
        self.step, self.total, self.first = initial, total, initial
        if on_terminal():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True,
                            smoothing=0.1)
        else:
            self.plain = PlainLines(self._line)

    def advance(self, seconds_left: float | None) -> None:
        """One step more; with no step limit, the time left as an ETA."""
        self.step += 1
        self.seconds_left = seconds_left
        if self.bar is not None:
            self.bar.update(1)
            if self.bar.total is None and seconds_left is not None:
                self.bar.set_description(f"ETA {clock_time(seconds_left)}", refresh=False)
        elif self.plain is not None:
            self.plain.tick()

    def show(self, line: dict[str, Any]) -> None:
        """The loss, learning rate and speed of the newest "train" log line."""
        self.latest = line
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{line['loss']:.3f}", lr=f"{line['lr']:.2e}",
                                 tok_s=f"{line['tokens_per_s']:.0f}", refresh=False)

    def _line(self, elapsed: float) -> str:
        """The plain line: step, loss, tokens/s, elapsed, time left."""
        of = f" of {self.total:,}" if self.total is not None else ""
        parts = [f"step {self.step:,}{of}"]
        if self.latest:
            parts += [f"loss {self.latest['loss']:.3f}",
                      f"{self.latest['tokens_per_s']:,.0f} tokens/s"]
        parts.append(f"elapsed {clock_time(elapsed)}")
        # Whichever limit comes first: the steps at this pace, or the minutes.
        estimates = [] if self.seconds_left is None else [self.seconds_left]
        if self.total is not None and self.step > self.first:
            estimates.append(elapsed / (self.step - self.first) * (self.total - self.step))
        left = min(estimates, default=None)
        if left is not None:
            parts.append(f"ETA {clock_time(left)}")
        return "progress: " + ", ".join(parts)

    def close(self) -> None:
        """Take the bar off the terminal, before the lines that follow it."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self.plain = None
