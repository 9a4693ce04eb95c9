"""The trainer under faults: disk full during a save, signals during validation, averaging
and saving, a resume with another tokenizer, and the printed resume command.

Each case ends with the run directory holding only complete checkpoints, and where it goes on
the resumed run must log what an uninterrupted one logs.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time

import orbax.checkpoint as ocp
import pytest
from test_train_cli import (  # noqa: F401 (the fixtures: the same run, made once)
    REPO,
    _args,
    _comparable,
    _lines,
    _run,
    corpus,
    env,
    first_run,
    uninterrupted,
)

import nmt.rundir.final_model
import nmt.training.trainer
import nmt.training.validation
import train as train_cli
from nmt.models.model_dir import load_model
from nmt.rundir import checkpoints as checkpoint
from nmt.training.trainer import train


def _start_like(uninterrupted, out):
    """A new run directory with the uninterrupted run's tokenizer (SentencePiece training is
    threaded, so retraining could differ), for runs that must match it."""
    out.mkdir()
    shutil.copyfile(uninterrupted / "spm.model", out / "spm.model")
    return out


def _in_process(corpus, out, monkeypatch, env, max_steps=60, **extra):
    monkeypatch.setenv("FLAX_NMT_CACHE", env["FLAX_NMT_CACHE"])
    run, _ = train_cli.resolve(_args(corpus, out, max_steps, **extra))
    return run.replace(trainer={"progress": False})


def _assert_same_metrics(out, uninterrupted):
    expected = [_comparable(line) for line in _lines(uninterrupted)]
    got = [_comparable(line) for line in _lines(out)]
    assert [line["step"] for line in got] == [line["step"] for line in expected]
    for a, b in zip(got, expected):
        for key, value in b.items():
            if isinstance(value, float):
                assert a[key] == pytest.approx(value, rel=1e-6, abs=1e-7), (a["step"], key)
            else:
                assert a[key] == value, (a["step"], key)


def _no_partial_checkpoints(out):
    for directory in (out / "checkpoints", out / "best"):
        if directory.is_dir():
            assert not [p for p in directory.iterdir() if not p.name.isdigit()], directory
            for step_dir in directory.iterdir():
                assert checkpoint.is_complete_step_dir(step_dir), step_dir
                assert checkpoint.damaged_file(step_dir) is None


def test_disk_full_during_a_save_then_resume_continues_exactly(uninterrupted, corpus, env,
                                                               tmp_path, monkeypatch, capsys):
    out = _start_like(uninterrupted, tmp_path / "full")
    real_save = ocp.CheckpointManager.save

    def save(self, step, *args, **kwargs):
        if step == 40 and str(self.directory).endswith("checkpoints"):
            partial = self.directory / f"{step}.orbax-checkpoint-tmp-7" / "params"
            partial.mkdir(parents=True)
            (partial / "shard").write_bytes(b"\0" * 4096)
            raise OSError(errno.ENOSPC, "No space left on device", str(partial / "shard"))
        return real_save(self, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "save", save)
    monkeypatch.setenv("FLAX_NMT_CACHE", env["FLAX_NMT_CACHE"])
    status = train_cli.main(_args(corpus, out) + ["--no-progress"])
    err = capsys.readouterr().err
    line = [x for x in err.splitlines() if x.startswith("train.py: error:")]
    assert status == 1 and len(line) == 1 and "Traceback" not in err
    assert "cannot write checkpoint step 40" in line[0] and "no space left" in line[0]
    assert "checkpoint step 20" in line[0] and "run the same command again" in line[0]
    assert checkpoint.complete_steps(out / "checkpoints") == [20]
    _no_partial_checkpoints(out)
    assert not (out / "model").exists()

    monkeypatch.setattr(ocp.CheckpointManager, "save", real_save)
    result = _run(_args(corpus, out), env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "from step 20" in result.stdout + result.stderr
    _assert_same_metrics(out, uninterrupted)


def test_disk_full_at_the_checkpoint_of_a_new_best_keeps_the_previous_best(corpus, env,
                                                                          tmp_path, monkeypatch,
                                                                          capsys):
    """best/ keeps one step: were it written before the checkpoint of the same step, a full
    disk at that checkpoint would leave neither the previous best nor the new one's
    bookkeeping, though the error says best/ is as it was."""
    out = tmp_path / "best"
    real_save = ocp.CheckpointManager.save

    def save(self, step, *args, **kwargs):
        if step == 40 and str(self.directory).endswith("checkpoints"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(self, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "save", save)
    monkeypatch.setenv("FLAX_NMT_CACHE", env["FLAX_NMT_CACHE"])
    status = train_cli.main(_args(corpus, out, best_metric="ppl") + ["--no-progress"])
    out_text, err = capsys.readouterr()
    assert status == 1 and "best/ and model/ are as they were" in err
    assert "(best perplexity)" in out_text.split("step 40:")[-1]  # a new best, at step 40
    assert checkpoint.complete_steps(out / "best") == [20]
    _no_partial_checkpoints(out)


def test_sigterm_during_validation_saves_a_complete_checkpoint_that_resumes_exactly(
        uninterrupted, corpus, env, tmp_path, monkeypatch):
    out = _start_like(uninterrupted, tmp_path / "term")
    real_scores = nmt.training.validation.Validator.scores
    calls = []

    def scores(self, graphdef, params, not_finite, deadline=None):
        calls.append(1)
        if len(calls) == 2:  # the validation of step 40
            os.kill(os.getpid(), signal.SIGTERM)
        return real_scores(self, graphdef, params, not_finite, deadline)

    monkeypatch.setattr(nmt.training.validation.Validator, "scores", scores)
    summary = train(_in_process(corpus, out, monkeypatch, env, 10**6), out)
    assert summary["stopped"] == "SIGTERM" and summary["steps"] == 40
    assert checkpoint.complete_steps(out / "checkpoints")[-1] == 40
    _no_partial_checkpoints(out)
    monkeypatch.setattr(nmt.training.validation.Validator, "scores", real_scores)
    result = _run(_args(corpus, out), env)
    assert result.returncode == 0, result.stderr[-3000:]
    _assert_same_metrics(out, uninterrupted)


def test_sigterm_while_the_next_batch_is_slow_to_come_stops_at_once(corpus, env, tmp_path,
                                                                   monkeypatch):
    """A batch that takes long to build (a new epoch's plan on a huge corpus) does not hold
    up a stop: the wait ends, the step before it is saved, and the run exits as stopped."""
    import data.batching

    out = tmp_path / "slow"
    real_batch_arrays, built, released = data.batching.batch_arrays, [], threading.Event()

    def batch_arrays(*args, **kwargs):
        built.append(1)
        if len(built) == 8:  # the signal once the batches built before are taken
            threading.Timer(3, os.kill, (os.getpid(), signal.SIGTERM)).start()
            released.wait(120)  # longer than the test waits
            raise RuntimeError("the run ended while this batch was being built")
        return real_batch_arrays(*args, **kwargs)

    monkeypatch.setattr(data.batching, "batch_arrays", batch_arrays)
    began = time.monotonic()
    try:
        summary = train(_in_process(corpus, out, monkeypatch, env, 40), out)
    finally:
        released.set()
    assert time.monotonic() - began < 100
    assert summary["stopped"] == "SIGTERM" and summary["steps"] < 8
    assert checkpoint.complete_steps(out / "checkpoints")[-1] == summary["steps"]
    _no_partial_checkpoints(out)


def test_sigterm_during_averaging_leaves_a_complete_average(corpus, env, tmp_path,
                                                           monkeypatch):
    out = tmp_path / "avg"
    real_average = nmt.rundir.final_model.average_checkpoints

    def average(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return real_average(*args, **kwargs)

    monkeypatch.setattr(nmt.rundir.final_model, "average_checkpoints", average)
    summary = train(_in_process(corpus, out, monkeypatch, env, 40, average_last=2), out)
    assert summary["steps"] == 40
    _, _, values = load_model(out / "averaged")
    assert values["averaged_steps"] == [20, 40]
    assert not [p for p in out.iterdir() if p.name.endswith((".tmp", ".old"))]
    _no_partial_checkpoints(out)


def test_a_checkpoint_unreadable_at_the_export_is_a_fault_while_running(corpus, env, tmp_path,
                                                                         monkeypatch, capsys):
    """Exit 1, as for faults while running: the flags and paths were fine (it was 2)."""
    out = tmp_path / "export"

    def average(run_dir, *args):
        raise checkpoint.CheckpointError(f"{run_dir / 'checkpoints'}: every checkpoint is "
                                         "damaged.")

    monkeypatch.setattr(nmt.rundir.final_model, "average_checkpoints", average)
    monkeypatch.setenv("FLAX_NMT_CACHE", env["FLAX_NMT_CACHE"])
    status = train_cli.main(_args(corpus, out, 20, average_last=1) + ["--no-progress"])
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith("train.py: error:")]
    assert status == 1 and line == [f"train.py: error: {out / 'checkpoints'}: every checkpoint "
                                    "is damaged."]


def test_a_second_ctrl_c_during_a_save_aborts_after_it(corpus, env, tmp_path, monkeypatch):
    out = tmp_path / "twice"
    real_save = checkpoint.Checkpointer.save

    def save(self, step, *args, **kwargs):
        if step == 20:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return real_save(self, step, *args, **kwargs)

    monkeypatch.setattr(checkpoint.Checkpointer, "save", save)
    with pytest.raises(KeyboardInterrupt):
        train(_in_process(corpus, out, monkeypatch, env, 10**6), out)
    assert checkpoint.complete_steps(out / "checkpoints") == [20]
    _no_partial_checkpoints(out)


def test_resume_refuses_a_missing_or_replaced_tokenizer(uninterrupted, corpus, tmp_path,
                                                        capsys, monkeypatch, env):
    from data.tokenizer import TokenizerConfig, train_tokenizer

    monkeypatch.setenv("FLAX_NMT_CACHE", env["FLAX_NMT_CACHE"])
    out = tmp_path / "copy"
    shutil.copytree(uninterrupted, out)
    (out / "spm.model").unlink()
    assert train_cli.main(_args(corpus, out) + ["--no-progress"]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{out / 'spm.model'} is missing" in line and str(out / "model" / "spm.model") in line
    assert not (out / "spm.model").exists()

    texts = [f"zz{i} qq{i % 7} ww{i % 13}" for i in range(3000)]
    train_tokenizer(texts, TokenizerConfig(vocab_size=320)).save(tmp_path / "other")
    shutil.copyfile(tmp_path / "other" / "spm.model", out / "spm.model")
    assert train_cli.main(_args(corpus, out) + ["--no-progress"]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{out / 'spm.model'} is not the tokenizer that checkpoint step 60" in line


def test_the_printed_resume_command_trains_on_under_average_last(corpus, env, tmp_path,
                                                                 monkeypatch, capsys):
    out = tmp_path / "resume"
    real_step = nmt.training.trainer.Trainer._train_one_step

    def step(self):
        if self.step == 25:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step(self)

    monkeypatch.setattr(nmt.training.trainer.Trainer, "_train_one_step", step)
    summary = train(_in_process(corpus, out, monkeypatch, env, 10**6, average_last=2), out)
    assert summary["stopped"] == "SIGTERM"
    command = re.search(r"python train\.py .*--resume", capsys.readouterr().out).group(0)
    argv = shlex.split(command)[2:] + ["--max-steps", "40"]
    result = subprocess.run([sys.executable, "train.py", *argv], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"from step {summary['steps']}" in result.stdout + result.stderr
    assert checkpoint.complete_steps(out / "checkpoints")[-1] == 40
    _, _, values = load_model(out / "averaged")
    assert values["averaged_steps"][-1] == 40


def test_rerunning_a_finished_run_writes_no_checkpoint_again(uninterrupted, corpus, env,
                                                             tmp_path, monkeypatch):
    """A finished run started again has nothing to train: its newest checkpoint, optimizer
    state included, is left as it is (a rerun on a nearly full disk must not need its space),
    though the run's epochs have moved on since the process that trained it started."""
    out = tmp_path / "finished"
    shutil.copytree(uninterrupted, out)
    last = out / "checkpoints" / "60"
    before = {path: (path.stat().st_mtime_ns, path.read_bytes())
              for path in sorted(last.rglob("*")) if path.is_file()}
    saved = json.loads((last / "data" / "metadata").read_text())
    assert saved["iterator"]["epoch"] > saved["plan"]["epoch"]  # epochs passed since it started
    summary = train(_in_process(corpus, out, monkeypatch, env), out)
    assert summary["steps"] == 60
    after = {path: (path.stat().st_mtime_ns, path.read_bytes())
             for path in sorted(last.rglob("*")) if path.is_file()}
    assert after == before


def test_a_run_whose_updates_blow_up_the_model_validates_to_bleu_zero_not_a_crash(
        corpus, env, tmp_path, monkeypatch):
    """--peak-lr 1e5 takes the loss from 6 to 1e10 in one update, finite: a model that far gone
    scores every hypothesis below the floor of the search's unfilled places, and its best is
    kept all the same (validation ended in an IndexError): BLEU 0, not a crash."""
    out = tmp_path / "blown"
    summary = train(_in_process(corpus, out, monkeypatch, env, 2, schedule="inverse_sqrt",
                                peak_lr=1e5, eval_every=1, eval_sentences=3), out)
    evals = [line for line in _lines(out) if line["kind"] == "eval"]
    assert [line["step"] for line in evals] == [1, 2] and summary["steps"] == 2
    assert evals[-1]["loss"] > 1e6 and evals[-1]["bleu"] == 0.0


@pytest.mark.parametrize("flag", ["--peak-lr", "--lr-scale"])
def test_a_learning_rate_beyond_float32_is_refused_naming_its_flag(flag, capsys):
    schedule = "noam" if flag == "--lr-scale" else "inverse_sqrt"
    assert train_cli.main(["--schedule", schedule, flag, "1e39"]) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and f"given by {flag} 1e+39" in line
    assert "must be at most 3.403e+38, the largest float32" in line
