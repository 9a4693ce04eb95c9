"""Length filtering, token-budget batches padded to fixed bucket shapes, resumable iteration.

A batch is a dict of int32 numpy arrays, the contract with the model:
  `src`     [B, S]  source ids + EOS, padded with the pad id (`Examples.ids`)
  `tgt_in`  [B, T]  BOS + target ids, padded
  `tgt_out` [B, T]  target ids + EOS, padded
Rows that are all padding fill short batches; the loss gives them zero weight.

Shapes. S and T are each one of `BatchConfig.buckets` below `max_len`, or `max_len` itself
(default buckets `DEFAULT_BUCKETS`: steps of 3 up to 26, where most sentences lie, then growing
steps up to 256). Every pair goes to the cell
(S, T) of the smallest buckets that hold its lengths, so pairs in a batch have similar lengths.
Each shape's batch size B is fixed: at most `batch_tokens // max(S, T)` (so the token budget
`B * max(S, T) <= batch_tokens` always holds) and a multiple of `num_devices`. Cells are filled
in order of size. A cell with too few pairs for one full batch passes them on to the next
larger cell (one bucket up in S or T, towards S = T) and makes no shape of its own; a cell with
enough is cut into the fewest batches that fit the budget, all of one size B, its pairs spread
evenly over them (their counts differ by at most one), so no batch is half empty: the all-pad
rows that B's rounding to a multiple of `num_devices` adds are shared out too, not left to the
last batch. Cell sizes do not change between
epochs, so neither do the shapes: a few dozen on real corpora (`plan_stats` reports them).
Sampled segmentations (`data.sampling`) change the lengths every epoch; their epochs keep the
shapes of the deterministic segmentation (`BucketGrid`, `grid_epoch`).

Order. Each epoch's plan (which pairs form which batch, and the order of batches) is a pure
function of the data, the config, the seed and the epoch number, and is the same on every
process. `BatchIterator.state` is `{"epoch": e, "position": p}`: the next batch is batch `p`
of epoch `e`'s plan. Process `i` of `n` builds the arrays of only rows `[i*B/n, (i+1)*B/n)`
of each global batch (`batch_arrays`), ready for `jax.make_array_from_process_local_data`.

The plan of an epoch is `plan_batches`: packed rows (`data.packing.pack_epoch`) or, with
packing off, the bucketed batches above (`bucket_epoch`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
from collections import Counter
from typing import TYPE_CHECKING, Callable, Iterator, NamedTuple, Sequence

import numpy as np

from data.config import DEFAULT_BUCKETS, BatchConfig, DataError
from data.packing import PackedBatch, pack_epoch, packed_arrays
from data.store import Ragged, TokenStore
from data.tokenizer import SpecialIds

if TYPE_CHECKING:  # only for annotations: the batching itself needs no datasets
    import datasets

log = logging.getLogger("data")

Batch = dict[str, np.ndarray]

# A cell whose pairs fill fewer than this many batches passes them to the next cell. The
# smallest value that keeps the number of shapes within `BatchConfig.max_shapes` is used
# (shapes and padding on Multi30k for some values: docs/performance.md).
_MIN_FILLS = (1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, math.inf)


def _bucket_of(length: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= length; beyond the last, the next multiple of 64."""
    if length <= buckets[-1]:
        return buckets[int(np.searchsorted(buckets, length))]
    return 64 * math.ceil(length / 64)


# ---------------------------------------------------------------------------------------------
# Examples: the pairs kept, as lengths and rows of the token store


@dataclasses.dataclass(frozen=True)
class Examples:
    """The encoded pairs kept after filtering: their lengths, and where their ids are.

    Pair k is row `index[k]` of `store` (memory-mapped for a corpus on disk); only the
    lengths and the index are in memory, 16 bytes a pair, whatever the length of the pairs.
    Plans are made from the lengths alone; batches gather their ids from the store.
    """

    store: TokenStore
    index: np.ndarray  # [n] int64 rows of `store`
    src_len: np.ndarray  # [n] int32 source lengths including EOS
    tgt_len: np.ndarray  # [n] int32 target lengths including BOS (tgt_in) or EOS (tgt_out)
    ids: SpecialIds = SpecialIds()  # the pad, BOS and EOS that batches are built with

    def __len__(self) -> int:
        return len(self.index)

    @classmethod
    def of_store(cls, store: TokenStore, ids: SpecialIds = SpecialIds()) -> "Examples":
        """Every pair of `store`, none filtered."""
        return cls(store, np.arange(len(store), dtype=np.int64), store.src.lengths() + 1,
                   store.tgt.lengths() + 1, ids)

    def store_rows(self, positions: np.ndarray) -> np.ndarray:
        """[k] rows of the store of pairs at `positions`; -1 (an all-pad row) stays -1."""
        positions = np.asarray(positions, np.int64)
        return np.where(positions >= 0, self.index[np.maximum(positions, 0)], -1)


@dataclasses.dataclass(frozen=True)
class FilterStats:
    total: int
    empty: int  # a side of no tokens, EOS alone
    too_long: int
    bad_ratio: int
    kept: int


def _flat_ids(encoded: datasets.Dataset, column: str) -> Ragged:
    """A list-of-ids column read whole into memory, chunk by chunk from Arrow."""
    values, lengths = [], []
    for chunk in encoded.data.column(column).chunks:
        values.append(chunk.flatten().to_numpy(zero_copy_only=False).astype(np.int32, copy=False))
        lengths.append(chunk.value_lengths().to_numpy(zero_copy_only=False))
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    if lengths:
        np.cumsum(np.concatenate(lengths), out=offsets[1:])
    flat = np.concatenate(values) if values else np.zeros(0, np.int32)
    return Ragged(flat, offsets)


def store_in_memory(encoded: datasets.Dataset) -> TokenStore:
    """The `src_ids` and `tgt_ids` of an encoded dataset as a store in memory."""
    if encoded._indices is not None:  # a select/shuffle view: lay the rows out in order first
        encoded = encoded.flatten_indices()
    return TokenStore(_flat_ids(encoded, "src_ids"), _flat_ids(encoded, "tgt_ids"))


def too_unequal(src_len: np.ndarray, tgt_len: np.ndarray, max_ratio: float) -> np.ndarray:
    """[N] bool: pairs whose longer side has more than `max_ratio` times the tokens of the
    shorter. Lengths come with EOS or BOS, which the ratio leaves out: 10 tokens to 1 is 10,
    not 11 / 2, as corpus cleaning counts words."""
    src_tokens, tgt_tokens = src_len - 1, tgt_len - 1
    return np.maximum(src_tokens, tgt_tokens) > max_ratio * np.minimum(src_tokens, tgt_tokens)


class LengthLimit(NamedTuple):
    """What sets a split's `BatchConfig.max_len`, and how to raise it, as its errors say."""

    setting: str
    remedy: str


TRAINING_LIMIT = LengthLimit("--max-tokens-per-sentence, at most the model's --max-len",
                             "raise --max-tokens-per-sentence (and --max-len)")
# Validation keeps every pair that the model's positions hold (whatever the training filters).
VALIDATION_LIMIT = LengthLimit("the model's --max-len (validation pairs are never filtered by "
                               "--max-tokens-per-sentence)", "raise --max-len")


def load_examples(encoded: TokenStore | datasets.Dataset, config: BatchConfig = BatchConfig(),
                  name: str = "train", ids: SpecialIds = SpecialIds(),
                  limit: LengthLimit = TRAINING_LIMIT) -> Examples:
    """The pairs of an encoded split (a token store, or a dataset with `src_ids` and
    `tgt_ids`, read into memory) with two non-empty sides that pass the length and
    length-ratio filters. A side is empty when it has no tokens: reading drops blank lines,
    but not those of characters that encode to nothing (U+200B, U+FEFF survive `strip`).

    Reads only the offsets of a store. Logs how many pairs each filter dropped; raises
    `DataError` if none are left, naming `limit` as what sets the length filter.
    """
    store = encoded if isinstance(encoded, TokenStore) else store_in_memory(encoded)
    src_len, tgt_len = store.src.lengths() + 1, store.tgt.lengths() + 1
    empty = (src_len == 1) | (tgt_len == 1)
    too_long = ~empty & ((src_len > config.max_len) | (tgt_len > config.max_len))
    bad_ratio = ~empty & ~too_long & too_unequal(src_len, tgt_len, config.max_ratio)
    keep = np.flatnonzero(~empty & ~too_long & ~bad_ratio)
    stats = FilterStats(len(src_len), int(empty.sum()), int(too_long.sum()),
                        int(bad_ratio.sum()), len(keep))
    log.info(
        "%s: kept %d of %d pairs; dropped %d with an empty side (no tokens), %d longer than "
        "%d positions (tokens + EOS or BOS), %d with token ratio > %g", name, stats.kept,
        stats.total, stats.empty, stats.too_long, config.max_len, stats.bad_ratio,
        config.max_ratio,
    )
    if not len(keep):
        raise DataError(
            f"{name}: no pairs left after filtering {stats.total} pairs ({stats.empty} with an "
            f"empty side; {stats.too_long} longer than {config.max_len} positions, tokens + "
            f"EOS or BOS: {limit.setting}; {stats.bad_ratio} with token ratio > "
            f"{config.max_ratio:g}); {limit.remedy} or check the data"
        )
    if len(keep) < stats.total:
        src_len, tgt_len = src_len[keep], tgt_len[keep]
    return Examples(store, keep.astype(np.int64), src_len, tgt_len, ids)


# ---------------------------------------------------------------------------------------------
# The plan of one epoch


@dataclasses.dataclass(frozen=True)
class PlannedBatch:
    """One global batch: its shape and which pairs fill its rows (-1 = an all-pad row)."""

    src_len: int  # S
    tgt_len: int  # T
    rows: np.ndarray  # [B] int64 positions in Examples, or -1


def _rows_with_counts(batch: PackedBatch) -> np.ndarray:
    """[rows + pairs] int64: each row's pair count, then its pairs, row after row."""
    counts = batch.counts
    heads = batch.ends - counts + np.arange(batch.num_rows)  # where each row's count goes
    out = np.empty(batch.num_rows + len(batch.pairs), np.int64)
    is_pair = np.ones(len(out), bool)
    is_pair[heads] = False
    out[heads] = counts
    out[is_pair] = batch.pairs
    return out


def plan_fingerprint(plan: list[PlannedBatch] | list[PackedBatch]) -> str:
    """A digest of a plan's shapes and rows: equal plans, equal fingerprints."""
    digest = hashlib.sha256()
    for batch in plan:
        if isinstance(batch, PackedBatch):
            digest.update(np.array([-1, batch.width, batch.num_rows], np.int64).tobytes())
            digest.update(_rows_with_counts(batch).tobytes())
            continue
        digest.update(np.array([batch.src_len, batch.tgt_len, len(batch.rows)],
                               np.int64).tobytes())
        digest.update(np.asarray(batch.rows, np.int64).tobytes())
    return digest.hexdigest()[:16]


def plan_batches(examples: "Examples", config: BatchConfig, epoch: int, shuffle: bool = True,
                 grid: "BucketGrid | None" = None) -> list[PlannedBatch] | list[PackedBatch]:
    """One epoch's global batches, as the config lays them out: packed rows
    (`config.packing`, `data.packing.pack_epoch`) or bucketed batches (`bucket_epoch`, or
    `grid_epoch` in the fixed shapes of `grid` where one is given)."""
    if config.packing:
        return pack_epoch(examples.src_len, examples.tgt_len, config, epoch, shuffle)
    if grid is not None:
        return grid_epoch(examples, grid, config, epoch, shuffle)
    return bucket_epoch(examples, config, epoch, shuffle)


def _next_cell(i: int, j: int, counts: np.ndarray) -> tuple[int, int] | None:
    """Where the leftover pairs of cell (i, j) go: one bucket up in S or T, or None at the top.

    Moves the shorter side up first (towards S = T, where most pairs are); on the diagonal,
    into whichever neighbour holds more pairs.
    """
    n = counts.shape[0]
    up_s = (i + 1, j) if i + 1 < n else None
    up_t = (i, j + 1) if j + 1 < n else None
    if up_s is None or up_t is None:
        return up_s or up_t
    if i != j:
        return up_s if i < j else up_t
    return up_s if counts[up_s] >= counts[up_t] else up_t


def _even_rows(pairs: int, max_rows: int, multiple: int) -> int:
    """B that cuts `pairs` into the fewest batches of at most `max_rows`, all of one size:
    the smallest multiple of `multiple` that holds them in that many batches, so those
    batches have fewer than `multiple` all-pad rows each, plus one."""
    n_batches = -(-pairs // max_rows)
    rows = -(-pairs // n_batches)
    return rows + -rows % multiple


def _split_evenly(pool: np.ndarray, rows: int, size_s: int, size_t: int) -> list[PlannedBatch]:
    """Cut `pool` into the fewest batches of `rows` rows, its pairs in order and spread
    evenly: each batch holds floor or ceil(len(pool) / batches) of them, then all-pad rows.
    Left to the last batch, the padding of B rounded up to a multiple of the devices could
    all but empty it (9 pairs, B = 8: 8 and 1 real rows; spread, 5 and 4)."""
    n_batches = -(-len(pool) // rows)
    real = np.full(n_batches, len(pool) // n_batches)
    real[:len(pool) % n_batches] += 1
    padded = np.full((n_batches, rows), -1, np.int64)
    padded[np.arange(rows) < real[:, None]] = pool  # row-major: the pairs keep their order
    return [PlannedBatch(size_s, size_t, batch) for batch in padded]


def _cells(n_buckets: int) -> Iterator[tuple[int, int]]:
    """Cells (i, j) in order of i + j: each comes after every cell that carries pairs into it."""
    for diagonal in range(2 * n_buckets - 1):
        for i in range(max(0, diagonal - n_buckets + 1), min(diagonal, n_buckets - 1) + 1):
            yield i, diagonal - i


def _cell_rows(counts: np.ndarray, buckets: np.ndarray, config: BatchConfig,
               min_fill: float) -> np.ndarray:
    """[n * n] the B of each cell's batches when cells need `min_fill` batches' worth of
    pairs, the ones carried into them included; 0 for a cell whose pairs move on
    (`_next_cell`) or that has none. The one carrying rule of `bucket_epoch` and
    `bucket_grid`: it depends on counts alone, so every epoch gets the same shapes."""
    n = len(buckets)
    pools, rows = counts.copy(), np.zeros(n * n, np.int64)
    for i, j in _cells(n):
        if not pools[i, j]:
            continue
        max_rows = config.rows(int(buckets[i]), int(buckets[j]))
        target = _next_cell(i, j, counts)
        if target is not None and pools[i, j] < min_fill * max_rows:
            pools[target] += pools[i, j]
        else:
            rows[i * n + j] = _even_rows(int(pools[i, j]), max_rows, config.num_devices)
    return rows


def _min_fill(counts: np.ndarray, buckets: np.ndarray, config: BatchConfig) -> float:
    """The smallest fill threshold that keeps the shapes within `config.max_shapes`."""
    for min_fill in _MIN_FILLS:
        if np.count_nonzero(_cell_rows(counts, buckets, config, min_fill)) <= config.max_shapes:
            return min_fill
    return math.inf


def bucket_epoch(examples: Examples, config: BatchConfig, epoch: int, shuffle: bool = True
                 ) -> list[PlannedBatch]:
    """The bucketed global batches of one epoch, identical on every process.

    A cell gets batches of its own when its pairs (with those carried into it) fill at least
    `min_fill` batches, else they move on; `min_fill` is 1 unless more is needed to keep the
    shapes within `config.max_shapes`. It depends only on cell counts, so every epoch has the
    same shapes.
    With `shuffle`, pairs within a cell and the order of batches are permuted by a generator
    seeded with (config.seed, epoch); without, pairs keep corpus order and batches come in
    order of shape (for evaluation).
    """
    buckets = np.asarray(config.used_buckets)
    s_cell = np.searchsorted(buckets, examples.src_len)  # [n]
    t_cell = np.searchsorted(buckets, examples.tgt_len)
    n_buckets = len(buckets)
    counts = np.zeros((n_buckets, n_buckets), dtype=np.int64)
    np.add.at(counts, (s_cell, t_cell), 1)

    rng = np.random.default_rng([config.seed, epoch])
    order = rng.permutation(len(examples)) if shuffle else np.arange(len(examples))
    cell_id = s_cell * n_buckets + t_cell
    order = order[np.argsort(cell_id[order], kind="stable")]  # grouped by cell, random within
    starts = np.concatenate([[0], np.cumsum(counts.ravel())])

    rows = _cell_rows(counts, buckets, config, _min_fill(counts, buckets, config))
    carried: dict[tuple[int, int], np.ndarray] = {}
    batches: list[PlannedBatch] = []
    for i, j in _cells(n_buckets):
        flat = i * n_buckets + j
        own = order[starts[flat]:starts[flat + 1]]
        pool = np.concatenate([carried.pop((i, j)), own]) if (i, j) in carried else own
        if not len(pool):
            continue
        if not rows[flat]:  # too few for batches of their own: the next larger cell takes them
            target = _next_cell(i, j, counts)
            carried[target] = np.concatenate([carried.get(target, pool[:0]), pool])
            continue
        batches += _split_evenly(pool, int(rows[flat]), int(buckets[i]), int(buckets[j]))
    if shuffle:
        batches = [batches[k] for k in rng.permutation(len(batches))]
    return batches


@dataclasses.dataclass(frozen=True)
class BucketGrid:
    """The shapes of a bucketed plan, fixed from one set of lengths, for epochs whose
    lengths change (sampled segmentations, `data.sampling`): their batches keep these
    shapes, so the train step compiles no new one mid-training.

    Cells are flat indices, i * n + j. `rows[c]` is the B of cell c's batches (0: it has
    none). `dest[i, j]` is the cell with batches that takes a pair of cell (i, j): the one
    with the least padding (S + T) that holds it; -1 where none does. `up[c]` is where the
    pairs of cell c that fill no batch of B rows go: the cell with batches and the least
    padding that holds every pair of c; -1 for none (c's last batch is then padded).
    """

    buckets: np.ndarray  # [n] the used buckets
    rows: np.ndarray  # [n * n] int64
    dest: np.ndarray  # [n, n] int64
    up: np.ndarray  # [n * n] int64

    def cells(self, src_len: np.ndarray, tgt_len: np.ndarray) -> np.ndarray:
        """[k] the cell whose batches take each pair; -1 where none holds it."""
        inside = (src_len <= self.buckets[-1]) & (tgt_len <= self.buckets[-1])
        last = len(self.buckets) - 1
        i = np.minimum(np.searchsorted(self.buckets, src_len), last)
        j = np.minimum(np.searchsorted(self.buckets, tgt_len), last)
        return np.where(inside, self.dest[i, j], -1)


def bucket_grid(src_len: np.ndarray, tgt_len: np.ndarray, config: BatchConfig) -> BucketGrid:
    """The shapes that `bucket_epoch` gives pairs of these lengths, as a `BucketGrid`."""
    buckets = np.asarray(config.used_buckets)
    n = len(buckets)
    counts = np.zeros((n, n), dtype=np.int64)
    np.add.at(counts, (np.searchsorted(buckets, src_len), np.searchsorted(buckets, tgt_len)), 1)
    rows = _cell_rows(counts, buckets, config, _min_fill(counts, buckets, config))
    with_batches = sorted(np.flatnonzero(rows).tolist(),  # least padding first
                          key=lambda c: (buckets[c // n] + buckets[c % n], c))

    def holding(i: int, j: int, other_than: int = -1) -> int:
        return next((c for c in with_batches
                     if c // n >= i and c % n >= j and c != other_than), -1)

    dest = np.array([[holding(i, j) for j in range(n)] for i in range(n)], np.int64)
    up = np.full(n * n, -1, np.int64)
    for c in with_batches:
        up[c] = holding(c // n, c % n, other_than=c)
    return BucketGrid(buckets, rows, dest, up)


def grid_epoch(examples: Examples, grid: BucketGrid, config: BatchConfig, epoch: int,
               shuffle: bool = True) -> list[PlannedBatch]:
    """The batches of one epoch in the shapes of `grid` alone. Each pair goes to the cell
    that `grid` gives it; cells in order of size cut their pairs into batches of the grid's
    B and pass those that fill no batch on (`BucketGrid.up`), so only the largest cells
    have all-pad rows. Shuffled as `bucket_epoch`. Raises ValueError for a pair that no
    cell of the grid holds (`SampledEpochs` gives such a pair its deterministic
    segmentation, which always fits)."""
    n = len(grid.buckets)
    cell = grid.cells(examples.src_len, examples.tgt_len)
    if (cell < 0).any():
        k = int(np.flatnonzero(cell < 0)[0])
        raise ValueError(f"pair {k} ({examples.src_len[k]}, {examples.tgt_len[k]} tokens) "
                         "fits no batch shape of the grid")
    rng = np.random.default_rng([config.seed, epoch])
    order = rng.permutation(len(examples)) if shuffle else np.arange(len(examples))
    order = order[np.argsort(cell[order], kind="stable")]  # grouped by cell, random within
    starts = np.concatenate([[0], np.cumsum(np.bincount(cell, minlength=n * n))])
    carried: dict[int, np.ndarray] = {}
    batches: list[PlannedBatch] = []
    for i, j in _cells(n):  # a cell's `up` comes after it
        c = i * n + j
        if not grid.rows[c]:
            continue
        own = order[starts[c]:starts[c + 1]]
        pool = np.concatenate([carried.pop(c), own]) if c in carried else own
        rows, up = int(grid.rows[c]), int(grid.up[c])
        full = len(pool) - len(pool) % rows if up >= 0 else len(pool)
        if full:
            batches += _split_evenly(pool[:full], rows, int(grid.buckets[i]),
                                     int(grid.buckets[j]))
        if full < len(pool):
            carried[up] = np.concatenate([carried.get(up, pool[:0]), pool[full:]])
    if shuffle:
        batches = [batches[k] for k in rng.permutation(len(batches))]
    return batches


# ---------------------------------------------------------------------------------------------
# The arrays of planned batches


def _gather(ragged: Ragged, rows: np.ndarray, width: int, bos: bool, eos: bool,
            special: SpecialIds) -> np.ndarray:
    """[len(rows), width] int32: each row's ids, with BOS before and/or EOS after, padded.

    `rows` are rows of `ragged`; -1 becomes all padding (no BOS or EOS).
    """
    real = rows >= 0
    safe = np.where(real, rows, 0)
    starts = ragged.offsets[safe]  # [b]
    lengths = np.where(real, ragged.offsets[safe + 1] - starts, 0)  # [b]
    shift = int(bos)
    pos = np.arange(width)[None, :] - shift  # [1, width] position in the id list
    inside = (pos >= 0) & (pos < lengths[:, None])  # [b, width]
    out = np.full((len(rows), width), special.pad, dtype=np.int32)
    out[inside] = ragged.values[(starts[:, None] + pos)[inside]]
    if bos:
        out[real, 0] = special.bos
    if eos:
        out[np.flatnonzero(real), lengths[real] + shift] = special.eos
    return out


def batch_arrays(examples: Examples, batch: PlannedBatch | PackedBatch, process_index: int = 0,
                 process_count: int = 1) -> Batch:
    """This process's rows of a planned batch, bucketed (`bucketed_arrays`) or packed
    (`data.packing.packed_arrays`)."""
    if isinstance(batch, PackedBatch):
        return packed_arrays(examples, batch, process_index, process_count)
    return bucketed_arrays(examples, batch, process_index, process_count)


def bucketed_arrays(examples: Examples, batch: PlannedBatch, process_index: int = 0,
                    process_count: int = 1) -> Batch:
    """This process's rows of a bucketed batch as {src [B/P, S], tgt_in [B/P, T], tgt_out}."""
    rows = batch.rows
    if len(rows) % process_count:
        raise DataError(
            f"batch of {len(rows)} rows cannot be split over {process_count} processes; set "
            "num_devices to a multiple of the process count"
        )
    local = len(rows) // process_count
    rows = examples.store_rows(rows[process_index * local:(process_index + 1) * local])
    store, special = examples.store, examples.ids
    return {
        "src": _gather(store.src, rows, batch.src_len, bos=False, eos=True, special=special),
        "tgt_in": _gather(store.tgt, rows, batch.tgt_len, bos=True, eos=False, special=special),
        "tgt_out": _gather(store.tgt, rows, batch.tgt_len, bos=False, eos=True, special=special),
    }


def _jax_process() -> tuple[int, int]:
    import jax  # only here: the rest of the data package does not need JAX

    return jax.process_index(), jax.process_count()


class BatchIterator:
    """Endless training batches over epochs, resumable from `state`.

    `state` is JSON-serializable, {"epoch": e, "position": p}, and names the next batch;
    an iterator built with a saved state yields exactly the batches the original would have.
    Process index and count default to JAX's. `describe`: log the plan of the epoch it starts
    in (off where it is built only to count an epoch's batches).
    """

    def __init__(self, examples: Examples, config: BatchConfig = BatchConfig(), *,
                 state: dict | None = None, process_index: int | None = None,
                 process_count: int | None = None,
                 resegmented: Callable[[int], Examples] | None = None,
                 grid: BucketGrid | None = None, describe: bool = True):
        if process_index is None or process_count is None:
            process_index, process_count = _jax_process()
        if config.num_devices % process_count:
            raise DataError(
                f"num_devices {config.num_devices} is not a multiple of the process count "
                f"{process_count}; pass the global device count (jax.device_count())"
            )
        if not 0 <= process_index < process_count:
            raise DataError(f"process_index {process_index} not in [0, {process_count})")
        self.examples = examples
        self.resegmented = resegmented
        self.config = config
        self.process_index = process_index
        self.process_count = process_count
        state = state or {"epoch": 0, "position": 0}
        self._epoch, self._position = int(state["epoch"]), int(state["position"])
        # Sampled segmentations change the lengths every epoch, but not the shapes: those of
        # the deterministic segmentation (`grid`, where the sampler has built it already).
        if grid is None and resegmented is not None and not config.packing:
            grid = bucket_grid(examples.src_len, examples.tgt_len, config)
        self._grid = grid if resegmented is not None else None
        self._planned_epoch: int | None = None
        self._plan: list[PlannedBatch] = []
        self._planned_examples = examples
        plan = self.plan(self._epoch)
        if describe:
            log.info("batches per epoch: %s",
                     plan_stats(self._planned_examples, config, plan=plan).summary())

    @property
    def state(self) -> dict:
        """{"epoch": int, "position": int} of the next batch."""
        return {"epoch": self._epoch, "position": self._position}

    @property
    def epochs_completed(self) -> int:
        """Epochs whose every batch has been yielded (the current epoch's own count of
        batches, which packing or sampled segmentations make differ between epochs)."""
        return self._epoch + (self._position >= self.batches_per_epoch)

    @property
    def batches_per_epoch(self) -> int:
        """Batches of the current epoch (the same every epoch unless segmentations are
        sampled, which changes the lengths)."""
        return len(self.plan(self._epoch))

    def examples_of(self, epoch: int) -> Examples:
        """The pairs of `epoch`: `resegmented(epoch)` where each epoch has its own
        segmentations (`data.sampling.SampledEpochs.examples`), else always `examples`."""
        return self.resegmented(epoch) if self.resegmented is not None else self.examples

    def plan(self, epoch: int) -> list[PlannedBatch] | list[PackedBatch]:
        """The global batch plan of `epoch` (cached for the current epoch)."""
        if self._planned_epoch != epoch:
            self._planned_examples = self.examples_of(epoch)
            self._plan = plan_batches(self._planned_examples, self.config, epoch,
                                      grid=self._grid)
            self._planned_epoch = epoch
        return self._plan

    def __iter__(self) -> "BatchIterator":
        return self

    def __next__(self) -> Batch:
        plan = self.plan(self._epoch)
        if self._position >= len(plan):
            self._epoch, self._position = self._epoch + 1, 0
            plan = self.plan(self._epoch)
        batch = plan[self._position]
        self._position += 1
        return batch_arrays(self._planned_examples, batch, self.process_index,
                            self.process_count)


def eval_batches(examples: Examples, config: BatchConfig = BatchConfig(),
                 process_index: int | None = None, process_count: int | None = None
                 ) -> Iterator[Batch]:
    """Every pair once, in a fixed order (validation loss); this process's rows."""
    if process_index is None or process_count is None:
        process_index, process_count = _jax_process()
    for batch in plan_batches(examples, config, epoch=0, shuffle=False):
        yield batch_arrays(examples, batch, process_index, process_count)


# ---------------------------------------------------------------------------------------------
# Measurements


@dataclasses.dataclass(frozen=True)
class PlanStats:
    """What one epoch's plan looks like; `padding_waste` = padded / all positions (src+tgt)."""

    pairs: int
    batches: int
    shapes: dict[tuple[int, int, int], int]  # (B, S, T) -> number of batches
    real_tokens: int
    positions: int
    padding_waste: float
    all_pad_rows: int
    max_batch_tokens: int  # the largest B * max(S, T)

    @property
    def num_shapes(self) -> int:
        return len(self.shapes)

    def summary(self) -> str:
        return (
            f"{self.pairs} pairs in {self.batches} batches of {self.num_shapes} shapes (B, S, T);"
            f" padding waste {100 * self.padding_waste:.1f}% (src+tgt), {self.all_pad_rows} "
            f"all-pad rows, largest B*max(S,T) {self.max_batch_tokens}"
        )


def plan_stats(examples: Examples, config: BatchConfig = BatchConfig(), epoch: int = 0,
               plan: list[PlannedBatch] | list[PackedBatch] | None = None) -> PlanStats:
    """Count shapes, real tokens and padded positions of one epoch's plan (`plan`, when it
    has been made already)."""
    if plan is None:
        plan = plan_batches(examples, config, epoch)
    src_len, tgt_len = examples.src_len, examples.tgt_len
    shapes: Counter = Counter()
    real = positions = pad_rows = 0
    for batch in plan:
        if isinstance(batch, PackedBatch):
            pairs = batch.pairs
            shape = (batch.num_rows, batch.width, batch.width)
            pad_rows += int((batch.counts == 0).sum())
        else:
            pairs = batch.rows[batch.rows >= 0]
            shape = (len(batch.rows), batch.src_len, batch.tgt_len)
            pad_rows += len(batch.rows) - len(pairs)
        shapes[shape] += 1
        real += int(src_len[pairs].sum() + tgt_len[pairs].sum())
        positions += shape[0] * (shape[1] + shape[2])
    return PlanStats(
        pairs=len(examples), batches=len(plan), shapes=dict(shapes), real_tokens=real,
        positions=positions, padding_waste=1 - real / positions if positions else 0.0,
        all_pad_rows=pad_rows,
        max_batch_tokens=max(b * max(s, t) for b, s, t in shapes),
    )


# ---------------------------------------------------------------------------------------------
# Inference


def inference_batches(ids: Sequence[Sequence[int]], batch_tokens: int = 4096,
                      buckets: Sequence[int] = DEFAULT_BUCKETS, multiple_of: int = 1,
                      special: SpecialIds = SpecialIds()
                      ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Batch source id lists (no EOS) for translation, shortest first.

    Yields `(src, index)`: `src` [B, S] int32 (ids + EOS, padded to a bucket length),
    `index` [B] int64 the position of each row in `ids`, -1 for all-pad rows that keep B
    fixed per S. Write outputs back with `out[index[index >= 0]] = hyps[index >= 0]`.
    B is `batch_tokens // S` (rounded down to `multiple_of`), one row count per width, so the
    compiled shapes stay one per bucket. A batch takes the next B sentences in length order
    even where they cross into the next bucket (it is then padded to that bucket, with the
    row count of that width), so only the last batch has rows of PAD: a bucket's last
    sentences share a batch with the next bucket's first rather than with empty rows, whose
    search steps cost as much as a sentence's.
    Inputs longer than the last bucket get S rounded up to a multiple of 64 (one new shape).
    """
    lengths = np.array([len(x) + 1 for x in ids], dtype=np.int64)
    ragged = _ragged(ids)
    order = np.argsort(lengths, kind="stable")
    widths = np.array([_bucket_of(int(n), buckets) for n in lengths[order]], dtype=np.int64)

    def rows_of(width: int) -> int:
        rows = batch_tokens // width
        return max(multiple_of, rows - rows % multiple_of)

    start = 0
    while start < len(order):
        width = int(widths[start])
        rows = rows_of(width)
        # Widen while the batch's last sentence needs a wider bucket; widths only grow and
        # rows only shrink, so this ends (at worst with the one-row minimum).
        while int(widths[min(start + rows, len(order)) - 1]) > width:
            width = int(widths[min(start + rows, len(order)) - 1])
            rows = rows_of(width)
        end = min(start + rows, len(order))
        index = np.concatenate([order[start:end], np.full(rows - (end - start), -1)])
        yield _gather(ragged, index, width, bos=False, eos=True, special=special), index
        start = end


def source_width(ids: Sequence[Sequence[int]], buckets: Sequence[int] = DEFAULT_BUCKETS) -> int:
    """The width one batch of all of `ids` (no EOS) is padded to: the bucket of the longest
    with its EOS (beyond the last bucket, the next multiple of 64, as in inference_batches)."""
    return _bucket_of(max(len(x) for x in ids) + 1, buckets)


def single_batch(ids: Sequence[Sequence[int]], rows: int, width: int,
                 special: SpecialIds = SpecialIds()) -> tuple[np.ndarray, np.ndarray]:
    """All of `ids` (no EOS) as one batch, in input order: `(src, index)` as inference_batches
    yields them, src [rows, width] (rows >= len(ids); the rows after them all PAD, index -1)
    and width at least `source_width(ids)`."""
    if rows < len(ids) or width < max(len(x) for x in ids) + 1:
        raise ValueError(f"{len(ids)} sentences of up to {max(len(x) for x in ids)} tokens + EOS "
                         f"do not fit a batch of {rows} rows of width {width}")
    index = np.concatenate([np.arange(len(ids)), np.full(rows - len(ids), -1)])
    return _gather(_ragged(ids), index, width, bos=False, eos=True, special=special), index


def _ragged(ids: Sequence[Sequence[int]]) -> Ragged:
    """Id lists as one Ragged array."""
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in ids], out=offsets[1:])
    values = np.fromiter((i for row in ids for i in row), dtype=np.int32, count=int(offsets[-1]))
    return Ragged(values, offsets)
