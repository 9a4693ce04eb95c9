"""Progress that suits where it goes, one rule for every command: on a terminal, tqdm's bar;
anywhere else (a log file, nohup, a cluster's job log) one plain line at a steady interval and
never a carriage return, so that a log shows a long run alive without filling with redrawn
bars."""

from __future__ import annotations

import math
import os
import sys
import time
from typing import IO, Callable

# Seconds between two plain progress lines: $NMT_PROGRESS_SECONDS, else half a minute.
INTERVAL_VARIABLE = "NMT_PROGRESS_SECONDS"


def plain_interval() -> float:
    try:
        seconds = float(os.environ.get(INTERVAL_VARIABLE, ""))
    except ValueError:
        return 30.0
    return max(seconds, 0.0) if math.isfinite(seconds) else 30.0


def on_terminal(stream: IO | None = None) -> bool:
    stream = stream if stream is not None else sys.stderr
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # closed, or not a real stream
        return False


class PlainLines:
    """Writes `describe()` as one line on `stream` (default: stderr at the time) whenever
    `interval` seconds (default `plain_interval()`) have passed since the start or the last
    line, as `tick` is called."""

    def __init__(self, describe: Callable[[float], str], interval: float | None = None,
                 stream: IO | None = None, clock: Callable[[], float] = time.monotonic):
        self.describe = describe  # given the seconds since the start
        self.interval = plain_interval() if interval is None else interval
        self.stream = stream
        self.clock = clock
        self.start = self.last = clock()

    def tick(self) -> None:
        now = self.clock()
        if now - self.last >= self.interval:
            self.last = now
            stream = self.stream if self.stream is not None else sys.stderr
            if stream is not None:
                print(self.describe(now - self.start), file=stream, flush=True)


def clock_time(seconds: float) -> str:
    """h:mm:ss, or m:ss under an hour."""
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


class LineCounter:
    """A tqdm-like counter (`update(n)`, a context manager) for work counted in lines: a bar
    on a terminal, plain lines elsewhere, nothing when `quiet` or with nothing to count."""

    def __init__(self, total: int, quiet: bool, what: str = "lines",
                 interval: float | None = None, initial: int = 0):
        self.bar, self.plain, self.total, self.done, self.what = None, None, total, initial, what
        self.counted = 0  # done in this process, for the rate
        if quiet or total <= 1:
            return
        if on_terminal():
            from tqdm import tqdm  # where a bar is shown: not on the fast path

            self.bar = tqdm(total=total, initial=initial, unit="sent", file=sys.stderr,
                            dynamic_ncols=True)
        else:
            self.plain = PlainLines(self._describe, interval)

    def _describe(self, elapsed: float) -> str:
        rate = self.counted / elapsed if elapsed > 0 else 0.0
        left = (self.total - self.done) / rate if rate > 0 else None
        eta = f", ETA {clock_time(left)}" if left is not None else ""
        return (f"{self.done:,} of {self.total:,} {self.what} ({rate:,.1f}/s), elapsed "
                f"{clock_time(elapsed)}{eta}")

    def update(self, n: int) -> None:
        self.done += n
        self.counted += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.plain is not None:
            self.plain.tick()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> LineCounter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
