"""Encoded pairs on disk, read back memory-mapped: the token store that batches gather from.

A store is a directory with, for each side (`src`, `tgt`), the ids of every pair end to end
(`SIDE.ids`, int32, no BOS or EOS) and where each pair starts (`SIDE.offsets`, int64, one more
than the pairs), plus `store.json` with the counts. Both files are raw little-endian arrays, so
a corpus of any size opens in constant time and memory: pages are read when a batch touches
them, and the operating system may drop them again. Only the lengths (`Ragged.lengths`) are
ever read whole.

Stores are written from Arrow tables in chunks (`write_store`) and several stores of
consecutive rows join into one by copying files (`join_stores`), so encoding can be shared
between processes without any of them holding the corpus.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa

from data.config import DataError
from transformer.atomic_files import write_atomically

SIDES = ("src", "tgt")
META_FILE = "store.json"
_COPY_BLOCK = 64 << 20


@dataclasses.dataclass(frozen=True)
class Ragged:
    """Lists of ids laid end to end: row k is `values[offsets[k]:offsets[k + 1]]`."""

    values: np.ndarray  # [tokens] int32, memory-mapped for a store on disk
    offsets: np.ndarray  # [rows + 1] int64

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        """[rows] int32 ids per row, read in one pass over the offsets."""
        return np.diff(self.offsets).astype(np.int32)

    def row(self, k: int) -> np.ndarray:
        return np.asarray(self.values[self.offsets[k]:self.offsets[k + 1]])

    def to_lists(self) -> list[list[int]]:
        """Every row as a list of ints (for tests and small stores)."""
        return [self.row(k).tolist() for k in range(len(self))]


@dataclasses.dataclass(frozen=True)
class TokenStore:
    """The encoded pairs of one split: `src` and `tgt` ids of the same rows."""

    src: Ragged
    tgt: Ragged
    path: Path | None = None  # None for a store built in memory

    def __len__(self) -> int:
        return len(self.src)

    @classmethod
    def open(cls, path: str | Path) -> "TokenStore":
        """The store in directory `path`, memory-mapped read-only. Raises `DataError` naming
        the store when it is incomplete or damaged (`store_damage`)."""
        path = Path(path)
        damage = store_damage(path)
        if damage is not None:
            raise DataError(f"{path}: encoded store is incomplete or damaged ({damage}); "
                            "delete that directory and run again to encode the data anew")
        meta = json.loads((path / META_FILE).read_text())
        sides = [Ragged(_map(path / f"{side}.ids", np.int32, meta[f"{side}_tokens"]),
                        _map(path / f"{side}.offsets", np.int64, meta["rows"] + 1))
                 for side in SIDES]
        return cls(*sides, path=path)

    @classmethod
    def from_lists(cls, src: Iterable[Iterable[int]], tgt: Iterable[Iterable[int]]
                   ) -> "TokenStore":
        """A store in memory, for tests and small inputs."""
        return cls(*(_ragged(rows) for rows in (src, tgt)))


def _ragged(rows: Iterable[Iterable[int]]) -> Ragged:
    lists = [np.asarray(list(row), np.int32) for row in rows]
    offsets = np.zeros(len(lists) + 1, np.int64)
    np.cumsum([len(x) for x in lists], out=offsets[1:])
    values = np.concatenate(lists) if lists else np.zeros(0, np.int32)
    return Ragged(values.astype(np.int32), offsets)


def _map(path: Path, dtype, count: int) -> np.ndarray:
    if count == 0:  # a memory map of zero bytes is an error
        return np.zeros(0, dtype)
    return np.memmap(path, dtype=np.dtype(dtype).newbyteorder("<"), mode="r", shape=(count,))


def _file_sizes(meta: dict) -> dict[str, int]:
    """Bytes of each file of a store with metadata `meta`."""
    sizes = {}
    for side in SIDES:
        sizes[f"{side}.ids"] = 4 * meta[f"{side}_tokens"]
        sizes[f"{side}.offsets"] = 8 * (meta["rows"] + 1)
    return sizes


def store_damage(path: str | Path) -> str | None:
    """What makes the store in directory `path` unusable (no metadata, or a file missing or
    of another size than the metadata says), None when it is complete. A store this user
    may not read is not damaged: `DataError` says so (another user's, in a shared cache)."""
    path = Path(path)
    try:
        meta = json.loads((path / META_FILE).read_text())
        sizes = _file_sizes(meta)
    except FileNotFoundError:
        return f"no {META_FILE}"
    except PermissionError as err:
        raise _not_readable(path, err) from err
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"{META_FILE} unreadable: {err}"
    for name, size in sizes.items():
        try:
            found = (path / name).stat().st_size
        except PermissionError as err:
            raise _not_readable(path, err) from err
        except OSError:
            return f"{name} missing"
        if found != size:
            return f"{name} holds {found} bytes, not {size}"
    return None


def _not_readable(path: Path, err: PermissionError) -> DataError:
    return DataError(
        f"{err.filename or path}: permission denied reading the encoded store {path}; have "
        f"its owner make it readable (chmod -R a+rX {path}), or set FLAX_NMT_CACHE to a "
        "cache of your own")


def is_store(path: str | Path) -> bool:
    """Whether `path` holds a complete store (its metadata is written last, and every file
    has the size that it gives)."""
    return store_damage(path) is None


class _SideWriter:
    """Appends rows of one side to its `.ids` and `.offsets` files."""

    def __init__(self, directory: Path, side: str):
        self.ids = open(directory / f"{side}.ids", "wb")
        self.offsets = open(directory / f"{side}.offsets", "wb")
        self.tokens = 0
        self.offsets.write(np.zeros(1, "<i8").tobytes())

    def add(self, values: np.ndarray, lengths: np.ndarray) -> None:
        self.ids.write(np.ascontiguousarray(values, "<i4").tobytes())
        ends = self.tokens + np.cumsum(lengths, dtype=np.int64)
        self.offsets.write(ends.astype("<i8").tobytes())
        self.tokens += int(lengths.sum())

    def close(self) -> None:
        for handle in (self.ids, self.offsets):
            with handle:
                _sync(handle)


def _sync(handle) -> None:
    """Put what was written to `handle` on disk, before the rename that publishes its store."""
    handle.flush()
    os.fsync(handle.fileno())


def write_store(directory: str | Path, tables: Iterable, columns=("src_ids", "tgt_ids")) -> int:
    """Write the list-of-int columns `columns` of Arrow `tables` (datasets or pyarrow tables,
    in row order) as a store in `directory`, chunk by chunk. Returns the rows written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    writers = [_SideWriter(directory, side) for side in SIDES]
    rows = 0
    try:
        for table in tables:
            for batch in _record_batches(table):
                for writer, column in zip(writers, columns):
                    lists = batch.column(batch.schema.get_field_index(column))
                    writer.add(_list_values(lists), lists.value_lengths().to_numpy(
                        zero_copy_only=False))
                rows += batch.num_rows
    finally:
        for writer in writers:
            writer.close()
    _write_meta(directory, rows, [w.tokens for w in writers])
    return rows


def _record_batches(table) -> Iterator:
    """The record batches of a pyarrow table or a dataset. A dataset's files are read batch
    by batch, not memory-mapped: mapped, every page read would stay in this process's
    resident memory until the end, as much as the whole encoded corpus."""
    files = [f["filename"] for f in getattr(table, "cache_files", [])]
    if files and getattr(table, "_indices", None) is None and sum(
            arrow_file_rows(name) for name in files) == len(table):
        for name in files:
            with pa.OSFile(name) as source:
                yield from pa.ipc.open_stream(source)
        return
    if getattr(table, "_indices", None) is not None:  # a selection: its rows, in its order
        for chunk in table.with_format("arrow").iter(batch_size=10_000):
            yield from chunk.to_batches()
        return
    yield from getattr(table, "data", table).to_batches()


def arrow_file_rows(path: str) -> int:
    """Rows of an Arrow stream file, read from its batch headers."""
    with pa.memory_map(path) as source:
        return sum(batch.num_rows for batch in pa.ipc.open_stream(source))


def _list_values(lists) -> np.ndarray:
    """The ids of an Arrow list array, end to end (its slice of the child array)."""
    return lists.flatten().to_numpy(zero_copy_only=False)


def _write_meta(directory: Path, rows: int, tokens: list[int]) -> None:
    meta = {"rows": rows, **{f"{side}_tokens": n for side, n in zip(SIDES, tokens)}}
    write_atomically(directory / META_FILE, json.dumps(meta) + "\n")


def join_stores(directory: str | Path, parts: list[str | Path]) -> int:
    """Write the rows of the stores `parts`, in order, as one store in `directory` (a file
    copy, plus the offsets shifted part by part). Returns the rows written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stores = [TokenStore.open(part) for part in parts]
    tokens = []
    for side in SIDES:
        with open(directory / f"{side}.ids", "wb") as ids:
            for part in parts:
                with open(Path(part) / f"{side}.ids", "rb") as source:
                    shutil.copyfileobj(source, ids, _COPY_BLOCK)
            _sync(ids)
        base = 0
        with open(directory / f"{side}.offsets", "wb") as offsets:
            offsets.write(np.zeros(1, "<i8").tobytes())
            for store in stores:
                ragged = getattr(store, side)
                for start in range(1, len(ragged.offsets), _COPY_BLOCK // 8):
                    block = ragged.offsets[start:start + _COPY_BLOCK // 8]
                    offsets.write((block + base).astype("<i8").tobytes())
                base += len(ragged.values)
            _sync(offsets)
        tokens.append(base)
    rows = sum(len(store) for store in stores)
    _write_meta(directory, rows, tokens)
    return rows


def store_bytes(path: str | Path) -> int:
    """Bytes of a store on disk."""
    return sum(os.path.getsize(p) for p in Path(path).iterdir())
