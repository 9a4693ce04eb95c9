"""Fetch the corpora the recipes use: `python -m data.download {multi30k,enja} DIR`.

Writes DIR/{train,valid,TEST}.{src,tgt}, plain UTF-8 with one sentence per line, from the
upstream repositories at fixed commits (the raw, cased files; decompressed and renamed only).
The recipes read data/multi30k and data/enja (from the repository root), so
`python -m data.download multi30k data/multi30k` needs nothing more; another DIR is named by
the recipes' variable: `MULTI30K=DIR python train.py --config configs/multi30k_small.yaml`
(`ENJA=DIR` for configs/enja_small.yaml). Needs network; everything else in this project runs
offline.
"""

from __future__ import annotations

import argparse
import errno
import gzip
import http.client
import os
import shutil
import sys
import urllib.error
import urllib.request
import zlib
from pathlib import Path

# name -> (base URL, {our file: upstream file}, the variable the recipes read, its default)
CORPORA = {
    "multi30k": (
        "https://raw.githubusercontent.com/multi30k/dataset/"
        "a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1/raw/",
        {f"{ours}.{lang}": f"{theirs}.{lang}.gz"
         for ours, theirs in (("train", "train"), ("valid", "val"),
                              ("test2016", "test_2016_flickr"))
         for lang in ("en", "de", "fr")},
        "MULTI30K", "data/multi30k"),
    "enja": (
        "https://raw.githubusercontent.com/odashi/small_parallel_enja/"
        "312408a11c5fbcbc09443bebb18121f7efdcd61e/",
        {f"{ours}.{lang}": f"{theirs}.{lang}"
         for ours, theirs in (("train", "train"), ("valid", "dev"), ("test", "test"))
         for lang in ("en", "ja")},
        "ENJA", "data/enja"),
}


# What a fetch that did not complete raises: no network, a dropped connection
# (IncompleteRead is an HTTPException), or a .gz cut short (EOFError, zlib.error).
_FETCH_ERRORS = (urllib.error.URLError, TimeoutError, OSError, http.client.HTTPException,
                 EOFError, zlib.error)


def download(name: str, directory: Path) -> None:
    """Fetch every file of corpus `name`, then write them into `directory`."""
    write(name, directory, fetch(name))


def fetch(name: str) -> dict[str, bytes]:
    """Our file name -> its bytes, decompressed, for every file of corpus `name`."""
    base, files, _, _ = CORPORA[name]
    fetched = {}
    for ours, theirs in files.items():
        with urllib.request.urlopen(base + theirs, timeout=60) as response:
            data = response.read()
        fetched[ours] = gzip.decompress(data) if theirs.endswith(".gz") else data
    return fetched


def write(name: str, directory: Path, fetched: dict[str, bytes]) -> None:
    """Write the files of corpus `name` into `directory`, created if needed. Each is written
    under a temporary name and all are renamed into place only once every one is written and
    no destination is in the way (a directory); a rename that still fails puts back the files
    renamed before it. A failure (a full disk) leaves the files an earlier run wrote as they
    were, never new ones beside old, and no directory that it created; its error names the
    final file, not the temporary."""
    _, _, variable, default = CORPORA[name]
    created = _missing_directories(directory)
    staged = {directory / ours: directory / f".{ours}.partial" for ours in fetched}
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for (final, partial), data in zip(staged.items(), fetched.values()):
            try:
                partial.write_bytes(data)
            except OSError as err:
                err.filename = str(final)  # the file the user asked for, not its temporary
                raise
        for final in staged:
            if final.is_dir():
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(final))
        _replace_all(staged)
    except BaseException:
        for partial in staged.values():
            partial.unlink(missing_ok=True)
        if created:
            shutil.rmtree(created[-1], ignore_errors=True)  # the outermost one it created
        raise
    for final, data in zip(staged, fetched.values()):
        lines = data.count(b"\n")
        print(f"{final}: {lines} lines", flush=True)
    if directory.resolve() == Path(default).resolve():
        print("Done. The recipes read it from here: python train.py --config configs/...")
    else:
        print(f"Done. Use it with: {variable}={directory} python train.py --config configs/...")


def _replace_all(staged: dict[Path, Path]) -> None:
    """Rename each temporary onto its final file, all or none: each old file is first kept
    as a second link (or copy), so that every rename stays atomic and a failure or Ctrl-C
    puts back every file renamed before it."""
    done: list[tuple[Path, Path | None]] = []  # (final, its old file kept aside, or None)
    try:
        for final, partial in staged.items():
            aside = None
            if os.path.lexists(final):
                aside = final.with_name(f".{final.name}.old")
                aside.unlink(missing_ok=True)  # left by a run that was killed
                _keep(final, aside)
            done.append((final, aside))
            try:
                partial.replace(final)
            except OSError as err:
                err.filename = str(final)  # the file the user asked for, not its temporary
                raise
    except BaseException:
        for renamed, old in reversed(done):
            if old is None:
                renamed.unlink(missing_ok=True)
            elif os.path.lexists(renamed) and os.path.samefile(old, renamed):
                old.unlink()  # not replaced yet (renaming a link onto itself does nothing)
            else:
                old.replace(renamed)
        raise
    for _, aside in done:
        if aside is not None:
            aside.unlink(missing_ok=True)


def _keep(path: Path, aside: Path) -> None:
    """`aside` as a second name of `path` (a copy where the file system has no hard links)."""
    try:
        os.link(path, aside)
    except OSError:
        shutil.copy2(path, aside)


def _missing_directories(directory: Path) -> list[Path]:
    """`directory` and those of its parents that do not exist yet, innermost first."""
    missing = []
    while not directory.exists() and directory != directory.parent:
        missing.append(directory)
        directory = directory.parent
    return missing


def _unusable(directory: Path) -> str | None:
    """Why `directory` cannot receive the corpus, or None."""
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing == directory and not directory.is_dir():
        return f"{directory}: exists and is not a directory; give a directory (new or existing)"
    if not existing.is_dir():
        return f"{directory}: {existing} is a file, not a directory; choose another path"
    return None


def by_hand(name: str, directory: Path) -> str:
    """How to get corpus `name` into `directory` without this command: which files to fetch,
    and how they are decompressed and renamed."""
    base, files, _, _ = CORPORA[name]
    renames = ", ".join(f"{theirs} -> {ours}" for ours, theirs in files.items())
    gunzip = " (gunzip each .gz first)" if any(f.endswith(".gz") for f in files.values()) else ""
    return (f"fetch {base}FILE for each file below on a machine with network access, then put "
            f"them in {directory} renamed{gunzip}: {renames}")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, as every command of the project
        print(f"{self.prog}: error: {message}; see {self.prog} --help", file=sys.stderr)
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m data.download", description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", choices=sorted(CORPORA))
    parser.add_argument("directory", type=Path)
    args = parser.parse_args(argv)
    problem = _unusable(args.directory)
    if problem:
        print(f"{parser.prog}: error: {problem}", file=sys.stderr)
        return 2
    try:
        fetched = fetch(args.corpus)  # all of it before anything is written
    except _FETCH_ERRORS as err:
        reason = getattr(err, "reason", err)
        print(f"{parser.prog}: error: cannot fetch {args.corpus} ({reason}); this needs "
              "network access to raw.githubusercontent.com. By hand: "
              f"{by_hand(args.corpus, args.directory)}", file=sys.stderr)
        return 1
    try:
        write(args.corpus, args.directory, fetched)
    except OSError as err:
        fix = ("move it out of the way" if isinstance(err, IsADirectoryError)
               else "free some space")
        print(f"{parser.prog}: error: cannot write {err.filename or args.directory} "
              f"({err.strerror or err}); {fix} or choose another directory, and run it again",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
