"""The batch loader: the thread that reads batches ahead of the train step gives the batches,
the resume position and the errors of the iterator it wraps, and never outlives `close()`."""

from __future__ import annotations

import threading
import time

import datasets
import numpy as np
import pytest

from data.batching import BatchConfig, BatchIterator, load_examples
from data.config import DataError
from nmt.training.loader import THREAD_NAME, BatchLoader, StopRequested

CONFIG = BatchConfig(packing=False, batch_tokens=64, max_len=16, buckets=(8, 16),
                     num_devices=1)


@pytest.fixture(scope="module")
def examples():
    """61 pairs of random lengths: a few batches an epoch, the last epoch's cut short."""
    rng = np.random.default_rng(0)
    src_len = rng.integers(1, 15, 61)
    tgt_len = rng.integers(1, 15, 61)
    return load_examples(datasets.Dataset.from_dict({
        "src_ids": [rng.integers(4, 50, k).tolist() for k in src_len],
        "tgt_ids": [rng.integers(4, 50, k).tolist() for k in tgt_len],
        "src_len": src_len.tolist(), "tgt_len": tgt_len.tolist()}), CONFIG)


def _iterator(examples, state=None) -> BatchIterator:
    return BatchIterator(examples, CONFIG, state=state, process_index=0, process_count=1)


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])


def _wait_until(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


class Failing:
    """Batches {"i": [i]}; `next()` raises at batch `fail_at` (0-based)."""

    batches_per_epoch = 100
    epochs_completed = 0

    def __init__(self, fail_at: int | None = None):
        self.fail_at, self.position = fail_at, 0

    @property
    def state(self) -> dict:
        return {"epoch": 0, "position": self.position}

    def __next__(self) -> dict:
        if self.position == self.fail_at:
            raise DataError(f"bad pair in batch {self.position}")
        self.position += 1
        return {"i": np.array([self.position - 1])}


def test_batches_and_state_are_those_of_the_iterator_though_it_reads_ahead(examples):
    bare = _iterator(examples)
    per_epoch = bare.batches_per_epoch
    expected, states = [], []
    for _ in range(per_epoch + 3):  # into the second epoch
        expected.append(next(bare))
        states.append(bare.state)

    k = per_epoch - 2
    with BatchLoader(_iterator(examples), depth=3) as loader:
        assert loader.batches_per_epoch == per_epoch and loader.epochs_completed == 0
        for i in range(k):
            _assert_same(next(loader), expected[i])
            assert loader.state == states[i]
        _wait_until(lambda: loader._queue.full())  # the thread is 3 batches further on
        assert loader.state == states[k - 1] != loader.iterator.state
        figures = loader.window()
        assert set(figures) == {"data_wait_s", "loader_queue"}
        assert 0 <= figures["loader_queue"] <= 3 and loader.wait_seconds >= 0
        saved = loader.state

    resumed = BatchLoader(_iterator(examples, state=saved))  # mid-epoch, as from a checkpoint
    with resumed:
        for i in range(k, len(expected)):
            _assert_same(next(resumed), expected[i])
            assert resumed.state == states[i]
        assert resumed.epochs_completed == 1


def test_an_error_of_the_iterator_comes_at_the_batch_it_was_raised_for():
    loader = BatchLoader(Failing(fail_at=3), depth=2)
    assert [int(next(loader)["i"][0]) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(DataError, match="bad pair in batch 3") as raised:
        next(loader)
    assert "raise DataError" in str(raised.traceback[-1].statement)  # the thread's traceback
    assert not loader._thread.is_alive()
    assert loader.state == {"epoch": 0, "position": 3}  # the last batch taken
    with pytest.raises(DataError):  # and again, rather than waiting for batches forever
        next(loader)


def test_close_unblocks_a_thread_waiting_on_the_full_queue():
    loader = BatchLoader(Failing(), depth=2)
    next(loader)
    _wait_until(lambda: loader._queue.full())
    begin = time.monotonic()
    loader.close()
    assert time.monotonic() - begin < 2.0
    assert not loader._thread.is_alive()
    loader.close()  # again: nothing
    with pytest.raises(RuntimeError, match="closed"):
        next(loader)


def test_ctrl_c_in_the_consumer_leaves_no_thread():
    with pytest.raises(KeyboardInterrupt):
        with BatchLoader(Failing(), depth=2) as loader:
            next(loader)
            _wait_until(lambda: loader._queue.full())
            raise KeyboardInterrupt
    assert not loader._thread.is_alive() and not _loader_threads()


class Stuck(Failing):
    """Batches as `Failing`'s, but the one at `stuck_at` takes until `release` is set."""

    def __init__(self, stuck_at: int):
        super().__init__()
        self.stuck_at, self.release = stuck_at, threading.Event()

    def __next__(self) -> dict:
        if self.position == self.stuck_at:
            self.release.wait()
        return super().__next__()


def test_a_stop_requested_while_waiting_for_a_batch_ends_the_wait():
    """A batch that never comes does not hold up the stop: `next()` gives up within a look
    at `stop_requested`, and the batches taken before stay taken."""
    stop = threading.Event()
    iterator = Stuck(stuck_at=2)
    with BatchLoader(iterator, depth=2, stop_requested=stop.is_set) as loader:
        assert [int(next(loader)["i"][0]) for _ in range(2)] == [0, 1]
        threading.Timer(0.3, stop.set).start()
        begin = time.monotonic()
        with pytest.raises(StopRequested):
            next(loader)
        assert 0.3 <= time.monotonic() - begin < 2.0
        assert loader.state == {"epoch": 0, "position": 2}  # of the next batch to take
        iterator.release.set()
    assert not loader._thread.is_alive()


def test_a_loader_never_read_starts_no_thread():
    loader = BatchLoader(Failing())
    assert not loader._thread.is_alive()
    loader.close()
    assert not loader._thread.is_alive()
