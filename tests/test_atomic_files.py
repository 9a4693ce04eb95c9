"""transformer.atomic_files: the one way a file is written whole. After any failure the file
is the old one and no temporary is left; a written file is fsynced before its rename and its
directory after; the data cache writes through it. A temporary directory is its writer's
until the writer is gone, even when another process looks at it the moment it is made."""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from pathlib import Path

import pytest

from transformer.atomic_files import (
    ABANDONED_AFTER,
    atomic_file,
    new_directory,
    remove_abandoned,
    write_atomically,
)


class Boom(Exception):
    pass


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _record_syncs_and_renames(monkeypatch) -> list[tuple[str, int]]:
    """Record ("fsync", inode) and ("replace", inode of the file renamed) in order."""
    events: list[tuple[str, int]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.fstat(fd).st_ino))
        real_fsync(fd)

    def replace(source, target):
        events.append(("replace", os.stat(source).st_ino))
        real_replace(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


@pytest.mark.parametrize("old", [b"old\n", None], ids=["replacing", "new"])
def test_a_writer_that_raises_leaves_the_old_file_and_no_temporary(old, tmp_path):
    out = tmp_path / "out.bin"
    if old is not None:
        out.write_bytes(old)
    with pytest.raises(Boom):
        with atomic_file(out, "wb") as handle:
            handle.write(b"half of the new")
            handle.flush()
            raise Boom
    assert (out.read_bytes() if out.exists() else None) == old
    assert _names(tmp_path) == ([] if old is None else ["out.bin"])


def test_the_file_is_synced_before_its_rename_and_the_directory_after(tmp_path, monkeypatch):
    out = tmp_path / "out.txt"
    out.write_text("old\n")
    events = _record_syncs_and_renames(monkeypatch)
    write_atomically(out, "new\n")
    monkeypatch.undo()
    written, directory = out.stat().st_ino, tmp_path.stat().st_ino
    assert events == [("fsync", written), ("replace", written), ("fsync", directory)]
    assert out.read_text() == "new\n" and _names(tmp_path) == ["out.txt"]


@pytest.mark.parametrize("step", ["file", "directory"])
def test_a_failed_sync_leaves_old_or_new_and_no_temporary(step, tmp_path, monkeypatch):
    out = tmp_path / "out.txt"
    out.write_text("old\n")
    real_fsync = os.fsync

    def fsync(fd):
        if os.path.isdir(f"/proc/self/fd/{fd}") == (step == "directory"):
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="Input/output error"):
        write_atomically(out, "new\n")
    # A failed directory sync comes after the rename: the new file is in place, unsynced.
    assert out.read_text() == ("old\n" if step == "file" else "new\n")
    assert _names(tmp_path) == ["out.txt"]


def test_a_directory_that_cannot_be_synced_is_not_an_error(tmp_path, monkeypatch):
    real_fsync = os.fsync

    def fsync(fd):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(errno.EINVAL, "Invalid argument")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_atomically(tmp_path / "out.txt", "new\n")
    assert (tmp_path / "out.txt").read_text() == "new\n"


def test_a_full_disk_names_the_file_and_leaves_the_old_one(tmp_path, monkeypatch):
    out = tmp_path / "out.bin"
    out.write_bytes(b"old")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as info:
        write_atomically(out, b"new")
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(out)
    assert out.read_bytes() == b"old" and _names(tmp_path) == ["out.bin"]


@pytest.mark.parametrize("failing", ["create", "replace"])
@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_an_error_about_the_temporary_names_the_file(tmp_path, monkeypatch, failing, code):
    """A read-only or denied directory named the hidden temporary, a name nobody gave."""
    out = tmp_path / "out.bin"
    out.write_bytes(b"old")
    real = os.open if failing == "create" else os.replace

    def refuse(name, *args, **kwargs):
        if Path(name).name.startswith(".out.bin."):
            raise OSError(code, os.strerror(code), name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(os, "open" if failing == "create" else "replace", refuse)
    with pytest.raises(OSError) as info:
        write_atomically(out, b"new")
    assert info.value.errno == code and info.value.filename == str(out)
    assert isinstance(info.value, PermissionError) == (code == errno.EACCES)  # as raised
    assert out.read_bytes() == b"old" and _names(tmp_path) == ["out.bin"]


def test_an_error_about_another_file_keeps_its_name(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        with atomic_file(tmp_path / "out.txt", "w") as handle:
            handle.write(open(tmp_path / "missing.txt").read())
    assert info.value.filename == str(tmp_path / "missing.txt")
    assert _names(tmp_path) == []


def test_text_is_utf8_with_newlines_and_files_get_the_usual_permissions(tmp_path):
    previous = os.umask(0o022)
    try:
        write_atomically(tmp_path / "a.txt", "café\n")
        write_atomically(tmp_path / "b.bin", b"\x00\xff")
    finally:
        os.umask(previous)
    assert (tmp_path / "a.txt").read_bytes() == "café\n".encode()
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\xff"
    assert {(tmp_path / name).stat().st_mode & 0o777 for name in ("a.txt", "b.bin")} == {0o644}


def test_a_failed_publish_removes_the_temporary(tmp_path):
    def refuse(written: Path, path: Path) -> None:
        raise Boom

    with pytest.raises(Boom):
        with atomic_file(tmp_path / "out.txt", "w", publish=refuse) as handle:
            handle.write("new\n")
    assert _names(tmp_path) == []


def test_only_w_and_wb_are_accepted(tmp_path):
    with pytest.raises(ValueError, match="mode 'w' or 'wb', not 'a'"):
        with atomic_file(tmp_path / "out.txt", "a"):
            pass
    assert _names(tmp_path) == []


def scan_at_the_first_lock(monkeypatch, under: Path, seconds: float = 0.1) -> threading.Event:
    """Make another process's look for abandoned temporaries fall on the moment a writer locks
    its new temporary: the first flock taken of something under `under` finds that look
    holding the lock for `seconds`. The Event is set once the look has let go."""
    real_flock, let_go = fcntl.flock, threading.Event()

    def end_the_look(look: int) -> None:
        os.close(look)
        let_go.set()

    def flock(fd: int, operation: int) -> None:
        named = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if not let_go.is_set() and named.is_relative_to(under.resolve()):
            monkeypatch.setattr(fcntl, "flock", real_flock)
            look = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)  # its own open file, as a process's
            real_flock(look, fcntl.LOCK_EX | fcntl.LOCK_NB)
            threading.Timer(seconds, end_the_look, [look]).start()
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock)
    return let_go


def age(path: Path) -> None:
    """Make `path` look as last modified well over ABANDONED_AFTER seconds ago."""
    stale = time.time() - 2 * ABANDONED_AFTER
    os.utime(path, (stale, stale))


def test_a_new_directory_stays_its_writers_when_looked_at_as_it_is_made(tmp_path, monkeypatch):
    """Another process's look for abandoned temporaries may hold a new directory's lock when
    its writer takes it: the writer waits, and a later look, once the directory is old, leaves
    it to its writer. (Not waiting left it unlocked, removed while still being written.)"""
    let_go = scan_at_the_first_lock(monkeypatch, tmp_path)
    lock, tmp = new_directory(tmp_path / "store")
    try:
        assert let_go.wait(10)
        (tmp / "part").write_text("being written")
        age(tmp)
        remove_abandoned([tmp])
        assert (tmp / "part").read_text() == "being written"
    finally:
        os.close(lock)
    remove_abandoned([tmp])  # its writer gone: now it is abandoned
    assert not tmp.exists()


# ----------------------------------------------------------------------------- users


def test_the_text_cache_names_input_read_once_by_its_pairs(tmp_path):
    from data.arrow_text import cached_pairs

    pairs = [("a man", "ein Mann"), ("  ", "leer"), ("a dog", "ein Hund")]
    ds = cached_pairs(iter(pairs), "a pipe", key=None, cache_dir=tmp_path)
    assert ds["source"] == ["a man", "a dog"]
    files = _names(tmp_path / "text")
    assert files == [f"{ds._fingerprint}.arrow", f"{ds._fingerprint}.json"]
    again = cached_pairs(iter(pairs), "a pipe", key=None, cache_dir=tmp_path)
    assert again._fingerprint == ds._fingerprint and _names(tmp_path / "text") == files


def test_the_text_cache_keeps_nothing_of_input_without_pairs(tmp_path):
    from data.arrow_text import cached_pairs
    from data.config import DataError

    with pytest.raises(DataError, match="no sentence pairs"):
        cached_pairs(iter([("", "x")]), "empty", key="k", cache_dir=tmp_path)
    assert _names(tmp_path / "text") == []
