"""transformer.shortlist and searching over a shortlist's candidates: the table (IBM Model 1),
the candidate lists, the search restricted to them, and the commands that build and use it."""

from __future__ import annotations

import dataclasses
import logging
import os
import stat

import jax
import numpy as np
import pytest
from flax import nnx

from data.tokenizer import SpecialIds
from nmt.models.translator import Translator
from transformer.config import SearchConfig, get_preset
from transformer.model import Transformer
from transformer.search import pad_sources, search
from transformer.shortlist import Shortlist, build_shortlist

SPECIAL = 4  # PAD, UNK, BOS, EOS
EOS = 3


def word_for_word_pairs(count: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """A language whose word s translates as s + 100, with a function word (7) in every
    target sentence, in shuffled order."""
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(count):
        src = rng.integers(10, 90, size=rng.integers(3, 10))
        tgt = np.append(src + 100, 7)
        rng.shuffle(tgt)
        pairs.append((src.tolist(), tgt.tolist()))
    return pairs


def test_model_one_finds_each_words_translation_and_leaves_the_function_word_to_null():
    shortlist = build_shortlist(word_for_word_pairs(2000), 300, SPECIAL, "t", per_source=3,
                                always=2)
    for s in range(10, 90):
        assert shortlist.translations[s, 0] == s + 100
        assert shortlist.probabilities[s, 0] > 0.8
    # Co-occurrence counts would rank 7 first everywhere: it is in every sentence.
    assert shortlist.by_frequency[0] == 7
    assert not np.any(shortlist.translations[:SPECIAL] >= 0)  # special ids translate nothing


def hand_made(vocab: int = 40) -> Shortlist:
    translations = np.full((vocab, 3), -1, np.int32)
    probabilities = np.zeros((vocab, 3), np.float32)
    translations[10] = [20, 21, 22]
    probabilities[10] = [0.9, 0.5, 0.1]
    translations[11] = [23, 20, -1]
    probabilities[11] = [0.7, 0.2, 0.0]
    by_frequency = np.array([30, 31, 32] + [i for i in range(SPECIAL, vocab)
                                            if i not in (30, 31, 32)], np.int32)
    return Shortlist(translations, probabilities, by_frequency, 2, SPECIAL, "t")


def test_candidates_are_specials_frequent_then_likeliest_of_a_fixed_size_ascending():
    shortlist = hand_made()
    src = np.array([[10, 11, EOS, 0], [0, 0, 0, 0]])  # padding and EOS choose nothing
    assert shortlist.candidates(src, 10).tolist() == [0, 1, 2, 3, 20, 21, 22, 23, 30, 31]
    # Short of room, the least likely translations go first: 22 (0.1), then 21 (0.5).
    assert shortlist.candidates(src, 8).tolist() == [0, 1, 2, 3, 20, 23, 30, 31]
    # With room to spare, the next most frequent targets fill it.
    twelve = shortlist.candidates(src, 12).tolist()
    assert twelve == [0, 1, 2, 3, 4, 20, 21, 22, 23, 30, 31, 32]
    assert shortlist.candidates(src, 40).tolist() == list(range(40))
    # Room for one beside the specials: the most frequent target, not the lowest id.
    assert shortlist.candidates(src, 5).tolist() == [0, 1, 2, 3, 30]
    swapped = Shortlist(shortlist.translations, shortlist.probabilities,
                        shortlist.by_frequency[[1, 0, *range(2, len(shortlist.by_frequency))]],
                        shortlist.always, SPECIAL, "t")
    assert swapped.candidates(src, 5).tolist() == [0, 1, 2, 3, 31]


def sharp_model(tied: bool = True, vocab: int = 48) -> Transformer:
    overrides = {} if tied else {"share_embeddings": False, "output_bias": True}
    model = Transformer(get_preset("tiny", vocab_size=vocab, **overrides), rngs=nnx.Rngs(3))
    table = model.src_embedding.table.embedding
    table[...] = table[...] * 4.0
    if not tied:
        kernel = model.output_projection.kernel
        kernel[...] = kernel[...] * 4.0
        model.output_bias[...] = jax.random.normal(jax.random.key(1), (vocab,))
    return model


def batch(vocab: int = 48) -> np.ndarray:
    rng = np.random.default_rng(0)
    rows = [list(rng.integers(SPECIAL, vocab, size=n)) + [EOS] for n in (9, 4, 12, 6)]
    return pad_sources(rows, 0)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied-bias"])
@pytest.mark.parametrize("config", [
    SearchConfig(beam_size=3, nbest=2, max_len_a=0, max_len_b=10),
    SearchConfig(strategy="greedy", max_len_a=0, max_len_b=10),
], ids=["beam", "greedy"])
def test_every_token_as_a_candidate_gives_the_search_without_a_shortlist(tied, config):
    model = sharp_model(tied)
    plain = search(model, batch(), config)
    listed = search(model, batch(), config, candidates=np.arange(48))
    np.testing.assert_array_equal(listed.tokens, plain.tokens)
    # The same sums, from a product over a gathered matrix: equal up to float32 rounding.
    np.testing.assert_allclose(listed.scores, plain.scores, rtol=1e-6, atol=0)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied-bias"])
def test_a_few_candidates_give_only_those_tokens_scored_by_a_softmax_over_them(tied):
    model = sharp_model(tied)
    src = batch()
    candidates = np.array([0, 1, 2, 3, 9, 17, 18, 30, 41], np.int32)
    config = SearchConfig(strategy="greedy", max_len_a=0, max_len_b=8)
    result = search(model, src, config, candidates=candidates)
    produced = set(result.tokens.ravel().tolist())
    assert produced <= set(candidates.tolist()) and produced - {0, EOS}
    # The score is each token's log-probability under a softmax over the candidates only.
    for row in range(len(src)):
        tokens = result.tokens[row, 0, :result.lengths[row, 0]]
        tgt_in = np.concatenate([[2], tokens[:-1]])[None].astype(np.int32)
        logits = model.decode(model.encode(src[row:row + 1]), model.source_mask(src[row:row + 1]),
                              tgt_in)[0][0]
        logprobs = jax.nn.log_softmax(np.asarray(logits)[:, candidates], axis=-1)
        positions = np.searchsorted(candidates, tokens)
        expected = float(np.asarray(logprobs)[np.arange(len(tokens)), positions].sum())
        assert result.scores[row, 0] == pytest.approx(expected, abs=1e-4)


def test_candidates_without_the_special_ids_first_are_refused():
    with pytest.raises(ValueError, match="starting with 0..3"):
        search(sharp_model(), batch(), SearchConfig(strategy="greedy", max_len_b=4),
               candidates=np.array([1, 2, 3, 9]))


class NumberTokenizer:
    """Sentences of integers (the token ids themselves)."""

    ids = SpecialIds()
    fingerprint = "t"

    def encode(self, sentences, side="source"):
        return [[int(word) for word in sentence.split()] for sentence in sentences]

    def decode(self, rows):
        return [" ".join(map(str, row)) for row in rows]


SENTENCES = ["5 9 13 17", "40 41", "7 7 7 30 31 32 33", "12"]


def test_the_translator_searches_each_batch_over_its_candidates():
    model, search_config = sharp_model(vocab=64), SearchConfig(beam_size=2, max_len_b=6)
    shortlist = hand_made(64)
    plain = Translator(model, NumberTokenizer(), search_config).translate(SENTENCES)
    whole = Translator(model, NumberTokenizer(), search_config, shortlist=shortlist,
                       shortlist_size=64)
    assert whole.translate(SENTENCES) == plain
    small = Translator(model, NumberTokenizer(), search_config, shortlist=shortlist,
                       shortlist_size=9)
    allowed = set(shortlist.candidates(np.array([[int(w) for s in SENTENCES
                                                  for w in s.split()]]), 9).tolist())
    for text in small.translate(SENTENCES):
        assert {int(w) for w in text.split()} <= allowed
    assert "shortlist of 9" in small.describe()


def test_shortlist_sizes_and_vocabularies_that_cannot_work_are_refused(caplog):
    model, config = sharp_model(vocab=64), SearchConfig(beam_size=2)
    with pytest.raises(ValueError, match="vocabulary of 40 tokens, the model has 64"):
        Translator(model, NumberTokenizer(), config, shortlist=hand_made(40), shortlist_size=9)
    with pytest.raises(ValueError, match="--shortlist 4: a batch needs at least 5"):
        Translator(model, NumberTokenizer(), config, shortlist=hand_made(64), shortlist_size=4)
    with caplog.at_level(logging.WARNING):
        clamped = Translator(model, NumberTokenizer(), config, shortlist=hand_made(64),
                             shortlist_size=1000)
    assert clamped.shortlist_size == 64 and "more than the vocabulary's 64" in caplog.text
    # Sampling among the top k of fewer candidates: refused before any search compiles.
    sample = SearchConfig(strategy="sample", top_k=30)
    with pytest.raises(ValueError, match=r"top_k 30 is larger than --shortlist's candidates "
                                         r"\(20 tokens\)"):
        Translator(model, NumberTokenizer(), sample, shortlist=hand_made(64), shortlist_size=20)
    with pytest.raises(ValueError, match=r"top_k 30 is larger than the candidate tokens given"):
        search(model, batch(64), sample, rng=jax.random.key(0),
               candidates=np.arange(20, dtype=np.int32))


def test_saved_shortlist_loads_equal_and_a_damaged_one_is_named(tmp_path):
    shortlist = hand_made()
    shortlist.save(tmp_path / "shortlist.npz")
    loaded = Shortlist.load(tmp_path / "shortlist.npz")
    for field in ("translations", "probabilities", "by_frequency"):
        np.testing.assert_array_equal(getattr(loaded, field), getattr(shortlist, field))
    assert (loaded.always, loaded.special, loaded.tokenizer) == (2, SPECIAL, "t")
    whole = (tmp_path / "shortlist.npz").read_bytes()
    for damaged in (b"not a zip", whole[:len(whole) // 2], whole[:-30], whole[:10]):
        (tmp_path / "bad.npz").write_bytes(damaged)  # a cut copy too
        with pytest.raises(ValueError, match="bad.npz is not a readable shortlist"):
            Shortlist.load(tmp_path / "bad.npz")
    # Another file copied over it (msgpack parameters): numpy would take it for a pickle.
    (tmp_path / "bad.npz").write_bytes(b"\x82\xa6params\x81")
    with pytest.raises(ValueError) as refused:
        Shortlist.load(tmp_path / "bad.npz")
    assert "(not a NumPy .npz archive); build it again" in str(refused.value)
    assert "pickle" not in str(refused.value)


@pytest.mark.parametrize("damage, message", [
    (lambda s: {"translations": s.translations[:, :1]},
     "probabilities are float32 (40, 3), translations (40, 1)"),
    (lambda s: {"translations": s.translations.T}, "translations (3, 40)"),
    (lambda s: {"translations": s.translations.astype(np.float32)},
     "translations are float32 (40, 3), not 2-D ids"),
    (lambda s: {"translations": np.where(s.translations >= 0, s.translations + 30, -1)},
     "translations hold ids outside -1 to 39"),
    (lambda s: {"translations": np.full_like(s.translations, -2)}, "outside -1 to 39"),
    (lambda s: {"by_frequency": s.by_frequency[:10]}, "by_frequency is not the ids 4 to 39"),
    (lambda s: {"by_frequency": s.by_frequency + 1}, "by_frequency is not the ids 4 to 39"),
    (lambda s: {"by_frequency": np.concatenate([s.by_frequency[:-1], s.by_frequency[:1]])},
     "by_frequency is not the ids 4 to 39, each once"),
    (lambda s: {"always": -3}, "always -3 is not between 0 and the vocabulary's 40"),
    (lambda s: {"always": 41}, "always 41 is not between 0"),
    (lambda s: {"special": 0}, "special 0 is not between 0 and the vocabulary's 40"),
    (lambda s: {"special": 40}, "special 40 is not between"),
], ids=["narrower", "transposed", "float-ids", "ids-past-vocab", "negative-ids",
        "cut-by-frequency", "by-frequency-past-vocab", "by-frequency-repeats", "negative-always",
        "always-past-vocab", "no-special", "all-special"])
def test_a_shortlist_whose_arrays_do_not_fit_together_is_named_with_what_is_wrong(
        tmp_path, damage, message):
    """A search would index past such a table, or pick wrong candidates without a word."""
    shortlist = hand_made()
    dataclasses.replace(shortlist, **damage(shortlist)).save(tmp_path / "shortlist.npz")
    with pytest.raises(ValueError) as refused:
        Shortlist.load(tmp_path / "shortlist.npz")
    assert str(refused.value).startswith(f"{tmp_path / 'shortlist.npz'} is not a readable "
                                         f"shortlist ("), refused.value
    assert message in str(refused.value) and "build it again" in str(refused.value)


# ----------------------------------------------------------------------------- the commands


@pytest.fixture(scope="module")
def shortlisted(run_dir, tmp_path_factory):
    """A copy of the tiny model with a shortlist built by the command from a small corpus,
    and its CTranslate2 vocabulary map."""
    import shutil

    from nmt.distillation import shortlist as command
    from translate_model import sentences

    folder = tmp_path_factory.mktemp("shortlisted")
    model = shutil.copytree(run_dir / "model", folder / "model")
    (folder / "train.de").write_text("\n".join(sentences(200, seed=3)) + "\n")
    (folder / "train.en").write_text("\n".join(sentences(200, seed=4)) + "\n")
    assert command.main(["--model", str(model), "--train-prefix", str(folder / "train"),
                         "--per-source", "8", "--always", "10",
                         "--ctranslate2-map", str(folder / "vmap.txt")]) == 0
    return folder


def test_translate_py_with_every_token_as_candidate_translates_as_without(shortlisted, capsys):
    import translate
    from translate_model import sentences

    lines = sentences(6, seed=8)
    assert translate.main(["--model", str(shortlisted / "model"), "-q", *lines]) == 0
    plain = capsys.readouterr().out
    assert translate.main(["--model", str(shortlisted / "model"), "-q", "--shortlist", "300",
                           *lines]) == 0
    assert capsys.readouterr().out == plain


@pytest.mark.parametrize("flags, code, message", [
    (["--shortlist", "0"], 2, "--shortlist must be >= 1"),
    (["--shortlist", "3"], 2, "a batch needs at least 5 candidates"),
    (["--shortlist", "50", "--engine", "ctranslate2"], 2, "searched by --engine jax"),
    (["--shortlist", "20", "--sample", "--top-k", "30"], 2,
     "--top-k 30 is larger than --shortlist's candidates (20 tokens)"),
], ids=["zero", "below-specials", "ctranslate2", "top-k"])
def test_translate_py_refuses_a_shortlist_it_cannot_use_in_one_line(shortlisted, flags, code,
                                                                   message, capsys):
    import translate

    assert translate.main(["--model", str(shortlisted / "model"), *flags, "Ein mann."]) == code
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_a_model_without_or_with_another_tokenizers_shortlist_is_named(shortlisted, run_dir,
                                                                      tmp_path, capsys):
    import shutil

    import translate

    assert translate.main(["--model", str(run_dir), "--shortlist", "50", "Ein mann."]) == 1
    assert "has no shortlist.npz: build one with" in capsys.readouterr().err
    other = shutil.copytree(shortlisted / "model", tmp_path / "model")
    stored = Shortlist.load(other / "shortlist.npz")
    Shortlist(stored.translations, stored.probabilities, stored.by_frequency, stored.always,
              stored.special, "another").save(other / "shortlist.npz")
    assert translate.main(["--model", str(other), "--shortlist", "50", "Ein mann."]) == 1
    assert "built for another SentencePiece model" in capsys.readouterr().err


def test_ctranslate2_vocabulary_map_lists_pieces_after_a_line_of_those_always_in(shortlisted):
    lines = (shortlisted / "vmap.txt").read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("\t") and len(lines[0].split("\t")[1].split()) == 10
    assert len(lines) > 20 and all(line.count("\t") == 1 for line in lines)
    assert all(1 <= len(line.split("\t")[1].split()) <= 8 for line in lines[1:])


def test_the_shortlist_command_refuses_bad_counts_and_misaligned_corpora(shortlisted, tmp_path,
                                                                        capsys):
    from nmt.distillation import shortlist as command

    model = str(shortlisted / "model")
    assert command.main(["--model", model, "--train-prefix", str(shortlisted / "train"),
                         "--per-source", "0"]) == 2
    assert "--per-source must be >= 1" in capsys.readouterr().err
    assert command.main(["--model", model, "--train-prefix", str(shortlisted / "train"),
                         "--iterations", "1000000"]) == 2
    assert "--iterations must be >= 1 and <= 100" in capsys.readouterr().err
    (tmp_path / "c.de").write_text("a\nb\n")
    (tmp_path / "c.en").write_text("a\n")
    assert command.main(["--model", model, "--train-prefix", str(tmp_path / "c")]) == 1
    assert "has 2 lines but" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["", "\n\n\n"], ids=["empty", "empty-lines"])
def test_the_shortlist_command_refuses_a_corpus_without_text_and_keeps_the_shortlist(
        shortlisted, tmp_path, capsys, text):
    from nmt.distillation import shortlist as command

    before = (shortlisted / "model" / "shortlist.npz").read_bytes()
    for lang in ("de", "en"):
        (tmp_path / f"c.{lang}").write_text(text)
    assert command.main(["--model", str(shortlisted / "model"),
                         "--train-prefix", str(tmp_path / "c")]) == 1
    err = capsys.readouterr().err.strip()
    assert f"{tmp_path}/c.de and {tmp_path}/c.en hold no pair of non-empty lines" in err, err
    assert len(err.splitlines()) == 1
    assert (shortlisted / "model" / "shortlist.npz").read_bytes() == before


@pytest.mark.parametrize("flags, message", [
    (["--ctranslate2-map", "{tmp}/nodir/map.txt"], "--ctranslate2-map {tmp}/nodir/map.txt: the "
                                                   "directory {tmp}/nodir does not exist"),
    (["--ctranslate2-map", "{tmp}"], "--ctranslate2-map {tmp} is a directory"),
    (["--model", ""], "argument --model: '' is blank"),  # not the current directory
    (["--src", " "], "argument --src: ' ' is blank"),
    # The model translates de->en: an en->de table would be the wrong way round.
    (["--src", "en", "--tgt", "de"], "--src en, but --model {model} was trained with --src de"),
    (["--tgt", "de"], "--tgt de, but --model {model} was trained with --tgt en"),
], ids=["map-directory", "map-is-directory", "blank-model", "blank-language", "flipped",
        "other-target"])
def test_the_shortlist_command_refuses_bad_flags_before_any_work(shortlisted, tmp_path, capsys,
                                                                 flags, message):
    from nmt.distillation import shortlist as command

    before = (shortlisted / "model" / "shortlist.npz").read_bytes()
    argv = ["--model", str(shortlisted / "model"), "--train-prefix", str(shortlisted / "train"),
            *(flag.format(tmp=tmp_path) for flag in flags)]
    try:
        status = command.main(argv)
    except SystemExit as parser_exit:  # argparse's own checks
        status = parser_exit.code
    assert status == 2
    err = capsys.readouterr().err.strip()
    message = message.format(tmp=tmp_path, model=shortlisted / "model")
    assert message in err and len(err.splitlines()) == 1, err
    assert (shortlisted / "model" / "shortlist.npz").read_bytes() == before


@pytest.mark.parametrize("kind", ["fifo", "symlink", "dangling-symlink"])
def test_a_ctranslate2_map_that_is_no_regular_file_is_refused_untouched(shortlisted, tmp_path,
                                                                       capsys, kind):
    """The map is renamed onto its path: a pipe or a link there was replaced by a file."""
    from nmt.distillation import shortlist as command

    path, target = tmp_path / "map.txt", tmp_path / "real.txt"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        if kind == "symlink":
            target.write_text("mine")
        path.symlink_to(target)
    before = (shortlisted / "model" / "shortlist.npz").read_bytes()
    assert command.main(["--model", str(shortlisted / "model"), "--train-prefix",
                         str(shortlisted / "train"), "--ctranslate2-map", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    what = "not a regular file" if kind == "fifo" else "a symbolic link"
    assert f"--ctranslate2-map {path} is {what}; give the path of a regular file" in err, err
    assert len(err.splitlines()) == 1
    assert stat.S_ISFIFO(path.lstat().st_mode) if kind == "fifo" else path.is_symlink()
    assert (shortlisted / "model" / "shortlist.npz").read_bytes() == before


def test_the_server_loads_each_models_shortlist_and_names_it_in_its_engine(shortlisted,
                                                                          run_dir):
    from nmt.serving import command as server
    from nmt.translation.errors import InputError

    model = str(shortlisted / "model")
    args = server.build_parser().parse_args(["--model", model, "--shortlist", "50"])
    server.check_args(args)
    server.apply_backend_defaults(args)  # as load_served_models does: --batch-tokens
    translator, _ = server.load_translator(model, model, args)
    assert translator.shortlist_size == 50
    assert translator.describe() == "jax float32, shortlist of 50"
    args = server.build_parser().parse_args(["--model", str(run_dir), "--shortlist", "50"])
    with pytest.raises(InputError, match="has no shortlist.npz"):
        server.load_translator(str(run_dir), str(run_dir), args)
