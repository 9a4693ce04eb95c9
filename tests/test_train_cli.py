"""train.py end to end on a small synthetic corpus: resume parity, signals, NaN, averaging, flags.

Each run is a subprocess, as a user would start it. They share one JAX compilation cache
(FLAX_NMT_CACHE), so only the first run compiles. The corpus and the first run, uninterrupted,
are made once per test run (`conftest.built_once`) for this module and the modules that import
them (tests/test_trainer_faults.py compares its runs with the same uninterrupted one), whichever
pytest-xdist worker gets there first.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import SHALLOW_FLAGS, built_once, xla_flags

import train as train_cli
from data.tokenizer import load_tokenizer
from nmt.models.model_dir import load_model
from nmt.rundir import checkpoints as checkpoint
from nmt.settings import recipes
from nmt.settings.config import SettingsError
from nmt.training.stopping import Limits, StopReason
from nmt.training.summary import translate_command
from nmt.training.trainer import Trainer, TrainingError, _write_run_config, train
from synthetic_corpus import write_corpus
from trainer_hooks import poison_parameters_before

REPO = Path(__file__).resolve().parents[1]
@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> dict[str, str]:
    def write(root: Path) -> None:
        write_corpus(root, 600, 0, "train")
        write_corpus(root, 40, 1, "valid")

    root = built_once(tmp_path_factory, "train_cli_corpus", write)
    return {"train": str(root / "train"), "valid": str(root / "valid")}


def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "FLAX_NMT_CACHE": str(cache), "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="session")
def first_run(corpus, tmp_path_factory) -> Path:
    """A folder holding `a`, the uninterrupted run, and `cache`, the compilation cache it
    filled first (its train step compiles, not read from a cache) and the later runs share."""
    def train_uninterrupted(root: Path) -> None:
        # stderr is a pipe, as in a log: plain progress lines (here every 0.2 s), never "\r".
        env = {**_env(root / "cache"), "NMT_PROGRESS_SECONDS": "0.2"}
        result = _run(_args(corpus, root / "a"), env)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "\r" not in result.stderr
        assert re.search(r"progress: step \d+ of 60, loss \d+\.\d+, [\d,]+ tokens/s, elapsed "
                         r"\d+:\d\d, ETA \d+:\d\d", result.stderr), result.stderr[-3000:]

    return built_once(tmp_path_factory, "train_cli_first_run", train_uninterrupted)


@pytest.fixture(scope="session")
def env(first_run) -> dict[str, str]:
    return _env(first_run / "cache")


def _args(corpus: dict[str, str], out: Path, max_steps: int = 60, **extra) -> list[str]:
    args = ["--preset", "tiny", *SHALLOW_FLAGS, "--train-prefix", corpus["train"],
            "--valid-prefix", corpus["valid"], "--vocab-size", "320",
            "--batch-tokens", "256", "--buckets", "16", "--max-tokens-per-sentence", "16",
            "--warmup", "20", "--max-steps", str(max_steps), "--log-every", "7",
            "--eval-every", "20", "--eval-sentences", "0", "--keep-last", "3",
            "--output-dir", str(out)]
    for key, value in extra.items():
        args += [f"--{key.replace('_', '-')}"] + ([str(value)] if value != "" else [])
    return args


def _run(args: list[str], env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "train.py", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _all_lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _lines(run_dir: Path) -> list[dict]:
    """The training's own lines: what the process compiled and how long it took vary."""
    return [line for line in _all_lines(run_dir) if line["kind"] not in ("compile", "summary")]


_WALL_CLOCK = ("tokens_per_s", "elapsed_s", "translate_s", "data_wait_s", "loader_queue")


def _comparable(line: dict) -> dict:
    return {k: v for k, v in line.items() if k not in _WALL_CLOCK}


@pytest.fixture(scope="session")
def uninterrupted(first_run) -> Path:
    """The run of 60 steps, shared: read it, or copy it to change it."""
    return first_run / "a"


def test_run_directory_layout(uninterrupted):
    out = uninterrupted
    for name in ("config.yaml", "spm.model", "metrics.jsonl", "checkpoints", "tb", "model"):
        assert (out / name).exists(), name
    config = recipes.load_saved(out / "config.yaml")
    assert {"model", "optimizer", "search", "data", "trainer"} <= set(
        yaml.safe_load((out / "config.yaml").read_text()))
    assert config.model.d_model == 24 and config.trainer.max_steps == 60
    assert checkpoint.complete_steps(out / "checkpoints") == [20, 40, 60]
    steps = [line["step"] for line in _lines(out) if line["kind"] == "train"]
    assert steps == [7, 14, 21, 28, 35, 42, 49, 56, 60]
    evals = [line for line in _lines(out) if line["kind"] == "eval"]
    assert [e["step"] for e in evals] == [20, 40, 60]
    assert evals[-1]["loss"] < evals[0]["loss"]
    model, tokenizer, values = load_model(out)
    assert values["model"].d_model == 24 and values["step"] == 60


def test_the_collector_is_off_while_the_run_starts_and_on_while_it_steps(corpus, env,
                                                                        tmp_path):
    """train.py prepares its data and model without Python's garbage collector walking JAX's
    objects, and collects again from the first step on."""
    probe = f"""
import gc, sys
sys.argv = ["train.py", *{_args(corpus, tmp_path / "run", max_steps=2)!r}]
import train
from nmt.training.trainer import Trainer
loop, seen = Trainer.loop, []

def probed_loop(self):
    seen.append((gc.isenabled(), gc.get_freeze_count() > 0))
    return loop(self)

Trainer.loop = probed_loop
try:
    train.run()
finally:
    print("probe", seen, file=sys.stderr)
"""
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                            text=True, timeout=300, env={**env, "NMT_ALLOCATOR": "system"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "probe [(True, True)]" in result.stderr, result.stderr[-3000:]


def test_packed_batches_compile_one_train_step_ahead_of_time(uninterrupted):
    compiled = [line for line in _all_lines(uninterrupted) if line["kind"] == "compile"]
    steps = [line for line in compiled if line["function"] == "jit(train_step)"]
    assert len(steps) == 1 and steps[0]["label"] == "train_step [16x16]"  # 256 tokens / 16
    assert not steps[0]["cache_hit"] and steps[0]["seconds"] > 0
    assert len([c for c in compiled if c["function"] == "jit(eval_step)"]) == 1
    searches = {"jit(_beam_start)", "jit(_beam_resume)"}
    assert [c for c in compiled if c["function"] in searches] == []  # no BLEU, no search
    summary = _all_lines(uninterrupted)[-1]
    assert summary["kind"] == "summary" and summary["compiled"] == len(compiled)
    assert summary["compile_s"] == pytest.approx(sum(c["seconds"] for c in compiled), abs=0.05)


def test_bucketed_batches_compile_each_shape_once(corpus, env, tmp_path):
    out = tmp_path / "bucketed"
    result = _run(_args(corpus, out, max_steps=10**6, max_epochs=1, no_packing="",
                        buckets="8,12,16"), env)
    assert result.returncode == 0, result.stderr[-3000:]
    shapes = int(re.search(r"batches of (\d+) shapes", result.stderr).group(1))
    assert shapes > 2
    steps = [line for line in _all_lines(out)
             if line["kind"] == "compile" and line["function"] == "jit(train_step)"]
    assert len(steps) == shapes and len({line["label"] for line in steps}) == shapes


def test_sigterm_then_resume_logs_the_same_metrics(uninterrupted, corpus, env, tmp_path):
    out = tmp_path / "b"
    out.mkdir()
    # The same tokenizer as the uninterrupted run (SentencePiece training is threaded).
    (out / "spm.model").write_bytes((uninterrupted / "spm.model").read_bytes())
    # Without a step limit the run cannot end before the signal arrives; max_steps only
    # decides when to stop, so the resumed run (limit 60) must match the uninterrupted one.
    process = subprocess.Popen([sys.executable, "train.py", *_args(corpus, out, 10**6)],
                               cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    deadline = time.monotonic() + 240
    metrics = out / "metrics.jsonl"
    while time.monotonic() < deadline and process.poll() is None:
        if metrics.exists() and any(json.loads(line)["step"] >= 21
                                    for line in metrics.read_text().splitlines()):
            break
        time.sleep(0.05)
    if process.poll() is not None or time.monotonic() >= deadline:
        process.kill()
        pytest.fail(f"the run did not reach step 21 in time: {process.communicate()[1][-3000:]}")
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr[-3000:]  # saved, but not finished: 128 + SIGTERM
    assert "--resume" in stdout and "SIGTERM" in stdout
    interrupted_at = checkpoint.complete_steps(out / "checkpoints")[-1]
    assert 21 <= interrupted_at < 60, "interrupt it earlier: the comparison needs steps after it"

    result = _run(_args(corpus, out), env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"from step {interrupted_at}" in result.stdout + result.stderr
    # The step saved because of the signal is not one of the last --keep-last: the run keeps
    # (and would average) the steps the uninterrupted one keeps.
    assert (checkpoint.complete_steps(out / "checkpoints")
            == checkpoint.complete_steps(uninterrupted / "checkpoints") == [20, 40, 60])
    # The same programs as the interrupted run's: all from the persistent compilation cache.
    resumed_compilations = [line for line in _all_lines(out)
                            if line["kind"] == "compile" and line["step"] > interrupted_at]
    assert resumed_compilations and all(c["cache_hit"] for c in resumed_compilations)
    assert _all_lines(out)[-1]["compiled"] == 0
    expected = [_comparable(line) for line in _lines(uninterrupted)]
    resumed = [_comparable(line) for line in _lines(out)]
    assert [line["step"] for line in resumed] == [line["step"] for line in expected]
    for got, want in zip(resumed, expected):
        assert got.keys() == want.keys()
        for key, value in want.items():
            if isinstance(value, float):
                assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-7), (got["step"], key)
            else:
                assert got[key] == value, (got["step"], key)


def test_average_only_averages_without_training(uninterrupted, env, tmp_path, capsys,
                                                monkeypatch):
    """train.py's main in this process (the command as a process is tested above)."""
    # The run warms up for 20 steps: an average from step 20 on is told that it reaches
    # into the warm-up, one from step 40 on is not.
    monkeypatch.setenv("FLAX_NMT_CACHE", env["FLAX_NMT_CACHE"])
    run = shutil.copytree(uninterrupted, tmp_path / "a run's $HOME #1")  # pasted to a shell
    assert train_cli.main(["--average-only", "--average-last", "3", "--output-dir", str(run)]) == 0
    assert "start at step 20, within the 20-step learning-rate warm-up" in capsys.readouterr().err
    assert train_cli.main(["--average-only", "--average-last", "5", "--output-dir", str(run)]) == 0
    assert ("averaged/ is the mean of 3 checkpoint(s), steps [20, 40, 60], fewer than "
            "--average-last 5: the run has no more complete ones") in capsys.readouterr().err
    assert train_cli.main(["--average-only", "--average-last", "2", "--output-dir", str(run)]) == 0
    out, err = capsys.readouterr()
    assert "warm-up" not in err
    averaged = run / "averaged"
    _, _, values = load_model(averaged)
    assert values["averaged_steps"] == [40, 60]
    assert shlex.split(out.splitlines()[-1].removeprefix("Translate: ")) == [
        "python", "translate.py", "--model", str(averaged), "..."]
    # No training happened: no new checkpoint, no new metrics.
    assert checkpoint.complete_steps(run / "checkpoints") == [20, 40, 60]
    assert _all_lines(run) == _all_lines(uninterrupted)


def test_nan_loss_stops_and_keeps_last_good_checkpoint(corpus, env, tmp_path, monkeypatch):
    monkeypatch.setenv("FLAX_NMT_CACHE", env["FLAX_NMT_CACHE"])
    run, _ = train_cli.resolve(_args(corpus, tmp_path / "nan", save_every=5))
    run = run.replace(trainer={"progress": False})
    poison_parameters_before(monkeypatch, step=12)
    with pytest.raises(TrainingError, match=r"diverged.*step 12.*newest checkpoint is step 10"):
        train(run, tmp_path / "nan")
    assert checkpoint.complete_steps(tmp_path / "nan" / "checkpoints") == [5, 10]
    assert not (tmp_path / "nan" / "model").exists()


@pytest.mark.parametrize("flag", ["--resume", "--average-only"])
def test_resume_or_average_without_checkpoints_is_an_error(flag, tmp_path, capsys):
    """A path that is no run at all is named as such (a mistyped --output-dir), and
    --average-only is never told to drop itself, which would start training."""
    missing, flags = tmp_path / "none", [flag] + ["--average-last", "2"] * (flag != "--resume")
    assert train_cli.main([*flags, "--output-dir", str(missing)]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"train.py: error: {flag}: there is no run directory {missing}; check --output-dir "
        "(or the recipe's output_dir).")
    (missing / "checkpoints").mkdir(parents=True)
    assert train_cli.main([*flags, "--output-dir", str(missing)]) == 2
    fix = ("drop it to start a new run there" if flag == "--resume" else
           "train there first, or give the --output-dir of a run that has saved checkpoints")
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"train.py: error: {flag}: {missing / 'checkpoints'} holds no complete checkpoint; "
        f"{fix}.")


def test_recipe_file_and_flag_precedence(tmp_path):
    recipe = tmp_path / "r.json"
    recipe.write_text(json.dumps({"preset": "base", "batch-tokens": 8000, "warmup": 4000,
                                  "#": "comment"}))
    run, _ = train_cli.resolve(["--config", str(recipe), "--batch-tokens", "100"])
    assert (run.preset, run.model.d_model) == ("base", 512)
    assert (run.batching.batch_tokens, run.optimizer.warmup_steps) == (100, 4000)
    defaults, _ = train_cli.resolve([])
    assert run.replace(batching={"batch_tokens": 2048}, optimizer={"warmup_steps": 200}) == \
        dataclasses.replace(defaults, preset="base", model=recipes.PRESETS["base"])
    recipe.write_text(json.dumps({"batch-size": 8000}))
    with pytest.raises(SettingsError, match="unknown setting 'batch-size'"):
        train_cli.resolve(["--config", str(recipe)])


def test_recipe_values_must_have_the_flag_type(tmp_path):
    recipe = tmp_path / "r.json"
    recipe.write_text(json.dumps({"batch-tokens": "4096"}))
    with pytest.raises(SettingsError, match=rf"--config {recipe}: 'batch-tokens' must be an "
                                            r"integer \(as --batch-tokens takes\), got "
                                            r"\"4096\"; write 4096 without quotes"):
        train_cli.resolve(["--config", str(recipe)])
    recipe.write_text(json.dumps({"progress": 1}))
    with pytest.raises(SettingsError, match="'progress' must be true or false"):
        train_cli.resolve(["--config", str(recipe)])
    # An int is a number; a byte order mark is not JSON.
    recipe.write_text("\ufeff" + json.dumps({"max-minutes": 3, "buckets": [8, 16]}),
                      encoding="utf-8")
    run = train_cli.resolve(["--config", str(recipe)])[0]
    assert (run.trainer.max_minutes, run.batching.buckets) == (3.0, (8, 16))


def test_bad_buckets_fail_before_training(tmp_path, capsys):
    for flag in (",", "16,x", " "):
        with pytest.raises(SystemExit):
            train_cli.resolve(["--buckets", flag])
        assert re.search(r"argument --buckets: expected comma-separated integers",
                         capsys.readouterr().err)
    with pytest.raises(SystemExit):
        train_cli.resolve(["--buckets", "32,16"])
    assert re.search(r"argument --buckets: --buckets must be integers >= 2 in strictly "
                     r"increasing order, .* got 32,16", capsys.readouterr().err)
    recipe = tmp_path / "r.json"
    for value in (5, [], [16, "32"]):
        recipe.write_text(json.dumps({"buckets": value}))
        with pytest.raises(SettingsError, match=rf"--config {recipe}: 'buckets': expected "
                                                r"comma-separated integers"):
            train_cli.resolve(["--config", str(recipe)])


def test_spm_model_sets_the_vocabulary_size(tmp_path, capsys):
    from data.tokenizer import TokenizerConfig, train_tokenizer
    from translate_model import sentences

    given = train_tokenizer(sentences(300), TokenizerConfig(vocab_size=300)).save(tmp_path)
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"vocab-size": 8000, "spm-model": str(given)}))
    out = tmp_path / "run"
    for flags, message in (
            (["--spm-model", str(given), "--vocab-size", "500"],
             f"--vocab-size 500 but --spm-model {given} has 300 pieces"),
            (["--config", str(recipe)], f"--config {recipe} ('vocab-size'): 8000 but "
                                         f"--spm-model {given} has 300 pieces; drop it or pass "
                                         "--vocab-size 300,"),
            (["--spm-model", str(tmp_path / "none.model")],
             f"--spm-model: {tmp_path / 'none.model'}: SentencePiece model not found")):
        assert train_cli.main([*flags, "--output-dir", str(out)]) == 2
        assert message in capsys.readouterr().err
    assert not out.exists()
    run, _ = train_cli.resolve(["--spm-model", str(given), "--tokenizer-type", "bpe"])
    assert (run.tokenizer.spm_model, run.tokenizer.vocab_size) == (str(given), 300)
    # A recipe's size gives way to a model given over it, as its corpus to --train-file.
    sized = tmp_path / "sized.yaml"
    sized.write_text("tokenizer:\n  vocab_size: 8000\n")
    capsys.readouterr()
    run, _ = train_cli.resolve(["--config", str(sized), "--spm-model", str(given)])
    assert run.tokenizer.vocab_size == 300
    assert (f"--spm-model {given} has 300 pieces: they replace the vocabulary size 8000 of "
            f"{sized} line 2: tokenizer.vocab_size") in capsys.readouterr().err


def test_the_default_vocabulary_fits_a_small_corpus_and_the_run_resumes(env, tmp_path, capsys,
                                                                        monkeypatch):
    """2,000 pairs cannot make train.py's default 4,000 pieces: the run trains with the most
    SentencePiece can make, says so, and the same command resumes it."""
    monkeypatch.setenv("FLAX_NMT_CACHE", env["FLAX_NMT_CACHE"])
    train_prefix = write_corpus(tmp_path, 2000, 5, "train")
    valid_prefix = write_corpus(tmp_path, 20, 6, "valid")
    out = tmp_path / "run"
    args = ["--preset", "tiny", *SHALLOW_FLAGS, "--no-progress", "--train-prefix", train_prefix,
            "--valid-prefix", valid_prefix, "--batch-tokens", "256", "--eval-sentences", "0",
            "--output-dir", str(out)]
    assert train_cli.main([*args, "--max-steps", "2"]) == 0, capsys.readouterr().err[-2000:]
    pieces = load_tokenizer(out).vocab_size
    assert 300 <= pieces < 4000
    assert (f"--vocab-size 4000 is more pieces than SentencePiece can make from this "
            f"training text: using its most, {pieces}") in capsys.readouterr().err
    model, _, _ = load_model(out / "model")
    assert model.config.vocab_size == pieces
    assert train_cli.main([*args, "--max-steps", "3"]) == 0, capsys.readouterr().err[-2000:]
    summaries = [line["step"] for line in _all_lines(out) if line["kind"] == "summary"]
    assert summaries == [2, 3]
    assert load_tokenizer(out).vocab_size == pieces


def test_max_minutes_holds_the_whole_run_closing_work_included(corpus, env, tmp_path):
    """The command, from its start to its exit, within --max-minutes and a margin for the
    interpreter's start and exit; the closing validation, average and export inside it."""
    out = tmp_path / "run"
    args = _args(corpus, out, max_steps=1_000_000, max_minutes=0.4, eval_every=100_000,
                 eval_sentences=20, average_last=2, save_every=50)
    began = time.monotonic()
    result = _run(args, env)
    wall = time.monotonic() - began
    assert result.returncode == 0, result.stderr[-3000:]
    assert wall < 0.4 * 60 + 3, result.stdout
    minutes = float(re.search(r"\(max_minutes, ([\d.]+) min, peak memory [\d.]+ GB\)",
                              result.stdout).group(1))
    assert minutes <= 0.4
    evals = [line for line in _all_lines(out) if line["kind"] == "eval"]
    assert [e.get("sentences") for e in evals] == [20] and "bleu" in evals[0]
    assert (out / "averaged").is_dir() and (out / "model").is_dir()


def test_max_minutes_too_short_for_the_closing_work_names_the_least(corpus, env, tmp_path,
                                                                    capsys, monkeypatch):
    monkeypatch.setenv("FLAX_NMT_CACHE", env["FLAX_NMT_CACHE"])
    args = _args(corpus, tmp_path / "run", max_steps=1_000_000, max_minutes=0.05)
    assert train_cli.main(["--no-progress", *args]) == 2
    err = capsys.readouterr().err
    least = re.search(r"train.py: error: --max-minutes 0.05 is too short for this run: starting "
                      r"took \d+ s and the closing validation, checkpoint and export need about "
                      r"\d+ s more; use --max-minutes ([\d.]+) or more.\n$", err)
    assert least and float(least.group(1)) > 0.05, err[-2000:]
    assert not checkpoint.complete_steps(tmp_path / "run" / "checkpoints")


def test_a_validation_out_of_time_stops_translating_and_scores_nothing(corpus, env, tmp_path,
                                                                       capsys, monkeypatch):
    """Past the time left for validating, translating stops: the line says how far it got,
    no BLEU is recorded as the best, and model/ is the last step."""
    monkeypatch.setenv("FLAX_NMT_CACHE", env["FLAX_NMT_CACHE"])
    monkeypatch.setattr(Limits, "validation_deadline", property(lambda self: 0.0))
    out = tmp_path / "run"
    args = _args(corpus, out, max_steps=3, eval_sentences=40, samples=0)
    assert train_cli.main(["--no-progress", *args]) == 0
    stdout = capsys.readouterr().out
    assert re.search(r"step 3: valid loss [\d.]+ ppl [\d.]+ \(no BLEU: --max-minutes ran out "
                     r"after translating \d+ of 40 sentences\)", stdout), stdout
    (last,) = [line for line in _all_lines(out) if line["kind"] == "eval"]
    assert "bleu" not in last and 0 < last["translated"] < 40
    _, _, values = load_model(out / "model")
    assert (values["step"], values["chosen"]) == (3, "last step")


def test_steps_interrupted_before_the_first_log_line_count_in_the_summary(
        corpus, env, tmp_path, capsys, monkeypatch):
    """Ctrl-C before the first "train" line: the summary's seconds in steps count the steps
    of the window left open (it was 0.0)."""
    monkeypatch.setenv("FLAX_NMT_CACHE", env["FLAX_NMT_CACHE"])
    reached, one_step = Limits.reached, Trainer._train_one_step

    def interrupted_after_five(self, step, epochs_completed, signals):
        return StopReason.SIGINT if step >= 5 else reached(self, step, epochs_completed, signals)

    def slow_step(self):
        time.sleep(0.1)  # steps long enough to count in tenths of a second
        return one_step(self)

    monkeypatch.setattr(Limits, "reached", interrupted_after_five)
    monkeypatch.setattr(Trainer, "_train_one_step", slow_step)
    out = tmp_path / "run"
    assert train_cli.main(["--no-progress", *_args(corpus, out, log_every=50)]) == 130
    assert "train steps took 0.0 s" not in capsys.readouterr().out
    lines = _all_lines(out)
    assert not [line for line in lines if line["kind"] == "train"]
    (summary,) = [line for line in lines if line["kind"] == "summary"]
    assert summary["step"] == 5 and summary["steps_s"] >= 0.3, summary
    assert checkpoint.complete_steps(out / "checkpoints") == [5]


def test_missing_training_data_names_the_file_and_leaves_no_run_directory(tmp_path, capsys):
    out = tmp_path / "run"
    assert train_cli.main(["--train-prefix", str(tmp_path / "none"), "--output-dir",
                           str(out)]) == 2
    assert f"{tmp_path / 'none.en'}: file not found" in capsys.readouterr().err
    assert not out.exists()


def test_the_wmt_recipe_without_its_corpus_stops_naming_the_file(tmp_path, capsys,
                                                                  monkeypatch):
    """The paper's recipe reads WMT14 from $WMT14 (data/wmt14 by default): absent, train.py
    stops in one line naming the file and where to get it, not training on the built-in
    corpus."""
    monkeypatch.delenv("WMT14", raising=False)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    assert train_cli.main(["--config", str(REPO / "configs/wmt_base_paper.yaml"),
                           "--max-steps", "1", "--output-dir", str(out)]) == 2
    captured = capsys.readouterr()
    # Besides the warning that one step is inside the recipe's warm-up.
    lines = [line for line in captured.err.strip().splitlines()
             if not line.startswith("WARNING train.py: --warmup 4000")]
    assert len(lines) == 1 and lines[0].startswith(
        "train.py: error: data/wmt14/train.en: file not found"), captured.err
    assert "get the corpus: WMT14 en-de" in lines[0] and "WMT14=DIR" in lines[0]
    assert "built-in corpus" not in captured.err + captured.out
    assert not out.exists()


def test_r_drop_without_dropout_is_warned_of_before_training(tmp_path, capsys):
    missing = ["--train-prefix", str(tmp_path / "none"), "--output-dir", str(tmp_path / "run")]
    assert train_cli.main([*missing, "--rdrop", "5", "--dropout", "0"]) == 2
    err = capsys.readouterr().err
    assert "--rdrop 5 with every dropout 0: the two passes are the same" in err, err
    assert train_cli.main([*missing, "--rdrop", "5", "--dropout", "0.1"]) == 2
    assert "--rdrop" not in capsys.readouterr().err


@pytest.mark.parametrize("schedule", ["inverse_sqrt", "noam"])
def test_a_warm_up_as_long_as_the_run_is_warned_of_at_start(tmp_path, capsys, schedule):
    missing = ["--train-prefix", str(tmp_path / "none"), "--output-dir", str(tmp_path / "run"),
               "--schedule", schedule, "--max-steps", "3"]
    assert train_cli.main([*missing, "--warmup", "100000"]) == 2
    err = capsys.readouterr().err
    assert (f"--warmup 100000 is not below --max-steps 3: the {schedule} learning rate warms up "
            "for the whole run, reaching 3/100000 of its peak at the last step") in err, err
    assert train_cli.main([*missing, "--warmup", "2"]) == 2
    assert "--warmup" not in capsys.readouterr().err
    assert train_cli.main(missing) == 2  # train.py's default warm-up (200 steps): a smoke run
    assert "--warmup" not in capsys.readouterr().err


def test_a_bleu_tokenizer_that_cannot_run_fails_before_training(tmp_path, capsys,
                                                               monkeypatch):
    mecab = pytest.importorskip("sacrebleu.tokenizers.tokenizer_ja_mecab")
    monkeypatch.setattr(mecab, "MeCab", None)  # as where sacrebleu[ja] is not installed
    out = tmp_path / "run"
    for flags, message in (
            (["--tgt", "ja"], "BLEU tokenizer ja-mecab (sacreBLEU's choice for target language "
                              "'ja') needs MeCab: pip install 'sacrebleu[ja]'"),
            (["--bleu-tokenize", "ja-mecab"], "train.py: error: --bleu-tokenize: BLEU "
                                              "tokenizer ja-mecab needs MeCab"),
            (["--bleu-tokenize", "mecab"], "train.py: error: --bleu-tokenize: unknown BLEU "
                                           "tokenizer 'mecab'")):
        assert train_cli.main([*flags, "--output-dir", str(out)]) == 2
        assert message in capsys.readouterr().err
    assert not out.exists()


def _bad_sources(root: Path) -> dict[str, tuple[list[str], str]]:
    """train.py flags naming a bad training source, and what the error must say."""
    import datasets

    ints = root / "ints.parquet"
    datasets.Dataset.from_dict({"en": ["a", "b"], "de": [1, 2]}).to_parquet(str(ints))
    not_parquet = root / "bad.parquet"
    not_parquet.write_text("not parquet\n")
    (root / "notads").mkdir()
    return {
        "non-string column": (["--train-file", str(ints)], f"{ints} row 0 (0-based), column 'de'"),
        "not parquet": (["--train-file", str(not_parquet)],
                        f"{not_parquet}: not a readable parquet file"),
        "not a dataset": (["--dataset", str(root / "notads")],
                          f"{root / 'notads'}: not a dataset directory"),
    }


def test_bad_training_source_is_a_data_error(env, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FLAX_NMT_CACHE", env["FLAX_NMT_CACHE"])
    for name, (flags, message) in _bad_sources(tmp_path).items():
        code = train_cli.main(["--preset", "tiny", "--no-progress", *flags,
                               "--output-dir", str(tmp_path / "out")])
        err = capsys.readouterr().err
        assert code == 2 and f"error: {message}" in err, (name, err)


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_recipes_load_and_round_trip(path, tmp_path):
    run, _ = train_cli.resolve(["--config", str(path)])
    assert run == recipes.load(path)
    section = yaml.safe_load(path.read_text())["model"]
    assert run.preset == section["preset"]
    assert all(getattr(run.model, key) == value for key, value in section.items()
               if key != "preset")
    written = tmp_path / "config.yaml"
    written.write_text(recipes.dump(run))
    assert recipes.load_saved(written) == run
    assert recipes.dump(recipes.load_saved(written)) == written.read_text()


def test_no_argument_defaults():
    run, _ = train_cli.resolve([])
    assert run.preset == "compact" and run.model.dropout == 0.0 and run.data.uses_builtin
    assert run.batching.packing and run.trainer.limits() == (None, 4.0)
    assert str(run.default_output_dir()) == "runs/builtin-en-de-compact"
    # Naming another preset starts the model from it: the defaults' dropout 0 does not apply,
    # even to the default preset named.
    assert train_cli.resolve(["--preset", "small"])[0].model == recipes.PRESETS["small"]
    assert train_cli.resolve(["--preset", "compact"])[0].model == recipes.PRESETS["compact"]
    # The help says what the defaults set for the default preset.
    assert re.search(r"\(default 0\.0 when neither --preset nor the recipe names a preset, "
                     r"which runs compact; a preset named, compact included, gives its own\)",
                     " ".join(train_cli.build_parser().format_help().split()))


def test_a_recipes_preset_named_again_keeps_the_recipes_model_settings():
    recipe = ["--config", str(REPO / "configs" / "multi30k_cpu.yaml")]
    assert train_cli.resolve(recipe)[0].model.dropout == 0.1
    assert train_cli.resolve([*recipe, "--preset", "compact"])[0].model.dropout == 0.1


def test_another_preset_keeps_the_recipes_numerics_and_names_what_it_replaces(tmp_path, caplog):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model:\n  preset: small\n  dropout: 0.3\n  d_model: 512\n"
                      "  dtype: bfloat16\n  activation_dtype: float32\n")
    with caplog.at_level("WARNING", logger="train.py"):
        model = train_cli.resolve(["--config", str(recipe), "--preset", "tiny"])[0].model
    assert model == dataclasses.replace(recipes.PRESETS["tiny"], dtype="bfloat16",
                                        activation_dtype="float32")
    assert [r.getMessage() for r in caplog.records] == [
        f"--preset tiny replaces the recipe's model settings dropout=0.3, d_model=512 ({recipe} "
        "lines 3, 4); give them as flags to keep them"]
    caplog.clear()  # a flag beside the preset is kept, and a preset named again replaces nothing
    with caplog.at_level("WARNING", logger="train.py"):
        flags = ["--config", str(recipe), "--preset", "tiny", "--dropout", "0.2"]
        assert train_cli.resolve(flags)[0].model.dropout == 0.2
        again = ["--config", str(recipe), "--preset", "small"]
        assert train_cli.resolve(again)[0].model.d_model == 512
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "--preset tiny replaces the recipe's model settings d_model=512"]


def test_an_error_names_the_users_settings_not_the_defaults(capsys):
    assert train_cli.main(["--no-packing", "--batch-tokens", "0"]) == 2
    assert capsys.readouterr().err.strip().endswith("(given by --batch-tokens 0)")


def test_two_devices_with_accumulation(corpus, env, tmp_path):
    """The same loop on a 2-device mesh (forced host devices), 2 micro-batches per update."""
    out = tmp_path / "two"
    two = {**env, "XLA_FLAGS": xla_flags(devices=2)}
    result = _run(_args(corpus, out, max_steps=10, accum=2, eval_every=10), two)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 cpu device(s)" in result.stdout
    assert checkpoint.complete_steps(out / "checkpoints") == [10]
    assert [line["step"] for line in _lines(out) if line["kind"] == "eval"] == [10]


def test_two_processes(corpus, env, tmp_path):
    """Two processes (jax.distributed over localhost) share one run directory, the reading
    of the corpus and its encoding."""
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    out = tmp_path / "mp"
    # A corpus of its own, so that the encoding is not in the module's cache already.
    corpus = {**corpus, "train": write_corpus(tmp_path, 600, 7, "train")}
    args = _args(corpus, out, max_steps=2, eval_every=2) + [
        "--coordinator", f"localhost:{port}", "--num-processes", "2"]
    procs = [subprocess.Popen([sys.executable, "train.py", *args, "--process-id", str(i)],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (stdout, stderr) in zip(procs, outputs):
        assert p.returncode == 0, stderr[-3000:]
    assert "2 process(es)" in outputs[0][0]
    # Each process encoded its own half of the training pairs, and only that.
    shares = [re.findall(r"encoding rows \[(\d+), (\d+)\) of 600: share (\d) of 2", stderr)
              for _, stderr in outputs]
    assert shares == [[("0", "300", "0")], [("300", "600", "1")]], [
        stderr[-2000:] for _, stderr in outputs]
    assert checkpoint.complete_steps(out / "checkpoints") == [2]
    load_model(out)


def test_early_stopping_on_bleu(corpus, env, tmp_path, monkeypatch):
    monkeypatch.setenv("FLAX_NMT_CACHE", env["FLAX_NMT_CACHE"])
    run, _ = train_cli.resolve(_args(corpus, tmp_path / "early", max_steps=1000, eval_every=5,
                                     eval_sentences=4, early_stop_patience=1))
    # The tiny model soon stops improving BLEU; the first validation that does not beat the
    # best so far ends the run.
    summary = train(run.replace(trainer={"progress": False, "samples": 0}), tmp_path / "early")
    evals = [line for line in _lines(tmp_path / "early") if line["kind"] == "eval"]
    bleus = [e["bleu"] for e in evals]
    assert summary["stopped"] == "early_stop"
    assert summary["steps"] == evals[-1]["step"] < 1000
    assert bleus[-1] <= max(bleus[:-1]) and bleus[:-1] == sorted(set(bleus[:-1]))
    assert summary["best_step"] == evals[bleus.index(max(bleus))]["step"]
    assert checkpoint.complete_steps(tmp_path / "early" / "best") == [summary["best_step"]]


def test_a_run_config_yaml_continues_the_run_in_the_folder_holding_it(tmp_path, monkeypatch):
    """Written without --output-dir (runs/NAME under the directory train.py started in), then
    read from another directory, and after the run was moved: the run is where the file is."""
    monkeypatch.chdir(tmp_path)
    run = recipes.run_from_flat(preset="tiny")
    run_dir = run.output_dir()
    (run_dir / checkpoint.CHECKPOINTS_DIR).mkdir(parents=True)
    assert recipes.RUN_MARK == checkpoint.CHECKPOINTS_DIR  # what makes the folder a run directory
    _write_run_config(run_dir, run)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    again = recipes.load(Path("..") / run_dir / "config.yaml")
    assert again.output_dir().resolve() == (tmp_path / run_dir).resolve()
    assert again.replace(trainer={"output_dir": None}) == run
    moved = tmp_path / "moved" / "run"
    moved.parent.mkdir()
    (tmp_path / run_dir).rename(moved)
    assert recipes.load(moved / "config.yaml").output_dir() == moved
    # A copy of it under another name, or in a folder that is no run, is a recipe like any
    # other: no folder is implied.
    (tmp_path / "recipe.yaml").write_text((moved / "config.yaml").read_text())
    assert recipes.load(tmp_path / "recipe.yaml").trainer.output_dir is None
    (elsewhere / "config.yaml").write_text((moved / "config.yaml").read_text())
    assert recipes.load(elsewhere / "config.yaml").trainer.output_dir is None


def test_the_translate_command_of_the_summary_pastes_into_a_shell():
    model_dir, example = Path("runs/a run's $HOME #1/model"), 'Er sagt "ja" für $5!'
    assert shlex.split(translate_command(model_dir, example)) == [
        "python", "translate.py", "--model", str(model_dir), example]
