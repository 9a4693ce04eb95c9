"""Batching: token budget, bucket shapes, exact contents, resumption, process shards, filters."""

import json
import logging
import os
from pathlib import Path

import datasets
import numpy as np
import pytest

from data.batching import (
    DEFAULT_BUCKETS,
    BatchConfig,
    BatchIterator,
    Examples,
    _even_rows,
    _split_evenly,
    batch_arrays,
    bucket_epoch,
    bucket_grid,
    eval_batches,
    grid_epoch,
    inference_batches,
    load_examples,
    plan_stats,
    single_batch,
    source_width,
)
from data.corpus import CorpusSpec, DataError, iter_text, load_corpus
from data.encoding import encode_corpus
from data.tokenizer import BOS_ID, EOS_ID, PAD_ID, TokenizerConfig, train_tokenizer

MULTI30K = Path(os.environ["MULTI30K"])  # conftest.py: the shared copy unless set
BUCKETS = (4, 8, 12, 16, 24, 32, 48, 64)


def random_encoded(n: int, seed: int = 0, max_len: int = 40, vocab: int = 97) -> datasets.Dataset:
    """n pairs with random lengths (target about as long as source) and random ids >= 4."""
    rng = np.random.default_rng(seed)
    src_len = rng.integers(1, max_len, n)
    tgt_len = np.clip(src_len + rng.integers(-3, 4, n), 1, max_len)
    src = [rng.integers(4, vocab, k).tolist() for k in src_len]
    tgt = [rng.integers(4, vocab, k).tolist() for k in tgt_len]
    return datasets.Dataset.from_dict({
        "src_ids": src, "tgt_ids": tgt, "src_len": src_len.tolist(), "tgt_len": tgt_len.tolist(),
    })


@pytest.fixture(scope="module")
def encoded() -> datasets.Dataset:
    return random_encoded(1000)


def expected_rows(encoded: datasets.Dataset, index: int) -> tuple[list[int], list[int]]:
    row = encoded[index]
    return row["src_ids"], row["tgt_ids"]


def padded(ids: list[int], width: int) -> list[int]:
    return ids + [PAD_ID] * (width - len(ids))


def test_batches_respect_budget_buckets_and_contents(encoded):
    config = BatchConfig(packing=False, batch_tokens=512, max_len=64, buckets=BUCKETS,
                         num_devices=4)
    examples = load_examples(encoded, config)
    plan = bucket_epoch(examples, config, epoch=0)
    rows_of_shape: dict[tuple[int, int], int] = {}
    seen = []
    for planned in plan:
        batch = batch_arrays(examples, planned)
        size, width_s = batch["src"].shape
        width_t = batch["tgt_in"].shape[1]
        assert batch["tgt_out"].shape == (size, width_t)
        assert all(a.dtype == np.int32 for a in batch.values())
        assert width_s in BUCKETS and width_t in BUCKETS
        assert size % 4 == 0 and size * max(width_s, width_t) <= 512
        assert rows_of_shape.setdefault((width_s, width_t), size) == size  # one B per shape
        for r, k in enumerate(planned.rows):
            if k < 0:
                assert not batch["src"][r].any() and not batch["tgt_in"][r].any()
                assert not batch["tgt_out"][r].any()
                continue
            src, tgt = expected_rows(encoded, int(examples.index[k]))
            assert batch["src"][r].tolist() == padded(src + [EOS_ID], width_s)
            assert batch["tgt_in"][r].tolist() == padded([BOS_ID] + tgt, width_t)
            assert batch["tgt_out"][r].tolist() == padded(tgt + [EOS_ID], width_t)
            seen.append(int(examples.index[k]))
    assert sorted(seen) == list(range(len(encoded)))  # every pair exactly once per epoch
    stats = plan_stats(examples, config)
    assert stats.batches == len(plan) and stats.max_batch_tokens <= 512
    assert stats.num_shapes == len(rows_of_shape)


def test_no_batch_is_wider_than_max_len(encoded):
    config = BatchConfig(packing=False, batch_tokens=512, max_len=30, buckets=BUCKETS)
    assert config.used_buckets == (4, 8, 12, 16, 24, 30)
    examples = load_examples(encoded, config)
    widths = {(b.src_len, b.tgt_len) for b in bucket_epoch(examples, config, 0)}
    assert max(max(w) for w in widths) == 30
    assert all(s in config.used_buckets and t in config.used_buckets for s, t in widths)


def test_max_len_beyond_the_last_bucket_is_one_more_width(encoded):
    """--max-tokens-per-sentence above the largest of --buckets: the widest batches are
    max_len wide, sized by the token budget like every other width."""
    config = BatchConfig(packing=False, batch_tokens=512, max_len=37, buckets=(4, 8, 16, 32))
    assert config.used_buckets == (4, 8, 16, 32, 37)
    examples = load_examples(encoded, config)
    assert int(max(examples.src_len.max(), examples.tgt_len.max())) > 32
    plan = bucket_epoch(examples, config, 0)
    assert sorted(int(k) for b in plan for k in b.rows if k >= 0) == list(range(len(examples)))
    assert {(b.src_len, b.tgt_len) for b in plan} <= {(s, t) for s in config.used_buckets
                                                       for t in config.used_buckets}
    widest = [b for b in plan if max(b.src_len, b.tgt_len) == 37]
    assert widest and all(len(b.rows) * 37 <= 512 for b in widest)


def test_bad_buckets_name_the_flag():
    for buckets in ((), (8, 4), (1, 8), (8, 8)):
        with pytest.raises(DataError, match=r"--buckets must be integers >= 2 in strictly "
                                            r"increasing order"):
            BatchConfig(packing=False, buckets=buckets)


def test_max_shapes_bounds_the_shapes(encoded):
    config = BatchConfig(packing=False, batch_tokens=256, max_len=64, buckets=BUCKETS)
    examples = load_examples(encoded, config)
    unbounded = plan_stats(examples, config)
    assert unbounded.num_shapes > 4
    bounded = plan_stats(examples, BatchConfig(packing=False, batch_tokens=256, max_len=64,
                                               buckets=BUCKETS, max_shapes=4))
    assert bounded.num_shapes <= 4
    assert bounded.real_tokens == unbounded.real_tokens  # still every pair once
    assert bounded.padding_waste > unbounded.padding_waste


def test_a_cell_spreads_its_pairs_evenly_over_its_batches():
    # B rounded up to a multiple of the devices once left every all-pad row to the last
    # batch: 9 pairs in B = 8 rows gave 8 and 1 real rows, 17 pairs on 8 devices 16 and 1.
    rng = np.random.default_rng(0)
    cases = [(9, 8, 4), (17, 16, 8), (10, 4, 1)] + [
        (int(rng.integers(1, 300)), int(rng.integers(1, 70)), int(rng.choice([1, 2, 3, 4, 8])))
        for _ in range(500)]
    for pairs, max_rows, devices in cases:
        max_rows = max(max_rows, devices)
        rows = _even_rows(pairs, max_rows, devices)
        pool = rng.permutation(1000)[:pairs]
        batches = _split_evenly(pool, rows, 12, 16)
        assert len(batches) == -(-pairs // rows)  # the shapes of a plain cut into B rows
        assert all(len(b.rows) == rows and (b.src_len, b.tgt_len) == (12, 16) for b in batches)
        real = [b.rows[b.rows >= 0] for b in batches]
        assert np.concatenate(real).tolist() == pool.tolist()  # each pair once, in order
        counts = [len(r) for r in real]
        assert max(counts) - min(counts) <= 1, (pairs, max_rows, devices, counts)
        assert all((b.rows[len(r):] == -1).all() for b, r in zip(batches, real))
    assert [sum(b.rows >= 0) for b in _split_evenly(np.arange(9), 8, 4, 4)] == [5, 4]
    assert [sum(b.rows >= 0) for b in _split_evenly(np.arange(10), 4, 4, 4)] == [4, 3, 3]


@pytest.mark.parametrize("devices", [1, 3, 8])
def test_bucketed_and_grid_epochs_fill_a_cells_batches_within_one_pair(devices):
    rng = np.random.default_rng(devices)
    src_len = rng.integers(2, 64, 3000)
    tgt_len = np.clip(src_len + rng.integers(-4, 5, 3000), 2, 64)
    config = BatchConfig(packing=False, batch_tokens=1024, max_len=64, buckets=BUCKETS,
                         num_devices=devices)
    # A sampled epoch: lengths change by a token or two, the grid's shapes stay.
    jitter = [np.clip(n + rng.integers(-2, 2, len(n)), 1, 64) for n in (src_len, tgt_len)]
    grid = bucket_grid(src_len, tgt_len, config)
    plans = [bucket_epoch(Examples(None, np.arange(3000), src_len, tgt_len), config, 0),
             grid_epoch(Examples(None, np.arange(3000), *jitter), grid, config, 0)]
    for plan in plans:
        rows = np.concatenate([b.rows for b in plan])
        assert sorted(rows[rows >= 0].tolist()) == list(range(3000))
        cells: dict[tuple[int, int, int], list[int]] = {}
        for b in plan:
            assert len(b.rows) % devices == 0
            cells.setdefault((len(b.rows), b.src_len, b.tgt_len), []).append(
                int((b.rows >= 0).sum()))
        for (size, _, _), real in cells.items():  # a shape is one cell's
            assert len(real) == -(-sum(real) // size)  # as many batches as a plain cut
            assert max(real) - min(real) <= 1, (size, real)


def test_plan_depends_on_seed_and_epoch_only(encoded):
    config = BatchConfig(packing=False, batch_tokens=512, max_len=64, buckets=BUCKETS)
    examples = load_examples(encoded, config)

    def rows(plan):
        return [b.rows.tolist() for b in plan]

    epoch0 = rows(bucket_epoch(examples, config, 0))
    assert rows(bucket_epoch(examples, config, 0)) == epoch0
    assert rows(bucket_epoch(examples, config, 1)) != epoch0
    other_seed = BatchConfig(packing=False, batch_tokens=512, max_len=64, buckets=BUCKETS, seed=1)
    assert rows(bucket_epoch(examples, other_seed, 0)) != epoch0


def take(iterator, n):
    return [next(iterator) for _ in range(n)]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])


def test_resumed_iterator_gives_the_same_batches(encoded):
    config = BatchConfig(packing=False, batch_tokens=1024, max_len=64, buckets=BUCKETS,
                         num_devices=2)
    examples = load_examples(encoded, config)
    per_epoch = len(bucket_epoch(examples, config, 0))
    original = BatchIterator(examples, config, process_index=0, process_count=1)
    states, batches = [], []
    for taken in range(2 * per_epoch + 5):  # crosses two epoch boundaries
        # --max-epochs stops as soon as an epoch's last batch is out, not one batch later
        assert original.epochs_completed == taken // per_epoch
        states.append(json.loads(json.dumps(original.state)))
        batches.append(next(original))
    assert original.state == {"epoch": 2, "position": 5}
    for start in (0, 3, per_epoch - 1, per_epoch, per_epoch + 7):
        resumed = BatchIterator(examples, config, state=states[start], process_index=0,
                                process_count=1)
        assert_same_batches(take(resumed, 6), batches[start:start + 6])


def test_process_shards_are_disjoint_and_cover_the_global_batch(encoded):
    config = BatchConfig(packing=False, batch_tokens=1024, max_len=64, buckets=BUCKETS,
                         num_devices=4)
    examples = load_examples(encoded, config)
    whole = BatchIterator(examples, config, process_index=0, process_count=1)
    shards = [BatchIterator(examples, config, process_index=p, process_count=2) for p in (0, 1)]
    n = len(bucket_epoch(examples, config, 0)) + 3
    for global_batch, part0, part1 in zip(take(whole, n), take(shards[0], n), take(shards[1], n)):
        for key in global_batch:
            assert part0[key].shape[0] == part1[key].shape[0] == global_batch[key].shape[0] // 2
            np.testing.assert_array_equal(np.concatenate([part0[key], part1[key]]),
                                          global_batch[key])
    # Disjoint and covering, in terms of pairs: split every planned batch's rows.
    for planned in bucket_epoch(examples, config, 0):
        half = len(planned.rows) // 2
        first, second = set(planned.rows[:half]) - {-1}, set(planned.rows[half:]) - {-1}
        assert not first & second and first | second == set(planned.rows) - {-1}


def test_batch_sizes_must_split_over_processes(encoded):
    config = BatchConfig(packing=False, batch_tokens=1024, max_len=64, buckets=BUCKETS,
                         num_devices=3)
    examples = load_examples(encoded, config)
    with pytest.raises(DataError, match="num_devices 3 is not a multiple of the process count 2"):
        BatchIterator(examples, config, process_index=0, process_count=2)
    with pytest.raises(DataError, match=r"a batch of 100 tokens \(--batch-tokens x --accum\) "
                                        r"holds 1 rows of the longest pairs \(64 tokens: the "
                                        r"smaller of --max-tokens-per-sentence and the model's "
                                        r"--max-len\), fewer than the 2 .*use --batch-tokens 128"):
        BatchConfig(packing=False, batch_tokens=100, max_len=64, buckets=BUCKETS, num_devices=2)


def test_default_process_from_jax(encoded):
    config = BatchConfig(packing=False, batch_tokens=1024, max_len=64, buckets=BUCKETS)
    iterator = BatchIterator(load_examples(encoded, config), config)
    assert (iterator.process_index, iterator.process_count) == (0, 1)


def test_filters_drop_and_count(caplog):
    src = [[5] * 3, [5] * 70, [5] * 2, [5] * 30, [5] * 10]
    tgt = [[6] * 3, [6] * 4, [6] * 40, [6] * 1, [6] * 12]
    encoded = datasets.Dataset.from_dict({"src_ids": src, "tgt_ids": tgt})
    config = BatchConfig(packing=False, max_len=64, max_ratio=9.0, buckets=BUCKETS,
                         batch_tokens=512)
    with caplog.at_level(logging.INFO, logger="data"):
        examples = load_examples(encoded, config)
    # 71 > 64 positions; 40 / 2 > 9 (target vs source); 30 / 1 > 9; 3/4 and 10/12 are kept.
    assert examples.index.tolist() == [0, 4]
    assert ("kept 2 of 5 pairs; dropped 0 with an empty side (no tokens), 1 longer than 64 "
            "positions (tokens + EOS or BOS), 2 with token ratio > 9" in caplog.text)
    assert examples.src_len.tolist() == [4, 11] and examples.tgt_len.tolist() == [4, 13]
    batches = list(eval_batches(examples, config, process_index=0, process_count=1))
    rows = [row.tolist() for b in batches for row in b["src"] if row.any()]
    width = batches[0]["src"].shape[1]
    assert rows == [padded([5, 5, 5, EOS_ID], width), padded([5] * 10 + [EOS_ID], width)]


def test_length_ratio_filter_keeps_pairs_at_exactly_the_limit():
    """Guards max_ratio as "more than this many times" the tokens (Moses' clean-corpus): 18 / 2
    and 9 / 1 are kept with max_ratio 9, 19 / 2 and 10 / 1 dropped, whichever side is the
    longer. EOS and BOS are not tokens of the text: with them 10 / 1 would be 11 / 2."""
    src = [[5] * 2, [5] * 2, [5] * 18, [5] * 19, [5] * 4, [5] * 9, [5] * 10, [5], [5]]
    tgt = [[6] * 18, [6] * 19, [6] * 2, [6] * 2, [6] * 4, [6], [6], [6] * 9, [6] * 10]
    encoded = datasets.Dataset.from_dict({"src_ids": src, "tgt_ids": tgt})
    config = BatchConfig(packing=False, max_len=64, max_ratio=9.0, buckets=BUCKETS,
                         batch_tokens=512)
    assert load_examples(encoded, config).index.tolist() == [0, 2, 4, 5, 7]


def test_the_length_limit_counts_positions_and_says_so(caplog):
    """--max-tokens-per-sentence 64 keeps 63 tokens a side: EOS (source) or BOS (target)
    takes the 64th position, and the log names positions, not tokens."""
    src = [[5] * 63, [5] * 64, [5] * 3, [5] * 3]
    tgt = [[6] * 3, [6] * 3, [6] * 63, [6] * 64]
    encoded = datasets.Dataset.from_dict({"src_ids": src, "tgt_ids": tgt})
    config = BatchConfig(packing=False, max_len=64, max_ratio=100.0, buckets=BUCKETS,
                         batch_tokens=512)
    with caplog.at_level(logging.INFO, logger="data"):
        assert load_examples(encoded, config).index.tolist() == [0, 2]
    assert "2 longer than 64 positions (tokens + EOS or BOS)" in caplog.text


def test_a_side_of_no_tokens_is_dropped_and_counted_as_empty(tmp_path, caplog):
    """A line of characters that encode to no token (U+200B, U+FEFF: not blank to
    `str.strip`, so reading keeps it) makes an empty side: the pair is dropped and counted
    with the empty ones, not trained on as EOS alone."""
    from data.encoding import encode_split
    from data.tokenizer import TokenizerConfig, train_tokenizer

    texts = ["a small house", "\u200b", "the old tree", "\ufeff", "green hills"]
    tokenizer = train_tokenizer(texts, TokenizerConfig(vocab_size=300))
    split = datasets.Dataset.from_dict({"source": texts, "target": texts[::-1]})
    store = encode_split(split, tokenizer, tmp_path, num_proc=1)
    assert [len(ids) for ids in store.src.to_lists()][1::2] == [0, 0]
    config = BatchConfig(packing=False, max_len=64, max_ratio=100.0, buckets=BUCKETS,
                         batch_tokens=512)  # no pair too unequal
    with caplog.at_level(logging.INFO, logger="data"):
        examples = load_examples(store, config)
    assert examples.index.tolist() == [0, 2, 4]
    assert min(examples.src_len.min(), examples.tgt_len.min()) > 1
    assert "kept 3 of 5 pairs; dropped 2 with an empty side (no tokens), 0 longer" in caplog.text


def test_no_pairs_left_is_an_error():
    encoded = datasets.Dataset.from_dict({"src_ids": [[5] * 100], "tgt_ids": [[6] * 100]})
    with pytest.raises(DataError, match=r"train: no pairs left after filtering 1 pairs \(0 "
                       r"with an empty side; 1 longer than 64 positions, tokens \+ EOS or BOS: "
                       r"--max-tokens-per-sentence"):
        load_examples(encoded, BatchConfig(packing=False, max_len=64, buckets=BUCKETS,
                                           batch_tokens=512))


def test_a_validation_set_emptied_by_the_length_filter_is_told_to_raise_max_len(tmp_path):
    """Validation is cut at the model's --max-len, never at --max-tokens-per-sentence: the
    error names that limit, not the training filter's flag."""
    from nmt.settings import recipes
    from nmt.training.run_data import prepare_data
    from synthetic_corpus import write_corpus

    train = write_corpus(tmp_path, 200, 0, "train")
    for lang, word in (("en", "red"), ("de", "rot")):
        (tmp_path / f"long.{lang}").write_text(" ".join([word] * 200) + "\n")
    run = recipes.run_from_flat(preset="tiny", train_prefix=train,
                                valid_prefix=str(tmp_path / "long"), vocab_size=320,
                                max_tokens_per_sentence=32)
    with pytest.raises(DataError) as info:
        prepare_data(run, tmp_path / "run", model_max_len=64)
    message = str(info.value)
    assert message.startswith("validation: no pairs left after filtering 1 pairs")
    assert ("1 longer than 64 positions, tokens + EOS or BOS: the model's --max-len "
            "(validation pairs are never filtered by --max-tokens-per-sentence)" in message)
    assert message.endswith("; raise --max-len or check the data")


def test_eval_batches_give_every_pair_once(encoded):
    config = BatchConfig(packing=False, batch_tokens=512, max_len=64, buckets=BUCKETS)
    examples = load_examples(encoded, config)
    src_tokens = sum(int((b["src"] != PAD_ID).sum()) for b in
                     eval_batches(examples, config, process_index=0, process_count=1))
    assert src_tokens == int(examples.src_len.sum())


def test_a_single_batch_keeps_input_order_ends_each_row_with_eos_and_pads_the_rest():
    ids = [[5, 6, 7], [8] * 20, [], [9, 10]]
    width = source_width(ids, BUCKETS)
    assert width == 24  # the longest, 20 tokens + EOS, in its bucket
    src, index = single_batch(ids, rows=8, width=width)
    assert src.shape == (8, 24) and index.tolist() == [0, 1, 2, 3, -1, -1, -1, -1]
    for row, tokens in zip(src, ids):
        assert row.tolist() == tokens + [EOS_ID] + [PAD_ID] * (23 - len(tokens))
    assert not src[4:].any()
    with pytest.raises(ValueError, match="4 sentences of up to 20 tokens"):
        single_batch(ids, rows=3, width=24)
    with pytest.raises(ValueError, match="do not fit a batch of 8 rows of width 16"):
        single_batch(ids, rows=8, width=16)


def test_inference_batches_restore_input_order():
    rng = np.random.default_rng(1)
    ids = [rng.integers(4, 50, k).tolist() for k in rng.integers(0, 30, 101)] + [[7] * 300]
    restored: list = [None] * len(ids)
    sizes: dict[int, int] = {}
    batches = list(inference_batches(ids, batch_tokens=128, buckets=BUCKETS, multiple_of=2))
    # Batches are filled across buckets: only the last may hold rows of PAD, whose search
    # steps would cost as much as a sentence's.
    assert all((index >= 0).all() for _, index in batches[:-1])
    for src, index in batches:
        width = src.shape[1]
        assert width in BUCKETS or width == 320  # 301 tokens: rounded up to a multiple of 64
        assert sizes.setdefault(width, src.shape[0]) == src.shape[0]
        assert src.shape[0] % 2 == 0 and (src.shape[0] * width <= 128 or src.shape[0] == 2)
        for row, k in zip(src, index):
            if k < 0:
                assert not row.any()
            else:
                tokens = row.tolist()
                restored[k] = tokens[:tokens.index(EOS_ID)]
                assert not any(tokens[len(restored[k]) + 1:])
    assert restored == ids


@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"{MULTI30K} not found (shared data absent)")
def test_multi30k_padding_waste_and_shapes(tmp_path):
    corpus = load_corpus(CorpusSpec(train_prefix=str(MULTI30K / "train"),
                                    valid_prefix=str(MULTI30K / "valid")))
    # Default vocabulary; a 20k-sentence sample keeps the test fast (waste barely changes).
    tokenizer = train_tokenizer(iter_text(corpus["train"]), TokenizerConfig(max_sentences=20_000))
    encoded = encode_corpus(corpus, tokenizer, cache_dir=tmp_path)
    config = BatchConfig()
    examples = load_examples(encoded["train"], config)
    stats = plan_stats(examples, config)
    assert config.buckets == DEFAULT_BUCKETS
    assert stats.pairs == 29000
    assert stats.padding_waste <= 0.10, stats.summary()
    assert stats.num_shapes <= 48, stats.summary()
    assert stats.max_batch_tokens <= config.batch_tokens
