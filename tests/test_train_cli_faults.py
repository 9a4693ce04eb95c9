"""train.py, its recipes and the corpus download under hostile input: each case ends correct or
in one line naming what is wrong and what to do, with the exit status of the README's rule (2
for bad flags, values and paths, 1 for faults while running, 130 and 143 after SIGINT and
SIGTERM)."""

from __future__ import annotations

import errno
import os
import re
import signal
import urllib.error
from pathlib import Path

import jax
import pytest
from conftest import SHALLOW_FLAGS

import nmt.training.trainer
import nmt.training.validation
import train as train_cli
from data import download
from nmt.settings import recipes
from nmt.settings.config import SettingsError
from synthetic_corpus import write_corpus
from translate_model import make_model

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A tiny exported model (preset tiny's architecture, 300 pieces) to fine-tune."""
    return make_model(tmp_path_factory.mktemp("init") / "run") / "model"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("corpus")
    valid = write_corpus(root, 20, 1, "valid")
    # Validation pair 6 is longer than the model's 64 positions.
    for side, word in (("en", "red"), ("de", "RED")):
        path = Path(f"{valid}.{side}")
        lines = path.read_text().splitlines()
        lines[5] = " ".join([word] * 90)
        path.write_text("\n".join(lines) + "\n")
    return {"train": write_corpus(root, 200, 0, "train"), "valid": valid}


@pytest.fixture(autouse=True)
def cache(tmp_path_factory, monkeypatch):
    """One compilation and encoding cache for the module: only the first run compiles."""
    monkeypatch.setenv("FLAX_NMT_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def _fine_tune(model, corpus, out, steps=2, *extra) -> list[str]:
    return ["--init-from", str(model), "--train-prefix", corpus["train"],
            "--valid-prefix", corpus["valid"], "--batch-tokens", "256",
            "--max-tokens-per-sentence", "16", "--warmup", "2", "--max-steps", str(steps),
            "--eval-every", "2", "--eval-sentences", "0", "--no-progress",
            "--output-dir", str(out), *extra]


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("train.py: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def fine_tuned(model, corpus, tmp_path_factory) -> tuple[Path, list[str]]:
    """A fine-tuning run of two steps, and its flags."""
    out = tmp_path_factory.mktemp("runs") / "tuned"
    args = _fine_tune(model, corpus, out)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FLAX_NMT_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        assert train_cli.main(args) == 0
    return out, args


# ----------------------------------------------------------------------------- --init-from


def test_init_from_a_run_directory_names_the_model_folder_it_reads(fine_tuned, corpus, tmp_path,
                                                                     capsys):
    run_dir, _ = fine_tuned
    capsys.readouterr()
    assert train_cli.main(_fine_tune(run_dir, corpus, tmp_path / "again")) == 0
    assert f"Starting from the parameters of {run_dir / 'model'}." in capsys.readouterr().out


def test_a_preset_with_another_architecture_than_init_from_is_refused(model, tmp_path, capsys):
    out = tmp_path / "run"
    assert train_cli.main(["--init-from", str(model), "--preset", "base",
                           "--output-dir", str(out)]) == 2
    line = _error_line(capsys)
    assert f"--preset base conflicts with --init-from {model}" in line
    assert "whose model has d_model 24 (preset base has 512)" in line
    assert "give --preset tiny" in line and "drop --preset base" in line
    assert not out.exists()
    # The model's own preset may be named: it brings that preset's dropout.
    run, _ = train_cli.resolve(["--init-from", str(model), "--preset", "tiny"])
    assert run.preset == "tiny" and run.model.dropout == recipes.PRESETS["tiny"].dropout


def test_a_fine_tuning_runs_config_reruns_it_exactly(fine_tuned, tmp_path):
    out, args = fine_tuned
    run, _ = train_cli.resolve(args)
    # What the run used: the model's architecture, named by its preset, and its vocabulary.
    assert (run.preset, run.tokenizer.vocab_size, run.model.vocab_size) == ("tiny", 300, 300)
    assert recipes.load(out / "config.yaml") == run
    again = tmp_path / "again"
    assert train_cli.main(["--config", str(out / "config.yaml"), "--output-dir", str(again),
                           "--max-steps", "3"]) == 0
    assert recipes.load(again / "config.yaml") == run.replace(
        trainer={"output_dir": str(again), "max_steps": 3})


def test_a_marian_vocabulary_below_the_tokenizers_minimum_reloads(corpus, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from test_convert_import import make_opus_dir

    from nmt.convert.marian_import import import_marian

    imported = import_marian(make_opus_dir(tmp_path / "opus", corpus), tmp_path / "imported")
    run, _ = train_cli.resolve(["--init-from", str(imported), "--dropout", "0.2"])
    assert run.model.vocab_size < 300 and run.model.activation == "swish"
    saved = tmp_path / "config.yaml"
    saved.write_text(recipes.dump(run))
    assert recipes.load(saved) == run


def test_settings_that_cannot_resume_a_fine_tuning_run_are_usage_errors(fine_tuned, corpus,
                                                                       capsys):
    _, args = fine_tuned
    without = [a for a in args if a not in ("--init-from", args[1])]
    assert train_cli.main([*without, "--max-steps", "4"]) == 2
    assert "pass --init-from" in _error_line(capsys)
    assert train_cli.main([*args, "--max-steps", "4", "--seed", "5"]) == 2
    assert "pass --seed 0 to resume" in _error_line(capsys)


def test_a_run_resumed_in_another_direction_is_refused(fine_tuned, capsys):
    """--src and --tgt swapped would go on training the checkpoints the other way round."""
    out, args = fine_tuned
    assert train_cli.main([*args, "--max-steps", "4", "--src", "en", "--tgt", "de"]) == 2
    assert (f"the run in {out} translates de->en (see {out / 'config.yaml'}), this run asks "
            "for en->de: pass --src de --tgt en to resume it") in _error_line(capsys)


def test_init_from_given_to_a_run_trained_from_scratch_is_refused(model, corpus, tmp_path,
                                                                  capsys):
    """Its checkpoints would be resumed and --init-from ignored, though the user asked to
    fine-tune: here its own model/, whose tokenizer is the run's."""
    out = tmp_path / "scratch"
    scratch = [a for a in _fine_tune(model, corpus, out) if a not in ("--init-from", str(model))]
    assert train_cli.main([*scratch, "--preset", "tiny", "--vocab-size", "320",
                           *SHALLOW_FLAGS]) == 0
    assert train_cli.main([*scratch, "--preset", "tiny", *SHALLOW_FLAGS, "--init-from",
                           str(out / "model"), "--max-steps", "4"]) == 2
    assert (f"the run in {out} was trained from scratch (see {out / 'config.yaml'}), this run "
            f"asks for --init-from {out / 'model'}: drop --init-from to resume the run, or use "
            "a new --output-dir") in _error_line(capsys)


def test_dropout_and_dtype_may_change_on_resume_and_the_model_records_them(
        model, corpus, tmp_path, capsys):
    """They leave the parameters' layout as it is (fairseq and Marian allow both); the
    model's width does not, and is still refused."""
    import json

    out = tmp_path / "run"
    scratch = [*(a for a in _fine_tune(model, corpus, out) if a not in ("--init-from",
                                                                          str(model))),
               "--preset", "tiny", "--vocab-size", "320", *SHALLOW_FLAGS]
    assert train_cli.main(scratch) == 0
    capsys.readouterr()
    assert train_cli.main([*scratch, "--max-steps", "4", "--dropout", "0.2",
                           "--dtype", "bfloat16"]) == 0
    assert ("INFO trainer: resuming with dropout 0.1 -> 0.2, dtype 'float32' -> 'bfloat16' "
            "changed; the parameters' layout is the same") in capsys.readouterr().err
    config = json.loads((out / "model" / "config.json").read_text())["model"]
    assert (config["dropout"], config["dtype"]) == (0.2, "bfloat16")
    assert recipes.load(out / "config.yaml").model.dropout == 0.2
    assert train_cli.main([*scratch, "--max-steps", "6", "--d-model", "30"]) == 2
    assert "was trained with a different model (d_model: saved 24, now 30)" in _error_line(
        capsys)


def test_a_run_resumed_without_its_preset_is_refused_naming_it(model, corpus, tmp_path,
                                                               capsys):
    """The refusal names the run's --preset, and no info line about the settings that may
    change comes before it: the run does not resume."""
    out = tmp_path / "run"
    scratch = [a for a in _fine_tune(model, corpus, out) if a not in ("--init-from", str(model))]
    assert train_cli.main([*scratch, "--preset", "tiny", "--vocab-size", "320",
                           *SHALLOW_FLAGS]) == 0
    capsys.readouterr()
    assert train_cli.main([*scratch, "--vocab-size", "320", *SHALLOW_FLAGS, "--max-steps",
                           "4"]) == 2
    err = capsys.readouterr().err
    assert "resuming with" not in err
    lines = [line for line in err.splitlines() if line.startswith("train.py: error:")]
    assert len(lines) == 1, err
    assert f"{out / 'config.yaml'} was trained with a different model (d_model: saved 24, now" in (
        lines[0])
    assert re.search(r"; pass --preset tiny \(the run's, this run's is \w+\) and its model "
                     r"flags to resume, or a new --output-dir\.$", lines[0]), lines[0]


def test_a_linear_schedule_at_its_end_is_refused_a_higher_limit_naming_decay_steps(
        model, corpus, tmp_path, capsys):
    """The rate is zero after the end fitted to --max-steps 4: resumed with --max-steps 8 the
    run would train nothing, so it is refused before compiling, naming the --decay-steps
    that extends the line; given it, the run trains on to the new limit."""
    out = tmp_path / "run"
    scratch = [*(a for a in _fine_tune(model, corpus, out, 4) if a not in ("--init-from",
                                                                             str(model))),
               "--preset", "tiny", "--vocab-size", "320", *SHALLOW_FLAGS,
               "--schedule", "linear"]
    assert train_cli.main(scratch) == 0
    assert recipes.load(out / "config.yaml").optimizer.decay_steps == 4
    capsys.readouterr()
    assert train_cli.main([*scratch, "--max-steps", "8"]) == 2
    assert (f"--max-steps 8 trains no further: the run's checkpoint is at step 4, and its "
            "linear learning rate is zero after step 4, the end it records (decay_steps in "
            f"{out / 'config.yaml'}, given or fitted to its earlier limit); --decay-steps 8 "
            "extends the line, or use a new --output-dir.") in _error_line(capsys)
    assert recipes.load(out / "config.yaml").optimizer.decay_steps == 4
    # A limit of epochs the checkpoint has not trained is refused too, whatever the limits
    # that stopped the run were.
    assert train_cli.main([*scratch, "--max-steps", "none", "--max-epochs", "50"]) == 2
    assert _error_line(capsys).startswith("train.py: error: --max-epochs 50 trains no further")
    assert train_cli.main([*scratch, "--max-steps", "8", "--decay-steps", "8"]) == 0
    assert "Finished after 8 steps (max_steps" in capsys.readouterr().out


def test_a_model_edited_in_config_yaml_is_refused_in_one_line(model, corpus, tmp_path, capsys):
    """Resuming with --config of a config.yaml whose model was edited agrees with that file,
    but not with the checkpoints: one line names the shapes, without the traceback that each
    of orbax's abandoned array reads would print."""
    import gc

    out = tmp_path / "run"
    scratch = [*(a for a in _fine_tune(model, corpus, out) if a not in ("--init-from",
                                                                          str(model))),
               "--preset", "tiny", "--vocab-size", "320", *SHALLOW_FLAGS]
    assert train_cli.main(scratch) == 0
    config = out / "config.yaml"
    text = config.read_text()
    config.write_text(text.replace("model: {preset: tiny,", "model: {preset: tiny, d_model: 30,"))
    assert config.read_text() != text
    capsys.readouterr()
    assert train_cli.main(["--config", str(config), "--max-steps", "4"]) == 2
    gc.collect()  # abandoned reads print when collected
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("INFO")]
    assert len(lines) == 1, err[-3000:]
    assert "the model's shapes differ from those of its checkpoints" in lines[0]
    assert re.search(r"is \([\d, ]*30,?\) now and \([\d, ]*24,?\) in the checkpoint", lines[0])


def test_another_seed_is_refused_on_resume_without_config_yaml(model, corpus, tmp_path,
                                                               capsys):
    """The checkpoint records the seed: config.yaml, which the other checks read, may be
    gone."""
    out = tmp_path / "run"
    scratch = [*(a for a in _fine_tune(model, corpus, out) if a not in ("--init-from",
                                                                          str(model))),
               "--preset", "tiny", "--vocab-size", "320", *SHALLOW_FLAGS]
    assert train_cli.main(scratch) == 0
    (out / "config.yaml").unlink()
    assert train_cli.main([*scratch, "--max-steps", "4", "--seed", "5"]) == 2
    assert (f"checkpoint step 2 in {out / 'checkpoints'} was trained with --seed 0, this run "
            "asks for --seed 5") in _error_line(capsys)


# ----------------------------------------------------------------------------- while training


def _kill_at_step(monkeypatch, step: int, signum: int) -> None:
    real = nmt.training.trainer.Trainer._train_one_step

    def train_one_step(self):
        if self.step == step:
            os.kill(os.getpid(), signum)
        return real(self)

    monkeypatch.setattr(nmt.training.trainer.Trainer, "_train_one_step", train_one_step)


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_run_stopped_by_a_signal_saves_and_exits_as_the_shell_expects(
        signum, status, model, corpus, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    _kill_at_step(monkeypatch, 1, signum)
    assert train_cli.main(_fine_tune(model, corpus, out, 10**6)) == status
    printed = capsys.readouterr().out
    assert "checkpoint saved" in printed
    assert f"--output-dir {out} --resume" in printed


def test_out_of_memory_is_one_line_with_the_settings_to_lower(model, corpus, tmp_path,
                                                               monkeypatch, capsys):
    def exhausted(self):
        raise jax.errors.JaxRuntimeError(
            "RESOURCE_EXHAUSTED: Out of memory allocating 67301106816 bytes.")

    monkeypatch.setattr(nmt.training.trainer.Trainer, "_train_one_step", exhausted)
    assert train_cli.main(_fine_tune(model, corpus, tmp_path / "run", 5, "--no-packing")) == 1
    line = _error_line(capsys)
    assert "out of memory while training: XLA asked for 62.7 GiB (67301106816 bytes)" in line
    assert "the host has" in line and "GiB free" in line
    assert "--batch-tokens (now 256)" in line and "--max-tokens-per-sentence (now 16" in line
    assert "--batch-tokens 128 --accum 2" in line

    # Where the state is first made: one line too, and no run directory left.
    def start(*args):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 8 bytes.")

    monkeypatch.setattr(nmt.training.trainer, "prepare_start", start)
    assert train_cli.main(_fine_tune(model, corpus, tmp_path / "new")) == 1
    assert "(8 bytes)" in _error_line(capsys)
    assert not (tmp_path / "new").exists()


def test_validation_translates_only_the_pairs_the_length_filter_kept(model, corpus, tmp_path,
                                                                    monkeypatch, capsys):
    translated = []
    real = nmt.training.validation.Translator.translate_nbest

    def translate_nbest(self, sentences, *args, **kwargs):
        translated.extend(sentences)
        return real(self, sentences, *args, **kwargs)

    monkeypatch.setattr(nmt.training.validation.Translator, "translate_nbest", translate_nbest)
    args = _fine_tune(model, corpus, tmp_path / "run", 1, "--eval-every", "1",
                      "--eval-sentences", "20", "--samples", "0")
    assert train_cli.main(args) == 0
    err = capsys.readouterr().err
    # The model's direction, de->en: without --src and --tgt a fine-tuning run takes them.
    valid = Path(f"{corpus['valid']}.de").read_text().splitlines()
    assert translated == valid[:5] + valid[6:]
    assert "validation: kept 19 of 20 pairs" in err and "input line" not in err


# ----------------------------------------------------------------------------- recipes


def test_a_source_flag_replaces_the_recipes_source(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("data:\n  train_prefix: corpus/train\n  valid_prefix: corpus/valid\n")
    run, _ = train_cli.resolve(["--config", str(recipe), "--train-file", "pairs.tsv",
                                "--valid-file", "valid.tsv"])
    assert (run.data.train_file, run.data.train_prefix) == ("pairs.tsv", None)
    assert (run.data.valid_file, run.data.valid_prefix) == ("valid.tsv", None)
    run, _ = train_cli.resolve(["--config", str(recipe), "--builtin"])
    assert run.data.builtin and run.data.train_prefix is None
    # Two sources in one layer are still one too many.
    with pytest.raises(SettingsError, match="give one training source"):
        train_cli.resolve(["--train-file", "a.tsv", "--dataset", "wmt14"])
    # A dataset's configuration goes with it, and stays with the dataset alone.
    recipe.write_text("data:\n  dataset: wmt14\n  dataset_config: de-en\n")
    run, _ = train_cli.resolve(["--config", str(recipe), "--train-prefix", "corpus/train"])
    assert (run.data.dataset, run.data.dataset_config) == (None, None)
    run, _ = train_cli.resolve(["--config", str(recipe), "--dataset-config", "fr-en"])
    assert (run.data.dataset, run.data.dataset_config) == ("wmt14", "fr-en")


@pytest.mark.parametrize("name, text", [("empty.yaml", ""), ("comments.yaml", "# nothing\n"),
                                        ("sections.yaml", "model:\ndata:\n"),
                                        ("empty.json", '{"#": "a comment"}')])
def test_an_empty_recipe_is_an_error(name, text, tmp_path, capsys):
    recipe = tmp_path / name
    recipe.write_text(text)
    assert train_cli.main(["--config", str(recipe), "--output-dir", str(tmp_path / "r")]) == 2
    line = _error_line(capsys)
    assert f"--config {recipe}: the recipe sets nothing" in line
    assert not (tmp_path / "r").exists()


def test_a_recipe_directory_is_named_as_one(tmp_path, capsys):
    assert train_cli.main(["--config", str(tmp_path)]) == 2
    assert f"--config {tmp_path}: is a directory; give a recipe file" in _error_line(capsys)


@pytest.mark.parametrize("flags, message", [
    (["--num-processes", "0"], "--num-processes must be >= 1, got 0"),
    (["--process-id", "-1"], "--process-id must be >= 0, got -1"),
    (["--num-processes", "2", "--process-id", "2", "--coordinator", "127.0.0.1:1"],
     "--process-id 2 is not below --num-processes 2; number the processes 0 to 1"),
    (["--coordinator", "localhost"], "--coordinator must be HOST:PORT"),
    (["--coordinator", "localhost:70000"], "--coordinator must be HOST:PORT"),
    (["--num-processes", "2"], "several processes need all three of --coordinator HOST:PORT"),
])
def test_process_flags_jax_would_refuse_are_named_before_it_starts(flags, message, tmp_path,
                                                                  capsys, monkeypatch):
    for launcher in ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS",
                     "MEGASCALE_COORDINATOR_ADDRESS", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE",
                     "PMI_SIZE", "TPU_WORKER_HOSTNAMES"):
        monkeypatch.delenv(launcher, raising=False)
    assert train_cli.main([*flags, "--output-dir", str(tmp_path / "r")]) == 2
    assert message in _error_line(capsys)


def test_an_exported_model_as_output_dir_is_refused_and_left_as_it_was(model, capsys):
    before = sorted(p.name for p in model.iterdir())
    assert train_cli.main(["--preset", "tiny", "--max-steps", "1", "--output-dir",
                           str(model)]) == 2
    assert (f"--output-dir {model} holds an exported model (config.json), not a run; "
            f"give a new directory for the run (to fine-tune that model: --init-from "
            f"{model})") in _error_line(capsys)
    assert sorted(p.name for p in model.iterdir()) == before


def test_an_empty_variable_takes_the_default_as_in_the_shell(monkeypatch):
    monkeypatch.setenv("MULTI30K", "")
    run = recipes.load(REPO / "configs/multi30k_cpu.yaml")
    assert run.data.train_prefix == "data/multi30k/train"
    assert recipes.expand_variables("${MULTI30K}/x", "here") == "/x"  # no default: as it is
    monkeypatch.setenv("MULTI30K", "/mine")
    assert recipes.load(REPO / "configs/multi30k_cpu.yaml").data.train_prefix == "/mine/train"


# ----------------------------------------------------------------------------- downloads


def _offline(monkeypatch) -> list:
    calls = []

    def urlopen(*args, **kwargs):
        calls.append(args)
        raise urllib.error.URLError("Temporary failure in name resolution")

    monkeypatch.setattr(download.urllib.request, "urlopen", urlopen)
    return calls


def test_downloading_into_a_file_is_refused_before_any_fetch(tmp_path, capsys, monkeypatch):
    calls = _offline(monkeypatch)
    existing = tmp_path / "file"
    existing.write_text("mine\n")
    for path in (existing, existing / "sub"):
        assert download.main(["multi30k", str(path)]) == 2
        line = capsys.readouterr().err.strip()
        assert line.startswith(f"python -m data.download: error: {path}: ")
        assert "not a directory" in line and "\n" not in line
    assert not calls and existing.read_text() == "mine\n"


def test_a_failed_download_leaves_no_directory_behind(tmp_path, capsys, monkeypatch):
    _offline(monkeypatch)
    assert download.main(["multi30k", str(tmp_path / "new" / "m")]) == 1
    assert "cannot fetch multi30k" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []

    monkeypatch.setattr(download, "fetch", lambda name: {"train.en": b"a\n", "train.de": b"b\n"})
    real_write = Path.write_bytes

    def full(self, data):
        if "train.de" in self.name:  # its temporary, renamed once every file is written
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real_write(self, data)

    monkeypatch.setattr(Path, "write_bytes", full)
    assert download.main(["multi30k", str(tmp_path / "new" / "m")]) == 1
    err = capsys.readouterr().err
    assert f"cannot write {tmp_path / 'new' / 'm' / 'train.de'} (No space left" in err
    assert list(tmp_path.iterdir()) == []


def test_a_later_logging_set_up_unmutes_what_an_earlier_one_quieted():
    import logging

    from nmt.runtime import cli

    cli.setup_logging(logging.INFO, "%(message)s", ("data", "jax"))  # as translate.py does
    assert logging.getLogger("data").getEffectiveLevel() == logging.WARNING
    cli.setup_logging(logging.INFO, "%(message)s", ("jax",))  # as train.py does
    assert logging.getLogger("data").getEffectiveLevel() == logging.INFO
    assert logging.getLogger("jax").getEffectiveLevel() == logging.WARNING


def test_regularization_left_out_on_resume_is_said_to_change(model, corpus, tmp_path, capsys):
    """A run trained with --rdrop and subword sampling, resumed without the flags, goes on
    without them (as fairseq and Marian resume with the new flags): one info line says so,
    and none where they stay."""
    out = tmp_path / "run"
    scratch = [*(a for a in _fine_tune(model, corpus, out) if a not in ("--init-from",
                                                                          str(model))),
               "--preset", "tiny", "--vocab-size", "320", *SHALLOW_FLAGS]
    assert train_cli.main([*scratch, "--rdrop", "2", "--subword-alpha", "0.1"]) == 0
    capsys.readouterr()
    assert train_cli.main([*scratch, "--max-steps", "4"]) == 0
    err = capsys.readouterr().err
    assert ("INFO trainer: resuming with rdrop 2.0 -> 0.0, subword_alpha 0.1 -> None changed"
            in err.splitlines())
    assert recipes.load(out / "config.yaml").optimizer.rdrop == 0.0
    assert train_cli.main([*scratch, "--max-steps", "6"]) == 0
    assert "resuming with" not in capsys.readouterr().err


def test_subword_nbest_fine_tuning_a_bpe_model_is_refused_naming_init_from(
        model, corpus, tmp_path, capsys):
    """The BPE tokenizer came with --init-from, not --spm-model: the one line says so,
    rather than name only the flag the user did not give."""
    out = tmp_path / "bpe"
    scratch = [*(a for a in _fine_tune(model, corpus, out) if a not in ("--init-from",
                                                                          str(model))),
               "--preset", "tiny", "--vocab-size", "320", *SHALLOW_FLAGS,
               "--tokenizer-type", "bpe"]
    assert train_cli.main(scratch) == 0
    capsys.readouterr()
    assert train_cli.main(_fine_tune(out / "model", corpus, tmp_path / "tuned", 2,
                                     "--subword-alpha", "0.1", "--subword-nbest", "64")) == 2
    line = _error_line(capsys)
    assert ("--subword-nbest 64 chooses among the N best segmentations of unigram sampling, "
            "and this run's spm.model is a BPE model (the one --spm-model or --init-from "
            "gave)") in line


def test_a_cache_disk_without_room_is_a_fault_in_one_line(corpus, tmp_path, capsys,
                                                          monkeypatch):
    """No room for the corpus' cache is the machine's state, not a mistake in the command:
    exit status 1, as for a checkpoint that a full disk stops, with the estimate named."""
    from data import disk

    class Usage:
        free = 10_000  # bytes

    monkeypatch.setenv("FLAX_NMT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda path: Usage)
    assert train_cli.main(["--train-prefix", corpus["train"], "--valid-prefix",
                           corpus["valid"], "--preset", "tiny", "--max-steps", "2",
                           "--no-progress", "--output-dir", str(tmp_path / "run")]) == 1
    line = _error_line(capsys)
    assert "but only 0.0 GiB is free; free some space, or set FLAX_NMT_CACHE" in line, line
