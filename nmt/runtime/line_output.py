"""translate.py's output, written in whole lines even when Ctrl-C or SIGTERM comes mid-write.

Why: a reader that is slow (or paused) keeps a pipe full, and a write then blocks in the
middle of a chunk. A signal that ends it there leaves the reader half a line that looks like
a whole translation. So while a chunk is written, SIGINT and SIGTERM are only recorded; the
write goes on to the end of the line it was in, then the signal takes effect as it would
have (KeyboardInterrupt, translate.py's SIGTERM exit). A reader that takes nothing more for
LINE_END_WAIT_S, or a second signal, ends the write where it is: the command never hangs.

Python's own signal handlers cannot give this: one raising inside a write loses how much of
it was written, and blocking the signals in the main thread leaves JAX's threads to take them.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import stat
import threading
import time
from typing import IO, Iterator

LINE_END_WAIT_S = 5.0
_POLL_MS = 200
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class LineOutput:
    """A text stream's `write` and `flush` as above; an OSError while writing names the
    stream as `name` ("standard output", or the path given): a write to a descriptor names
    no file, and "a file: no space left" does not say which."""

    def __init__(self, stream: IO[str], name: str):
        self.stream, self.name = stream, name

    def write(self, text: str) -> None:
        with self._naming():
            fd = _descriptor(self.stream)
            if fd is None or threading.current_thread() is not threading.main_thread():
                self.stream.write(text)  # no descriptor (a test's StringIO), or no signals
                return
            self.stream.flush()  # what the stream holds goes first
            write_whole_lines(fd, text.encode(getattr(self.stream, "encoding", None)
                                              or "utf-8"))

    def flush(self) -> None:
        with self._naming():
            self.stream.flush()

    @contextlib.contextmanager
    def _naming(self) -> Iterator[None]:
        try:
            yield
        except OSError as err:
            err.filename = err.filename or self.name
            raise


def _descriptor(stream: IO[str]) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def write_whole_lines(fd: int, data: bytes) -> None:
    """Write `data` to `fd`; a SIGINT or SIGTERM meanwhile acts at the end of the line it cut
    (module docstring). A handler that returns (rather than ending the command) lets the
    write go on."""
    done = 0
    while done < len(data):
        done, received = _write_until_signalled(fd, data, done)
        for signum in received:
            signal.raise_signal(signum)  # its handler runs now: KeyboardInterrupt, SystemExit


def _write_until_signalled(fd: int, data: bytes, done: int) -> tuple[int, list[int]]:
    """Write `data[done:]` until all is written or a signal came; then up to the end of the
    line it cut, unless a second signal comes or LINE_END_WAIT_S passes. Returns where it
    stopped and the signals received, which were held meanwhile."""
    received: list[int] = []
    held = {signum: signal.getsignal(signum) for signum in _SIGNALS}
    held = {signum: handler for signum, handler in held.items()
            if handler not in (signal.SIG_IGN, None)}  # ignored ones stay ignored
    try:  # the handlers are put back even if installing one of them fails
        for signum in held:
            signal.signal(signum, lambda signum, frame: received.append(signum))
        # After poll says a pipe is writable, a write of PIPE_BUF bytes at most does not block:
        # this loop waits only in poll, where a recorded signal is seen within _POLL_MS.
        piece = len(data) if stat.S_ISREG(os.fstat(fd).st_mode) else select.PIPE_BUF
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        end, deadline = len(data), None
        while done < end and len(received) < 2:
            if received and deadline is None:
                end = _line_end(data, done)
                deadline = time.monotonic() + LINE_END_WAIT_S
            if deadline is not None and time.monotonic() >= deadline:
                break
            if poller.poll(_POLL_MS):
                done += os.write(fd, data[done:min(end, done + piece)])
    finally:
        for signum, handler in held.items():
            signal.signal(signum, handler)
    return done, received


def _line_end(data: bytes, done: int) -> int:
    """Where the line that `data[done:]` goes on with ends (`done` itself at a line's start:
    `data` begins with one)."""
    if done == 0 or data[done - 1:done] == b"\n":
        return done
    newline = data.find(b"\n", done)
    return newline + 1 if newline >= 0 else len(data)
