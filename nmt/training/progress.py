"""The progress bar on the terminal of process 0, kept apart from the loop it reports on."""

from __future__ import annotations

from typing import Any

from nmt.settings.config import TrainerConfig
from nmt.training.summary import progress_bar


class Progress:
    """Steps done, the time left (without a step limit) and the latest log line, on a bar that
    is shown between `open` and `close` (never with --no-progress or off process 0)."""

    def __init__(self):
        self.bar = None

    def open(self, trainer: TrainerConfig, total: int | None, initial: int) -> None:
        """Show the bar from step `initial` of `total` (None: no step limit)."""
        self.bar = progress_bar(trainer, total, initial)

    def advance(self, seconds_left: float | None) -> None:
        """One step more; with no step limit, the time left as an ETA."""
        if self.bar is None:
            return
        self.bar.update(1)
        if self.bar.total is None and seconds_left is not None:
            minutes, seconds = divmod(int(seconds_left), 60)
            self.bar.set_description(f"ETA {minutes}:{seconds:02d}", refresh=False)

    def show(self, line: dict[str, Any]) -> None:
        """The loss, learning rate and speed of the newest "train" log line."""
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{line['loss']:.3f}", lr=f"{line['lr']:.2e}",
                                 tok_s=f"{line['tokens_per_s']:.0f}", refresh=False)

    def close(self) -> None:
        """Take the bar off the terminal, before the lines that follow it."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
