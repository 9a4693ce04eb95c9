"""Ensembles and force decoding: search over several models must score every token by
their mean probability, with each model's cache following the beams (transformer/ensemble.py);
scoring a reference must give the teacher-forced log-probability of exactly its tokens."""

import dataclasses
import json
import math
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_search import BOS, EOS, PAD, sharp_model, sources, teacher_forced_logits, token_logprobs

from transformer.config import SearchConfig, get_preset
from transformer.ensemble import Ensemble
from transformer.model import Transformer
from transformer.search import length_penalty, search


def mean_probability_logprob(models, src_row, hypothesis) -> float:
    """log of the models' mean probability, summed over the hypothesis' tokens."""
    per_model = np.stack([token_logprobs(m, src_row, hypothesis) for m in models])
    return float(np.sum(np.logaddexp.reduce(per_model, axis=0) - math.log(len(models))))


def hypotheses(result, sentence: int) -> list[list[int]]:
    return [row[:length].tolist() for row, length in
            zip(result.tokens[sentence], result.lengths[sentence])]


def test_beam_scores_are_the_mean_probability_of_the_models():
    # Different models: if a member's cache did not follow the beams' parents, its part of
    # each score would come from another hypothesis' history and the sums below would differ.
    models = [sharp_model(seed=0), sharp_model(seed=1), sharp_model(seed=2)]
    ensemble = Ensemble(models)
    src = sources(np.random.default_rng(0), [9, 5, 7], 64)
    config = SearchConfig(beam_size=4, nbest=4, alpha=0.6, max_len_a=1.0, max_len_b=5)
    result = search(ensemble, src, config)
    alone = search(models[0], src, config)
    assert not np.array_equal(result.tokens, alone.tokens), "the ensemble equals one model"
    for sentence in range(len(src)):
        for hypothesis, length, score in zip(hypotheses(result, sentence),
                                             result.lengths[sentence], result.scores[sentence]):
            assert hypothesis[-1] == EOS
            expected = mean_probability_logprob(models, src[sentence], hypothesis)
            np.testing.assert_allclose(score * float(length_penalty(jnp.asarray(length), 0.6)),
                                       expected, rtol=1e-4, atol=1e-4)


def test_greedy_takes_the_most_likely_token_of_the_mean_distribution():
    models = [sharp_model(seed=3), sharp_model(seed=4)]
    src = sources(np.random.default_rng(1), [8, 6], 64)
    config = SearchConfig(strategy="greedy", max_len_a=1.0, max_len_b=5)
    ensemble = Ensemble(models)
    result = search(ensemble, src, config)
    for sentence in range(len(src)):
        hypothesis = hypotheses(result, sentence)[0]
        tgt_in = jnp.asarray([[BOS] + hypothesis[:-1]])
        row = jnp.asarray(src[sentence][None])
        per_model = [jax.nn.log_softmax(teacher_forced_logits(*nnx.split(m), row, tgt_in)[0])
                     for m in models]
        mean = np.logaddexp(*map(np.asarray, per_model))
        mean[:, [PAD, BOS]] = -np.inf
        limit = config.max_output_len(int((src[sentence] != PAD).sum()), ensemble.config.max_len)
        # The last token may be an EOS forced by the length limit rather than chosen.
        chosen = hypothesis if len(hypothesis) < limit else hypothesis[:-1]
        np.testing.assert_array_equal(mean[: len(chosen)].argmax(axis=-1), chosen)
        np.testing.assert_allclose(result.scores[sentence, 0],
                                   mean_probability_logprob(models, src[sentence], hypothesis),
                                   rtol=1e-4, atol=1e-4)


def test_an_ensemble_of_one_model_twice_translates_as_that_model():
    model = sharp_model(seed=5)
    src = sources(np.random.default_rng(2), [9, 4, 7, 3], 64)
    config = SearchConfig(beam_size=3, nbest=3, max_len_a=1.0, max_len_b=4)
    alone, twice = search(model, src, config), search(Ensemble([model, model]), src, config)
    np.testing.assert_array_equal(twice.tokens, alone.tokens)
    np.testing.assert_allclose(twice.scores, alone.scores, atol=1e-4)


def test_members_may_differ_in_size_but_not_in_vocabulary():
    small = sharp_model(seed=0)
    deeper = Transformer(dataclasses.replace(get_preset("tiny", vocab_size=64), decoder_layers=3,
                                             max_len=32), rngs=nnx.Rngs(1))
    ensemble = Ensemble([small, deeper])
    # No member decodes past its own positions (its init_cache would refuse).
    assert ensemble.config.max_len == 32
    cache = ensemble.init_cache(ensemble.encode(jnp.full((1, 5), 7)), 32)
    assert len(cache.members[1].self_key) == 3
    other_vocab = sharp_model(vocab=80)
    with pytest.raises(ValueError, match="model 1 has vocab_size 80 but model 0 has 64"):
        Ensemble([small, other_vocab])
    with pytest.raises(ValueError, match="at least two"):
        Ensemble([small])


# ----------------------------------------------------------------------------- translate.py


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny exported model (tests/translate_model.py) for the translate.py tests here."""
    from translate_model import make_model

    return make_model(tmp_path_factory.mktemp("exported"))


def test_translate_py_ensembles_models_of_one_tokenizer_only(exported, tmp_path, monkeypatch,
                                                             capsys):
    from nmt.translation import command as translate_cli

    run = exported
    # A copy of the same model: the ensemble must translate exactly as the model alone.
    shutil.copytree(run, tmp_path / "b")
    monkeypatch.setattr(translate_cli, "enable_compilation_cache", lambda: None)
    sentences = ["Ein Mann liest das Buch.", "Zwei Kinder spielen."]
    assert translate_cli.main(["--model", str(run), "-q", "--greedy", *sentences]) == 0
    alone = capsys.readouterr().out
    assert translate_cli.main(["--model", str(run), "--model", str(tmp_path / "b"), "-q",
                               "--greedy", *sentences]) == 0
    assert capsys.readouterr().out == alone

    # The same spm.model but the other direction recorded: refused, naming both.
    reverse = tmp_path / "r" / "model"
    shutil.copytree(run / "model", reverse)
    config = json.loads((reverse / "config.json").read_text())
    config.update(source_lang="en", target_lang="de")
    (reverse / "config.json").write_text(json.dumps(config))
    assert translate_cli.main(["--model", str(run), "--model", str(reverse), "-q",
                               "Hallo."]) == 1
    assert (f"{reverse} translates en->de but {run / 'model'} translates de->en; an ensemble's "
            "models translate one pair") in capsys.readouterr().err

    # Another SentencePiece model: refused, naming the directory.
    other = tmp_path / "c" / "model"
    shutil.copytree(run / "model", other)
    from data.tokenizer import TokenizerConfig, train_tokenizer
    from translate_model import sentences as corpus

    tokenizer = train_tokenizer(corpus(300, seed=7), TokenizerConfig(vocab_size=300))
    tokenizer.save(other)
    config = json.loads((other / "config.json").read_text())  # a model of its own tokenizer
    (other / "config.json").write_text(json.dumps({**config,
                                                   "tokenizer_sha256": tokenizer.sha256}))
    assert translate_cli.main(["--model", str(run), "--model", str(other), "-q", "Hallo."]) == 1
    assert f"{other} has another SentencePiece model" in capsys.readouterr().err
    assert translate_cli.main(["--model", str(run), "--model", str(run), "--plot-attention",
                               str(tmp_path / "a.png"), "Hallo."]) == 2


# ----------------------------------------------------------------------------- force decoding


def test_reference_logprobs_equal_one_pair_at_a_time_padding_and_all():
    from transformer.search import pad_sources, reference_logprobs

    rng = np.random.default_rng(4)
    model = sharp_model(seed=6)
    src = sources(rng, [9, 3, 6], 64)
    references = [[int(t) for t in rng.integers(4, 64, size=n)] + [EOS] for n in (2, 7, 0)]
    batched = reference_logprobs(model, src, pad_sources(references, PAD))
    for row, reference in enumerate(references):
        alone = token_logprobs(model, src[row][: int((src[row] != PAD).sum())], reference)
        np.testing.assert_allclose(batched[row], alone.sum(), rtol=1e-5, atol=1e-4)
    # An ensemble's scores are those of its mean probability.
    models = [model, sharp_model(seed=7)]
    ensemble = reference_logprobs(Ensemble(models), src, pad_sources(references, PAD))
    for row, reference in enumerate(references):
        np.testing.assert_allclose(ensemble[row],
                                   mean_probability_logprob(models, src[row], reference),
                                   rtol=1e-5, atol=1e-4)


def test_translate_py_score_prints_each_reference_logprob_in_order(exported, tmp_path,
                                                                   monkeypatch, capsys):
    from nmt.models.model_dir import load_model
    from nmt.translation import command as translate_cli
    from transformer.search import pad_sources, reference_logprobs
    from translate_model import sentences as corpus

    run = exported
    monkeypatch.setattr(translate_cli, "enable_compilation_cache", lambda: None)
    pairs = list(zip(corpus(6, seed=8), corpus(6, seed=9, max_words=14)))
    pairs[3] = (pairs[3][0], "")  # an empty reference is scored: EOS alone
    src_file, ref_file = tmp_path / "test.de", tmp_path / "test.en"
    src_file.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    ref_file.write_text("".join(r + "\n" for _, r in pairs), encoding="utf-8")
    flags = ["--model", str(run), "--score", "--src-file", str(src_file), "--ref-file",
             str(ref_file), "-q", "--batch-tokens", "32"]  # several batches, sorted by length
    assert translate_cli.main(flags) == 0
    printed = [float(x) for x in capsys.readouterr().out.splitlines()]
    assert translate_cli.main([*flags, "--normalize"]) == 0
    normalized = [float(x) for x in capsys.readouterr().out.splitlines()]

    assert len(printed) == len(normalized) == len(pairs)
    # The same pairs in one batch, in file order.
    model, tokenizer, _ = load_model(run)
    src = pad_sources([row + [EOS] for row in tokenizer.encode([s for s, _ in pairs])], PAD)
    tgt = [row + [EOS] for row in tokenizer.encode([r for _, r in pairs])]
    expected = reference_logprobs(model, src, pad_sources(tgt, PAD))
    np.testing.assert_allclose(printed, expected, atol=2e-4)
    np.testing.assert_allclose(normalized, expected / np.array([len(t) for t in tgt]), atol=2e-4)

    for bad, message in ((["--evaluate"], "give one of them"),
                         (["--hyp-file", str(tmp_path / "h")], "--hyp-file does not apply")):
        assert translate_cli.main([*flags, *bad]) == 2
        assert message in capsys.readouterr().err
    assert translate_cli.main(["--model", str(run), "--normalize", "Hallo."]) == 2
    assert "--normalize only applies with --score" in capsys.readouterr().err
