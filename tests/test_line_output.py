"""nmt.runtime.line_output: what a reader gets is whole lines, when Ctrl-C or SIGTERM comes
while a write waits on it, and a reader that takes nothing does not hold the command."""

from __future__ import annotations

import fcntl
import io
import os
import signal
import threading
import time

import pytest

from nmt.runtime import line_output
from nmt.runtime.line_output import LineOutput, write_whole_lines

F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
LINES = b"".join(b"line %05d of the output\n" % i for i in range(2000))  # 24 bytes a line


@pytest.fixture
def pipe():
    """A pipe that holds 4096 bytes (one page): a write of LINES waits on its reader."""
    read, write = os.pipe()
    fcntl.fcntl(write, F_SETPIPE_SZ, 4096)
    yield read, write
    for fd in (read, write):
        os.close(fd)


def _signal_later(*signums: int, after: float = 0.3, between: float = 0.3) -> threading.Thread:
    def send():
        time.sleep(after)
        for signum in signums:
            os.kill(os.getpid(), signum)
            time.sleep(between)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def _read_all(fd: int) -> bytes:
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return b"".join(chunks)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _whole_lines(data: bytes) -> None:
    assert data and data.endswith(b"\n") and len(data) < len(LINES)
    assert LINES.startswith(data)


def test_a_signal_ends_the_write_at_the_end_of_the_line_it_cut(pipe):
    read, write = pipe
    received, stop = [], threading.Event()

    def slow_reader():  # takes the pipe's contents a few bytes at a time
        while not stop.is_set():
            received.append(os.read(read, 7))
            time.sleep(0.002)

    reader = threading.Thread(target=slow_reader, daemon=True)
    _signal_later(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        reader.start()
        write_whole_lines(write, LINES)
    time.sleep(0.2)
    stop.set()
    os.write(write, b"!")  # wakes the reader if the pipe is empty
    reader.join(timeout=10)
    data = b"".join(received) + _read_all(read)
    assert data.endswith(b"!")
    _whole_lines(data[:-1])
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_reader_that_takes_nothing_does_not_hold_the_signal_longer_than_the_wait(
        pipe, monkeypatch):
    read, write = pipe
    monkeypatch.setattr(line_output, "LINE_END_WAIT_S", 0.5)
    _signal_later(signal.SIGINT)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        write_whole_lines(write, LINES)
    assert time.monotonic() - start < 0.3 + 0.5 + 1.5
    assert len(_read_all(read)) == 4096  # as far as the pipe took it: the line is cut


def test_a_second_signal_ends_the_write_at_once(pipe, monkeypatch):
    read, write = pipe
    monkeypatch.setattr(line_output, "LINE_END_WAIT_S", 60)
    _signal_later(signal.SIGINT, signal.SIGINT)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        write_whole_lines(write, LINES)
    assert time.monotonic() - start < 10


def test_sigterm_acts_through_its_own_handler_after_the_line(pipe, monkeypatch):
    read, write = pipe
    monkeypatch.setattr(line_output, "LINE_END_WAIT_S", 0.5)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: exit(128 + signum))
    try:
        _signal_later(signal.SIGTERM)
        with pytest.raises(SystemExit) as info:
            write_whole_lines(write, LINES)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert info.value.code == 143


def test_a_handler_that_returns_lets_the_write_go_on(pipe):
    read, write = pipe
    seen, received = [], []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    reader = threading.Thread(target=lambda: received.append(_drain(read, len(LINES))),
                              daemon=True)
    try:
        _signal_later(signal.SIGINT)
        reader.start()
        write_whole_lines(write, LINES)
    finally:
        signal.signal(signal.SIGINT, previous)
    reader.join(timeout=30)
    assert seen == [signal.SIGINT] and received == [LINES]


def _drain(fd: int, size: int) -> bytes:
    """`size` bytes of `fd`, read slowly."""
    data = b""
    while len(data) < size:
        time.sleep(0.01)
        data += os.read(fd, 512)
    return data


def test_a_write_error_names_the_stream():
    with open("/dev/full", "w") as full:
        with pytest.raises(OSError) as info:
            LineOutput(full, "standard output").write("a line\n")
    assert info.value.filename == "standard output"


def test_a_stream_without_descriptor_is_written_as_it_is():
    text = io.StringIO()
    out = LineOutput(text, "standard output")
    out.write("one\n")
    out.flush()
    assert text.getvalue() == "one\n"
