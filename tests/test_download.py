"""data.download writes a corpus all or nothing: aligned files never end up new beside old."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from data import download

NAMES = list(download.CORPORA["multi30k"][1])


@pytest.fixture
def fetched(monkeypatch) -> dict[str, bytes]:
    data = {name: b"new\n" for name in NAMES}
    monkeypatch.setattr(download, "fetch", lambda name: data)
    return data


def _old(target: Path, skip: str = "") -> None:
    target.mkdir()
    for name in NAMES:
        if name != skip:
            (target / name).write_text("old\n")


def test_a_directory_in_the_way_replaces_no_file_and_is_named(tmp_path, capsys, fetched):
    target = tmp_path / "m"
    _old(target, skip="train.de")
    (target / "train.de").mkdir()
    assert download.main(["multi30k", str(target)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and ".partial" not in err
    assert f"cannot write {target / 'train.de'} (Is a directory); move it out of the way" in err
    assert {(target / n).read_text() for n in NAMES if n != "train.de"} == {"old\n"}
    assert sorted(p.name for p in target.iterdir()) == sorted(NAMES)  # no temporaries


def test_a_rename_that_fails_puts_back_the_files_renamed_before_it(
        tmp_path, capsys, monkeypatch, fetched):
    target = tmp_path / "m"
    _old(target, skip="valid.en")  # one final file that did not exist before
    real_replace = Path.replace

    def replace(self: Path, to):
        if self.name == ".test2016.de.partial":  # its temporary onto it
            raise OSError(errno.EACCES, "Permission denied", str(self), str(to))
        return real_replace(self, to)

    monkeypatch.setattr(Path, "replace", replace)
    assert download.main(["multi30k", str(target)]) == 1
    err = capsys.readouterr().err.strip()
    assert f"cannot write {target / 'test2016.de'} (Permission denied)" in err
    assert ".partial" not in err and ".old" not in err
    assert not (target / "valid.en").exists()
    assert {(target / n).read_text() for n in NAMES if n != "valid.en"} == {"old\n"}
    assert sorted(p.name for p in target.iterdir()) == sorted(set(NAMES) - {"valid.en"})

    monkeypatch.setattr(Path, "replace", real_replace)
    assert download.main(["multi30k", str(target)]) == 0
    assert {(target / n).read_text() for n in NAMES} == {"new\n"}
    assert sorted(p.name for p in target.iterdir()) == sorted(NAMES)


def test_ctrl_c_among_the_renames_puts_back_every_old_file(tmp_path, monkeypatch, fetched):
    """Ctrl-C while the files are renamed into place: every file is back as it was, none
    missing, no temporary or kept old copy left (a stale one from a killed run included)."""
    target = tmp_path / "m"
    _old(target, skip="valid.en")
    (target / ".train.en.old").write_text("stale\n")
    real_replace = Path.replace

    def replace(self: Path, to):
        if self.name == ".valid.de.partial":
            raise KeyboardInterrupt
        return real_replace(self, to)

    monkeypatch.setattr(Path, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        download.write("multi30k", target, fetched)
    assert not (target / "valid.en").exists()
    assert {(target / n).read_text() for n in NAMES if n != "valid.en"} == {"old\n"}
    assert sorted(p.name for p in target.iterdir()) == sorted(set(NAMES) - {"valid.en"})
