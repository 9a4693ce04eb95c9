"""Training batches built on a thread a few batches ahead of the train step.

    with BatchLoader(BatchIterator(examples, config), depth=4) as batches:
        batch = next(batches)

Building a batch's arrays takes host time that would otherwise stall every step. The thread
reads ahead; `state`, `epochs_completed` and `batches_per_epoch` describe the batches the
caller has taken, so a checkpoint saved after step k resumes at batch k + 1 all the same.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Iterator

THREAD_NAME = "batch-loader"
# Seconds between looks at the caller's `stop_requested` while `next()` waits for a batch.
STOP_CHECK_SECONDS = 0.2


class StopRequested(Exception):
    """`next()` stopped waiting for a batch not yet built: `stop_requested()` said so."""


class BatchLoader:
    """A `data.batching.BatchIterator` (or any iterator with `state`, `epochs_completed` and
    `batches_per_epoch`) read on a daemon thread into a queue of `depth` batches.

    An error of the iterator (a DataError, say) is raised by the `next()` that would have
    returned its batch, as itself. The thread starts at `start()` or the first `next()`, so a
    loader built but never read holds no thread; `close()` (or leaving a `with` block) stops it.
    While `next()` waits for a batch, it asks `stop_requested()` every `STOP_CHECK_SECONDS` and
    raises `StopRequested` when it answers True (a signal asked the run to stop): a batch
    that takes long to build, or never comes, does not hold up the stop.
    """

    def __init__(self, iterator: Any, depth: int = 4,
                 stop_requested: Callable[[], bool] = lambda: False):
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.iterator, self.depth, self.stop_requested = iterator, depth, stop_requested
        # Read before the thread moves the iterator on (the first epoch's count: sampled
        # segmentations change it a little from epoch to epoch).
        self.batches_per_epoch: int = iterator.batches_per_epoch
        self.state: dict = dict(iterator.state)  # of the next batch the caller takes
        self.epochs_completed: int = iterator.epochs_completed  # as of the batches taken
        self.wait_seconds = 0.0  # the caller waited for batches, in all
        self._window_wait, self._window_ready, self._window_takes = 0.0, 0, 0
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, name=THREAD_NAME, daemon=True)
        self._end: BaseException | None = None  # what ended the batches, once taken

    def start(self) -> None:
        """Start reading ahead (the first batches can be built while the step compiles)."""
        if self._thread.ident is None and not self._stop.is_set():
            self._thread.start()

    def __iter__(self) -> Iterator:
        return self

    def __next__(self) -> Any:
        if self._end is not None:
            raise self._end
        if self._stop.is_set():
            raise RuntimeError("the batch loader is closed")
        self.start()
        self._window_ready += self._queue.qsize()
        begin = time.perf_counter()
        item = self._take()
        waited = time.perf_counter() - begin
        self.wait_seconds += waited
        self._window_wait += waited
        self._window_takes += 1
        if isinstance(item, BaseException):
            self._end = item
            self.close()
            raise item
        self.state, self.epochs_completed, batch = item
        return batch

    def _take(self) -> Any:
        while True:
            try:
                return self._queue.get(timeout=STOP_CHECK_SECONDS)
            except queue.Empty:
                if self.stop_requested():
                    raise StopRequested("stopped waiting for the next batch") from None

    def window(self) -> dict[str, float]:
        """The figures of the batches taken since the last call: `data_wait_s`, the seconds
        the caller waited for them, and `loader_queue`, the mean number of batches ready when
        it asked (near `depth`: the data keeps up; near 0: the steps wait for data)."""
        takes = max(self._window_takes, 1)
        figures = {"data_wait_s": round(self._window_wait, 3),
                   "loader_queue": round(self._window_ready / takes, 2)}
        self._window_wait, self._window_ready, self._window_takes = 0.0, 0, 0
        return figures

    def _produce(self) -> None:
        """The thread: (state after the batch, batch) into the queue until stopped; the
        iterator's end or error goes in last, for the caller to raise in order."""
        try:
            while not self._stop.is_set():
                batch = next(self.iterator)
                self._queue.put((dict(self.iterator.state), self.iterator.epochs_completed,
                                 batch))
        except BaseException as err:  # noqa: BLE001 - handed over to the caller's thread
            self._queue.put(err)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread and drop the batches read ahead; again: nothing. A thread still
        building a batch after `timeout` seconds is left to end by itself once it is built
        (a daemon: it never holds up the exit)."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        while self._thread.is_alive() and time.monotonic() < deadline:
            self._drain()  # a thread blocked on the full queue puts, then sees the stop
            self._thread.join(timeout=0.05)
        self._drain()

    def _drain(self) -> None:
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return

    def __enter__(self) -> "BatchLoader":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
