"""Packed batches: several pairs laid end to end in rows of one fixed width.

A packed batch has the arrays of a padded one, each [rows, width], and four more:

  `src`, `tgt_in`, `tgt_out`     as in `data.batching`: ids + EOS, BOS + ids, ids + EOS
  `src_segments`, `tgt_segments` int32: 1, 2, 3, ... for the pairs of a row, in order; 0 on
                                 padding. Pair k's source and target have the same segment.
  `src_positions`, `tgt_positions` int32: each token's position in its own pair, from 0.

Every training step then has one shape, [rows, width], with almost no padding. The model
keeps pairs apart with the segments (attention never crosses them) and restarts positions at
every pair; the loss counts every target token once (`transformer.training`).

Packing an epoch: the pairs in a seeded random order (seed, epoch) go one by one into the
open row they fill best (the least room left on both sides after it), among a few open rows;
when none has room, the fullest open row is closed and a new one opened. Rows are never
split and hold whole pairs only. Batches take `rows` consecutive rows; the last batch of an
epoch is completed with empty rows. The plan is a pure function of the data, the settings,
the seed and the epoch, the same on every process, and each pair of the epoch is in exactly
one row.
"""

from __future__ import annotations

import array
import dataclasses

import numpy as np

from data.config import BatchConfig, DataError
from data.tokenizer import SpecialIds

# Rows open at once: more pack tighter, and each pair looks at every open row (figures in
# docs/performance.md, "Batch shapes and padding").
OPEN_ROWS = 32
_NO_ROOM = 1 << 30
_SLOTS = range(OPEN_ROWS)
# The arrays of a packed batch, each [rows, width] int32.
PACKED_KEYS = ("src", "tgt_in", "tgt_out", "src_segments", "tgt_segments", "src_positions",
               "tgt_positions")


@dataclasses.dataclass(frozen=True)
class PackedBatch:
    """One global batch of packed rows, as two flat arrays (an epoch of a large corpus has
    millions of rows: an array object per row would cost more than the pairs).

    Row r holds the pairs (positions in `Examples`) `pairs[ends[r - 1]:ends[r]]` (from 0 for
    r = 0), in row order; a row with none is all padding.
    """

    width: int
    pairs: np.ndarray  # [p] int64
    ends: np.ndarray  # [rows] int64

    @classmethod
    def of_rows(cls, width: int, rows) -> "PackedBatch":
        """The batch whose row r holds the pairs `rows[r]`."""
        counts = np.array([len(row) for row in rows], np.int64)
        pairs = np.concatenate([np.asarray(row, np.int64) for row in rows] or [np.zeros(0)])
        return cls(width, pairs.astype(np.int64), np.cumsum(counts))

    @property
    def num_rows(self) -> int:
        return len(self.ends)

    @property
    def counts(self) -> np.ndarray:
        """[rows] pairs in each row."""
        return np.diff(self.ends, prepend=0)

    @property
    def rows(self) -> list[np.ndarray]:
        """The pairs of each row (views of `pairs`)."""
        return np.split(self.pairs, self.ends[:-1])

    def row_range(self, first: int, last: int) -> tuple[np.ndarray, np.ndarray]:
        """(pairs, counts) of rows [first, last)."""
        start = int(self.ends[first - 1]) if first else 0
        end = int(self.ends[last - 1]) if last else 0
        return self.pairs[start:end], self.counts[first:last]


def fit_width(config: BatchConfig, src_len: np.ndarray, tgt_len: np.ndarray) -> BatchConfig:
    """`config` with the width of the pairs it will pack: the longest side among them
    (EOS or BOS included), rounded up to a multiple of 8. A set `pack_width` stays."""
    if not config.packing or config.pack_width is not None or not len(src_len):
        return config
    longest = int(max(src_len.max(), tgt_len.max()))
    return dataclasses.replace(config, fitted_width=-(-longest // 8) * 8)


def pack_rows(src_len: np.ndarray, tgt_len: np.ndarray, order: np.ndarray, width: int
              ) -> list[np.ndarray]:
    """Rows of pair indices, each pair whole: the pairs taken in `order`, sides of lengths
    `src_len` and `tgt_len` (EOS or BOS included), every row's sides at most `width` long."""
    pairs, ends = pack_flat(src_len, tgt_len, order, width)
    return np.split(pairs, ends[:-1]) if len(ends) else []


def pack_flat(src_len: np.ndarray, tgt_len: np.ndarray, order: np.ndarray, width: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """`pack_rows` as (pairs [p] int64, row ends [rows] int64), as `PackedBatch` holds them.

    Plain Python over lists: with only `OPEN_ROWS` rows to look at per pair, a loop is
    three times faster than numpy calls on arrays that small (4.5M pairs in about 10 s).
    """
    if len(order) and max(src_len[order].max(), tgt_len[order].max()) > width:
        raise DataError(f"a pair longer than the row width {width} cannot be packed")
    free_src = [-1] * OPEN_ROWS  # -1: no row open in this slot
    free_tgt = [-1] * OPEN_ROWS
    members: list[list[int]] = [[] for _ in range(OPEN_ROWS)]
    packed, ends = array.array("q"), array.array("q")  # 8 bytes a pair, 8 a row
    for pair, s, t in _in_order(src_len, tgt_len, order):
        slot, least_room = -1, _NO_ROOM
        for k in _SLOTS:  # the open row that the pair fills best; the first on ties
            if free_src[k] >= s and free_tgt[k] >= t:
                room = free_src[k] - s + free_tgt[k] - t
                if room < least_room:
                    slot, least_room = k, room
        if slot < 0:
            # Close the fullest open row (or use an empty slot) and start a new row there.
            fullest = _NO_ROOM
            for k in _SLOTS:
                free = -1 if free_src[k] < 0 else free_src[k] + free_tgt[k]
                if free < fullest:
                    slot, fullest = k, free
            if members[slot]:
                packed.extend(members[slot])
                ends.append(len(packed))
            members[slot], free_src[slot], free_tgt[slot] = [], width, width
        members[slot].append(pair)
        free_src[slot] -= s
        free_tgt[slot] -= t
    for row in members:
        if row:
            packed.extend(row)
            ends.append(len(packed))
    return (np.frombuffer(packed, np.int64).copy() if packed else np.zeros(0, np.int64),
            np.frombuffer(ends, np.int64).copy() if ends else np.zeros(0, np.int64))


def _in_order(src_len: np.ndarray, tgt_len: np.ndarray, order: np.ndarray, chunk: int = 1 << 16):
    """(pair, source length, target length) as Python ints, in `order`, converted a chunk
    at a time: a list of a whole corpus's ints would take 36 bytes a pair."""
    for start in range(0, len(order), chunk):
        pairs = order[start:start + chunk]
        yield from zip(pairs.tolist(), src_len[pairs].tolist(), tgt_len[pairs].tolist())


def pack_epoch(src_len: np.ndarray, tgt_len: np.ndarray, config: BatchConfig, epoch: int,
               shuffle: bool = True) -> list[PackedBatch]:
    """The packed global batches of one epoch, identical on every process. Without
    `shuffle` the pairs are taken in corpus order (evaluation)."""
    width, per_batch = config.width, config.rows_per_batch
    rng = np.random.default_rng([config.seed, epoch])
    order = rng.permutation(len(src_len)) if shuffle else np.arange(len(src_len))
    pairs, ends = pack_flat(src_len, tgt_len, order, width)
    ends = np.concatenate([ends, np.full(-len(ends) % per_batch, len(pairs), np.int64)])
    batches = []
    for first in range(0, len(ends), per_batch):
        start = int(ends[first - 1]) if first else 0
        rows = ends[first:first + per_batch]
        batches.append(PackedBatch(width, pairs[start:int(rows[-1])], rows - start))
    return batches


def _fill(ragged, pairs: np.ndarray, counts: np.ndarray, width: int, bos: bool, eos: bool,
          special: SpecialIds) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, segments, positions), each [len(counts), width] int32, of one side of the pairs:
    row r lays the next `counts[r]` store rows of `pairs` (rows of `ragged`) end to end."""
    ids = np.full((len(counts), width), special.pad, np.int32)
    segments = np.zeros((len(counts), width), np.int32)
    positions = np.zeros((len(counts), width), np.int32)
    if not len(pairs):
        return ids, segments, positions
    starts = ragged.offsets[pairs]
    tokens = ragged.offsets[pairs + 1] - starts  # [p] ids of each pair
    spans = tokens + 1  # with BOS in front or EOS behind
    first_pair = np.cumsum(counts) - counts  # [rows] index in `pairs` of each row's first
    segment = np.arange(len(pairs)) - np.repeat(first_pair, counts) + 1  # [p] 1, 2, ... per row
    ends = np.cumsum(spans)
    filled = counts > 0
    row_start = np.repeat((ends - spans)[first_pair[filled]], counts[filled])
    column = ends - spans - row_start  # [p] where each pair starts in its row
    # One entry per position filled: its row, column and place in its pair.
    place = np.arange(int(spans.sum())) - np.repeat(ends - spans, spans)
    row = np.repeat(np.repeat(np.arange(len(counts)), counts), spans)
    col = np.repeat(column, spans) + place
    offset = place - int(bos)  # index into the pair's ids; -1 is BOS, `tokens` is EOS
    is_id = (offset >= 0) & (offset < np.repeat(tokens, spans))
    values = np.full(len(place), special.bos if bos else special.eos, np.int32)
    values[is_id] = ragged.values[(np.repeat(starts, spans) + offset)[is_id]]
    if not bos and not eos:
        values[~is_id] = special.pad
    ids[row, col] = values
    segments[row, col] = np.repeat(segment, spans)
    positions[row, col] = place
    return ids, segments, positions


def packed_arrays(examples, batch: PackedBatch, process_index: int = 0,
                  process_count: int = 1) -> dict[str, np.ndarray]:
    """This process's rows of a packed batch, [rows / processes, width] each."""
    if batch.num_rows % process_count:
        raise DataError(f"a batch of {batch.num_rows} rows cannot be split over "
                        f"{process_count} processes; the device count must be a multiple of "
                        "the process count")
    local = batch.num_rows // process_count
    pairs, counts = batch.row_range(process_index * local, (process_index + 1) * local)
    pairs = examples.store_rows(pairs)
    store, special, width = examples.store, examples.ids, batch.width
    src, src_segments, src_positions = _fill(store.src, pairs, counts, width, bos=False,
                                             eos=True, special=special)
    tgt_in, tgt_segments, tgt_positions = _fill(store.tgt, pairs, counts, width, bos=True,
                                                eos=False, special=special)
    tgt_out, _, _ = _fill(store.tgt, pairs, counts, width, bos=False, eos=True, special=special)
    return {"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out,
            "src_segments": src_segments, "tgt_segments": tgt_segments,
            "src_positions": src_positions, "tgt_positions": tgt_positions}
