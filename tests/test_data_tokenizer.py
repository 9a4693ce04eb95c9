"""SentencePiece tokenizer: id conventions, round trips in several scripts, reuse, encoding
cache."""

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import datasets
import numpy as np
import pytest
import sentencepiece as spm

import data.encoding
from data.corpus import DataError, read_prefix
from data.encoding import encode_corpus, encode_split, train_or_load_tokenizer
from data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Tokenizer,
    TokenizerConfig,
    train_tokenizer,
)

# Multi30k and small_parallel_enja where the recipes read them (conftest.py: the shared copies
# unless $MULTI30K and $ENJA are set); the Korean-English corpus, which no recipe reads, from
# ../shared/data.
CORPORA = {"multi30k": Path(os.environ["MULTI30K"]),
           "small_parallel_enja": Path(os.environ["ENJA"]),
           "korean-english": Path(__file__).resolve().parents[2] / "shared/data/korean-english"}
ROOT = Path(__file__).resolve().parents[1]
MISSING = [str(path) for path in CORPORA.values() if not path.is_dir()]
needs_shared = pytest.mark.skipif(bool(MISSING),
                                  reason=f"{', '.join(MISSING)} not found (shared data absent)")


def shared(prefix: str) -> Path:
    """The path of "corpus/split" in the folder that holds that corpus."""
    corpus, _, split = prefix.partition("/")
    return CORPORA[corpus] / split


SMALL_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.",
    "私はテニス部員です。",
    "세계에서 가장 강력한 수퍼컴퓨터",
    "Numbers 12345 and %s placeholders, {name} too.",
] + [
    f"{a} {b} {c}."
    for a in ("The dog", "A woman", "Zwei Männer", "Ein Kind", "Three girls")
    for b in ("runs", "spielt", "is sitting", "fährt", "wartet", "climbs")
    for c in ("in the park", "auf der Straße", "near a big lake", "im Schnee", "with friends")
]


def is_normalization_stable(text: str) -> bool:
    """Text that normalization leaves alone (NFKC-stable, single spaces, no outer spaces)."""
    return unicodedata.normalize("NFKC", text) == text and " ".join(text.split()) == text


@pytest.fixture(scope="module")
def small_tokenizer() -> Tokenizer:
    return train_tokenizer(SMALL_TEXT, TokenizerConfig(vocab_size=350))


@pytest.fixture(scope="module")
def shared_tokenizer() -> Tokenizer:
    """Trained on a little of every shared corpus (en, de, ja, ko)."""
    if MISSING:
        pytest.skip(f"{', '.join(MISSING)} not found (shared data absent)")
    texts = []
    for prefix, src, tgt, n in (
        ("multi30k/train", "en", "de", 3000),
        ("small_parallel_enja/train", "en", "ja", 3000),
        ("korean-english/news_dev", "ko", "en", 1000),
    ):
        ds = read_prefix(shared(prefix), src, tgt).select(range(n))
        texts += list(ds["source"]) + list(ds["target"])
    return train_tokenizer(texts, TokenizerConfig(vocab_size=2000, max_sentences=20000))


def test_special_ids(small_tokenizer):
    processor = small_tokenizer.processor
    assert (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id()) == (
        PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert small_tokenizer.vocab_size == 350
    assert small_tokenizer.pieces([PAD_ID, UNK_ID, BOS_ID, EOS_ID]) == ["<pad>", "<unk>", "<s>",
                                                                          "</s>"]


def test_round_trip_and_no_unk_for_unseen_characters(small_tokenizer):
    texts = SMALL_TEXT[:6] + ["Ελληνικά και русский текст 🙂", "ñandú ﬁ ½"]
    ids = small_tokenizer.encode(texts)
    assert all(isinstance(i, int) for row in ids for i in row)
    assert not any(UNK_ID in row or EOS_ID in row or BOS_ID in row for row in ids)
    decoded = small_tokenizer.decode(ids)
    assert decoded == [small_tokenizer.normalize(t) for t in texts]
    assert decoded[:7] == texts[:7]  # these are left alone by normalization


def test_a_text_with_a_lone_surrogate_is_refused_by_index_and_code_point(small_tokenizer):
    """Not Unicode (undecodable bytes under surrogateescape): SentencePiece's own error was a
    TypeError naming neither the text nor the character."""
    for method in (small_tokenizer.encode, small_tokenizer.token_spans):
        with pytest.raises(ValueError, match=r"^text 1 is not valid Unicode: it holds U\+D800 "
                                             r"\(at character 1\)"):
            method(["ok", "a\ud800b"])


def test_token_spans_are_the_encoded_ids_and_the_characters_each_covers(small_tokenizer):
    """Where a word alignment meets the text (inline markup): the ids `encode` gives, and
    each token's characters, leading spaces left out, in order and within the text."""
    text = "Der Hund läuft 🙂 schnell."
    [(ids, spans)] = small_tokenizer.token_spans([text])
    assert ids == small_tokenizer.encode([text])[0]
    assert len(spans) == len(ids)
    pieces = [small_tokenizer.processor.id_to_piece(i).replace("\u2581", "") for i in ids]
    for piece, (start, end) in zip(pieces, spans):
        if not piece.startswith("<0x"):  # a byte piece covers part of its character
            assert text[start:end] == piece, (piece, text[start:end])
    assert [start for start, _ in spans] == sorted(start for start, _ in spans)
    assert "".join(text[a:b] for a, b in spans if b > a).startswith("DerHund")


def test_decode_stops_at_eos_and_ignores_pad_and_bos(small_tokenizer):
    ids = small_tokenizer.encode(["Der Hund", "fox"])
    rows = np.zeros((2, 12), np.int32)
    rows[0, 0] = BOS_ID
    rows[0, 1:1 + len(ids[0])] = ids[0]
    rows[0, 1 + len(ids[0])] = EOS_ID
    rows[0, 2 + len(ids[0])] = ids[1][0]  # after EOS: must be ignored
    rows[1, :len(ids[1])] = ids[1]
    assert small_tokenizer.decode(rows) == ["Der Hund", "fox"]
    assert small_tokenizer.decode([[EOS_ID] + ids[0]]) == [""]


def test_save_load_gives_same_ids(small_tokenizer, tmp_path):
    path = small_tokenizer.save(tmp_path)
    assert path == tmp_path / "spm.model"
    loaded = Tokenizer.load(tmp_path)
    assert loaded.fingerprint == small_tokenizer.fingerprint
    assert loaded.encode(SMALL_TEXT[:6]) == small_tokenizer.encode(SMALL_TEXT[:6])


def test_bpe_option():
    tokenizer = train_tokenizer(SMALL_TEXT, TokenizerConfig(vocab_size=350, model_type="bpe"))
    assert tokenizer.decode(tokenizer.encode(SMALL_TEXT[:3])) == SMALL_TEXT[:3]


def test_vocab_too_small_suggests_larger_size():
    with pytest.raises(DataError,
                       match=r"--vocab-size 300 is too small.*need 3\d\d; use --vocab-size"):
        train_tokenizer(SMALL_TEXT, TokenizerConfig(vocab_size=300))


def test_a_vocabulary_too_large_for_the_text_is_fitted_to_it(caplog):
    with caplog.at_level(logging.INFO, logger="data.tokenizer"):
        tokenizer = train_tokenizer(SMALL_TEXT, TokenizerConfig(vocab_size=5000))
    assert 300 < tokenizer.vocab_size < 5000
    assert (f"--vocab-size 5000 is more pieces than SentencePiece can make from this training "
            f"text: using its most, {tokenizer.vocab_size}") in caplog.text
    assert tokenizer.decode(tokenizer.encode(SMALL_TEXT[:3])) == SMALL_TEXT[:3]
    # The most it said it could make is what it makes when asked for exactly that.
    again = train_tokenizer(SMALL_TEXT, TokenizerConfig(vocab_size=tokenizer.vocab_size))
    assert again.vocab_size == tokenizer.vocab_size
    more = train_tokenizer(SMALL_TEXT, TokenizerConfig(vocab_size=tokenizer.vocab_size + 1))
    assert more.vocab_size == tokenizer.vocab_size


def test_a_bpe_vocabulary_too_large_for_the_text_says_how_many_pieces_it_never_uses(caplog):
    """SentencePiece's most for BPE is far above what a small text uses (pieces merged on the
    way to whole words); the model is kept, and one info line counts them and names a size."""
    with caplog.at_level(logging.INFO, logger="data.tokenizer"):
        tokenizer = train_tokenizer(SMALL_TEXT, TokenizerConfig(vocab_size=800, model_type="bpe"))
    processor = tokenizer.processor
    used = {i for row in tokenizer.encode(SMALL_TEXT) for i in row}
    merged = [i for i in range(tokenizer.vocab_size) if len(processor.id_to_piece(i)) > 1
              and not (processor.is_byte(i) or processor.is_control(i) or processor.is_unknown(i))]
    unused = sum(i not in used for i in merged)
    assert tokenizer.vocab_size == 800 and unused > len(merged) / 4
    assert [record.getMessage() for record in caplog.records] == [
        f"BPE: {unused} of the {len(merged)} merged pieces never occur in the segmentation of "
        "the training text (the model never sees them); --vocab-size 800 is more than this "
        f"text supports: about {800 - unused} suits it (or --tokenizer-type unigram, which is "
        "fitted to the text)"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="data.tokenizer"):
        train_tokenizer(SMALL_TEXT, TokenizerConfig(vocab_size=350, model_type="bpe"))
    assert caplog.records[0].getMessage().endswith("(the model never sees them)")


def test_a_one_shot_text_too_small_for_the_vocabulary_names_the_size_that_works():
    with pytest.raises(DataError, match=r"--vocab-size 5000 is too large.*use --vocab-size \d+"):
        train_tokenizer(iter(SMALL_TEXT), TokenizerConfig(vocab_size=5000))


def test_train_or_load_reuses_saved_model(tmp_path, monkeypatch):
    corpus = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"source": SMALL_TEXT, "target": SMALL_TEXT[::-1]})
    })
    config = TokenizerConfig(vocab_size=350)
    first = train_or_load_tokenizer(tmp_path, corpus, config)
    assert (tmp_path / "spm.model").read_bytes() == first.model_bytes

    def no_training(*args, **kwargs):
        raise AssertionError("the saved model should be reused")

    monkeypatch.setattr("data.encoding.train_tokenizer", no_training)
    again = train_or_load_tokenizer(tmp_path, corpus, config)
    assert again.fingerprint == first.fingerprint
    # Fewer pieces than asked is a vocabulary fitted to a small text (the run's config.yaml
    # says what was asked: nmt.rundir.resume checks it); more is another tokenizer.
    with pytest.raises(DataError, match=r"has 350 pieces but --vocab-size is 340"):
        train_or_load_tokenizer(tmp_path, corpus, TokenizerConfig(vocab_size=340))


def test_damaged_model_file_is_named(small_tokenizer, tmp_path):
    (tmp_path / "spm.model").write_bytes(small_tokenizer.model_bytes[:200])  # cut short
    with pytest.raises(DataError, match=r"spm\.model: not a SentencePiece model, or a damaged "
                                        r"one .*; restore the spm\.model"):
        Tokenizer.load(tmp_path)
    corpus = datasets.Dataset.from_dict({"source": SMALL_TEXT, "target": SMALL_TEXT})
    with pytest.raises(DataError, match=r"spm\.model: not a SentencePiece model"):  # on resume
        train_or_load_tokenizer(tmp_path, corpus, TokenizerConfig(vocab_size=350))


def test_marians_layout_decodes_the_pieces_of_a_model_as_sentencepiece_does(small_tokenizer):
    """What to-marian writes (the model as both sides' SentencePiece model, vocab.json of its
    pieces) reads back as the same text: a word boundary before any text gives no space, one
    at the end a space, and a piece the target model lacks its spaces alike."""
    from data.tokenizer import VocabTokenizer

    vocab = {piece: i for i, piece in enumerate(small_tokenizer.vocabulary())}
    marian = VocabTokenizer(small_tokenizer.model_bytes, small_tokenizer.model_bytes, vocab)
    space = small_tokenizer.processor.piece_to_id("\u2581")
    assert small_tokenizer.processor.id_to_piece(space) == "\u2581"
    words = small_tokenizer.encode(["Der Hund", "fox"])
    rows = [[space, *words[0]], [*words[0], space], [space, space, *words[1], space, space],
            [space], words[1], []]
    assert marian.decode(rows) == small_tokenizer.decode(rows)
    assert small_tokenizer.decode(rows[:2]) == ["Der Hund", "Der Hund "]
    lacking = dict(vocab, **{"\u2581Zq\u2581x": len(vocab)})  # a source-only piece
    other = VocabTokenizer(small_tokenizer.model_bytes, small_tokenizer.model_bytes, lacking)
    assert other.decode([[space, len(vocab), *words[1]]]) == ["Zq x fox"]


def test_a_special_tokens_map_that_is_not_an_object_is_named(small_tokenizer, tmp_path):
    from data.tokenizer import VocabTokenizer, load_tokenizer

    vocab = {piece: i for i, piece in enumerate(small_tokenizer.vocabulary())}
    VocabTokenizer(small_tokenizer.model_bytes, small_tokenizer.model_bytes, vocab).save(tmp_path)
    (tmp_path / "special_tokens_map.json").write_text('["</s>"]')
    with pytest.raises(DataError, match=r"special_tokens_map\.json must be a JSON object "
                                        r"naming the special tokens"):
        load_tokenizer(tmp_path)


def test_the_encoded_cache_is_keyed_by_the_sentencepiece_version_too(small_tokenizer,
                                                                     monkeypatch):
    """Another SentencePiece may segment the same text otherwise: its encoding is another."""
    import sentencepiece

    from data.encoding import encoding_key

    split = datasets.Dataset.from_dict({"source": SMALL_TEXT[:6], "target": SMALL_TEXT[6:12]})
    key = encoding_key(split, small_tokenizer)
    assert encoding_key(split, small_tokenizer) == key
    monkeypatch.setattr(sentencepiece, "__version__", "0.0.1")
    assert encoding_key(split, small_tokenizer) != key


def test_encoding_columns_and_cache(small_tokenizer, tmp_path, monkeypatch, caplog):
    split = datasets.Dataset.from_dict({"source": SMALL_TEXT[:6], "target": SMALL_TEXT[6:12]})
    encoded = encode_corpus(datasets.DatasetDict({"train": split}), small_tokenizer,
                            cache_dir=tmp_path)["train"]
    assert encoded.src.to_lists() == small_tokenizer.encode(SMALL_TEXT[:6])
    assert encoded.tgt.lengths().tolist() == [
        len(x) for x in small_tokenizer.encode(SMALL_TEXT[6:12])]
    assert encoded.src.values.dtype == np.int32 and isinstance(encoded.src.values, np.memmap)

    def no_map(*args, **kwargs):
        raise AssertionError("the cached encoding should be loaded")

    # The same content, built anew: found in the cache, not encoded again.
    monkeypatch.setattr(datasets.Dataset, "map", no_map)
    same = datasets.Dataset.from_dict({"source": SMALL_TEXT[:6], "target": SMALL_TEXT[6:12]})
    with caplog.at_level(logging.INFO, logger="data"):
        cached = encode_split(same, small_tokenizer, cache_dir=tmp_path)
    assert "loaded from cache" in caplog.text
    assert cached.src.to_lists() == encoded.src.to_lists()
    # Different text, or another tokenizer, must not hit that entry.
    other = datasets.Dataset.from_dict({"source": SMALL_TEXT[1:7], "target": SMALL_TEXT[6:12]})
    with pytest.raises(AssertionError, match="cached encoding"):
        encode_split(other, small_tokenizer, cache_dir=tmp_path)


def test_encoding_with_worker_processes_in_rounds(small_tokenizer, tmp_path, monkeypatch):
    """Two workers, three rounds (the last shorter): the rounds' stores join in order, and
    their Arrow files are gone."""
    monkeypatch.setattr(data.encoding, "ENCODE_ROUND_PAIRS", 60)
    split = datasets.Dataset.from_dict({"source": SMALL_TEXT, "target": SMALL_TEXT[::-1]})
    assert 2 * 60 < len(split) < 3 * 60
    encoded = encode_split(split, small_tokenizer, cache_dir=tmp_path, num_proc=2)
    assert sorted(p.name for p in encoded.path.iterdir()) == [
        "src.ids", "src.offsets", "store.json", "tgt.ids", "tgt.offsets"]
    assert encoded.src.to_lists() == small_tokenizer.encode(SMALL_TEXT)
    assert encoded.tgt.to_lists() == small_tokenizer.encode(SMALL_TEXT[::-1])


# Encodes with two spawned workers (as where JAX runs) that each mark their start, then sleep;
# with "idle", the first worker's share takes no time (and the worker is then idle).
_SLOW_ENCODING = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
import datasets
import data.encoding
from data.config import DataError
from nmt.runtime.cli import Fault, UsageError, guarded


class SlowTokenizer:
    fingerprint = "slow"

    def encode(self, texts, side):
        slow = sys.argv[4] == "busy" or texts[0] not in ("a b", "c")
        open(os.path.join(sys.argv[2], f"{os.getpid()}-{'slow' if slow else 'fast'}"),
             "w").close()
        if slow:
            time.sleep(60)
        return [[1] for _ in texts]


if __name__ == "__main__":
    datasets.disable_progress_bars()
    data.encoding._jax_running = lambda: True
    split = datasets.Dataset.from_dict({"source": ["a b"] * 50 + ["d e"] * 50,
                                        "target": ["c"] * 50 + ["f"] * 50})


    def encode():
        try:
            return data.encoding.encode_split(split, SlowTokenizer(), sys.argv[3], num_proc=2)
        except data.encoding.WorkerDied as err:  # as train.py: a fault, exit 1
            raise Fault(str(err)) from None
        except DataError as err:  # as train.py: a usage error, exit 2
            raise UsageError(str(err)) from None

    sys.exit(guarded("probe", lambda: encode() is None))
"""


def _started(marks: Path, workers: str) -> bool:
    """Whether both workers are busy (`busy`), or the fast share and the slow one started."""
    names = [mark.name for mark in marks.iterdir()]
    if workers == "busy":
        return len(names) == 2
    return {name.split("-")[1] for name in names} == {"fast", "slow"}


def _ended(command: subprocess.Popen, timeout: float) -> tuple[str, list[int]]:
    """(stderr, the processes of its session still there after up to 10 s) once `command`
    ends within `timeout` seconds: its workers must not outlive it."""
    _, err = command.communicate(timeout=timeout)
    deadline = time.monotonic() + 10
    while (left := _session(command.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return err, left


def _reap(command: subprocess.Popen) -> None:
    """Kill `command`'s whole session, whatever a test left running."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(command.pid, signal.SIGKILL)
    command.kill()
    command.wait()


def _session(leader: int) -> list[int]:
    """The processes of the session that `leader` started (itself included)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[3]) == leader and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


@pytest.mark.parametrize("signum, whom, workers, status", [
    (signal.SIGINT, "group", "busy", 130),    # Ctrl-C at a terminal: the whole process group
    (signal.SIGINT, "command", "busy", 130),  # kill -INT of the command alone
    (signal.SIGTERM, "command", "busy", 143),
    (signal.SIGTERM, "group", "idle", 143),   # systemd's stop, Slurm's scancel, GNU timeout
    (signal.SIGKILL, "worker", "busy", 1),    # the OOM killer
], ids=["ctrl-c", "sigint", "sigterm", "group-sigterm", "worker-killed"])
def test_a_signal_while_workers_encode_ends_them_with_one_line(signum, whom, workers, status,
                                                                tmp_path):
    """The command ends within seconds, says `interrupted` and nothing more after SIGINT
    (no worker's traceback), says which worker ended and what to do when one is killed,
    and leaves no process and no temporary store behind."""
    (tmp_path / "slow.py").write_text(_SLOW_ENCODING)
    marks, cache = tmp_path / "marks", tmp_path / "cache"
    marks.mkdir()
    command = subprocess.Popen(
        [sys.executable, str(tmp_path / "slow.py"), str(ROOT), str(marks), str(cache), workers],
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not _started(marks, workers) and command.poll() is None:
            assert time.monotonic() < deadline, "the workers never started encoding"
            time.sleep(0.1)
        time.sleep(1 if workers == "idle" else 0)  # the fast share written
        if whom == "worker":  # a mark's name starts with its worker's process id
            os.kill(int(min(marks.iterdir()).name.split("-")[0]), signum)
        else:
            (os.killpg if whom == "group" else os.kill)(command.pid, signum)
        err, left = _ended(command, timeout=20)
    finally:
        _reap(command)
    assert command.returncode == status, err
    assert not left, f"processes left behind: {left}"
    lines = [line for line in err.splitlines() if line.strip()]
    if whom == "worker":
        assert len(lines) == 1 and lines[0].startswith(
            "probe: error: a worker process encoding pairs "), err
        assert "ended with signal 9 (SIGKILL, killed: out of memory?); run again with more " \
               "memory, or fewer encoding processes" in lines[0], err
    else:
        assert lines == (["probe: interrupted"] if signum == signal.SIGINT else []), err
    assert not list((cache / "encoded").iterdir())


@needs_shared
@pytest.mark.parametrize("prefix, src, tgt", [
    ("korean-english/news_test", "ko", "en"),
    ("korean-english/jhe_eval", "ko", "en"),
    ("small_parallel_enja/test", "ja", "en"),
    ("multi30k/test2016", "de", "fr"),
])
def test_round_trip_shared_corpora(shared_tokenizer, prefix, src, tgt):
    ds = read_prefix(shared(prefix), src, tgt)
    texts = list(ds["source"]) + list(ds["target"])
    ids = shared_tokenizer.encode(texts)
    assert not any(UNK_ID in row for row in ids)
    decoded = shared_tokenizer.decode(ids)
    assert decoded == [shared_tokenizer.normalize(t) for t in texts]
    exact = [(d, t) for d, t in zip(decoded, texts) if is_normalization_stable(t)]
    assert len(exact) > 0.9 * len(texts)
    assert all(d == t for d, t in exact)


def test_a_second_run_on_the_same_text_reuses_the_trained_tokenizer(tmp_path, monkeypatch,
                                                                      caplog):
    monkeypatch.setenv("FLAX_NMT_CACHE", str(tmp_path / "cache"))
    corpus = datasets.Dataset.from_dict({"source": SMALL_TEXT, "target": SMALL_TEXT})
    config = TokenizerConfig(vocab_size=350)
    first = train_or_load_tokenizer(tmp_path / "run1", corpus, config)

    def no_training(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(data.encoding, "train_tokenizer", no_training)
    with caplog.at_level(logging.INFO, logger="data"):
        second = train_or_load_tokenizer(tmp_path / "run2", corpus, config)
    assert "reusing the tokenizer trained before on the same text" in caplog.text
    assert second.fingerprint == first.fingerprint
    assert (tmp_path / "run2" / "spm.model").read_bytes() == first.model_bytes
    # Other settings, or other text, train anew.
    with pytest.raises(AssertionError, match="trained again"):
        train_or_load_tokenizer(tmp_path / "run3", corpus, TokenizerConfig(vocab_size=360))
    other = datasets.Dataset.from_dict({"source": SMALL_TEXT[1:], "target": SMALL_TEXT[1:]})
    with pytest.raises(AssertionError, match="trained again"):
        train_or_load_tokenizer(tmp_path / "run4", other, config)


def test_full_width_forms_are_normalized_unless_the_tokenizer_keeps_them(small_tokenizer,
                                                                         tmp_path):
    """docs/training.md, "Normalization": the tokenizer trained here rewrites full-width
    punctuation and digits and half-width kana (nmt_nfkc), on both sides; one trained with
    normalization_rule_name=identity, given with --spm-model, keeps them."""
    text = "晴れですか？（はい）１２３ｶﾀｶﾅ、です。"
    assert small_tokenizer.normalize(text) == "晴れですか?(はい)123カタカナ、です。"
    corpus = tmp_path / "train.txt"
    corpus.write_text((text + "\nIt is sunny? (yes) 123.\n") * 50, encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(tmp_path / "spm"), vocab_size=320,
        normalization_rule_name="identity", byte_fallback=True, character_coverage=0.9995,
        pad_id=0, unk_id=1, bos_id=2, eos_id=3, hard_vocab_limit=False, minloglevel=2)
    kept = Tokenizer.load(tmp_path / "spm.model")
    assert kept.normalize(text) == text
    assert kept.decode(kept.encode([text])) == [text]
