"""The token store: memory-mapped batches equal in-memory ones, resumption, shares that join
into the whole, bounded memory, and streamed reading into the cache."""

import errno
import fcntl
import json
import logging
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pytest
from test_atomic_files import age, scan_at_the_first_lock

from data import arrow_text, disk
from data.batching import BatchConfig, BatchIterator, batch_arrays, load_examples, plan_batches
from data.config import CorpusSpec, DataError
from data.corpus import load_corpus, read_prefix
from data.encoding import sample_rows, sample_text, share_bounds
from data.packing import fit_width
from data.store import TokenStore, join_stores, write_store
from data.tokenizer import TokenizerConfig, train_tokenizer

WORKER = Path(__file__).with_name("data_share_worker.py")
ROOT = Path(__file__).resolve().parents[1]

LAYOUTS = {
    "packed": BatchConfig(batch_tokens=256, max_len=40, max_ratio=3.0, num_devices=2),
    "bucketed": BatchConfig(packing=False, batch_tokens=256, max_len=40, max_ratio=3.0,
                            buckets=(8, 16, 24, 32, 40), num_devices=2),
}


def random_encoded(n: int, seed: int = 0, longest: int = 45) -> datasets.Dataset:
    """n pairs of random ids, some too long or too unequal for the filters, written to Arrow
    in record batches of 64 rows (many chunks, as a corpus on disk has)."""
    rng = np.random.default_rng(seed)
    src = [rng.integers(4, 97, k).tolist() for k in rng.integers(1, longest, n)]
    tgt = [rng.integers(4, 97, k).tolist() for k in rng.integers(1, longest, n)]
    ids = pa.list_(pa.int32())
    table = pa.table({"src_ids": pa.array(src, ids), "tgt_ids": pa.array(tgt, ids)})
    chunked = pa.Table.from_batches(table.to_batches(max_chunksize=64))
    return datasets.Dataset(datasets.table.InMemoryTable(chunked))


@pytest.fixture(scope="module")
def encoded() -> datasets.Dataset:
    return random_encoded(700)


@pytest.fixture(scope="module")
def store(encoded, tmp_path_factory) -> TokenStore:
    path = tmp_path_factory.mktemp("store")
    write_store(path, [encoded])
    return TokenStore.open(path)


def _batches(examples, config, epochs=2, process_index=0, process_count=1):
    config = fit_width(config, examples.src_len, examples.tgt_len)
    for epoch in range(epochs):
        for batch in plan_batches(examples, config, epoch):
            yield batch_arrays(examples, batch, process_index, process_count)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_memory_mapped_batches_equal_in_memory_ones(encoded, store, layout):
    config = LAYOUTS[layout]
    assert isinstance(store.src.values, np.memmap) and isinstance(store.tgt.offsets, np.memmap)
    in_memory = load_examples(encoded, config)
    mapped = load_examples(store, config)
    assert 0 < len(mapped) < len(encoded)  # the filters dropped some
    np.testing.assert_array_equal(mapped.index, in_memory.index)
    count = 0
    for ours, reference in zip(_batches(mapped, config), _batches(in_memory, config),
                               strict=True):
        assert ours.keys() == reference.keys()
        for key in ours:
            np.testing.assert_array_equal(ours[key], reference[key], err_msg=key)
        count += 1
    assert count > 4
    # Each process's rows, as two processes would build them.
    halves = [list(_batches(mapped, config, 1, p, 2)) for p in range(2)]
    for whole, first, second in zip(_batches(mapped, config, 1), *halves, strict=True):
        for key in whole:
            np.testing.assert_array_equal(whole[key],
                                          np.concatenate([first[key], second[key]]))


def test_batch_rows_hold_the_pairs_ids(encoded, store):
    """A bucketed row is its pair's ids + EOS, read from the right row of the store."""
    config = LAYOUTS["bucketed"]
    examples = load_examples(store, config)
    batch = plan_batches(examples, config, 0)[0]
    arrays = batch_arrays(examples, batch)
    for row, position in zip(arrays["src"], batch.rows):
        if position < 0:
            assert not row.any()
            continue
        ids = encoded[int(examples.index[position])]["src_ids"]
        assert row[:len(ids)].tolist() == ids and row[len(ids)] == examples.ids.eos


def test_resume_mid_epoch_from_the_store(store):
    config = LAYOUTS["packed"]
    examples = load_examples(store, config)
    config = fit_width(config, examples.src_len, examples.tgt_len)
    first = BatchIterator(examples, config, process_index=0, process_count=1)
    per_epoch = first.batches_per_epoch
    for _ in range(per_epoch + 3):  # into the second epoch
        next(first)
    resumed = BatchIterator(examples, config, state=first.state, process_index=0,
                            process_count=1)
    for _ in range(per_epoch):
        ours, theirs = next(resumed), next(first)
        for key in ours:
            np.testing.assert_array_equal(ours[key], theirs[key])


def test_shares_are_disjoint_and_join_into_the_whole(encoded, store, tmp_path):
    bounds = share_bounds(len(encoded), 3)
    assert bounds[0][0] == 0 and bounds[-1][1] == len(encoded)
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert max(e - s for s, e in bounds) - min(e - s for s, e in bounds) <= 1
    parts = []
    for k, (start, end) in enumerate(bounds):
        write_store(tmp_path / f"part{k}", [encoded.select(range(start, end))])
        parts.append(tmp_path / f"part{k}")
    join_stores(tmp_path / "joined", parts)
    joined = TokenStore.open(tmp_path / "joined")
    for side in ("src", "tgt"):
        np.testing.assert_array_equal(getattr(joined, side).values, getattr(store, side).values)
        np.testing.assert_array_equal(getattr(joined, side).offsets,
                                      getattr(store, side).offsets)


def test_a_selection_is_written_as_its_rows_in_its_order(encoded, tmp_path):
    """A dataset holding an indices mapping (select, shuffle) is its selected rows, not the
    table under it."""
    rows = [5, 2, 640, 2]
    write_store(tmp_path / "picked", [encoded.select(rows), encoded.shuffle(seed=1)])
    picked = TokenStore.open(tmp_path / "picked")
    expected = [encoded[k]["src_ids"] for k in rows] + list(encoded.shuffle(seed=1)["src_ids"])
    assert picked.src.to_lists() == expected


def test_a_join_that_another_run_published_first_is_used(tmp_path, monkeypatch):
    """Two multi-process runs sharing a cache join the same shares: the second to publish
    takes the first's store (identical), where it ended in "Directory not empty"."""
    from data import encoding

    texts = [f"the {w} sat on the {v} mat" for w in ("cat", "dog", "owl") for v in "abcde"]
    split = datasets.Dataset.from_dict({"source": texts, "target": texts[::-1]})
    tokenizer = train_tokenizer(texts, TokenizerConfig(vocab_size=300))
    target = encoding._store_path(split, tokenizer, tmp_path)
    join = encoding.join_stores

    def other_run_first(tmp, parts):
        other = tmp_path / "other"
        join(other, parts)
        other.rename(target)
        return join(tmp, parts)

    monkeypatch.setattr(encoding, "join_stores", other_run_first)
    store = encoding.encode_shared(split, tokenizer, 0, 2, barrier=lambda name: None,
                                   cache_dir=tmp_path, num_proc=1)
    assert store.src.to_lists() == tokenizer.encode(texts)


def test_a_join_whose_shares_another_run_joined_and_removed_uses_its_store(tmp_path):
    """A second run sharing the cache reaches its join after the first joined the same shares
    and removed them: it takes the first's store rather than failing on the missing shares."""
    from data import encoding

    split, tokenizer = _letters_split_and_tokenizer()
    first = encoding.encode_shared(split, tokenizer, 0, 2, barrier=lambda name: None,
                                   cache_dir=tmp_path, num_proc=1)
    target = encoding._store_path(split, tokenizer, tmp_path)
    shares = [target.with_name(f"{target.name}.parts") / f"{k}-of-2" for k in range(2)]
    assert not any(share.exists() for share in shares)
    encoding._join(target, shares)
    assert TokenStore.open(target).src.to_lists() == first.src.to_lists()


def test_a_damaged_store_is_encoded_again(tmp_path, caplog):
    """A store whose file was truncated or removed since it was written is found so, named,
    and encoded again, not memory-mapped into "mmap length is greater than file size"."""
    from data import encoding

    texts = [f"the {w} sat on the {v} mat" for w in ("cat", "dog", "owl") for v in "abcde"]
    split = datasets.Dataset.from_dict({"source": texts, "target": texts[::-1]})
    tokenizer = train_tokenizer(texts, TokenizerConfig(vocab_size=300))
    target = encoding.encode_split(split, tokenizer, tmp_path, num_proc=1).path
    for damage in (lambda: os.truncate(target / "src.ids", 8),
                   lambda: (target / "tgt.offsets").unlink()):
        damage()
        with pytest.raises(DataError, match=f"{re.escape(str(target))}: encoded store is "
                           "incomplete or damaged .*; delete that directory"):
            TokenStore.open(target)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="data"):
            store = encoding.encode_split(split, tokenizer, tmp_path, num_proc=1)
        assert f"encoded store {target} is incomplete or damaged" in caplog.text
        assert store.src.to_lists() == tokenizer.encode(texts)
        assert store.tgt.to_lists() == tokenizer.encode(texts[::-1])


def _examples_peak_bytes(path) -> tuple[int, int]:
    """(peak bytes allocated while the examples of store `path` are loaded and an epoch
    planned, bytes of the store's ids)."""
    store = TokenStore.open(path)
    config = BatchConfig(packing=False, batch_tokens=512, max_len=40, max_ratio=3.0,
                         buckets=(8, 16, 24, 32, 40))
    tracemalloc.start()
    try:
        examples = load_examples(store, config)
        plan_batches(examples, config, 0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, store.src.values.nbytes + store.tgt.values.nbytes


def test_memory_per_pair_stays_bounded(tmp_path):
    """Loading and planning read the lengths, never the ids: the memory they take per pair
    is the same for a corpus ten times larger, and well under the ids' size."""
    per_pair = {}
    for n in (2_000, 20_000):
        write_store(tmp_path / str(n), [random_encoded(n, seed=n)])
        peak, ids_bytes = _examples_peak_bytes(tmp_path / str(n))
        assert peak < ids_bytes / 2, (n, peak, ids_bytes)
        per_pair[n] = peak / n
    assert per_pair[20_000] < 1.5 * per_pair[2_000], per_pair


# ----------------------------------------------------------------------------- reading


def _write_prefix(tmp_path, n: int, bad_line: int | None = None) -> str:
    tmp_path.mkdir(exist_ok=True)
    src = [f"sentence number {k} ." for k in range(n)]
    tgt = [f"Satz Nummer {k} ." if k % 10 else "  " for k in range(n)]  # every 10th empty
    (tmp_path / "c.en").write_text("\n".join(src) + "\n")
    data = ("\n".join(tgt) + "\n").encode()
    if bad_line is not None:
        lines = data.split(b"\n")
        lines[bad_line - 1] += b"\xff"
        data = b"\n".join(lines)
    (tmp_path / "c.de").write_bytes(data)
    return str(tmp_path / "c")


def test_reading_streams_chunks_into_the_cache(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("FLAX_NMT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(arrow_text, "CHUNK_PAIRS", 7)
    prefix = _write_prefix(tmp_path, 100)
    with caplog.at_level(logging.INFO, logger="data"):
        pairs = read_prefix(prefix, "en", "de")
    assert "dropped 10 of 100 pairs with an empty side" in caplog.text
    assert len(pairs) == 90 and pairs[0] == {"source": "sentence number 1 .",
                                             "target": "Satz Nummer 1 ."}
    assert len(pairs.data.to_batches()) == 13  # 90 pairs in chunks of 7
    assert pairs.cache_files  # memory-mapped from the cache, not built in memory
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="data"):
        again = read_prefix(prefix, "en", "de")
    assert "90 pairs, read before" in caplog.text
    assert again._fingerprint == pairs._fingerprint and again["target"] == pairs["target"]
    # Other content is another entry.
    (tmp_path / "c.de").write_text((tmp_path / "c.de").read_text().replace("Satz", "Zeile"))
    assert read_prefix(prefix, "en", "de")[0]["target"] == "Zeile Nummer 1 ."


def test_a_text_cache_entry_with_its_arrow_file_gone_or_cut_is_read_again(
        tmp_path, monkeypatch, caplog):
    """An entry whose .json is there but whose .arrow was removed or truncated is written
    again from the input, where it stopped training with "a file: does not exist"."""
    monkeypatch.setenv("FLAX_NMT_CACHE", str(tmp_path / "cache"))
    prefix = _write_prefix(tmp_path, 100)
    expected = read_prefix(prefix, "en", "de")["target"]
    (arrow,) = (tmp_path / "cache" / "text").glob("*.arrow")
    for damage in (arrow.unlink, lambda: os.truncate(arrow, arrow.stat().st_size // 2)):
        damage()
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="data"):
            pairs = read_prefix(prefix, "en", "de")
        assert f"the text cache entry {arrow} is incomplete or damaged" in caplog.text
        assert "read before" not in caplog.text
        assert pairs["target"] == expected and arrow.is_file()


def test_invalid_utf8_deep_in_a_file_names_it_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("FLAX_NMT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(arrow_text, "CHUNK_PAIRS", 7)
    prefix = _write_prefix(tmp_path, 300, bad_line=257)
    with pytest.raises(DataError, match=r"c\.de line 257: invalid UTF-8 \(byte 0xff"):
        read_prefix(prefix, "en", "de")
    assert not list((tmp_path / "cache" / "text").iterdir())  # no half-written entry


def test_a_corpus_larger_than_the_free_disk_stops_before_reading(tmp_path, monkeypatch):
    monkeypatch.setenv("FLAX_NMT_CACHE", str(tmp_path / "cache"))
    prefix = _write_prefix(tmp_path, 1000)

    class Usage:
        free = 10_000  # bytes

    monkeypatch.setattr(disk.shutil, "disk_usage", lambda path: Usage)
    read = []
    monkeypatch.setattr(arrow_text, "_write", lambda *args: read.append(args))
    with pytest.raises(DataError) as error:
        load_corpus(CorpusSpec(train_prefix=prefix, src="en", tgt="de"))
    message = str(error.value)
    assert "\n" not in message and not read
    assert f"needs about 0.0 GiB in {tmp_path / 'cache' / 'text'} but only 0.0 GiB is free" \
        in message


# ----------------------------------------------------------------------------- two processes


def test_two_processes_read_once_and_encode_disjoint_shares(tmp_path):
    """Process 0 reads the text into the shared cache and process 1 opens it; each encodes
    its own rows, and both open the one store their shares join into."""
    prefix = _write_prefix(tmp_path, 500)
    valid = _write_prefix(tmp_path / "valid", 30)
    texts = load_corpus_texts(prefix)
    tokenizer = train_tokenizer(texts["source"] + texts["target"],
                                TokenizerConfig(vocab_size=320))
    tokenizer.save(tmp_path / "tok")
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "FLAX_NMT_CACHE": str(tmp_path / "cache"), "JAX_PLATFORMS": "cpu"}
    workers = [subprocess.Popen(
        [sys.executable, str(WORKER), "--port", str(port), "--process-id", str(k), "--prefix",
         prefix, "--valid-prefix", valid, "--tokenizer", str(tmp_path / "tok"),
         "--out", str(tmp_path / f"out{k}.json")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(2)]
    logs = []
    for worker in workers:
        _, stderr = worker.communicate(timeout=240)
        assert worker.returncode == 0, stderr[-3000:]
        logs.append(stderr)
    shares = [re.findall(r"encoding rows \[(\d+), (\d+)\) of (\d+): share (\d) of 2", log)
              for log in logs]
    # Each process encoded one share, and only its own.
    assert [[int(share) for *_, share in found] for found in shares] == [[0], [1]], logs
    (a0, b0, n0, _), = shares[0]
    (a1, b1, n1, _), = shares[1]
    assert int(n0) == int(n1) == len(texts["source"]) == 450
    assert (int(a0), int(b0), int(b1)) == (0, int(a1), 450) and 0 < int(a1) < 450
    # The text was read once: process 1 found process 0's copy in the cache.
    assert "c.{en,de}: 450 pairs\n" in logs[0] and "read before" not in logs[0]
    assert "c.{en,de}: 450 pairs, read before" in logs[1]
    expected = {"src": tokenizer.encode(texts["source"]), "tgt": tokenizer.encode(texts["target"])}
    for k in range(2):
        assert json.loads((tmp_path / f"out{k}.json").read_text()) == expected


def load_corpus_texts(prefix: str) -> dict[str, list[str]]:
    """The pairs reading keeps (both sides non-empty), as lists."""
    src = Path(f"{prefix}.en").read_text().splitlines()
    tgt = Path(f"{prefix}.de").read_text().splitlines()
    kept = [(s.strip(), t.strip()) for s, t in zip(src, tgt) if s.strip() and t.strip()]
    return {"source": [s for s, _ in kept], "target": [t for _, t in kept]}


def test_the_tokenizer_sample_streamed_from_the_cache_is_the_seeded_rows(tmp_path, monkeypatch):
    monkeypatch.setenv("FLAX_NMT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(arrow_text, "CHUNK_PAIRS", 7)
    pairs = read_prefix(_write_prefix(tmp_path, 100), "en", "de")
    rows = sample_rows(len(pairs), 20, seed=3)
    assert len(rows) == 20 and rows.tolist() == sorted(set(rows.tolist()))
    assert rows.tolist() == sample_rows(len(pairs), 20, seed=3).tolist()
    assert rows.tolist() != sample_rows(len(pairs), 20, seed=4).tolist()
    assert len(pairs.cache_files) == 1  # one Arrow file: the sample is streamed from it
    streamed = list(sample_text(pairs, rows))
    chosen = pairs.select(rows)
    assert sorted(streamed) == sorted(list(chosen["source"]) + list(chosen["target"]))
    assert sample_rows(len(pairs), 500, seed=3) is None  # all of a small corpus


# ----------------------------------------------------------------------------- encoding

# Each worker's start takes seconds here, as where a spawned worker imports JAX.
_SLOW_START = """
import multiprocess.context, os, sys, time
_start = multiprocess.context.SpawnProcess.start


def _slow_start(self):
    _start(self)
    open(os.path.join(sys.argv[2], f"started-{self.pid}"), "w").close()
    time.sleep(3)


multiprocess.context.SpawnProcess.start = _slow_start
"""


def test_ctrl_c_while_the_workers_start_ends_the_encoding(tmp_path):
    """Ctrl-C (SIGINT to the process group) while the encoding's worker processes start is
    acted on once they are started: the command says `interrupted` and exits 130 with no
    process, no worker's traceback and no temporary store left, not encoding to the end."""
    from test_data_tokenizer import _SLOW_ENCODING, _ended, _reap

    (tmp_path / "slow.py").write_text(_SLOW_START + _SLOW_ENCODING)
    marks, cache = tmp_path / "marks", tmp_path / "cache"
    marks.mkdir()
    command = subprocess.Popen(
        [sys.executable, str(tmp_path / "slow.py"), str(ROOT), str(marks), str(cache), "busy"],
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not list(marks.glob("started-*")) and command.poll() is None:
            assert time.monotonic() < deadline, "no worker started"
            time.sleep(0.05)
        os.killpg(command.pid, signal.SIGINT)  # the first worker started, the second not
        err, left = _ended(command, timeout=30)  # the workers encode for 60 s
    finally:
        _reap(command)
    assert command.returncode == 130, err
    assert [line for line in err.splitlines() if line.strip()] == ["probe: interrupted"], err
    assert not left, f"processes left behind: {left}"
    assert not list((cache / "encoded").iterdir())


def _letters_split_and_tokenizer() -> tuple[datasets.Dataset, object]:
    """Pairs, and the smallest vocabulary of their letters: about one id per byte of text,
    four times as many bytes of ids as a large vocabulary gives."""
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), 7)) for _ in range(400)]
    texts = [" ".join(rng.choice(words, 9)) for _ in range(600)]
    split = datasets.Dataset.from_dict({"source": texts, "target": texts[::-1]})
    return split, train_tokenizer(texts, TokenizerConfig(vocab_size=300))


def _encoding_peak_bytes(split, tokenizer, cache: Path, monkeypatch) -> int:
    """Bytes on disk when encoding `split` (in one round) peaks: its store and the Arrow
    files it is written from, both there as the last rows are written."""
    from data import encoding
    from data.store import store_bytes

    write, arrow_bytes = encoding.write_store, []

    def measured(directory, tables):
        def sized(tables):
            for table in tables:
                arrow_bytes.extend(os.path.getsize(f["filename"]) for f in table.cache_files)
                yield table

        rows = write(directory, sized(tables))
        arrow_bytes.append(store_bytes(directory))
        return rows

    monkeypatch.setattr(encoding, "write_store", measured)
    encoding.encode_split(split, tokenizer, cache, num_proc=1)
    monkeypatch.setattr(encoding, "write_store", write)
    return sum(arrow_bytes)


def test_encoding_that_would_not_fit_the_free_disk_stops_before_writing(tmp_path,
                                                                        monkeypatch):
    """The free-space check before encoding counts the tokenizer's own ids: with a small
    vocabulary the encoding takes several times the text, and a disk one byte short of
    its peak is refused before anything is written, not filled."""
    from data import encoding

    split, tokenizer = _letters_split_and_tokenizer()
    peak = _encoding_peak_bytes(split, tokenizer, tmp_path / "measured", monkeypatch)
    assert peak > 5 * split.data.nbytes  # ids of letters: 4 bytes a byte of text, twice

    class Usage:
        free = peak - 1

    monkeypatch.setattr(disk.shutil, "disk_usage", lambda path: Usage)
    with pytest.raises(DataError, match=f"encoding 600 pairs needs about .* in "
                       f"{re.escape(str(tmp_path / 'cache' / 'encoded'))} but only"):
        encoding.encode_split(split, tokenizer, tmp_path / "cache", num_proc=1)
    assert not list((tmp_path / "cache" / "encoded").iterdir())


def test_a_disk_full_while_encoding_names_the_cache_and_leaves_nothing(tmp_path, monkeypatch):
    """A full disk met while the store is written (the estimate was short, or another
    process filled the disk) is one line naming the cache directory and what to do, where
    the write's own error named no file; the temporary store is removed."""
    from data import encoding, store

    split, tokenizer = _letters_split_and_tokenizer()

    def full(self, values, lengths):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as write(2) gives it

    monkeypatch.setattr(store._SideWriter, "add", full)
    with pytest.raises(DataError) as error:
        encoding.encode_split(split, tokenizer, tmp_path / "cache", num_proc=1)
    assert str(error.value) == (
        f"encoding 600 pairs in {tmp_path / 'cache' / 'encoded'}: no space left on device; "
        "free some space, or set FLAX_NMT_CACHE to a directory on a larger disk")
    assert not list((tmp_path / "cache" / "encoded").iterdir())


@pytest.mark.parametrize("disk_after_the_shares", ["too small", "fills while joining"])
def test_a_join_of_shares_the_disk_cannot_hold_is_one_line(tmp_path, monkeypatch,
                                                           disk_after_the_shares):
    """The joined store takes as much disk as the shares, removed only after it: a disk that
    held the shares but cannot hold their copy is refused before the join, and a full disk
    met while joining names the cache, as an encoding's does; no temporary store is left."""
    from data import encoding

    split, tokenizer = _letters_split_and_tokenizer()
    encode_share, cache = encoding._encode_share, tmp_path / "cache"

    class Usage:
        free = 1000 if disk_after_the_shares == "too small" else 1 << 30

    def then_the_disk_fills(split, tokenizer, bounds, share, target, num_proc):
        encode_share(split, tokenizer, bounds, share, target, num_proc)
        if share == len(bounds) - 1:
            shares = sum(f.stat().st_size for f in target.parent.glob("*/*"))
            assert (shares > Usage.free) == (disk_after_the_shares == "too small")
            monkeypatch.setattr(disk.shutil, "disk_usage", lambda path: Usage)

    def full(directory, parts):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as write(2) gives it

    monkeypatch.setattr(encoding, "_encode_share", then_the_disk_fills)
    monkeypatch.setattr(encoding, "join_stores", full)
    with pytest.raises(disk.DiskFull) as error:
        encoding.encode_shared(split, tokenizer, 0, 2, barrier=lambda name: None,
                               cache_dir=cache, num_proc=1)
    encoded = cache / "encoded"
    assert str(error.value) == (
        f"joining 2 encoded shares needs about 0.0 GiB in {encoded} but only 0.0 GiB is free; "
        "free some space, or set FLAX_NMT_CACHE to a directory on a larger disk"
        if disk_after_the_shares == "too small" else
        f"joining 2 encoded shares in {encoded}: no space left on device; free some space, or "
        "set FLAX_NMT_CACHE to a directory on a larger disk")
    assert not any(path.name.startswith(".") for path in encoded.iterdir())


# An encoding into the store sys.argv[2] killed with SIGKILL once it writes its temporary.
_KILLED_ENCODING = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import datasets
from data import encoding

target = Path(sys.argv[2])
encoding._store_path = lambda *args: target


class KilledWhileEncoding:
    fingerprint = "killed"

    def encode(self, texts, side):
        if list(target.parent.glob(f".{target.name}-*")):
            os.kill(os.getpid(), signal.SIGKILL)
        return [[5] for _ in texts]


split = datasets.Dataset.from_dict({"source": ["a"] * 9, "target": ["b"] * 9})
encoding.encode_split(split, KilledWhileEncoding(), num_proc=1)
"""


def test_a_temporary_store_left_by_a_killed_encoding_is_removed_by_the_next(tmp_path, caplog):
    """The temporary directory of an encoding killed with SIGKILL is removed by the next
    encoding of the same split, once a minute old; a writer's own, locked however old, and
    one just made (its writer may not have locked it yet) are left alone."""
    from data import encoding

    split, tokenizer = _letters_split_and_tokenizer()
    target = encoding._store_path(split, tokenizer, tmp_path)
    target.parent.mkdir(parents=True)
    killed = subprocess.run([sys.executable, "-c", _KILLED_ENCODING, str(ROOT), str(target)])
    assert killed.returncode == -signal.SIGKILL
    abandoned, = target.parent.glob(f".{target.name}-*")
    new = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    hour_ago = time.time() - 3600
    os.utime(abandoned, (hour_ago, hour_ago))
    writing = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    lock = os.open(writing, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as its writer holds it
        os.utime(writing, (hour_ago, hour_ago))
        with caplog.at_level(logging.INFO, logger="data"):
            store = encoding.encode_split(split, tokenizer, tmp_path, num_proc=1)
        assert not abandoned.exists() and writing.exists() and new.exists()
    finally:
        os.close(lock)
    assert f"removing {abandoned}, left by an encoding that was killed" in caplog.text
    assert store.src.to_lists() == tokenizer.encode(split["source"])


def test_a_temporary_store_looked_at_as_it_is_made_stays_its_writers(tmp_path, monkeypatch):
    """Another encoding's look for abandoned temporary stores may hold a new one's lock when
    its writer takes it; an encoding of the same split a minute later must still leave that
    store to its writer (it removed it while it was being written)."""
    from data import encoding

    split, tokenizer = _letters_split_and_tokenizer()
    target = encoding._store_path(split, tokenizer, tmp_path)
    target.parent.mkdir(parents=True)
    let_go = scan_at_the_first_lock(monkeypatch, target.parent)
    with encoding._temporary_store(target) as tmp:
        assert let_go.wait(10)
        (tmp / "store-part").write_text("being written")
        age(tmp)
        store = encoding.encode_split(split, tokenizer, tmp_path, num_proc=1)
        assert (tmp / "store-part").read_text() == "being written"
    assert store.src.to_lists() == tokenizer.encode(split["source"])


@pytest.mark.parametrize("umask", [0o002, 0o022])
def test_a_store_gets_the_permissions_of_any_new_directory(umask, tmp_path):
    """A store's directory and files are made with the umask's permissions, as any new
    file is: with umask 002 the group shares the cache (mkdtemp's 0700 shut it out)."""
    from data import encoding

    split, tokenizer = _letters_split_and_tokenizer()
    previous = os.umask(umask)
    try:
        store = encoding.encode_split(split, tokenizer, tmp_path, num_proc=1)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o777 & ~umask
    assert {stat.S_IMODE(f.stat().st_mode) for f in store.path.iterdir()} == {0o666 & ~umask}


def test_a_store_this_user_may_not_read_is_one_line_not_damage(tmp_path, monkeypatch):
    """Another user's store in a shared cache that this one may not read is named, with
    what to do, in one line; it is not taken for damaged and moved aside (which another
    user's directory refuses, with a traceback)."""
    from data import encoding

    split, tokenizer = _letters_split_and_tokenizer()
    target = encoding.encode_split(split, tokenizer, tmp_path, num_proc=1).path
    read_text = Path.read_text

    def denied(self, *args, **kwargs):  # as a directory of another user's, mode 0700
        if self.parent == target:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", denied)
    with pytest.raises(DataError) as error:
        encoding.encode_split(split, tokenizer, tmp_path, num_proc=1)
    assert str(error.value) == (
        f"{target / 'store.json'}: permission denied reading the encoded store {target}; "
        f"have its owner make it readable (chmod -R a+rX {target}), or set FLAX_NMT_CACHE "
        "to a cache of your own")
    monkeypatch.undo()
    assert TokenStore.open(target).src.to_lists() == tokenizer.encode(split["source"])
