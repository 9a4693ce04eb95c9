"""A model directory's files checked before the parameters are read (nmt.models.model_files):
each fault is named by its file, with what to do about it."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil

import pytest
import sentencepiece as spm

from nmt.models.model_files import (
    RUN_MARKERS,
    STORED_MODEL_FIELDS,
    ModelDirError,
    read_model_files,
)
from translate_model import sentences

SPECIAL = {"pad_token": "<pad>", "unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}


def _spm(seed: int) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences(200, seed=seed)),
                                   model_writer=model, vocab_size=40, model_type="unigram",
                                   character_coverage=1.0, minloglevel=2)
    return model.getvalue()


def _vocab(*models: bytes) -> dict[str, int]:
    """vocab.json as a model trained here exports it: the special pieces, then the pieces."""
    vocab = {piece: i for i, piece in enumerate(("<pad>", "<unk>", "<s>", "</s>"))}
    for model in models:
        processor = spm.SentencePieceProcessor(model_proto=model)
        for i in range(processor.get_piece_size()):
            vocab.setdefault(processor.id_to_piece(i), len(vocab))
    return vocab


@pytest.fixture(scope="module")
def marian_model(tmp_path_factory):
    """A tiny model exported in Marian's tokenizer layout (source.spm, target.spm, vocab.json,
    special_tokens_map.json), as `python -m nmt.convert from-marian` leaves one."""
    from flax import nnx

    from data.tokenizer import VocabTokenizer
    from nmt.models.model_dir import export_model
    from transformer.config import get_preset
    from transformer.model import Transformer

    source, target = _spm(1), _spm(2)
    tokenizer = VocabTokenizer(source, target, _vocab(source, target), SPECIAL)
    config = get_preset("tiny", vocab_size=tokenizer.vocab_size, **tokenizer.special_ids())
    params = nnx.state(Transformer(config, rngs=nnx.Rngs(0)), nnx.Param)
    return export_model(tmp_path_factory.mktemp("marian") / "model", params, config, tokenizer)


@pytest.fixture
def model(marian_model, tmp_path):
    """A copy of the Marian-layout model for one test to damage."""
    return shutil.copytree(marian_model, tmp_path / "model")


def test_the_marian_layout_model_reads(model):
    assert read_model_files(model)[0] == model


def test_a_changed_vocabulary_names_the_tokenizer_files_and_fitting_advice(model):
    """One sha256 covers the tokenizer's files: the message names them all, not source.spm,
    and says what restores a Marian layout (it has no spm.model)."""
    vocab = json.loads((model / "vocab.json").read_text())
    first, second = list(vocab)[-2:]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (model / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(ModelDirError) as info:
        read_model_files(model)
    message = str(info.value)
    assert message.startswith(
        f"the tokenizer files (source.spm, target.spm, vocab.json, special_tokens_map.json) in "
        f"{model} differ from those recorded in {model / 'config.json'} (tokenizer_sha256)")
    assert "spm.model" not in message and "nmt.convert from-marian" in message


@pytest.mark.parametrize("name", ["special_tokens_map.json", "vocab.json"])
def test_a_missing_tokenizer_file_is_named(model, name):
    """Without special_tokens_map.json the layout falls back to other special ids: the
    missing file is named, not a mismatch of bos_id."""
    (model / name).unlink()
    with pytest.raises(ModelDirError) as info:
        read_model_files(model)
    assert str(info.value).startswith(
        f"{model / name} is missing: {model / 'config.json'} lists it among the tokenizer's "
        "files; restore source.spm, target.spm, vocab.json, special_tokens_map.json from")


def _drop_model_fields(model, *names: str) -> None:
    values = json.loads((model / "config.json").read_text())
    for name in names:
        del values["model"][name]
    (model / "config.json").write_text(json.dumps(values))


def test_a_model_field_missing_from_config_json_is_named(model):
    """A missing d_model is not the base model's 512 (refused as not divisible by the heads)."""
    _drop_model_fields(model, "d_model")
    with pytest.raises(ModelDirError) as info:
        read_model_files(model)
    assert str(info.value) == (
        f"{model / 'config.json'}: not a valid model configuration (ValueError: ModelConfig "
        "field d_model is missing: the file is damaged or was written by another tool.); "
        "restore the config.json written with the model, or export the model again.")


def test_an_export_older_than_the_later_model_fields_reads_with_their_defaults(model):
    from transformer.config import ModelConfig

    later = {"activation_dtype", "activation", "output_bias"}
    assert later == {f.name for f in dataclasses.fields(ModelConfig)} - set(STORED_MODEL_FIELDS)
    _drop_model_fields(model, *later)
    config = read_model_files(model)[2]["model"]
    assert (config.activation_dtype, config.activation, config.output_bias) == (
        "auto", "relu", False)


@pytest.mark.parametrize("marker", ["checkpoints", "config.yaml"])
def test_a_run_that_has_not_exported_its_model_says_so(tmp_path, marker):
    """Still training, or stopped before the export: not an incomplete model directory, and
    the command that exports its latest checkpoint is the one train.py has."""
    from nmt.rundir.checkpoints import CHECKPOINTS_DIR
    from nmt.rundir.resume import RUN_CONFIG_FILE

    assert RUN_MARKERS == (CHECKPOINTS_DIR, RUN_CONFIG_FILE)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    if marker == "config.yaml":
        (run / "checkpoints").rmdir()
        (run / "config.yaml").write_text("model: {}\n")
    with pytest.raises(ModelDirError) as info:
        read_model_files(run)
    assert str(info.value) == (
        f"{run} is a run directory that has not exported its model yet (no model/): wait for "
        "its training to finish, or write averaged/ from its latest checkpoint with python "
        f"train.py --average-only --average-last 1 --output-dir {run} and pass "
        f"{run / 'averaged'} to --model.")
