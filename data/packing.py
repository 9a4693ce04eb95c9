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

import dataclasses

import numpy as np

from data.config import BatchConfig, DataError
from data.tokenizer import SpecialIds

# Rows open at once: more pack tighter, and each pair looks at every open row (figures in
# docs/performance.md, "Batch shapes and padding").
OPEN_ROWS = 32
_NO_ROOM = 1 << 30
# The arrays of a packed batch, each [rows, width] int32.
PACKED_KEYS = ("src", "tgt_in", "tgt_out", "src_segments", "tgt_segments", "src_positions",
               "tgt_positions")


@dataclasses.dataclass(frozen=True)
class PackedBatch:
    """One global batch of packed rows: `rows[r]` lists the pairs (positions in `Examples`)
    of row r, in row order; an empty list is an all-padding row."""

    width: int
    rows: tuple[np.ndarray, ...]


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
    if len(order) and max(src_len[order].max(), tgt_len[order].max()) > width:
        raise DataError(f"a pair longer than the row width {width} cannot be packed")
    free_src = np.full(OPEN_ROWS, -1, np.int64)  # -1: no row open in this slot
    free_tgt = np.full(OPEN_ROWS, -1, np.int64)
    members: list[list[int]] = [[] for _ in range(OPEN_ROWS)]
    rows: list[np.ndarray] = []
    for pair in order.tolist():
        s, t = src_len[pair], tgt_len[pair]
        room_left = np.where((free_src >= s) & (free_tgt >= t),
                             free_src - s + free_tgt - t, _NO_ROOM)
        slot = int(np.argmin(room_left))
        if room_left[slot] == _NO_ROOM:
            # Close the fullest open row (or use an empty slot) and start a new row there.
            slot = int(np.argmin(np.where(free_src < 0, -1, free_src + free_tgt)))
            if members[slot]:
                rows.append(np.asarray(members[slot], np.int64))
            members[slot], free_src[slot], free_tgt[slot] = [], width, width
        members[slot].append(pair)
        free_src[slot] -= s
        free_tgt[slot] -= t
    rows += [np.asarray(m, np.int64) for m in members if m]
    return rows


def pack_epoch(src_len: np.ndarray, tgt_len: np.ndarray, config: BatchConfig, epoch: int,
               shuffle: bool = True) -> list[PackedBatch]:
    """The packed global batches of one epoch, identical on every process. Without
    `shuffle` the pairs are taken in corpus order (evaluation)."""
    width, per_batch = config.width, config.rows_per_batch
    rng = np.random.default_rng([config.seed, epoch])
    order = rng.permutation(len(src_len)) if shuffle else np.arange(len(src_len))
    rows = pack_rows(src_len, tgt_len, order, width)
    empty = np.zeros(0, np.int64)
    rows += [empty] * (-len(rows) % per_batch)
    return [PackedBatch(width, tuple(rows[b:b + per_batch]))
            for b in range(0, len(rows), per_batch)]


def _fill(values: np.ndarray, offsets: np.ndarray, rows: tuple[np.ndarray, ...], width: int,
          bos: bool, eos: bool, special: SpecialIds
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, segments, positions), each [len(rows), width] int32, of one side of the pairs."""
    ids = np.full((len(rows), width), special.pad, np.int32)
    segments = np.zeros((len(rows), width), np.int32)
    positions = np.zeros((len(rows), width), np.int32)
    for r, pairs in enumerate(rows):
        start = 0
        for segment, pair in enumerate(pairs.tolist(), start=1):
            tokens = values[offsets[pair]:offsets[pair + 1]]
            length = len(tokens) + 1  # with BOS in front or EOS behind
            span = slice(start, start + length)
            if bos:
                ids[r, start] = special.bos
                ids[r, start + 1:start + length] = tokens
            else:
                ids[r, start:start + length - 1] = tokens
                if eos:
                    ids[r, start + length - 1] = special.eos
            segments[r, span] = segment
            positions[r, span] = np.arange(length)
            start += length
    return ids, segments, positions


def packed_arrays(examples, batch: PackedBatch, process_index: int = 0,
                  process_count: int = 1) -> dict[str, np.ndarray]:
    """This process's rows of a packed batch, [rows / processes, width] each."""
    if len(batch.rows) % process_count:
        raise DataError(f"a batch of {len(batch.rows)} rows cannot be split over "
                        f"{process_count} processes; the device count must be a multiple of "
                        "the process count")
    local = len(batch.rows) // process_count
    rows = batch.rows[process_index * local:(process_index + 1) * local]
    src, src_segments, src_positions = _fill(examples.src_values, examples.src_offsets, rows,
                                             batch.width, bos=False, eos=True,
                                             special=examples.ids)
    tgt_in, tgt_segments, tgt_positions = _fill(examples.tgt_values, examples.tgt_offsets,
                                                rows, batch.width, bos=True, eos=False,
                                                special=examples.ids)
    tgt_out, _, _ = _fill(examples.tgt_values, examples.tgt_offsets, rows, batch.width,
                          bos=False, eos=True, special=examples.ids)
    return {"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out,
            "src_segments": src_segments, "tgt_segments": tgt_segments,
            "src_positions": src_positions, "tgt_positions": tgt_positions}
