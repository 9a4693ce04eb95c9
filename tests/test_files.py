"""nmt.runtime.files: a file or directory is replaced whole or not at all, and no failure (an
error, Ctrl-C, SIGTERM's SystemExit, a full disk, a failed rename) leaves a temporary behind."""

from __future__ import annotations

import errno
import fcntl
import io
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from test_atomic_files import age, scan_at_the_first_lock

from nmt.runtime import files
from nmt.runtime.files import atomic_directory, atomic_file, write_atomically
from transformer import atomic_files


class Boom(Exception):
    pass


def _raise_error():
    raise Boom("inside the block")


def _press_ctrl_c():
    raise KeyboardInterrupt


def _receive_sigterm():
    """As translate.py and train.py handle SIGTERM: the handler raises SystemExit."""
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler interrupts this
    finally:
        signal.signal(signal.SIGTERM, previous)
    pytest.fail("SIGTERM was not delivered")


FAILURES = {"error": (_raise_error, Boom), "ctrl-c": (_press_ctrl_c, KeyboardInterrupt),
            "sigterm": (_receive_sigterm, SystemExit)}


def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# ----------------------------------------------------------------------------- files


def test_a_file_is_replaced_only_when_complete(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("old\n")
    with atomic_file(out) as handle:
        handle.write("new, café\n")
        handle.flush()
        assert out.read_text() == "old\n"
        assert (tmp_path / ("out.txt" + files.PARTIAL_SUFFIX)).read_text() == "new, café\n"
    assert out.read_bytes() == "new, café\n".encode("utf-8")
    assert _names(tmp_path) == ["out.txt"]


def test_write_atomically_writes_text_and_bytes(tmp_path):
    write_atomically(tmp_path / "a.txt", "line\n")
    write_atomically(tmp_path / "b.bin", b"\x00\xff")
    assert (tmp_path / "a.txt").read_text() == "line\n"
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\xff"
    assert _names(tmp_path) == ["a.txt", "b.bin"]


@pytest.mark.parametrize("failure", FAILURES, ids=list(FAILURES))
def test_a_failure_inside_leaves_the_old_file_and_no_partial(failure, tmp_path):
    fail, expected = FAILURES[failure]
    out = tmp_path / "out.txt"
    out.write_text("old\n")
    with pytest.raises(expected):
        with atomic_file(out) as handle:
            handle.write("half")
            fail()
    assert out.read_text() == "old\n"
    assert _names(tmp_path) == ["out.txt"]


class _FullDiskFile(io.FileIO):
    """A file on a full disk: the buffered text is accepted, the flush fails."""

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")


def _open_on_a_full_disk(path, mode, **text):
    raw = _FullDiskFile(path, "w")
    buffered = io.BufferedWriter(raw)
    return buffered if "b" in mode else io.TextIOWrapper(buffered, **text)


@pytest.mark.parametrize("mode", ["w", "wb"])
def test_a_full_disk_when_flushing_leaves_the_old_file_and_no_partial(mode, tmp_path,
                                                                     monkeypatch):
    out = tmp_path / "out.txt"
    out.write_text("old\n")
    monkeypatch.setattr(atomic_files, "open", _open_on_a_full_disk, raising=False)
    with pytest.raises(OSError) as info:
        write_atomically(out, "new\n" if mode == "w" else b"new\n")
    assert info.value.errno == errno.ENOSPC
    assert out.read_text() == "old\n"
    assert _names(tmp_path) == ["out.txt"]


def test_a_full_disk_names_the_file_being_written(tmp_path, monkeypatch):
    from nmt.runtime.cli import describe_os_error

    out = tmp_path / "out.txt"
    monkeypatch.setattr(atomic_files, "open", _open_on_a_full_disk, raising=False)
    with pytest.raises(OSError) as info:
        write_atomically(out, "new\n")
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(out)
    assert describe_os_error(info.value).startswith(f"{out}: no space left")


def test_a_file_gets_the_permissions_of_any_new_file(tmp_path):
    previous = os.umask(0o022)
    try:
        write_atomically(tmp_path / "out.txt", "x")
    finally:
        os.umask(previous)
    assert (tmp_path / "out.txt").stat().st_mode & 0o777 == 0o644


def test_an_error_inside_is_not_replaced_by_the_full_disk_of_the_close(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic_files, "open", _open_on_a_full_disk, raising=False)
    with pytest.raises(KeyboardInterrupt):
        with atomic_file(tmp_path / "out.txt") as handle:
            handle.write("half")
            raise KeyboardInterrupt
    assert _names(tmp_path) == []


@pytest.mark.parametrize("step", ["fsync", "replace"])
def test_a_failed_sync_or_rename_leaves_the_old_file_and_no_partial(step, tmp_path,
                                                                    monkeypatch):
    out = tmp_path / "out.txt"
    out.write_text("old\n")
    monkeypatch.setattr(os, step, _full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(out, "new\n")
    assert out.read_text() == "old\n"
    assert _names(tmp_path) == ["out.txt"]


def test_an_unwritable_place_is_an_os_error_and_leaves_nothing(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_atomically(tmp_path / "missing" / "out.txt", "x")
    assert _names(tmp_path) == []


# ----------------------------------------------------------------------------- directories


def _model_dir(path: Path, content: str) -> Path:
    (path / "sub").mkdir(parents=True)
    (path / "params").write_text(content)
    (path / "sub" / "vocab").write_text(content)
    return path


def test_a_new_directory_appears_only_when_complete(tmp_path):
    out = tmp_path / "model"
    with atomic_directory(out) as staging:
        assert staging == tmp_path / ".model.partial" and not out.exists()
        _model_dir(staging, "new")
    assert (out / "params").read_text() == "new" and (out / "sub" / "vocab").is_file()
    assert _names(tmp_path) == ["model"]


def test_a_directory_replaces_the_old_one_whole(tmp_path):
    out = _model_dir(tmp_path / "model", "old")
    (out / "only-in-the-old-one").write_text("x")
    with atomic_directory(out) as staging:
        (staging / "params").write_text("new")
        assert (out / "params").read_text() == "old"
    assert _names(out) == ["params"] and (out / "params").read_text() == "new"
    assert _names(tmp_path) == ["model"]


@pytest.mark.parametrize("failure", FAILURES, ids=list(FAILURES))
def test_a_failure_inside_leaves_the_old_directory_and_no_temporary(failure, tmp_path):
    fail, expected = FAILURES[failure]
    out = _model_dir(tmp_path / "model", "old")
    with pytest.raises(expected):
        with atomic_directory(out) as staging:
            (staging / "params").write_text("half")
            fail()
    assert (out / "params").read_text() == "old" and (out / "sub" / "vocab").is_file()
    assert _names(tmp_path) == ["model"]


def test_a_full_disk_inside_a_new_directory_leaves_nothing(tmp_path):
    with pytest.raises(OSError):
        with atomic_directory(tmp_path / "out") as staging:
            (staging / "params").write_text("half")
            _full_disk()
    assert _names(tmp_path) == []


def test_a_failed_rename_puts_the_old_directory_back(tmp_path, monkeypatch):
    out = _model_dir(tmp_path / "model", "old")
    real_rename = Path.rename

    def rename(self, target):
        if self.name == ".model.partial":
            raise OSError(errno.EIO, "Input/output error")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(OSError, match="Input/output"):
        with atomic_directory(out) as staging:
            (staging / "params").write_text("new")
    assert (out / "params").read_text() == "old"
    assert _names(tmp_path) == ["model"]


def test_what_a_killed_writer_left_is_cleared_and_its_old_directory_kept(tmp_path):
    """SIGKILL after the old directory was renamed aside: it is put back, then replaced; the
    killed writer's staging directory (unlocked, a minute old) is taken over."""
    _model_dir(tmp_path / ".model.old", "old")
    _model_dir(tmp_path / ".model.partial", "half")
    stale = time.time() - files.ABANDONED_AFTER - 1
    os.utime(tmp_path / ".model.partial", (stale, stale))
    with pytest.raises(Boom):
        with atomic_directory(tmp_path / "model"):
            _raise_error()
    assert (tmp_path / "model" / "params").read_text() == "old"
    assert _names(tmp_path) == ["model"]
    with atomic_directory(tmp_path / "model") as staging:
        (staging / "params").write_text("new")
    assert (tmp_path / "model" / "params").read_text() == "new"
    assert _names(tmp_path) == ["model"]


# ----------------------------------------------------------------------------- users


def test_a_failed_checksum_write_leaves_no_temporary(tmp_path, monkeypatch):
    from nmt.rundir import checkpoints

    step = _model_dir(tmp_path / "7", "weights")
    monkeypatch.setattr(os, "fsync", _full_disk)
    with pytest.raises(OSError, match="No space left"):
        checkpoints.write_checksums(step)
    assert _names(step) == ["params", "sub"]
    monkeypatch.undo()
    checkpoints.write_checksums(step)
    assert _names(step) == [checkpoints.CHECKSUMS_FILE, "params", "sub"]
    assert checkpoints.damaged_file(step) is None


def test_a_failed_metrics_rewrite_keeps_the_file_and_says_so(tmp_path, monkeypatch):
    from nmt.training.metrics_log import METRICS_FILE, MetricsWriteError, MetricsWriter

    lines = '{"kind": "train", "step": 5}\n{"kind": "train", "step": 10}\n'
    (tmp_path / METRICS_FILE).write_text(lines)
    monkeypatch.setattr(os, "replace", _full_disk)
    with pytest.raises(MetricsWriteError, match="No space left on device; it is unchanged"):
        MetricsWriter(tmp_path, resume_step=5, enabled=True)
    assert (tmp_path / METRICS_FILE).read_text() == lines
    assert _names(tmp_path) == [METRICS_FILE]


def test_two_writers_of_one_directory_each_fill_their_own(tmp_path):
    """The second writer's start must not empty the first one's staging directory, which
    then published a model without the files it wrote before."""
    out = tmp_path / "model"
    first = atomic_directory(out)
    staging = first.__enter__()
    (staging / "params").write_text("first")
    with atomic_directory(out) as other:
        assert other == tmp_path / ".model.partial.1"
        (staging / "config").write_text("{}")
        first.__exit__(None, None, None)
        assert _names(out) == ["config", "params"]
        (other / "params").write_text("second")
    assert _names(out) == ["params"] and (out / "params").read_text() == "second"
    assert _names(tmp_path) == ["model"]


def test_staging_directories_killed_writers_left_are_removed(tmp_path):
    """A killed export's staging directory that is still young is passed over for the next
    number, not taken; once it is a minute old and unlocked, the next export removes it, while
    another writer's, locked, stays."""
    busy, dead = tmp_path / ".model.partial", tmp_path / ".model.partial.2"
    for staging in (busy, dead):
        staging.mkdir()
        (staging / "params").write_text("half")
    stale = time.time() - 2 * files.ABANDONED_AFTER
    os.utime(dead, (stale, stale))
    os.utime(busy, (stale, stale))
    holder = os.open(busy, os.O_RDONLY)  # a writer at work holds its lock
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with atomic_directory(tmp_path / "model") as staging:
            assert staging == tmp_path / ".model.partial.1"
            (staging / "params").write_text("new")
    finally:
        os.close(holder)
    assert (tmp_path / "model" / "params").read_text() == "new"
    assert busy.is_dir() and not dead.exists()


def test_a_staging_directory_looked_at_as_it_is_made_stays_its_writers(tmp_path, monkeypatch):
    """Another export's look for abandoned staging directories may hold a new one's lock
    when its writer takes it; an export of the same model a minute later must then take a
    staging directory of its own, not empty the one still being filled."""
    out = tmp_path / "model"
    let_go = scan_at_the_first_lock(monkeypatch, tmp_path)
    with atomic_directory(out) as staging:
        assert let_go.wait(10)
        (staging / "params").write_text("first")
        age(staging)
        with atomic_directory(out) as other:
            assert other != staging
            (other / "params").write_text("second")
        assert (staging / "params").read_text() == "first"
    assert (out / "params").read_text() == "first"


def test_a_file_replaced_keeps_its_permissions(tmp_path):
    """A private file (0600) written again must not become readable by all (0644)."""
    path = tmp_path / "keys.txt"
    path.write_text("old")
    path.chmod(0o600)
    write_atomically(path, "new")
    assert (path.read_text(), path.stat().st_mode & 0o777) == ("new", 0o600)
