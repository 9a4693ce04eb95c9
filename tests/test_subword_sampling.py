"""Subword regularization: each epoch's segmentations sampled anew, reproducibly, within the
batch limits, and refused where the tokenizer or the settings cannot sample."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import datasets
import numpy as np
import pytest

from data import sampling
from data.batching import BatchConfig, BatchIterator, load_examples, plan_batches, plan_stats
from data.config import DataError, TokenizerConfig
from data.encoding import encode_split
from data.packing import fit_width
from data.sampling import SampledEpochs
from data.store import TokenStore
from data.tokenizer import Tokenizer, VocabTokenizer, train_tokenizer
from synthetic_corpus import syllable_sentences


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[datasets.Dataset, Tokenizer, object]:
    """300 pairs, a 400-piece unigram model, and the pairs kept by a loose filter."""
    sources, targets = syllable_sentences(300, 0), syllable_sentences(300, 1)
    texts = datasets.Dataset.from_dict({"source": sources, "target": targets})
    tokenizer = train_tokenizer(sources + targets, TokenizerConfig(vocab_size=400))
    store = encode_split(texts, tokenizer, tmp_path_factory.mktemp("cache"), num_proc=1)
    return texts, tokenizer, store


def _epochs(corpus, seed=0, alpha=0.5, nbest=-1, **batching) -> SampledEpochs:
    texts, tokenizer, store = corpus
    config = BatchConfig(**{"batch_tokens": 512, "max_len": 64, **batching})
    return SampledEpochs(load_examples(store, config), texts, tokenizer, alpha=alpha,
                         nbest=nbest, seed=seed, config=config)


def _rows(examples) -> list[tuple[list[int], list[int]]]:
    store = examples.store
    return [(store.src.row(int(i)).tolist(), store.tgt.row(int(i)).tolist())
            for i in examples.index]


def test_epochs_differ_and_each_is_the_same_for_the_same_seed_and_epoch(corpus):
    texts, tokenizer, store = corpus
    first, again = _epochs(corpus), _epochs(corpus)
    epoch0, epoch1 = _rows(first.examples(0)), _rows(first.examples(1))
    assert _rows(again.examples(1)) == epoch1    # a resumed run starting at epoch 1
    assert _rows(again.examples(0)) == epoch0    # out of order, in a new thread
    assert _rows(_epochs(corpus, seed=1).examples(0)) != epoch0
    deterministic = [(store.src.row(k).tolist(), store.tgt.row(k).tolist())
                     for k in range(len(store))]
    changed = sum(a != b for a, b in zip(epoch0, epoch1))
    assert changed > len(epoch0) // 3
    assert sum(a != b for a, b in zip(epoch0, deterministic)) > len(epoch0) // 3
    # Another segmentation of the same text: it decodes to the sentence it came from.
    for k in (0, 7, 123):
        assert tokenizer.decode([epoch1[k][0]])[0] == texts[k]["source"]
        assert tokenizer.decode([epoch1[k][1]])[0] == texts[k]["target"]


def test_the_same_epoch_sampled_while_another_thread_samples_is_the_same(corpus):
    """The draws are per thread: another sampling thread running alongside changes nothing."""
    expected = _rows(_epochs(corpus).examples(2))
    other = threading.Thread(target=lambda: _epochs(corpus, seed=5).examples(0))
    other.start()
    got = _rows(_epochs(corpus).examples(2))
    other.join()
    assert got == expected


def test_a_pair_sampled_past_the_limits_keeps_its_deterministic_segmentation(corpus):
    """The same draws under a limit as long as the longest fixed pair: the pairs that came
    out longer have their fixed ids, every other pair its sampled ones."""
    texts, tokenizer, store = corpus
    config = BatchConfig(batch_tokens=512, max_len=64, packing=False)
    kept = load_examples(store, config)
    longest = int(np.max(np.maximum(kept.src_len, kept.tgt_len)))
    tight = dataclasses.replace(config, max_len=longest)

    def epoch0(limits):
        return SampledEpochs(kept, texts, tokenizer, alpha=0.2, nbest=-1, seed=0,
                             config=limits).examples(0)

    loose, held = epoch0(config), epoch0(tight)
    assert np.max(np.maximum(held.src_len, held.tgt_len)) <= longest
    too_long = set(np.flatnonzero(np.maximum(loose.src_len, loose.tgt_len) > longest).tolist())
    assert too_long
    fixed = _rows(kept)
    for k, (sampled, got) in enumerate(zip(_rows(loose), _rows(held))):
        assert got == (fixed[k] if k in too_long else sampled), k
        assert (len(got[0]) + 1, len(got[1]) + 1) == (held.src_len[k], held.tgt_len[k])


def _token_ratio(examples) -> np.ndarray:
    """[N] the longer side's tokens over the shorter's (lengths without EOS or BOS)."""
    src, tgt = examples.src_len - 1, examples.tgt_len - 1
    return np.maximum(src, tgt) / np.minimum(src, tgt)


def test_a_pair_sampled_past_the_length_ratio_keeps_its_deterministic_segmentation(corpus):
    """The ratio a sampled pair is held to is the filter's, counted in tokens: under a limit
    most fixed pairs meet, sampled pairs more unequal than it keep their fixed ids."""
    texts, tokenizer, store = corpus
    config = BatchConfig(batch_tokens=512, max_len=64, packing=False)
    kept = load_examples(store, config)
    tight = dataclasses.replace(config, max_ratio=float(np.percentile(_token_ratio(kept), 90)))

    def epoch0(limits):
        return SampledEpochs(kept, texts, tokenizer, alpha=0.2, nbest=-1, seed=0,
                             config=limits).examples(0)

    loose, held = epoch0(config), epoch0(tight)
    too_unequal = set(np.flatnonzero(_token_ratio(loose) > tight.max_ratio).tolist())
    assert too_unequal
    fixed = _rows(kept)
    for k, (sampled, got) in enumerate(zip(_rows(loose), _rows(held))):
        assert got == (fixed[k] if k in too_unequal else sampled), k


def test_packed_rows_wider_than_max_len_take_no_sampled_pair_longer_than_it(corpus):
    """A packed row's width is the longest pair rounded up to 8; a sampled pair between
    max_len and that width would have positions the model does not have."""
    texts, tokenizer, store = corpus
    lengths = np.maximum(store.src.lengths(), store.tgt.lengths()) + 1
    max_len = int(np.percentile(lengths, 80)) // 8 * 8 + 3      # not a multiple of 8
    config = BatchConfig(batch_tokens=4096, max_len=max_len, packing=True)
    kept = load_examples(store, config)
    config = fit_width(config, kept.src_len, kept.tgt_len)
    assert config.width > max_len
    loose = SampledEpochs(kept, texts, tokenizer, alpha=0.1, nbest=-1, seed=0,
                          config=dataclasses.replace(config, max_len=64)).examples(0)
    loose_len = np.maximum(loose.src_len, loose.tgt_len)
    assert np.any((loose_len > max_len) & (loose_len <= config.width))   # the draws reach it
    held = SampledEpochs(kept, texts, tokenizer, alpha=0.1, nbest=-1, seed=0,
                         config=config).examples(0)
    assert np.max(np.maximum(held.src_len, held.tgt_len)) <= max_len


def test_no_chunk_or_side_repeats_the_draws_of_another(corpus, tmp_path, monkeypatch):
    """SentencePiece restarts its generator at every call: each chunk and side is seeded on
    its own, so the same sentences in two chunks, or on both sides, are sampled apart."""
    texts, tokenizer, _ = corpus
    half = list(texts["source"])[:150]
    twice = datasets.Dataset.from_dict({"source": half * 2, "target": half * 2})
    store = encode_split(twice, tokenizer, tmp_path, num_proc=1)
    monkeypatch.setattr(sampling, "TEXT_CHUNK", 150)
    rows = _rows(_epochs((twice, tokenizer, store)).examples(0))
    assert sum(rows[k] != rows[k + 150] for k in range(150)) > 50      # chunk 0 vs chunk 1
    assert sum(src != tgt for src, tgt in rows) > 100                   # source vs target


def test_closing_stops_the_next_epochs_sampling_and_refuses_more(corpus, monkeypatch):
    monkeypatch.setattr(sampling, "TEXT_CHUNK", 10)
    epochs = _epochs(corpus)
    epochs.examples(0)                       # epoch 1 starts on its thread, 30 chunks
    epochs.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("subword-sampling")]
    with pytest.raises(sampling.SamplingStopped, match="closed"):
        epochs.examples(1)


def test_a_process_that_exits_while_the_next_epoch_is_sampled_exits_cleanly(tmp_path):
    """The interpreter kills daemon threads at exit; one killed inside SentencePiece aborts
    the process (SIGABRT) instead of ending with its own status."""
    script = textwrap.dedent("""
        import time
        import datasets
        from data.batching import BatchConfig, load_examples
        from data.config import TokenizerConfig
        from data.encoding import encode_split
        from data.sampling import SampledEpochs
        from data.tokenizer import train_tokenizer
        from synthetic_corpus import syllable_sentences
        src, tgt = syllable_sentences(300, 0), syllable_sentences(300, 1)
        tokenizer = train_tokenizer(src + tgt, TokenizerConfig(vocab_size=400))
        texts = datasets.Dataset.from_dict({"source": src * 100, "target": tgt * 100})
        config = BatchConfig(batch_tokens=512, max_len=64)
        store = encode_split(texts, tokenizer, %r, num_proc=1)
        epochs = SampledEpochs(load_examples(store, config), texts, tokenizer, alpha=0.1,
                               nbest=-1, seed=0, config=config)
        epochs.examples(0)
        time.sleep(0.5)                      # epoch 1 is being drawn, 30,000 pairs
        print("exiting")
    """ % str(tmp_path / "cache"))
    tests_dir = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests_dir.parent), str(tests_dir)])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert (done.returncode, done.stdout) == (0, "exiting\n"), done.stderr[-2000:]


def test_an_epoch_sampled_in_another_process_is_the_same(corpus, tmp_path):
    """A resumed run, and each process of a multi-process one, draws its epochs in a process
    of its own: the same seed and epoch must give the same ids there."""
    texts, tokenizer, _ = corpus
    here = hashlib.sha256(repr(_rows(_epochs(corpus).examples(1))).encode()).hexdigest()
    (tmp_path / "spm.model").write_bytes(tokenizer.model_bytes)
    script = textwrap.dedent("""
        import hashlib, sys
        import datasets
        from data.batching import BatchConfig, load_examples
        from data.encoding import encode_split
        from data.sampling import SampledEpochs
        from data.tokenizer import Tokenizer
        from synthetic_corpus import syllable_sentences
        tokenizer = Tokenizer.load(%r)
        src, tgt = syllable_sentences(300, 0), syllable_sentences(300, 1)
        texts = datasets.Dataset.from_dict({"source": src, "target": tgt})
        config = BatchConfig(batch_tokens=512, max_len=64)
        store = encode_split(texts, tokenizer, %r, num_proc=1)
        examples = SampledEpochs(load_examples(store, config), texts, tokenizer, alpha=0.5,
                                 nbest=-1, seed=0, config=config).examples(1)
        rows = [(examples.store.src.row(int(i)).tolist(),
                 examples.store.tgt.row(int(i)).tolist()) for i in examples.index]
        print(hashlib.sha256(repr(rows).encode()).hexdigest())
    """ % (str(tmp_path / "spm.model"), str(tmp_path / "cache")))
    tests_dir = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests_dir.parent), str(tests_dir)])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == here


def test_a_sentencepiece_whose_draws_differ_between_processes_is_refused(corpus,
                                                                        monkeypatch):
    """Where the probe drawn in a new process differs from this process's, sampling would
    not repeat on resume: one line names the installed version and what to install."""
    monkeypatch.setattr(sampling, "_draw_in_new_process", lambda *args: [[5, 6, 7]])
    with pytest.raises(DataError, match=r"the installed sentencepiece \S+ draws differently "
                       r"in every process .*pip install 'sentencepiece<0.2.2'"):
        _epochs(corpus)


def test_a_probe_that_cannot_run_names_the_interpreters_own_error(corpus, tmp_path,
                                                                  monkeypatch):
    """The probe's process is the interpreter running this one: where it fails (no
    sentencepiece importable there), one line gives its last error line, not a traceback of
    the probe's script; what it prints before the draw does not count as the draw."""
    import stat

    python = sys.executable

    def interpreter(name: str, body: str) -> str:
        path = tmp_path / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
        return str(path)

    monkeypatch.setattr(sampling.sys, "executable", interpreter(
        "broken", "echo \"ModuleNotFoundError: No module named 'sentencepiece'\" >&2; exit 1"))
    with pytest.raises(DataError, match=r"drawing a probe in a new Python process \(.*broken\), "
                       r"which failed: ModuleNotFoundError: No module named 'sentencepiece'; "):
        _epochs(corpus)
    monkeypatch.setattr(sampling.sys, "executable", interpreter(
        "chatty", f"echo 'a greeting from a start-up hook'; exec {python} \"$@\""))
    assert _rows(_epochs(corpus).examples(0)) == _rows(_epochs(corpus, seed=0).examples(0))


def test_an_epoch_before_the_one_asked_for_is_abandoned(corpus, monkeypatch):
    """A resumed run checks its saved epoch's plan, which starts sampling the epoch after
    it; once a later epoch is asked for, that one is dropped, not kept for the whole run."""
    epochs = _epochs(corpus)
    epochs.examples(0)                  # starts epoch 1 in the background
    epochs.examples(3)                  # the run goes on from epoch 3: starts epoch 4
    assert sorted(epochs._pending) == [4]
    epochs.close()


@pytest.mark.parametrize("bucketed", [{}, {"batch_tokens": 256, "packing": False}],
                         ids=["packed", "bucketed"])
def test_resumed_batches_are_the_uninterrupted_ones_with_sampling_on(corpus, bucketed):
    """A saved iterator position, resumed in a new iterator with a new sampler: the same
    batches, across an epoch boundary, whose plans differ in length from epoch to epoch."""
    examples = _epochs(corpus, **bucketed).deterministic
    config = BatchConfig(**{"batch_tokens": 256, "max_len": 64, "seed": 3, **bucketed})
    straight = BatchIterator(examples, config, process_index=0, process_count=1,
                             resegmented=_epochs(corpus, **bucketed).examples)
    per_epoch = [len(straight.plan(e)) for e in range(3)]
    expected, states = [], []
    for _ in range(per_epoch[0] + 5):
        expected.append(next(straight))
        states.append(straight.state)
    cut = per_epoch[0] - 3
    resumed = BatchIterator(examples, config, process_index=0, process_count=1,
                            resegmented=_epochs(corpus, **bucketed).examples,
                            state=states[cut - 1])
    for k in range(cut, len(expected)):
        got = next(resumed)
        assert set(got) == set(expected[k])
        for name in got:
            np.testing.assert_array_equal(got[name], expected[k][name], err_msg=(k, name))
    assert resumed.epochs_completed == 1 and resumed.state == states[-1]


def test_bucketed_epochs_keep_the_batch_shapes_of_the_fixed_segmentation(corpus):
    """With packing off, every sampled epoch is batched in the (B, S, T) shapes of the
    deterministic segmentation, each pair once in a batch that holds it: the train step
    compiles no new shape mid-training. Planned from their own lengths, the sampled epochs
    would bring shapes of their own."""
    config = BatchConfig(batch_tokens=512, max_len=64, packing=False)
    epochs = _epochs(corpus, alpha=0.1, packing=False)
    fixed = epochs.deterministic

    def shapes(plan):
        return {(len(b.rows), b.src_len, b.tgt_len) for b in plan}

    allowed = shapes(plan_batches(fixed, config, 0))
    batches = BatchIterator(fixed, config, process_index=0, process_count=1,
                            resegmented=epochs.examples)
    seen, own = set(), set()
    for epoch in range(4):
        plan, sampled = batches.plan(epoch), batches.examples_of(epoch)
        assert sum(a != b for a, b in zip(_rows(sampled), _rows(fixed))) > len(fixed) // 3
        rows = np.concatenate([b.rows for b in plan])
        assert sorted(rows[rows >= 0].tolist()) == list(range(len(fixed)))
        for b in plan:
            real = b.rows[b.rows >= 0]
            assert np.all(sampled.src_len[real] <= b.src_len), (epoch, b)
            assert np.all(sampled.tgt_len[real] <= b.tgt_len), (epoch, b)
        seen |= shapes(plan)
        own |= shapes(plan_batches(sampled, config, epoch))
    assert seen <= allowed, seen - allowed
    assert own - allowed  # what the shapes would have been


def test_bpe_models_sample_by_dropping_merges(corpus):
    texts = corpus[0]
    bpe = train_tokenizer(list(texts["source"]) + list(texts["target"]),
                          TokenizerConfig(vocab_size=400, model_type="bpe"))
    sources = list(texts["source"])[:50]
    assert bpe.sample(sources, "source", 0.3, -1) != bpe.encode(sources)


@pytest.mark.parametrize("alpha, nbest, flag", [(0.0, -1, "--subword-alpha"),
                                                (1.5, -1, "--subword-alpha"),
                                                (-0.1, -1, "--subword-alpha"),
                                                (0.1, 0, "--subword-nbest"),
                                                (0.1, 1, "--subword-nbest"),
                                                (0.1, -2, "--subword-nbest"),
                                                (0.1, 2**31, "--subword-nbest")])
def test_settings_out_of_range_are_one_line_naming_the_flag(alpha, nbest, flag):
    with pytest.raises(DataError, match=flag) as caught:
        TokenizerConfig(subword_alpha=alpha, subword_nbest=nbest)
    assert "\n" not in str(caught.value)
    TokenizerConfig(subword_alpha=1.0, subword_nbest=64)
    with pytest.raises(DataError, match="finite"):
        TokenizerConfig(subword_alpha=float("nan"))


@pytest.mark.parametrize("settings", [dict(subword_nbest=64),
                                      dict(subword_nbest=64, subword_alpha=0.1, model_type="bpe")])
def test_an_nbest_that_nothing_would_sample_from_is_refused(settings):
    """Without unigram sampling --subword-nbest changes nothing: the user meant to sample."""
    with pytest.raises(DataError, match=r"--subword-nbest 64 chooses among the N best "
                                        r"segmentations of unigram sampling: give "
                                        r"--subword-alpha with a unigram tokenizer"):
        TokenizerConfig(**settings)


def test_an_nbest_with_a_given_bpe_model_is_refused(corpus):
    """--spm-model with a BPE model and --tokenizer-type left at unigram: the model's own
    type decides, so --subword-nbest is refused, not silently ignored by BPE-dropout."""
    texts = corpus[0]
    bpe = train_tokenizer(list(texts["source"]) + list(texts["target"]),
                          TokenizerConfig(vocab_size=400, model_type="bpe"))
    given = Tokenizer(bpe.model_bytes)
    with pytest.raises(DataError, match=r"--subword-nbest 64 chooses among the N best "
                                        r"segmentations of unigram sampling, and this run's "
                                        r"spm.model is a BPE model") as caught:
        given.check_sampling(0.1, 64)
    assert "\n" not in str(caught.value)
    given.check_sampling(0.1, -1)
    corpus[1].check_sampling(0.1, 64)
    assert (given.model_type, corpus[1].model_type) == ("bpe", "unigram")


def test_a_tokenizer_that_cannot_sample_is_refused_in_one_line(corpus):
    import io

    import sentencepiece as spm

    texts, tokenizer, store = corpus
    words = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts["source"]), model_writer=words, vocab_size=40,
        model_type="word", pad_id=0, unk_id=1, bos_id=2, eos_id=3, minloglevel=3)
    with pytest.raises(DataError, match="a word model.*drop --subword-alpha"):
        _epochs((texts, Tokenizer(words.getvalue()), store))
    marian = VocabTokenizer(tokenizer.model_bytes, tokenizer.model_bytes,
                            {p: i for i, p in enumerate(tokenizer.vocabulary())},
                            {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"})
    with pytest.raises(DataError, match="Marian vocabulary.*drop --subword-alpha"):
        _epochs((texts, marian, store))


def test_sampled_store_is_in_memory_and_sized_to_the_epoch(corpus):
    epoch = _epochs(corpus).examples(0)
    assert isinstance(epoch.store, TokenStore) and epoch.store.path is None
    assert len(epoch) == len(epoch.store) == len(corpus[2])


def test_the_plan_line_counts_the_padding_of_the_sampled_lengths(corpus, caplog):
    """The log's padding waste is of the epoch's own (sampled) pairs, not the fixed ones."""
    epochs = _epochs(corpus)
    config = BatchConfig(batch_tokens=256, max_len=64)
    with caplog.at_level(logging.INFO, logger="data"):
        iterator = BatchIterator(epochs.deterministic, config, process_index=0,
                                 process_count=1, resegmented=epochs.examples)
    expected = plan_stats(epochs.examples(0), config, plan=iterator.plan(0)).summary()
    assert f"batches per epoch: {expected}" in caplog.text
