"""Subword regularization: every epoch, the training pairs are segmented anew at random.

    epochs = SampledEpochs(examples, texts, tokenizer, alpha=0.1, nbest=-1, seed=0,
                           config=batch_config)
    epochs.examples(3)   # epoch 3's pairs: the same ids for the same seed and epoch

A unigram model samples a segmentation from its lattice (Kudo 2018: probabilities raised to
`alpha`, over all segmentations or the `nbest` best); a BPE model drops each merge with
probability `alpha` (BPE-dropout, Provilkov et al. 2020). SentencePiece does both. The pairs
kept are those the deterministic segmentation kept (`data.batching.load_examples`); a pair
whose sampled segmentation breaks the batch limits (length, length ratio, packed width), or
fits none of the deterministic segmentation's bucketed batch shapes (packing off), keeps its
deterministic one for that epoch. Validation and translation never sample.

Reproducible: SentencePiece restarts its generator from one process-wide seed at every call,
so each call (a chunk of pairs, one side) is seeded with (seed, epoch, chunk, side) under a
lock that keeps every other sampler of the process from reseeding it: a resumed run sees the
epochs an uninterrupted one saw, and no two chunks or sides repeat each other's draws.
SentencePiece 0.2.2 and 0.2.3 mix a per-process random value into that generator, so the
same seed draws alike only within one process: sampling starts with a probe drawn here and in
a new process, and is refused where the two differ (`check_draws_repeat`). The
next epoch is sampled on a thread of its own while the current one trains; `close()` (and the
interpreter's exit) stops it between chunks, since a thread killed inside SentencePiece aborts
the process.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import subprocess
import sys
import threading
import time
import weakref

import datasets
import numpy as np
import sentencepiece as spm

from data.batching import Examples, bucket_grid, too_unequal
from data.config import BatchConfig, DataError
from data.store import Ragged, TokenStore
from data.tokenizer import TokenizerBase

log = logging.getLogger("data")

TEXT_CHUNK = 10_000  # pairs read from the corpus and sampled at a time
_SENTENCEPIECE_DRAWS = threading.Lock()  # held by the sampler drawing


def chunk_seed(seed: int, epoch: int, start: int, side: str) -> int:
    """SentencePiece's seed (an unsigned 32-bit int) for one side of the chunk of pairs
    beginning at `start`, in `epoch` of a run seeded `seed`."""
    digest = hashlib.sha256(f"subword-sampling|{seed}|{epoch}|{start}|{side}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


# A probe of SentencePiece's seeding: the same draw here and in a new process, or not.
_PROBE_TEXTS = ["a quick brown fox jumps over the lazy dog near the riverbank at dawn",
                "zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich"] * 32
_PROBE_SEED = 20_171_206


def check_draws_repeat(tokenizer: TokenizerBase, alpha: float, nbest: int) -> None:
    """DataError unless a seeded draw gives the same ids in another process: SentencePiece
    0.2.2 and 0.2.3 mix a per-process random value into their generator, so a resumed run,
    or each process of a multi-process one, would see other segmentations than the seed
    promises. Call it holding `_SENTENCEPIECE_DRAWS`."""
    spm.set_random_generator_seed(_PROBE_SEED)
    here = tokenizer.sample(_PROBE_TEXTS, "source", alpha, nbest)
    if _draw_in_new_process(tokenizer.model_bytes, alpha, nbest) != here:
        raise DataError(
            f"subword sampling (--subword-alpha) needs draws that repeat for the same seed, "
            f"and the installed sentencepiece {spm.__version__} draws differently in every "
            "process (a resumed run would train on other segmentations than the run it "
            "continues): install one that repeats them (pip install 'sentencepiece<0.2.2'), "
            "or drop --subword-alpha")


def _draw_in_new_process(model_bytes: bytes, alpha: float, nbest: int) -> list[list[int]]:
    """The probe's draw (as `Tokenizer.sample` draws) in a fresh Python process; DataError
    naming the child's own error where it cannot draw."""
    script = (
        "import json, sys\n"
        "import sentencepiece as spm\n"
        "processor = spm.SentencePieceProcessor(model_proto=sys.stdin.buffer.read())\n"
        f"spm.set_random_generator_seed({_PROBE_SEED})\n"
        f"print(json.dumps(processor.encode({_PROBE_TEXTS!r}, out_type=int, "
        f"enable_sampling=True, alpha={alpha!r}, nbest_size={nbest!r}, num_threads=1)))\n")
    try:
        done = subprocess.run([sys.executable, "-c", script], input=model_bytes,
                              capture_output=True, timeout=_PROBE_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise _probe_failed(str(err)) from None
    lines = done.stdout.decode(errors="replace").splitlines()
    try:
        if done.returncode == 0 and lines:
            return json.loads(lines[-1])  # the last line: anything a start-up hook printed
    except ValueError:                    # before it is not the draw
        pass
    said = done.stderr.decode(errors="replace").strip().splitlines()
    raise _probe_failed(said[-1] if said else f"exit status {done.returncode}, no draw printed")


_PROBE_SECONDS = 120


def _probe_failed(reason: str) -> DataError:
    return DataError(
        f"subword sampling (--subword-alpha) starts by drawing a probe in a new Python process "
        f"({sys.executable}), which failed: {reason}; make that interpreter able to import "
        "sentencepiece, or drop --subword-alpha")


class SamplingStopped(RuntimeError):
    """Raised for an epoch asked of, or being sampled by, a closed `SampledEpochs`."""


class SampledEpochs:
    """The training pairs of each epoch under freshly sampled segmentations.

    `examples` are the pairs kept by the deterministic segmentation (their `index` rows are
    rows of `texts`, a split with `source` and `target` columns); `config` the batch settings
    whose limits a sampled pair must respect. Holds one epoch's ids in memory (4 bytes a
    token) and the next one's once sampled.
    """

    def __init__(self, examples: Examples, texts: datasets.Dataset, tokenizer: TokenizerBase,
                 *, alpha: float, nbest: int, seed: int, config: BatchConfig):
        with _SENTENCEPIECE_DRAWS:  # the checks draw too
            tokenizer.check_sampling(alpha, nbest)
            check_draws_repeat(tokenizer, alpha, nbest)
        self.deterministic, self.texts, self.tokenizer = examples, texts, tokenizer
        self.alpha, self.nbest, self.seed = alpha, nbest, seed
        # A packed row may be wider than max_len (rounded up to 8), but positions are not.
        self.longest = min(config.width, config.max_len) if config.packing else config.max_len
        self.max_ratio = config.max_ratio
        # Bucketed batches keep the deterministic segmentation's shapes: a sampled pair that
        # none of them holds keeps its deterministic ids.
        self.grid = (None if config.packing else
                     bucket_grid(examples.src_len, examples.tgt_len, config))
        log.info("subword regularization: the %d training pairs segmented anew every epoch "
                 "(alpha %g, nbest %d), the next epoch on a background thread",
                 len(examples), alpha, nbest)
        self._done: dict[int, Examples] = {}
        self._pending: dict[int, tuple[threading.Thread, list]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._abandoned: set[int] = set()  # epochs before one asked for, no longer sampled
        _open.add(self)

    def examples(self, epoch: int) -> Examples:
        """Epoch `epoch`'s pairs (waiting for them if they are being sampled); starts sampling
        the next epoch's in the background."""
        result = self._finish(epoch)
        self._start(epoch + 1)
        return result

    def close(self) -> None:
        """Stop sampling: the thread at work ends after its chunk, and is waited for."""
        self._stop.set()
        _open.discard(self)
        with self._lock:
            threads = [thread for thread, _ in self._pending.values()]
        for thread in threads:
            if thread.ident is not None and thread is not threading.current_thread():
                thread.join()

    def _start(self, epoch: int) -> None:
        with self._lock:
            if epoch in self._done or epoch in self._pending or self._stop.is_set():
                return
            out: list = []
            thread = threading.Thread(target=self._sample_into, args=(epoch, out),
                                      name=f"subword-sampling-{epoch}", daemon=True)
            self._pending[epoch] = (thread, out)
        thread.start()

    def _finish(self, epoch: int) -> Examples:
        self._start(epoch)
        with self._lock:
            pending = self._pending.pop(epoch, None)
            # An epoch before this one (a resumed run's check of its saved epoch started the
            # one after it) is never asked for again: its thread stops at its next chunk.
            for earlier in [e for e in self._pending if e < epoch]:
                del self._pending[earlier]
                self._abandoned.add(earlier)
        if pending is None and epoch not in self._done:
            raise SamplingStopped(f"epoch {epoch} asked of closed subword sampling")
        if pending is not None:
            thread, out = pending
            thread.join()
            if isinstance(out[0], BaseException):
                raise out[0]
            with self._lock:
                self._done = {epoch: out[0]}  # the epoch before is done with
        return self._done[epoch]

    def _sample_into(self, epoch: int, out: list) -> None:
        """The thread: epoch `epoch` sampled into `out` (or the error that stopped it)."""
        try:
            out.append(self._sample(epoch))
        except BaseException as err:  # noqa: BLE001 - raised in the caller's thread
            out.append(err)

    def _sample(self, epoch: int) -> Examples:
        """Every kept pair sampled, `TEXT_CHUNK` pairs at a time, each chunk's ids flattened
        into arrays at once (Python lists of ints would take 9 times the memory)."""
        begin = time.perf_counter()
        kept = self.deterministic
        src_parts, tgt_parts, src_lens, tgt_lens = [], [], [], []
        replaced = 0
        for start in range(0, len(kept), TEXT_CHUNK):
            if self._stop.is_set():
                raise SamplingStopped(f"epoch {epoch} was being sampled when sampling closed")
            if epoch in self._abandoned:
                raise SamplingStopped(f"epoch {epoch} was abandoned")
            positions = np.arange(start, min(start + TEXT_CHUNK, len(kept)))
            chunk = self.texts[kept.index[positions].tolist()]
            src, tgt = (self._draw(chunk[side], side, chunk_seed(self.seed, epoch, start, side))
                        for side in ("source", "target"))
            replaced += self._keep_within_limits(positions, src, tgt)
            for rows, parts, lens in ((src, src_parts, src_lens), (tgt, tgt_parts, tgt_lens)):
                lens.append(np.fromiter(map(len, rows), np.int64, len(rows)))
                parts.append(np.fromiter((i for row in rows for i in row), np.int32,
                                         int(lens[-1].sum())))
        log.debug("epoch %d sampled in %.1f s: %d of %d pairs kept their deterministic "
                  "segmentation (sampled past the limits or the batch shapes)", epoch,
                  time.perf_counter() - begin, replaced, len(kept))
        store = TokenStore(_ragged(src_parts, src_lens), _ragged(tgt_parts, tgt_lens))
        return Examples(store, np.arange(len(kept), dtype=np.int64),
                        store.src.lengths() + 1, store.tgt.lengths() + 1, kept.ids)

    def _draw(self, texts: list[str], side: str, seed: int) -> list[list[int]]:
        """Sampled ids of `texts`, SentencePiece's process-wide generator seeded `seed`."""
        with _SENTENCEPIECE_DRAWS:
            spm.set_random_generator_seed(seed)
            return self.tokenizer.sample(texts, side, self.alpha, self.nbest)

    def _keep_within_limits(self, positions: np.ndarray, src: list[list[int]],
                            tgt: list[list[int]]) -> int:
        """Put back the deterministic ids of the pairs (at `positions` of the kept ones) whose
        sampled segmentation breaks the batch limits, or fits no bucketed batch shape of the
        deterministic segmentation (`self.grid`); returns how many."""
        kept = self.deterministic
        src_len = np.fromiter(map(len, src), np.int32, len(src)) + 1      # with EOS / BOS
        tgt_len = np.fromiter(map(len, tgt), np.int32, len(tgt)) + 1
        broken = ((np.maximum(src_len, tgt_len) > self.longest)
                  | too_unequal(src_len, tgt_len, self.max_ratio))
        if self.grid is not None:
            broken |= self.grid.cells(src_len, tgt_len) < 0
        refused = np.flatnonzero(broken)
        for k, row in zip(refused.tolist(), kept.index[positions[refused]].tolist()):
            src[k] = kept.store.src.row(row).tolist()
            tgt[k] = kept.store.tgt.row(row).tolist()
        return len(refused)


_open: weakref.WeakSet[SampledEpochs] = weakref.WeakSet()  # not yet closed


def _close_all() -> None:
    """At exit, stop every sampler: the interpreter would kill its thread mid-draw."""
    for epochs in list(_open):
        epochs.close()


atexit.register(_close_all)


def _ragged(parts: list[np.ndarray], lengths: list[np.ndarray]) -> Ragged:
    """Chunks of ids laid end to end, with their rows' lengths, as one Ragged."""
    lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    return Ragged(values, offsets)
