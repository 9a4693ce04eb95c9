"""From a corpus to token ids: the run's tokenizer (trained, reused or given) and each split
encoded, with a disk cache of encoded splits."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import pickle
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Callable, Iterator

import datasets
import multiprocess
import multiprocess.connection
import multiprocess.resource_tracker
import numpy as np
import pyarrow as pa
import sentencepiece as spm

from data.config import DataError, TokenizerConfig, default_cache_dir
from data.corpus import iter_text
from data.disk import check_free_space, free_space, raise_if_disk_full
from data.store import (
    TokenStore,
    arrow_file_rows,
    is_store,
    join_stores,
    store_damage,
    write_store,
)
from data.tokenizer import (
    Tokenizer,
    TokenizerBase,
    load_tokenizer,
    tokenizer_present,
    train_tokenizer,
)
from transformer.atomic_files import (
    new_directory,
    remove_abandoned,
    sync_directory,
    write_atomically,
)

log = logging.getLogger("data")

# Bump when the encoded layout changes, so old cache entries are not reused.
_ENCODING_VERSION = "2"  # 2: token stores (data.store)
# Pairs encoded by one set of worker processes (`_encoded_rounds`): about 0.8 GB of text.
ENCODE_ROUND_PAIRS = 4_000_000
_ENCODED_FEATURES = datasets.Features({
    "src_ids": datasets.List(datasets.Value("int32")),
    "tgt_ids": datasets.List(datasets.Value("int32")),
})



def train_or_load_tokenizer(run_dir: str | Path, corpus: datasets.DatasetDict | datasets.Dataset,
                            config: TokenizerConfig = TokenizerConfig(),
                            given: str | Path | None = None) -> TokenizerBase:
    """Reuse the run directory's tokenizer if present (resume), else train one on the train
    split and save it there (`spm.model`).

    A reused joint model must have at most `config.vocab_size` pieces (fewer: fitted to a
    small corpus), or a `DataError` says so. With
    `given` (the model directory of --init-from) or else `config.spm_model` (--spm-model),
    that tokenizer is used instead: copied into `run_dir` on the first run, and required to be
    the same on a resumed one.
    """
    run_dir = Path(run_dir)
    if given is not None:
        return _use_given_tokenizer(run_dir, Path(given), "--init-from")
    if config.spm_model is not None:
        return _use_given_tokenizer(run_dir, Path(config.spm_model), "--spm-model")
    if tokenizer_present(run_dir):
        tokenizer = load_tokenizer(run_dir)
        if tokenizer.vocab_size > config.vocab_size:  # fewer: fitted to a small text
            raise DataError(
                f"{run_dir}'s tokenizer has {tokenizer.vocab_size} pieces but --vocab-size is "
                f"{config.vocab_size}; use --vocab-size {tokenizer.vocab_size} to resume this "
                "run, or a new run directory"
            )
        log.info("reusing the tokenizer in %s (%d pieces)", run_dir, tokenizer.vocab_size)
        return tokenizer
    train = corpus["train"] if isinstance(corpus, datasets.DatasetDict) else corpus
    trained_before = _tokenizer_cache_path(train, config)
    if trained_before.is_file():
        tokenizer = Tokenizer(trained_before.read_bytes())
        log.info("reusing the tokenizer trained before on the same text with the same settings "
                 "(%s); saved %s", trained_before, tokenizer.save(run_dir))
        return tokenizer
    rows = sample_rows(len(train), config.max_sentences // 2, config.seed)
    tokenizer = train_tokenizer(_SampleText(train, rows), config)
    path = tokenizer.save(run_dir)
    trained_before.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(trained_before, tokenizer.model_bytes)
    log.info(
        "trained %s tokenizer with %d pieces on %s of %d sentences (source and target); "
        "saved %s", config.model_type, tokenizer.vocab_size,
        "all" if rows is None else f"a sample (seed {config.seed}) of {2 * len(rows)}",
        2 * len(train), path,
    )
    return tokenizer


def _tokenizer_cache_path(train: datasets.Dataset, config: TokenizerConfig) -> Path:
    """Where the tokenizer trained on `train` with `config` is kept for the next run on the
    same data: training it takes a minute on a large corpus, and is not bit-reproducible."""
    settings = dataclasses.replace(config, spm_model=None)
    key = hashlib.md5(f"{train._fingerprint}|{settings}|{spm.__version__}".encode()).hexdigest()
    return default_cache_dir() / "tokenizers" / f"{key}.model"


def sample_rows(rows: int, pairs: int, seed: int) -> np.ndarray | None:
    """A seeded random choice of at most `pairs` of `rows` rows, sorted; None for all."""
    if rows <= pairs:
        return None
    return np.sort(np.random.default_rng(seed).choice(rows, size=max(pairs, 1), replace=False))


class _SampleText:
    """The tokenizer's training text, read again on each iteration (a vocabulary fitted to
    a small text trains twice)."""

    def __init__(self, split: datasets.Dataset, rows: np.ndarray | None):
        self.split, self.rows = split, rows

    def __iter__(self) -> Iterator[str]:
        return sample_text(self.split, self.rows)


def sample_text(split: datasets.Dataset, rows: np.ndarray | None) -> Iterator[str]:
    """Source and target of the `rows` of `split` (all if None): the tokenizer's training
    text, read in time that hardly grows with the corpus. A split that is its Arrow files
    is streamed from them, so that the pages read do not stay resident."""
    if rows is None:
        yield from iter_text(split)
        return
    files = [f["filename"] for f in split.cache_files]
    if len(files) != 1 or split._indices is not None or arrow_file_rows(files[0]) != len(split):
        yield from iter_text(split.select(rows))
        return
    start = 0
    with pa.OSFile(files[0]) as source:
        for batch in pa.ipc.open_stream(source):
            wanted = rows[np.searchsorted(rows, start):np.searchsorted(rows, start + len(batch))]
            picked = batch.take(pa.array(wanted - start))
            yield from picked.column("source").to_pylist()
            yield from picked.column("target").to_pylist()
            start += len(batch)


def _use_given_tokenizer(run_dir: Path, given: Path, flag: str) -> TokenizerBase:
    """The tokenizer `given` by `flag` (a .model file or a model directory), saved into
    `run_dir` unless already there."""
    tokenizer = load_tokenizer(given)
    if tokenizer_present(run_dir):
        if load_tokenizer(run_dir).fingerprint != tokenizer.fingerprint:
            raise DataError(
                f"{run_dir / next(iter(tokenizer.files()))} is not the tokenizer of {flag} "
                f"{given}: the run in {run_dir} started with another one, and its parameters "
                f"only fit that one; resume without {flag}, or start a new --output-dir")
        log.info("reusing the tokenizer in %s (%d pieces, the same as %s)", run_dir,
                 tokenizer.vocab_size, given)
        return tokenizer
    tokenizer.save(run_dir)
    log.info("using the tokenizer of %s (%d pieces), copied to %s", given,
             tokenizer.vocab_size, run_dir)
    return tokenizer


# ---------------------------------------------------------------------------------------------
# Encoding a corpus, cached on disk as token stores


class _EncodeBatch:
    """Picklable batch function for `Dataset.map` (a tokenizer pickles as its files)."""

    def __init__(self, tokenizer: TokenizerBase):
        self.tokenizer = tokenizer

    def __call__(self, batch: dict[str, list[str]]) -> dict[str, list]:
        return {"src_ids": self.tokenizer.encode(batch["source"], "source"),
                "tgt_ids": self.tokenizer.encode(batch["target"], "target")}


def encoding_key(split: datasets.Dataset, tokenizer: TokenizerBase) -> str:
    """The cache key of `split` encoded by `tokenizer`: the split's datasets fingerprint
    (content-based for our text caches and in-memory data), the tokenizer's model bytes, the
    SentencePiece version that encodes with them, and the store layout."""
    return hashlib.md5(f"{split._fingerprint}|{tokenizer.fingerprint}|{spm.__version__}|"
                       f"{_ENCODING_VERSION}".encode()).hexdigest()


def default_workers(rows: int) -> int:
    """Every core of this process for a large split; one for a small one, where starting
    worker processes costs more than they save."""
    return len(os.sched_getaffinity(0)) if rows >= 50_000 else 1


def _store_path(split: datasets.Dataset, tokenizer: TokenizerBase,
                cache_dir: str | Path | None) -> Path:
    cache_root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return cache_root / "encoded" / encoding_key(split, tokenizer)


def _jax_running() -> bool:
    """Whether this process has started JAX's runtime (and its threads); JAX is not
    imported to find out."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    started = getattr(bridge, "backends_are_initialized", None)
    return bool(started and started())


def _encode_in_worker(rows: datasets.Dataset, tokenizer: TokenizerBase, path: str) -> None:
    """A worker process's encoding of `rows` into `path`. Ctrl-C, which reaches the whole
    process group, is the parent's to handle (it ends the workers), not theirs to print
    tracebacks for. An error is left pickled beside `path`, for the parent to raise."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Blocked since the start (`_interrupts_deferred`): one pending since then is dropped now.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a fork inherits the parent's `_terminate`
    datasets.disable_progress_bars()  # one bar a worker would interleave
    try:
        _encode_rows(rows, tokenizer, path)
    except Exception as err:  # noqa: BLE001 - raised again in the parent
        try:
            error = pickle.dumps(err)
        except Exception:  # noqa: BLE001 - an error that does not pickle: its text
            error = pickle.dumps(RuntimeError(f"{type(err).__name__}: {err}"))
        Path(path + ".error").write_bytes(error)
        sys.exit(1)


def _terminate(signum: int, frame) -> None:
    raise SystemExit(128 + signum)


def _run_workers(shares: list[tuple[datasets.Dataset, TokenizerBase, str]],
                 names: list[str]) -> None:
    """Encode each share in a process of its own, returning once every one has written its
    file; `names[i]` says which pairs share i holds. A worker that ends otherwise (an error,
    or killed: by the OOM killer, say) ends the others and the encoding, and so does an
    exception here (Ctrl-C, or SIGTERM): no worker outlives the call.

    The workers are spawned rather than forked where JAX runs (a fork of a process in which
    JAX's threads run can deadlock), and they ignore SIGINT from their start. A Ctrl-C while
    they start (seconds, where each imports JAX) ends them once started. In the main
    thread, a SIGTERM whose action is the default (killing this process, and leaving the
    workers behind) raises SystemExit(143) while they run, so that it ends them."""
    context = multiprocess.get_context("spawn" if _jax_running() else None)
    if context.get_start_method() == "spawn":  # before `_interrupts_deferred`: starting the
        multiprocess.resource_tracker.ensure_running()  # tracker unblocks SIGINT
    main_thread = threading.current_thread() is threading.main_thread()
    workers = [context.Process(target=_encode_in_worker, args=share, daemon=True)
               for share in shares]
    terminating = main_thread and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    try:
        with _signals_set({signal.SIGTERM: _terminate} if terminating else {}):
            with _interrupts_deferred() if main_thread else contextlib.nullcontext([]) as noted:
                for worker in workers:
                    worker.start()
            if noted:
                raise KeyboardInterrupt
            running = {worker.sentinel: i for i, worker in enumerate(workers)}
            while running:
                for sentinel in multiprocess.connection.wait(list(running)):
                    i = running.pop(sentinel)
                    workers[i].join()
                    if workers[i].exitcode != 0:
                        raise _worker_error(workers[i].exitcode, shares[i][2], names[i])
    except BaseException:
        # Killed, not asked to end: a worker holds no lock this process waits on. A second
        # Ctrl-C must not cut the ending short (it takes well under a second).
        with _signals_set({signal.SIGINT: signal.SIG_IGN, signal.SIGTERM: signal.SIG_IGN}
                          if main_thread else {}):
            for worker in workers:
                if worker.pid is not None and worker.exitcode is None:
                    worker.kill()
            for worker in workers:
                if worker.pid is not None:
                    worker.join(timeout=10)
        raise


class WorkerDied(RuntimeError):
    """A worker process encoding pairs ended without finishing (killed, or crashed): a fault
    of the machine while running, not of the data or the flags."""


def _worker_error(exitcode: int, path: str, name: str) -> BaseException:
    """The error to raise for the worker encoding `name` into `path` that ended with
    `exitcode`: its own, when it left one."""
    with contextlib.suppress(OSError, pickle.UnpicklingError, AttributeError, ImportError):
        return pickle.loads(Path(path + ".error").read_bytes())
    if exitcode < 0:
        killed = ", killed: out of memory?" if -exitcode == signal.SIGKILL else ""
        how = f"signal {-exitcode} ({signal.Signals(-exitcode).name}{killed})"
    else:
        how = f"exit status {exitcode}"
    return WorkerDied(
        f"a worker process encoding {name} ended with {how}; run again with more memory, or "
        "fewer encoding processes (one per core this process may use by default: start it "
        "under `taskset -c 0-3` for 4, say)")


@contextlib.contextmanager
def _signals_set(handlers: dict) -> Iterator[None]:
    """The signal handlers `handlers` (signal: handler) while the block runs; the earlier
    ones after it."""
    previous = {signum: signal.signal(signum, handler) for signum, handler in handlers.items()}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[list[int]]:
    """SIGINT noted in the list yielded, not acted on, while the block starts workers (a
    KeyboardInterrupt inside a start would leave its process unknown, and running). It is
    blocked in this thread meanwhile, so that a worker starts with it blocked (inherited
    through fork and exec): one still importing when Ctrl-C reaches the process group does
    not print a traceback, and drops it once it ignores SIGINT (`_encode_in_worker`)."""
    noted: list[int] = []
    with _signals_set({signal.SIGINT: lambda signum, frame: noted.append(signum)}):
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            yield noted
        finally:  # a SIGINT pending meanwhile is noted as the mask is restored
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


# Pairs whose ids estimate the encoding's disk (`_check_room_to_encode`).
_SIZE_SAMPLE_PAIRS = 2000
# Margin over the sample's estimate: over 50 seeds, a sample's ids per pair were within 2.5%
# of the whole split's (the train splits of small_parallel_enja and Multi30k, 320 to 8,000
# pieces), and the estimate came to 1.19 times the peak measured.
_SIZE_MARGIN = 1.2


def encoding_peak_bytes(pairs: int, ids_per_pair: float) -> float:
    """Disk that encoding `pairs` pairs of `ids_per_pair` ids (both sides) takes at its peak:
    the store, and beside it one round of the workers' Arrow files (`_encoded_rounds`), both
    4 bytes an id. Per byte of text that is 1.9 (8,000 pieces, Multi30k) to 7.8 (320 pieces,
    about an id a letter): no constant fits every vocabulary."""
    store_pair = 4 * ids_per_pair + 2 * 8  # + int64 offsets
    arrow_pair = 4 * ids_per_pair + 2 * 4  # + int32 offsets
    return store_pair * pairs + arrow_pair * min(pairs, ENCODE_ROUND_PAIRS)


def _check_room_to_encode(directory: Path, split: datasets.Dataset,
                          tokenizer: TokenizerBase, what: str) -> None:
    """`check_free_space` for encoding `split` into `directory`. A SentencePiece id stands for
    a byte of text or more, but for the word-start mark each side may begin with: a bound
    that needs no encoding. Only where that does not fit are a sample's ids counted."""
    pairs = max(len(split), 1)
    if encoding_peak_bytes(pairs, split.data.nbytes / pairs + 2) <= free_space(directory):
        return
    rows = sample_rows(len(split), _SIZE_SAMPLE_PAIRS, seed=0)
    sample = split if rows is None else split.select(rows)
    ids = sum(len(row) for side in ("source", "target")
              for row in tokenizer.encode(sample[side], side))
    check_free_space(directory, _SIZE_MARGIN * encoding_peak_bytes(
        len(split), ids / max(len(sample), 1)), what)


def _encode_to(target: Path, split: datasets.Dataset, tokenizer: TokenizerBase,
               num_proc: int | None) -> None:
    """Encode `split` with `num_proc` worker processes into a store at `target`, through a
    temporary directory beside it: a store there is always complete."""
    target.parent.mkdir(parents=True, exist_ok=True)
    what = f"encoding {len(split)} pairs"
    _check_room_to_encode(target.parent, split, tokenizer, what)
    num_proc = default_workers(len(split)) if num_proc is None else num_proc
    _discard_damaged(target)
    with _temporary_store(target) as tmp:
        try:
            write_store(tmp, _encoded_rounds(split, tokenizer, num_proc, tmp))
            tmp.rename(target)
            sync_directory(target.parent)
        except OSError as err:  # another process finished the same entry first (theirs is
            if not is_store(target):  # identical), or this one failed
                raise_if_disk_full(err, target.parent, what)
                raise


@contextlib.contextmanager
def _temporary_store(target: Path) -> Iterator[Path]:
    """A new directory beside `target` to write its store in, removed after the block unless
    renamed. It is flocked while this process (or a worker it forked) lives, so that the next
    encoding of `target` tells it from one whose writer was killed (`_remove_abandoned`)."""
    _remove_abandoned(target)
    lock, tmp = new_directory(target)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        os.close(lock)


def _remove_abandoned(target: Path) -> None:
    """Remove the temporary stores of `target` left by processes killed while writing them
    (SIGKILL, a crash), by `transformer.atomic_files.take_over`'s rule."""
    remove_abandoned(target.parent.glob(f".{target.name}-*"), removing=lambda tmp: log.info(
        "removing %s, left by an encoding that was killed", tmp))


def _discard_damaged(target: Path) -> None:
    """Remove the store at `target` when it is there but damaged (a file truncated or
    removed since it was written), so that it is written again. It is moved aside first:
    another process finding it gone writes its own."""
    if not target.exists() or (damage := store_damage(target)) is None:
        return
    log.warning("encoded store %s is incomplete or damaged (%s); encoding it again", target,
                damage)
    lock, aside = new_directory(target, "damaged-")
    with contextlib.suppress(FileNotFoundError):  # another process moved it first
        target.rename(aside / target.name)
    shutil.rmtree(aside, ignore_errors=True)
    os.close(lock)


def _encoded_rounds(split: datasets.Dataset, tokenizer: TokenizerBase, num_proc: int,
                    work: Path) -> Iterator[datasets.Dataset]:
    """`split` encoded `ENCODE_ROUND_PAIRS` rows at a time, each round by fresh worker
    processes whose Arrow files are removed once the next round is asked for. A worker keeps
    every page of text it has read resident until it exits, so rounds bound the workers'
    memory, and the disk the encoding needs beyond the store, whatever the corpus size."""
    for start in range(0, len(split), ENCODE_ROUND_PAIRS):
        end = min(start + ENCODE_ROUND_PAIRS, len(split))
        directory = work / f"map-{start}"
        bounds = share_bounds(end - start, min(num_proc, end - start))
        shares = [(split.select(range(start + first, start + last)), tokenizer,
                   str(directory / f"{first}.arrow")) for first, last in bounds]
        if len(shares) > 1:  # the workers show no bars: one line a round says where it is
            log.info("encoding pairs %d-%d of %d in %d processes", start, end, len(split),
                     len(shares))
            directory.mkdir(parents=True, exist_ok=True)
            _run_workers(shares, [f"pairs {start + first}-{start + last} of {len(split)}"
                                  for first, last in bounds])
        else:
            _encode_rows(*shares[0])
        for _, _, file in shares:
            if not os.path.exists(file):  # a worker exits 0 only once its file is written
                raise DataError(f"{file}, written by a worker process, is missing; run again")
            yield datasets.Dataset.from_file(file)
        shutil.rmtree(directory)


def _encode_rows(rows: datasets.Dataset, tokenizer: TokenizerBase, path: str) -> None:
    """Encode `rows` into the Arrow file `path` (in a worker process, or in this one)."""
    rows.map(_EncodeBatch(tokenizer), batched=True, batch_size=2000,
             remove_columns=rows.column_names, features=_ENCODED_FEATURES,
             cache_file_name=path, new_fingerprint=hashlib.md5(path.encode()).hexdigest(),
             desc=f"encoding {len(rows)} pairs")


def encode_split(split: datasets.Dataset, tokenizer: TokenizerBase,
                 cache_dir: str | Path | None = None,
                 num_proc: int | None = None) -> TokenStore:
    """Encode one split to a token store (`data.store`): int32 ids without BOS or EOS.

    The store is saved under `cache_dir/encoded/KEY` (`encoding_key`) and opened from there,
    memory-mapped, on later runs. `num_proc` worker processes encode (default: every core
    for 50,000 pairs or more).
    """
    target = _store_path(split, tokenizer, cache_dir)
    if is_store(target):
        log.info("encoded split loaded from cache %s", target)
        return TokenStore.open(target)
    _encode_to(target, split, tokenizer, num_proc)
    log.info("encoded %d pairs, cached in %s", len(split), target)
    return TokenStore.open(target)


def share_bounds(rows: int, shares: int) -> list[tuple[int, int]]:
    """[start, end) of each of `shares` consecutive shares of `rows` rows, sizes within one."""
    edges = [rows * k // shares for k in range(shares + 1)]
    return list(zip(edges[:-1], edges[1:]))


def encode_shared(split: datasets.Dataset, tokenizer: TokenizerBase, process_index: int,
                  process_count: int, barrier: Callable[[str], None],
                  cache_dir: str | Path | None = None,
                  num_proc: int | None = None) -> TokenStore:
    """`encode_split` with the work shared by the processes of a run.

    Each process encodes its share of consecutive rows (`share_bounds`) into the cache;
    process 0 then joins the shares into the split's store, which every process opens. On a
    cache that the processes do not share (a local disk per host), each one finds the
    others' work missing and does it itself, as if alone. Every process must call this, with
    the same split: `barrier(name)` waits for all of them.
    """
    if process_count == 1:
        return encode_split(split, tokenizer, cache_dir, num_proc)
    target = _store_path(split, tokenizer, cache_dir)
    parts = target.with_name(f"{target.name}.parts")
    bounds = share_bounds(len(split), process_count)
    names = [parts / f"{k}-of-{process_count}" for k in range(process_count)]
    if not is_store(target):
        _encode_share(split, tokenizer, bounds, process_index, names[process_index], num_proc)
    barrier("encoded shares")
    if process_index == 0 and not is_store(target):
        for k, name in enumerate(names):
            if not is_store(name):
                log.warning("share %d of %s is not in the cache: the processes do not share "
                            "%s; encoding it here (put the cache on a shared filesystem, "
                            "FLAX_NMT_CACHE, to share the work)", k, target.name,
                            target.parent)
                _encode_share(split, tokenizer, bounds, k, name, num_proc)
        _join(target, names)
        shutil.rmtree(parts, ignore_errors=True)
    barrier("encoded")
    if not is_store(target):
        log.warning("%s is not in this process's cache (not shared with process 0); encoding "
                    "the whole split here", target)
        return encode_split(split, tokenizer, cache_dir, num_proc)
    log.info("encoded split loaded from cache %s", target)
    return TokenStore.open(target)


def _encode_share(split: datasets.Dataset, tokenizer: TokenizerBase,
                  bounds: list[tuple[int, int]], share: int, target: Path,
                  num_proc: int | None) -> None:
    start, end = bounds[share]
    log.info("encoding rows [%d, %d) of %d: share %d of %d", start, end, len(split), share,
             len(bounds))
    _encode_to(target, split.select(range(start, end)), tokenizer, num_proc)


def _join(target: Path, parts: list[Path]) -> None:
    """Join the stores `parts` into `target`, through a temporary directory beside it: the
    joined store needs as much disk as the shares, which are removed only after it."""
    what = f"joining {len(parts)} encoded shares"
    try:
        check_free_space(target.parent, sum(file.stat().st_size for part in parts
                                            for file in part.iterdir() if file.is_file()), what)
        _discard_damaged(target)
        with _temporary_store(target) as tmp:
            rows = join_stores(tmp, parts)
            tmp.rename(target)
            sync_directory(target.parent)
            log.info("joined %d shares (%d pairs) into %s", len(parts), rows, target)
    except (OSError, DataError) as err:  # another run sharing the cache joined the same
        if is_store(target):  # shares first (and may have removed them): its store is identical
            return
        if isinstance(err, OSError):
            raise_if_disk_full(err, target.parent, what)
        raise


def encode_corpus(corpus: datasets.DatasetDict, tokenizer: TokenizerBase,
                  cache_dir: str | Path | None = None, num_proc: int | None = None
                  ) -> dict[str, TokenStore]:
    """`encode_split` for every split of `corpus`."""
    return {name: encode_split(split, tokenizer, cache_dir, num_proc)
            for name, split in corpus.items()}
