"""Sentence pairs streamed into an Arrow file in the cache, and read back memory-mapped.

However large the corpus, at most `CHUNK_PAIRS` pairs are Python strings at a time: pairs
are stripped, those with an empty side dropped (and counted), and the rest written to
`CACHE/text/KEY.arrow` one record batch at a time. KEY is a digest of the input's content
(the files' bytes, or a dataset's fingerprint) and of how it was read, so a second run with
the same data opens the file in constant time, and the dataset's fingerprint (the key of
its encoding) stays content-based. Input that cannot be read twice (a pipe) is keyed by a
digest of the pairs it gave.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, Sequence

import datasets
import pyarrow as pa

from data.config import DataError, default_cache_dir
from data.disk import ENCODED_BYTES_PER_TEXT_BYTE, TEXT_BYTES_PER_TEXT_BYTE, check_free_space
from data.lines import is_regular_file, recording_carriage_returns, warn_carriage_returns
from transformer.atomic_files import atomic_file, write_atomically

log = logging.getLogger("data")

CHUNK_PAIRS = 50_000
_VERSION = "2"  # raised when reading changes what a file gives (2: lines with NUL refused)
_SCHEMA = pa.schema([("source", pa.string()), ("target", pa.string())])
_DIGEST_BLOCK = 8 << 20


def file_digest(paths: Iterable[str | Path], how: str) -> str | None:
    """A digest of the bytes of `paths` and of `how` they are read; None when one is not a
    regular file (a pipe can be read only once)."""
    digest = hashlib.blake2b(f"{_VERSION}|{how}".encode(), digest_size=16)
    for path in paths:
        if not is_regular_file(path):
            return None
        with open(path, "rb") as handle:
            while block := handle.read(_DIGEST_BLOCK):
                digest.update(block)
        digest.update(b"\0end of file\0")
    return digest.hexdigest()


def _text_dir(cache_dir: str | Path | None) -> Path:
    return (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "text"


def open_pairs(path: Path, key: str) -> datasets.Dataset:
    """The `source`/`target` dataset in Arrow file `path`, memory-mapped."""
    table = datasets.table.MemoryMappedTable.from_file(str(path))
    return datasets.Dataset(table, fingerprint=key)


class _Counts:
    """Pairs read, kept, and dropped for an empty side; the carriage-return warnings given."""

    def __init__(self):
        self.read = self.kept = self.empty_src = self.empty_tgt = 0
        # (file, lines, first line) per file that `iter_lines` warned of carriage returns in;
        # the file by its position among the input's files, a copy elsewhere shares the entry.
        self.carriage_returns: list[tuple[int, int, int]] = []

    def log(self, origin: str, cached: Path | None = None) -> None:
        """The counts, as the first reading found them when read from `cached`."""
        dropped = self.read - self.kept
        if dropped:
            both = self.empty_src + self.empty_tgt - dropped  # counted in each of the two
            parts = f"{self.empty_src - both} empty source, {self.empty_tgt - both} empty target"
            log.info("%s: dropped %d of %d pairs with an empty side (%s%s)", origin, dropped,
                     self.read, parts, f", {both} both empty" if both else "")
        if cached is None:
            log.info("%s: %d pairs", origin, self.kept)
        else:
            log.info("%s: %d pairs, read before (cache %s)", origin, self.kept, cached)

    def to_json(self) -> dict:
        return dict(vars(self))

    @classmethod
    def from_json(cls, values: dict) -> "_Counts":
        counts = cls()
        for name in vars(counts):
            if name != "carriage_returns":
                setattr(counts, name, values[name])
        # Absent from the entries written before the warnings were kept: none to repeat.
        counts.carriage_returns = [(int(file), int(lines), int(first))
                                   for file, lines, first in values.get("carriage_returns", [])]
        return counts


def _write(pairs: Iterable[tuple[str, str]], sink: BinaryIO, digest) -> _Counts:
    """Write the stripped pairs with two non-empty sides to `sink` as an Arrow stream, chunk
    by chunk; `digest` sees each pair kept."""
    counts = _Counts()
    with pa.ipc.new_stream(sink, _SCHEMA) as writer:
        sources: list[str] = []
        targets: list[str] = []
        for source, target in pairs:
            counts.read += 1
            source, target = source.strip(), target.strip()
            counts.empty_src += not source
            counts.empty_tgt += not target
            if source and target:
                sources.append(source)
                targets.append(target)
                if digest is not None:
                    digest.update(f"{len(source)}:{source}{len(target)}:{target}".encode())
                if len(sources) == CHUNK_PAIRS:
                    writer.write_batch(pa.record_batch([sources, targets], schema=_SCHEMA))
                    counts.kept += len(sources)
                    sources, targets = [], []
        if sources or not counts.kept:
            writer.write_batch(pa.record_batch([sources, targets], schema=_SCHEMA))
            counts.kept += len(sources)
    return counts


def _open_cached(directory: Path, key: str, origin: str, files: Sequence[str | Path]
                 ) -> datasets.Dataset | None:
    """The dataset of cache entry `key` (`KEY.json` and `KEY.arrow`), or None when it is
    absent, or incomplete or damaged (a file removed, truncated or overwritten), which the
    caller then writes again. The carriage-return warnings of its first reading are given
    again, naming `files`, the input's files."""
    meta, arrow = directory / f"{key}.json", directory / f"{key}.arrow"
    if not meta.is_file():
        return None
    try:
        counts = _Counts.from_json(json.loads(meta.read_text()))
        dataset = open_pairs(arrow, key)
        if len(dataset) != counts.kept:
            raise ValueError(f"{len(dataset)} pairs, not the {counts.kept} written")
        carriage_returns = [(str(files[file]), lines, first)
                            for file, lines, first in counts.carriage_returns]
    except (OSError, ValueError, KeyError, IndexError, TypeError, pa.ArrowException) as err:
        log.warning("%s: the text cache entry %s is incomplete or damaged (%s); reading the "
                    "input again", origin, arrow, err)
        return None
    for where, lines, first in carriage_returns:
        warn_carriage_returns(where, lines, first)
    counts.log(origin, cached=arrow)
    return dataset


def cached_pairs(pairs: Iterator[tuple[str, str]], origin: str, key: str | None,
                 input_bytes: int = 0, cache_dir: str | Path | None = None,
                 files: Sequence[str | Path] = ()) -> datasets.Dataset:
    """The pairs of `pairs` as a memory-mapped `source`/`target` dataset, from the cache
    when `key` (a digest of the input, `file_digest`) is there, else streamed into it.
    `files` are the files that `pairs` reads: the carriage returns warned of in one
    (`iter_lines`) are warned of again when the pairs come from the cache.

    `input_bytes` (the size of the input, 0 if unknown) checks the disk before reading: the
    text and its encoding must fit. Raises `DataError` when no pair has two non-empty sides.
    """
    directory = _text_dir(cache_dir)
    if key is not None and (cached := _open_cached(directory, key, origin, files)) is not None:
        return cached
    check_free_space(directory, (TEXT_BYTES_PER_TEXT_BYTE + ENCODED_BYTES_PER_TEXT_BYTE)
                     * input_bytes, f"reading and encoding {origin}")
    directory.mkdir(parents=True, exist_ok=True)
    digest = hashlib.blake2b(f"{_VERSION}|pairs".encode(), digest_size=16)

    def publish(written: Path, path: Path) -> None:
        # Input read once is named by a digest of its pairs, known only once they are written.
        os.replace(written, path if key else directory / f"{digest.hexdigest()}.arrow")

    names = [str(file) for file in files]
    with (atomic_file(directory / f"{key or 'stream'}.arrow", publish=publish) as sink,
          recording_carriage_returns() as carriage_returns):
        counts = _write(pairs, sink, digest if key is None else None)
        counts.carriage_returns = [(names.index(where), lines, first)
                                   for where, lines, first in carriage_returns if where in names]
        counts.log(origin)
        if not counts.kept:
            raise DataError(
                f"{origin}: no sentence pairs ({counts.read} read, {counts.read} with an "
                "empty side); check the path and the language codes")
    key = key or digest.hexdigest()
    write_atomically(directory / f"{key}.json", json.dumps({"origin": origin, **counts.to_json()})
                     + "\n")
    return open_pairs(directory / f"{key}.arrow", key)
