"""Every shipped recipe trains: its model, schedule, batching and checkpointing run two steps
on a synthetic corpus (data, vocabulary and budget made tiny by flags), and a recipe written
for another platform than this one says so before training.

Each runs with one encoder and one decoder layer (every other model setting its own, widths
included): what is tested is the recipe, and each layer more only adds compiling."""

from __future__ import annotations

from pathlib import Path

import jax
import pytest
from conftest import SHALLOW, SHALLOW_FLAGS

import train as train_cli
from nmt.models.model_dir import read_model_config
from nmt.rundir import checkpoints as checkpoint
from nmt.settings import recipes
from synthetic_corpus import write_corpus

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted((REPO / "configs").glob("*.yaml"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("corpus")
    return {"train": write_corpus(root, 300, 0, "train"),
            "valid": write_corpus(root, 20, 1, "valid")}


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_runs_two_steps(path, corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLAX_NMT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    tiny = ["--train-prefix", corpus["train"], "--valid-prefix", corpus["valid"],
            "--test-prefix", corpus["valid"], "--src", "en", "--tgt", "de",
            "--vocab-size", "320", "--batch-tokens", "512",
            "--max-tokens-per-sentence", "32", "--max-steps", "2", "--eval-sentences", "0",
            "--no-progress", "--output-dir", str(out), *SHALLOW_FLAGS]
    code = train_cli.main(["--config", str(path), *tiny])
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    recipe = recipes.load(path)
    assert checkpoint.complete_steps(out / "checkpoints") == [2]
    model, _ = read_model_config(out / "model")
    fields = ("d_model", "num_heads", "d_ff", "encoder_layers", "decoder_layers", "dropout",
              "dtype")
    expected = {name: getattr(recipe.model, name) for name in fields} | SHALLOW
    assert {name: getattr(model, name) for name in fields} == expected
    platform = jax.devices()[0].platform
    assert recipe.trainer.written_for is not None, f"{path.name}: say which platform it fits"
    warned = err.count("WARNING nmt.training.trainer: these settings were written for")
    assert warned == (recipe.trainer.written_for != platform), err[-3000:]
