"""train.py's flags and `recipes.load` build the same settings, also where the settings name
files that imply others: --init-from (the model's architecture) and --spm-model (its
vocabulary size)."""

from __future__ import annotations

import io

import pytest
import sentencepiece as spm

import train as train_cli
from data.config import DataError, TokenizerConfig
from nmt.settings import recipes
from nmt.settings.config import SettingsError
from translate_model import make_model, sentences


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("init") / "run") / "model"


def _recipe(tmp_path, text: str):
    path = tmp_path / "recipe.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_init_from_in_a_recipe_equals_the_flag(model_dir, tmp_path):
    recipe = _recipe(tmp_path, f"trainer:\n  init_from: {model_dir}\n  max_steps: 7\n")
    loaded = recipes.load(recipe)
    by_recipe, _ = train_cli.resolve(["--config", str(recipe)])
    by_flags, _ = train_cli.resolve(["--init-from", str(model_dir), "--max-steps", "7"])
    assert loaded == by_recipe == by_flags
    # The architecture is the model's (the tiny preset's), not train.py's default preset's.
    assert (loaded.model.d_model, loaded.model.d_ff) == (24, 40)
    assert loaded.model != recipes.run_from_flat().model


def test_spm_model_in_a_recipe_equals_the_flag(model_dir, tmp_path):
    spm = model_dir / "spm.model"
    recipe = _recipe(tmp_path, f"tokenizer:\n  spm_model: {spm}\n")
    loaded = recipes.load(recipe)
    assert loaded == train_cli.resolve(["--config", str(recipe)])[0]
    assert loaded == train_cli.resolve(["--spm-model", str(spm)])[0]
    assert loaded.tokenizer.vocab_size == 300  # the model's pieces, not the default size


def _spm_model(path, vocab_size: int, byte_fallback: bool, model_type: str = "bpe"):
    """A model (BPE unless `model_type` says) trained with spm_train's own defaults, save for
    this project's ids."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences(200, seed=2)),
                                   model_writer=model, model_type=model_type,
                                   vocab_size=vocab_size,
                                   byte_fallback=byte_fallback, pad_id=0, unk_id=1, bos_id=2,
                                   eos_id=3, minloglevel=2)
    path.write_bytes(model.getvalue())
    return path


def test_a_given_spm_model_under_300_pieces_is_its_vocabulary(tmp_path):
    """The 300-piece minimum is for tokenizers trained here (256 byte pieces); a model given
    with --spm-model needs only the 4 special ids and a piece."""
    small = _spm_model(tmp_path / "small.model", 120, byte_fallback=False)
    run, _ = train_cli.resolve(["--spm-model", str(small)])
    assert run.tokenizer.vocab_size == 120
    with pytest.raises(DataError, match="vocab_size 299 is too small"):
        TokenizerConfig(vocab_size=299)
    with pytest.raises(DataError, match=f"--spm-model {small} has 4 pieces"):
        TokenizerConfig(vocab_size=4, spm_model=str(small))


def test_a_recipe_conflicting_with_init_from_is_refused_by_load_too(model_dir, tmp_path):
    recipe = _recipe(tmp_path, f"model:\n  d_model: 64\ntrainer:\n  init_from: {model_dir}\n")
    with pytest.raises(SettingsError, match="conflicts with --init-from"):
        recipes.load(recipe)
    with pytest.raises(SettingsError, match="conflicts with --init-from"):
        train_cli.resolve(["--config", str(recipe)])


def test_init_from_brings_its_language_pair_unless_one_is_given(model_dir, caplog):
    """Without --src and --tgt a fine-tuning run trains the model's own direction (de->en
    here), as translate.py translates it; a pair given is kept, with a warning."""
    run, _ = train_cli.resolve(["--init-from", str(model_dir)])
    assert (run.data.src, run.data.tgt) == ("de", "en")
    assert recipes.run_from_flat().data.src == "en"  # train.py's default, which would flip it
    with caplog.at_level("WARNING", logger="train.py"):
        run, _ = train_cli.resolve(["--init-from", str(model_dir), "--src", "en", "--tgt", "de"])
    assert (run.data.src, run.data.tgt) == ("en", "de")
    assert (f"--init-from {model_dir} was trained for de->en; fine-tuning it into another "
            "language pair (--src en against its de; --tgt de against its en)") in caplog.text


def test_the_settings_warnings_reach_stderr_formatted_as_the_runs_logs(model_dir, tmp_path,
                                                                       capsys):
    (tmp_path / "file").write_text("not a directory\n")  # train.py stops right after settings
    assert train_cli.main(["--init-from", str(model_dir), "--src", "en", "--tgt", "de",
                           "--output-dir", str(tmp_path / "file")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"WARNING train.py: --init-from {model_dir} was trained for de->en")
    assert err[1].startswith("train.py: error: --output-dir") and len(err) == 2


def test_a_given_spm_model_without_byte_fallback_is_warned_of_once(tmp_path, caplog):
    """Without byte fallback the characters the model has not seen become <unk>: one line
    says so; a model with byte fallback passes without it."""
    bare = _spm_model(tmp_path / "bare.model", 120, byte_fallback=False)
    with caplog.at_level("WARNING", logger="train.py"):
        train_cli.resolve(["--spm-model", str(bare)])
    assert [record.getMessage() for record in caplog.records] == [
        f"--spm-model {bare} has no byte fallback: characters it has not seen become <unk> "
        "(\u2047) in training and translation; train it with --byte_fallback=true to avoid "
        "that"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="train.py"):
        train_cli.resolve(["--spm-model", str(_spm_model(tmp_path / "bytes.model", 400,
                                                         byte_fallback=True))])
    assert not caplog.records


def test_a_given_spm_model_brings_its_type_and_its_runs_config_yaml_warns_of_nothing(
        tmp_path, caplog):
    """config.yaml lists every setting, model_type included: it records the given model's
    type, so `--config RUN/config.yaml` resumes without a warning; only a --tokenizer-type
    other than the model's is warned of."""
    bpe = _spm_model(tmp_path / "bpe.model", 400, byte_fallback=True)
    with caplog.at_level("WARNING", logger="train.py"):
        run, _ = train_cli.resolve(["--spm-model", str(bpe)])
        saved = _recipe(tmp_path, recipes.dump(run))
        assert train_cli.resolve(["--config", str(saved)])[0] == run
        train_cli.resolve(["--spm-model", str(bpe), "--tokenizer-type", "bpe"])
    assert run.tokenizer.model_type == "bpe"
    assert "model_type: bpe" in saved.read_text()
    assert not caplog.records
    with caplog.at_level("WARNING", logger="train.py"):
        train_cli.resolve(["--spm-model", str(bpe), "--tokenizer-type", "unigram"])
    assert [record.getMessage() for record in caplog.records] == [
        f"--tokenizer-type unigram does not apply: --spm-model {bpe} is a bpe model, and no "
        "tokenizer is trained"]


def test_subword_nbest_with_a_given_unigram_model_is_not_refused_as_bpe(tmp_path):
    """With --spm-model the given model's type decides whether --subword-nbest applies
    (data.tokenizer checks it), not a --tokenizer-type bpe that does not apply to it: the
    flags and the Python API take unigram sampling from the N best."""
    from data.tokenizer import Tokenizer

    unigram = str(_spm_model(tmp_path / "unigram.model", 300, byte_fallback=True,
                             model_type="unigram"))
    run, _ = train_cli.resolve(["--spm-model", unigram, "--tokenizer-type", "bpe",
                                "--subword-alpha", "0.1", "--subword-nbest", "64"])
    by_api = recipes.run_from_flat(spm_model=unigram, tokenizer_type="bpe", subword_alpha=0.1,
                                   subword_nbest=64)
    assert (run.tokenizer.subword_nbest, by_api.tokenizer.subword_nbest) == (64, 64)
    Tokenizer.load(unigram).check_sampling(0.1, 64)
    with pytest.raises(DataError, match="--subword-nbest 64 chooses among the N best"):
        TokenizerConfig(model_type="bpe", subword_alpha=0.1, subword_nbest=64)
