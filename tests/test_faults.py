"""Bad values, bad paths and faults end in one line naming the culprit, and lose nothing.

Table-driven cases for train.py and translate.py (exit status, one stderr line, no traceback,
the value or path named), then the faults that must not cost data or a right answer: damaged
checkpoints, mismatched model directories, a second trainer, an interrupted translation,
scores of truncated references, exploding losses and gettext catalogs in other charsets.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import numpy as np
import pytest

import train as train_cli
from nmt.rundir import checkpoints as checkpoint
from nmt.rundir.lock import LOCK_FILE, RunDirectoryInUse, RunLock
from nmt.runtime import files
from nmt.training import command as train_command
from nmt.training.metrics_log import MetricsWindow
from nmt.translation import command as translate_cli
from translate_model import sentences

REPO = Path(__file__).resolve().parents[1]


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def _readonly_mount(tmp_path: Path) -> Path:
    """A read-only tmpfs under `tmp_path`, or a skip where this process may not mount."""
    target = tmp_path / "readonly"
    target.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(target)],
                            capture_output=True)
    if result.returncode != 0:
        pytest.skip("cannot mount a read-only file system here")
    return target


# ----------------------------------------------------------------------------- train.py


TRAIN_CASES = {
    "unknown choice": (["--norm", "side"], 2, "--norm: invalid choice: 'side'"),
    "unknown dtype": (["--dtype", "float16"], 2, "'float16'"),
    "unknown schedule": (["--schedule", "cosine"], 2, "'cosine'"),
    "dropout out of range": (["--dropout", "1.5"], 2, "--dropout 1.5"),
    "no warm-up": (["--warmup", "0"], 2, "--warmup 0"),
    "heads do not divide": (["--num-heads", "5", "--d-model", "24"], 2, "num_heads (5)"),
    "not a number": (["--max-steps", "ten"], 2, "'ten'"),
    "unknown flag": (["--bogus"], 2, "--bogus"),
    "a flag's prefix": (["--lr", "1e-4"], 2, "unrecognized arguments: --lr 1e-4"),
    "a dataset's configuration alone": (["--dataset-config", "de-en"], 2,
                                        "--dataset-config de-en is a configuration of a "
                                        "--dataset, and none is given"),
    "a packed width without packing": (["--no-packing", "--pack-width", "64"], 2,
                                       "--no-packing pads each pair to a bucket instead"),
    # A blank path would read as one left out: the built-in corpus, a new tokenizer, no recipe.
    "blank recipe": (["--config", ""], 2, "argument --config: '' is blank"),
    "blank corpus": (["--train-prefix", ""], 2, "argument --train-prefix: '' is blank"),
    "blank model": (["--init-from", " "], 2, "argument --init-from: ' ' is blank"),
    "blank tokenizer": (["--spm-model", ""], 2, "argument --spm-model: '' is blank"),
    "loss spike of one": (["--loss-spike", "1"], 2, "--loss-spike"),
    "noam's scale, another schedule": (["--lr-scale", "100"], 2,
                                       "--lr-scale 100.0: only --schedule noam reads lr_scale"),
    "a peak rate for noam": (["--schedule", "noam", "--peak-lr", "1e-6"], 2,
                             "only --schedule inverse_sqrt or linear reads peak_lr"),
    "decay steps, not linear": (["--decay-steps", "9000"], 2,
                                "only --schedule linear reads decay_steps"),
    "averaging without a count": (["--average-only"], 2, "--average-last"),
    "averaging more than are kept": (["--average-last", "6", "--keep-last", "5"], 2,
                                     "--average-last 6 averages the last 6 checkpoints, but "
                                     "--keep-last 5 keeps only 5"),
    "missing recipe": (["--config", "{tmp}/none.yaml"], 2, "{tmp}/none.yaml"),
    "output dir is a file": (["--output-dir", "{tmp}/file"], 2, "{tmp}/file"),
    "output dir under a file": (["--output-dir", "{tmp}/file/run"], 2, "{tmp}/file"),
    "resume without a run": (["--resume", "--output-dir", "{tmp}/none"], 2, "{tmp}/none"),
}


def _exit_status(main, argv: list, capsys) -> tuple[int, str]:
    """main(argv)'s exit status (argparse's exit included) and its one stderr line."""
    try:
        status = main([str(a) for a in argv])
    except SystemExit as exit_info:
        status = exit_info.code
    return status, _one_line(capsys.readouterr().err)


@pytest.mark.parametrize("case", TRAIN_CASES, ids=list(TRAIN_CASES))
def test_train_bad_values_and_paths_are_one_line(case, tmp_path, capsys):
    argv, code, named = TRAIN_CASES[case]
    (tmp_path / "file").write_text("not a directory\n")
    status, line = _exit_status(train_cli.main,
                                [a.replace("{tmp}", str(tmp_path)) for a in argv], capsys)
    assert status == code
    assert line.startswith("train.py: error: ") and named.replace("{tmp}", str(tmp_path)) in line
    assert not (tmp_path / "none").exists()


def test_train_output_dir_on_a_read_only_file_system(tmp_path, capsys):
    readonly = _readonly_mount(tmp_path)
    try:
        assert train_cli.main(["--output-dir", str(readonly / "run")]) == 2
        line = _one_line(capsys.readouterr().err)
        assert f"--output-dir {readonly / 'run'}" in line and "read-only" in line
    finally:
        subprocess.run(["umount", str(readonly)], check=False)


def test_disk_full_on_a_real_file_system_is_one_line_and_resumes(tmp_path, env):
    """An 8 MB tmpfs holds one checkpoint of a `compact` model cut to one layer each (5 MB)
    but not two: orbax's background writes fail by the dozen (each logged with its traceback,
    and TensorStore's callbacks then hit orbax's closed event loop a hundred times); the user
    sees one line. With space freed, the same command resumes and finishes."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small file system here")
    argv = [sys.executable, "train.py", "--preset", "compact", "--encoder-layers", "1",
            "--decoder-layers", "1", "--vocab-size", "500",
            "--max-train-pairs", "2000", "--batch-tokens", "512", "--save-every", "5",
            "--eval-every", "100", "--eval-sentences", "0", "--no-progress",
            "--max-steps", "20", "--output-dir", str(disk / "run")]
    try:
        full = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=600)
        assert full.returncode == 1
        lines = [line for line in full.stderr.splitlines()
                 if line.strip() and not line.startswith("INFO")]
        assert lines == [lines[-1]] and "Traceback" not in full.stderr, full.stderr[-3000:]
        assert lines[0].startswith("train.py: error: cannot write checkpoint step 10")
        assert "checkpoint step 5" in lines[0] and "is intact" in lines[0]
        assert sorted(p.name for p in (disk / "run" / "checkpoints").iterdir()) == ["5"]
        subprocess.run(["mount", "-o", "remount,size=200m", str(disk)], check=True)
        resumed = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                                 timeout=600)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert "resum" in resumed.stderr.lower() or "resum" in resumed.stdout.lower()
        assert "20" in {p.name for p in (disk / "run" / "checkpoints").iterdir()}
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_only_a_commands_own_process_starts_without_the_collector():
    """`done_starting` freezes nothing unless the entry point turned the collector off: main()
    called as a library (tests, notebooks) keeps collecting what it makes."""
    import gc

    from nmt.runtime import cli

    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    cli.done_starting()
    assert gc.isenabled() and gc.get_freeze_count() == frozen
    try:
        cli.start_without_collecting()
        assert not gc.isenabled()
        cli.done_starting()
        assert gc.isenabled() and gc.get_freeze_count() > frozen
        cli.done_starting()  # once only
    finally:
        gc.enable()
        gc.unfreeze()


def test_library_tracebacks_are_not_logged_unless_debugging(monkeypatch, capsys):
    from nmt.runtime import cli

    monkeypatch.delenv(cli.DEBUG_VARIABLE, raising=False)
    cli.setup_logging(logging.INFO, "%(levelname)s %(name)s: %(message)s", ("absl",))
    try:
        raise OSError(28, "No space left on device")
    except OSError:
        logging.getLogger("absl").error("write failed", exc_info=True)
        logging.getLogger("asyncio").error("Task exception was never retrieved", exc_info=True)
        logging.getLogger("nmt.training.trainer").error("ours", exc_info=True)
    logging.getLogger("absl").error("no exception: kept")
    err = capsys.readouterr().err
    assert "write failed" not in err and "never retrieved" not in err
    assert "ERROR nmt.training.trainer: ours" in err and "no exception: kept" in err

    ignored = []
    hook = cli._quiet_abandoned_io(ignored.append)
    for value in (RuntimeError("Event loop is closed"), RuntimeError("other")):
        hook(type("Unraisable", (), {"exc_value": value, "object": None})())
    assert [str(u.exc_value) for u in ignored] == ["other"]


def test_a_program_compiling_ahead_of_time_is_finished_before_the_process_exits(tmp_path):
    """A start-up check that fails while the train step compiles in the background ends the
    command: the compilation is waited for, not stopped inside XLA, which aborted the
    process (exit 134 or 139 instead of the error's 2)."""
    done = tmp_path / "traced"
    script = f"""
import time
import jax, jax.numpy as jnp
from nmt.runtime.compilation import AheadOfTime, CompileLog

def step(state, batch):
    time.sleep(1.0)  # still tracing when the main thread returns
    open({str(done)!r}, "w").close()
    return batch["x"] @ state

ahead = AheadOfTime(jax.jit(step), CompileLog(), "step")
ahead.start(jax.ShapeDtypeStruct((4, 4), jnp.float32),
            {{"x": jax.ShapeDtypeStruct((2, 4), jnp.float32)}})
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert done.exists()


def test_unexpected_errors_are_one_line_unless_debugging(tmp_path, capsys, monkeypatch):
    def broken(argv, started):
        raise KeyError("surprise")

    monkeypatch.setattr(train_command, "_main", broken)  # what train.py's main calls
    monkeypatch.delenv("NMT_DEBUG", raising=False)
    assert train_cli.main([]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "unexpected KeyError" in line and "NMT_DEBUG=1" in line
    monkeypatch.setenv("NMT_DEBUG", "1")
    with pytest.raises(KeyError):
        train_cli.main([])


@pytest.mark.parametrize("command", [["translate.py", "--model", "{model}", "Hallo."],
                                     ["train.py", "--max-steps", "1", "--output-dir", "{out}"],
                                     ["-m", "nmt.serving", "--model", "{model}", "--port", "0"],
                                     ["-m", "nmt.distillation", "--teacher", "{model}",
                                      "--train-prefix", "{out}/corpus", "--out", "{out}"]])
def test_a_backend_jax_lacks_in_jax_platforms_is_one_usage_line(command, run_dir, env,
                                                                tmp_path):
    """JAX's own error for JAX_PLATFORMS=cuda without CUDA is an empty AssertionError."""
    argv = [arg.format(model=run_dir, out=tmp_path / "run") for arg in command]
    result = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True,
                            env={**env, "JAX_PLATFORMS": "cuda"}, timeout=300)
    assert result.returncode == 2, result.stderr
    line = _one_line(result.stderr)
    assert "error: JAX_PLATFORMS=cuda: JAX has no such backend on this machine" in line
    assert "'.[cuda]'" in line and "unset JAX_PLATFORMS" in line
    assert not (tmp_path / "run").exists()


def test_a_peer_failing_while_the_process_counts_are_compared_is_a_fault(tmp_path, capsys,
                                                                         monkeypatch):
    """Another process failing or going silent at the start is relayed in one line (exit 1),
    not as an unexpected error."""
    from nmt.runtime import distributed

    def initialize(*args):
        raise distributed.PeerFailed("process 1 of 2 failed: interrupted")

    monkeypatch.setattr(distributed, "initialize_distributed", initialize)
    status = train_cli.main(["--max-steps", "1", "--output-dir", str(tmp_path / "run")])
    line = _one_line(capsys.readouterr().err)
    assert status == 1 and line == "train.py: error: process 1 of 2 failed: interrupted"


def test_an_encoding_worker_that_died_is_a_fault_while_running(tmp_path, capsys,
                                                                monkeypatch):
    """A worker killed while encoding (out of memory) is the machine's fault: exit 1, as
    faults while running are, not 2 as a bad corpus is."""
    import data.corpus
    from data.encoding import WorkerDied

    def died(*args):
        raise WorkerDied("a worker process encoding pairs 0-50 of 100 ended with signal 9")

    monkeypatch.setattr(data.corpus, "check_files", died)
    status = train_cli.main(["--max-steps", "1", "--output-dir", str(tmp_path / "run")])
    line = _one_line(capsys.readouterr().err)
    assert (status, line) == (1, "train.py: error: a worker process encoding pairs 0-50 of "
                                 "100 ended with signal 9")


@pytest.mark.parametrize("value, fix", [("gpu", "'.[cuda]'"), ("tpu", "'.[tpu]'"),
                                        ("bogus", "name a backend JAX has")])
def test_jax_platforms_names_the_extra_to_install(value, fix, monkeypatch):
    import jax

    from nmt.runtime import cli

    def unknown():
        raise RuntimeError("Unable to initialize backend 'rocm'")

    monkeypatch.setenv("JAX_PLATFORMS", value)
    monkeypatch.setattr(jax, "devices", unknown)
    with pytest.raises(cli.UsageError, match=f"^JAX_PLATFORMS={value}: JAX has no such") as err:
        cli.check_jax_platforms()
    assert fix in str(err.value) and "rocm" not in str(err.value)
    monkeypatch.setenv("JAX_PLATFORMS", "")
    cli.check_jax_platforms()  # unset: JAX picks, nothing is asked


def test_jax_platforms_with_its_plugin_installed_gives_jaxs_reason(monkeypatch):
    """The CUDA plugin installed but no GPU visible (a container without --gpus): JAX's
    reason, not advice to install what is there."""
    import jax

    from nmt.runtime import cli

    def no_gpu():
        raise RuntimeError("Unable to initialize backend 'cuda': no CUDA-capable device")

    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    monkeypatch.setattr(jax, "devices", no_gpu)
    monkeypatch.setattr(cli, "_installed", lambda prefix: prefix == "jax-cuda")
    with pytest.raises(cli.UsageError) as err:
        cli.check_jax_platforms()
    assert "jax-cuda plugin is installed but could not start a device (Unable to " in str(
        err.value)
    assert "no CUDA-capable device" in str(err.value) and "pip install" not in str(err.value)


def test_compilation_cache_write_and_read_failures_are_one_logged_warning_each(
        tmp_path, monkeypatch, caplog):
    """JAX warns for each program it cannot write to its cache (a full disk: all of them) or
    read from it (a damaged entry): each is one logged line."""
    import warnings

    import jax

    from nmt.runtime import compilation

    shown = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, *_: shown.append(message))
    monkeypatch.setattr(jax.config, "update", lambda *_: None)  # this process's cache stays
    monkeypatch.setattr(compilation.stored, "keep_programs_in", lambda _: None)
    monkeypatch.setattr(compilation, "_failures_told", set())
    compilation.enable_compilation_cache(tmp_path / "jax")
    with caplog.at_level(logging.WARNING, logger="nmt.runtime.compilation"), \
            warnings.catch_warnings():
        warnings.simplefilter("always")
        for name in ("jit_stage", "jit__beam_start"):
            warnings.warn(f"Error writing persistent compilation cache entry for '{name}': "
                          "OSError: [Errno 28] No space left on device")
            warnings.warn(f"Error reading persistent compilation cache entry for '{name}': "
                          "XlaRuntimeError: INVALID_ARGUMENT: truncated")
        warnings.warn("another warning")
    written, read = caplog.records
    assert written.getMessage().startswith(
        f"could not write to the compilation cache {tmp_path / 'jax'} (OSError: [Errno 28] No "
        "space left on device)")
    assert "free some space, or set FLAX_NMT_CACHE" in written.getMessage()
    assert read.getMessage().startswith(
        f"could not read an entry of the compilation cache {tmp_path / 'jax'} "
        "(XlaRuntimeError: INVALID_ARGUMENT: truncated), so its program was compiled again")
    assert [str(message) for message in shown] == ["another warning"]


def test_logging_follows_stderr_across_calls(monkeypatch):
    """Each main() logs to the sys.stderr of its own call, at its own level: a stream closed
    since an earlier call (a test's capture, a notebook cell) is never written to."""
    import io

    from nmt.runtime import cli

    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    cli.setup_logging(logging.INFO, "%(message)s", ())
    logging.getLogger("nmt.test").info("to the first")
    first.close()
    monkeypatch.setattr(sys, "stderr", second)
    cli.setup_logging(logging.WARNING, "%(message)s", ())
    logging.getLogger("nmt.test").info("hidden by the second call's level")
    logging.getLogger("nmt.test").warning("to the second")
    assert second.getvalue() == "to the second\n"


# ----------------------------------------------------------------------------- translate.py


def _translate(argv: list, capsys) -> tuple[int, str]:
    return _exit_status(translate_cli.main, argv, capsys)


@pytest.mark.parametrize("argv,code,named", [
    (["--model", "{run}", "--beam", "0", "Hallo."], 2, "--beam must be >= 1"),
    (["--model", "{run}", "--nbest", "x", "Hallo."], 2, "'x'"),
    (["--model", "{tmp}/none", "Hallo."], 2, "{tmp}/none"),  # a path not there: usage
    (["--model", "{run}", "--input", "{tmp}/none.txt"], 1, "{tmp}/none.txt"),
    (["--model", "{run}", "--output", "{tmp}/no/out.txt", "Hallo."], 2, "{tmp}/no"),
    (["--model", "{run}", "--output", "{tmp}", "Hallo."], 2, "is a directory"),
    (["--model", "{run}", "--chunk-lines", "0", "Hallo."], 2, "--chunk-lines"),
])
def test_translate_bad_values_and_paths_are_one_line(argv, code, named, run_dir, tmp_path,
                                                     capsys):
    argv = [a.replace("{run}", str(run_dir)).replace("{tmp}", str(tmp_path)) for a in argv]
    status, line = _translate(argv, capsys)
    assert status == code
    assert line.startswith("translate.py: error: ")
    assert named.replace("{tmp}", str(tmp_path)) in line


def test_translate_with_stdin_closed(run_dir, env):
    result = subprocess.run(["bash", "-c", f'"{sys.executable}" translate.py --model '
                             f'"{run_dir}" <&-'], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1
    assert "standard input is closed" in _one_line(result.stderr)


@pytest.mark.parametrize("output", [True, False])
def test_translate_with_stdout_closed(output, run_dir, env, tmp_path):
    """`>&-`: with --output FILE the translation goes there; without, one line says what to do
    (mimalloc's re-execution flushed the streams, and stdout is then None)."""
    flags = f'--output "{tmp_path}/out.en"' if output else ""
    result = subprocess.run(["bash", "-c", f'"{sys.executable}" translate.py --model '
                             f'"{run_dir}" -q {flags} Hallo. >&-'], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    if output:
        assert result.returncode == 0, result.stderr
        assert "error" not in result.stderr and "Traceback" not in result.stderr
        assert (tmp_path / "out.en").read_text().endswith("\n")
    else:
        assert result.returncode == 1
        assert _one_line(result.stderr) == ("translate.py: error: standard output is closed: "
                                            "give --output FILE, or redirect it.")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
def test_a_full_disk_on_stdout_names_standard_output(run_dir, env):
    result = subprocess.run(["bash", "-c", f'"{sys.executable}" translate.py --model '
                             f'"{run_dir}" -q Hallo. > /dev/full'], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    error = [line for line in result.stderr.splitlines() if ": error: " in line]
    assert error[0].startswith("translate.py: error: standard output: no space left on the "
                               "device"), result.stderr


def test_a_model_directory_with_another_tokenizer_is_refused(run_dir, tmp_path, capsys,
                                                            monkeypatch):
    from data.tokenizer import TokenizerConfig, train_tokenizer
    from nmt.models.model_dir import ModelDirError, load_model

    model = tmp_path / "model"
    shutil.copytree(run_dir / "model", model)
    smaller = train_tokenizer(sentences(200, seed=9), TokenizerConfig(vocab_size=320))
    smaller.save(tmp_path / "other")
    shutil.copyfile(tmp_path / "other" / "spm.model", model / "spm.model")
    with pytest.raises(ModelDirError) as info:  # the Python API
        load_model(model)
    message = str(info.value)
    assert str(model / "spm.model") in message and str(model / "config.json") in message
    assert "320 pieces" in message
    monkeypatch.setattr(translate_cli, "enable_compilation_cache", lambda: None)
    status, line = _translate(["--model", model, "Hallo."], capsys)  # the command
    assert status == 1 and str(model / "spm.model") in line


def test_a_tokenizer_of_the_same_size_but_other_pieces_is_refused(run_dir, tmp_path, capsys,
                                                                   monkeypatch):
    """Same size, same special ids: only config.json's record of its sha256 tells it apart."""
    from data.tokenizer import TokenizerConfig, load_tokenizer, train_tokenizer
    from nmt.models.model_dir import ModelDirError, load_model

    model = tmp_path / "model"
    shutil.copytree(run_dir / "model", model)
    size = load_tokenizer(model).vocab_size
    other = train_tokenizer(sentences(400, seed=11), TokenizerConfig(vocab_size=size))
    assert other.vocab_size == size and other.sha256 != load_tokenizer(model).sha256
    other.save(tmp_path / "other")
    shutil.copyfile(tmp_path / "other" / "spm.model", model / "spm.model")
    with pytest.raises(ModelDirError, match=r"spm.model is not the tokenizer the model was "
                                            r"trained with: its sha256 differs"):
        load_model(model)
    monkeypatch.setattr(translate_cli, "enable_compilation_cache", lambda: None)
    status, line = _translate(["--model", model, "Hallo."], capsys)
    assert status == 1 and "sha256 differs" in line


def test_parameters_of_another_shape_are_named(run_dir, tmp_path):
    from nmt.models.model_dir import ModelDirError, load_model

    model = tmp_path / "model"
    shutil.copytree(run_dir / "model", model)
    values = json.loads((model / "config.json").read_text())
    values["model"]["d_ff"] *= 2
    (model / "config.json").write_text(json.dumps(values))
    with pytest.raises(ModelDirError, match=r"params.msgpack: parameter .* has shape"):
        load_model(model)


def test_scoring_refuses_a_reference_it_would_truncate(run_dir, tmp_path, capsys,
                                                      monkeypatch):
    src, ref = tmp_path / "test.de", tmp_path / "test.en"
    src.write_text("Ein Mann.\nDie Katze.\n")
    ref.write_text("A man.\n" + " ".join(["the dog runs in the park"] * 40) + "\n")
    monkeypatch.setattr(translate_cli, "enable_compilation_cache", lambda: None)
    status, line = _translate(["--model", run_dir, "--score", "--src-file", src,
                               "--ref-file", ref, "-q"], capsys)
    assert status == 1 and f"{ref} line 2" in line and "tokens" in line


def test_output_is_written_as_it_goes_and_replaces_out_only_when_done(run_dir, env,
                                                                    tmp_path):
    source, out = tmp_path / "big.de", tmp_path / "out.en"
    source.write_text("".join(line + "\n" for line in sentences(4000, seed=3, max_words=6)))
    out.write_text("the earlier output\n")
    partial = tmp_path / ("out.en" + files.PARTIAL_SUFFIX)
    process = subprocess.Popen(
        [sys.executable, "translate.py", "--model", str(run_dir), "--greedy", "-q",
         "--input", str(source), "--output", str(out), "--chunk-lines", "50",
         "--batch-tokens", "256"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        if partial.exists() and partial.read_text().count("\n") >= 100:
            break
        time.sleep(0.05)
    assert process.poll() is None, process.communicate()[1][-2000:]
    written = partial.read_text().count("\n")
    assert 100 <= written < 4000  # lines appear before the input is finished
    assert out.read_text() == "the earlier output\n"
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    assert process.returncode != 0
    assert out.read_text() == "the earlier output\n" and not partial.exists()


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_a_slow_reader_holds_stdout_ends_after_a_whole_line(signum, status,
                                                                          run_dir, env,
                                                                          tmp_path):
    """The reader of stdout keeps its pipe full, so the write of the chunk waits; Ctrl-C or
    SIGTERM then ends translate.py at the end of the line it cut (the reader takes the rest
    of it), never in its middle."""
    source = tmp_path / "in.de"
    source.write_text("".join(line + "\n" for line in sentences(800, seed=5, max_words=6)))
    read, write = os.pipe()
    fcntl.fcntl(write, getattr(fcntl, "F_SETPIPE_SZ", 1031), 4096)
    # The child's SIGINT: SIG_DFL, not ignored as it would be if the tests ran in the background.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen(
            [sys.executable, "translate.py", "--model", str(run_dir), "--greedy", "-q",
             "--input", str(source), "--chunk-lines", "800"], cwd=REPO, env=env, stdout=write,
            stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, previous)
        os.close(write)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and process.poll() is None:  # until the pipe is full
            waiting = fcntl.ioctl(read, termios.FIONREAD, struct.pack("i", 0))
            if struct.unpack("i", waiting)[0] >= 4096:
                break
            time.sleep(0.05)
        time.sleep(0.5)
        assert process.poll() is None, process.communicate()[1][-2000:]
        process.send_signal(signum)
        time.sleep(0.5)
        with os.fdopen(read, "rb") as reader:
            data = reader.read()
    finally:
        if process.poll() is None:
            process.kill()
    err = process.communicate(timeout=60)[1]
    assert process.returncode == status, err
    assert 4096 < len(data) and data.endswith(b"\n")
    assert len(data.decode().splitlines()) < 800


def test_a_reader_that_goes_away_ends_translate_quietly_as_sigpipe_would(run_dir, env,
                                                                         tmp_path):
    """`translate.py ... | head -1`: no message, and status 141, what the shell reports for
    cat (or fairseq) killed by SIGPIPE, not 1, which reads as a fault."""
    source = tmp_path / "in.de"
    source.write_text("".join(line + "\n" for line in sentences(300, seed=7, max_words=6)))
    process = subprocess.Popen(
        [sys.executable, "translate.py", "--model", str(run_dir), "--greedy", "-q",
         "--input", str(source), "--chunk-lines", "10"], cwd=REPO, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline().endswith("\n")
    process.stdout.close()
    err = process.communicate(timeout=240)[1]
    assert process.returncode == 141, err
    assert "error" not in err and "Traceback" not in err, err


# ----------------------------------------------------------------------------- units


def test_run_lock_refuses_a_second_holder_and_not_a_dead_one(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(RunDirectoryInUse, match=rf"pid {os.getpid()} on "):
            with RunLock(tmp_path):
                pass
    # A holder killed with SIGKILL leaves its lock file, which must not block.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from nmt.rundir.lock import RunLock\n"
         "with RunLock(sys.argv[1]):\n print('held', flush=True); time.sleep(60)",
         str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(RunDirectoryInUse, match=rf"pid {holder.pid} "):
        RunLock(tmp_path).__enter__()
    holder.kill()
    holder.wait()
    assert (tmp_path / LOCK_FILE).exists()
    with RunLock(tmp_path):
        pass


def test_a_second_trainer_on_a_run_directory_refuses(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    with RunLock(run):
        status = train_cli.main(["--output-dir", str(run), "--max-steps", "1",
                                 "--preset", "tiny", "--vocab-size", "300"])
    line = _one_line(capsys.readouterr().err)
    assert status == 1 and f"{run} is in use by another trainer (pid {os.getpid()}" in line
    assert not (run / "checkpoints").exists()


def test_a_run_directory_without_file_locks_is_named(tmp_path, capsys, monkeypatch):
    """NFS without a lock daemon answers flock with ENOLCK: the lock file is named, with
    what to do, not 'a file: No locks available'."""
    import errno

    run = tmp_path / "run"
    run.mkdir()
    real_flock = fcntl.flock

    def no_locks_in_run(fd, operation):
        if os.readlink(f"/proc/self/fd/{fd}") == str(run / LOCK_FILE):
            raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
        return real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", no_locks_in_run)
    status = train_cli.main(["--output-dir", str(run), "--max-steps", "1",
                             "--preset", "tiny", "--vocab-size", "300"])
    line = _one_line(capsys.readouterr().err)
    assert status == 2, line
    assert f"cannot lock {run / LOCK_FILE}: the filesystem of {run} does not support" in line
    assert "a local disk or on a mount with locking enabled" in line
    assert not (run / "checkpoints").exists()


def _save_steps(directory: Path, steps: list[int]):
    import jax.numpy as jnp

    saver = checkpoint.Checkpointer(directory, keep_last=5, async_save=False)
    for step in steps:
        params = {"w": jnp.full((4, 3), float(step))}
        saver.save(step, params, {"step": jnp.asarray(step)}, {"step": step})
    saver.wait()
    return saver, {"w": jnp.zeros((4, 3))}, {"step": jnp.asarray(0)}


def test_an_incomplete_step_directory_is_reported_once(tmp_path, caplog):
    (tmp_path / "checkpoints" / "150").mkdir(parents=True)
    saver, _, _ = _save_steps(tmp_path, [1, 2])
    for _ in range(3):
        assert saver.steps() == [1, 2]
    saver.close()
    warned = [r.getMessage() for r in caplog.records if "incomplete checkpoint" in r.getMessage()]
    assert warned == [f"ignoring incomplete checkpoint {tmp_path / 'checkpoints' / '150'}"]


def test_a_flipped_byte_in_a_checkpoint_is_detected_and_skipped(tmp_path, caplog):
    saver, params_like, train_like = _save_steps(tmp_path, [1, 2])
    newest = tmp_path / "checkpoints" / "2"
    assert (newest / checkpoint.CHECKSUMS_FILE).is_file()
    assert checkpoint.damaged_file(newest) is None
    victim = max((p for p in newest.rglob("*") if p.is_file() and "params" in p.parts),
                 key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    assert str(victim) in checkpoint.damaged_file(newest)
    restored = saver.restore(params_like, train_like)
    assert restored.step == 1 and float(restored.params["w"][0, 0]) == 1.0
    assert "skipping damaged checkpoint" in caplog.text and str(victim) in caplog.text
    saver.close()


def test_a_damaged_step_above_the_run_is_set_aside_and_costs_no_good_checkpoint(tmp_path,
                                                                               caplog):
    """A damaged (or foreign) step numbered above the run's is skipped on resume; it must not
    count as the newest step in --keep-last, or the good steps saved after it are deleted."""
    import jax.numpy as jnp

    saver, params_like, train_like = _save_steps(tmp_path, [1, 2])
    saver.close()
    steps = tmp_path / "checkpoints"
    shutil.copytree(steps / "2", steps / "100")
    for victim in (steps / "100" / "params" / "d").iterdir():
        with victim.open("r+b") as f:
            f.truncate(victim.stat().st_size // 2)
    saver = checkpoint.Checkpointer(tmp_path, keep_last=1, async_save=False)
    assert saver.restore(params_like, train_like).step == 2
    for step in (3, 4):
        saver.save(step, {"w": jnp.full((4, 3), float(step))}, {"step": jnp.asarray(step)},
                   {"step": step})
    saver.wait()
    assert saver.steps() == [4]  # not [100]: 3 and 4 were deleted for it
    saver.close()
    aside = steps / "100.skipped"
    assert aside.is_dir() and f"moved it to {aside}" in caplog.text
    assert checkpoint.complete_steps(steps) == [4]  # what --average-last reads


def test_every_process_names_a_skipped_step_before_process_0_moves_it(tmp_path, caplog,
                                                                      monkeypatch):
    """Process 0 renames the step for all; a process that chose its name after the rename
    found `.skipped` taken and said the step went to `.skipped2`. Two threads stand in for
    two processes sharing the run directory, process 1 the slower."""
    import threading
    import time

    steps = tmp_path / "checkpoints"
    (steps / "100").mkdir(parents=True)
    meeting = threading.Barrier(2, timeout=30)
    local = threading.local()
    monkeypatch.setattr(checkpoint, "barrier", lambda name: meeting.wait())
    monkeypatch.setattr(checkpoint.jax, "process_index", lambda: local.index)

    def process(index: int) -> None:
        local.index = index
        time.sleep(0.3 * index)
        checkpoint._move_skipped(steps, [(100, ValueError("unreadable"), "damaged")])

    threads = [threading.Thread(target=process, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert (steps / "100.skipped").is_dir() and not (steps / "100").exists()
    assert caplog.text.count(f"moved it to {steps / '100.skipped'},") == 2, caplog.text
    assert ".skipped2" not in caplog.text


def test_a_failed_save_keeps_the_earlier_checkpoints(tmp_path, monkeypatch):
    import errno

    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    saver, params_like, train_like = _save_steps(tmp_path, [1])
    real_save = ocp.CheckpointManager.save

    def full_disk(self, step, *args, **kwargs):
        partial = Path(self.directory) / f"{step}.orbax-checkpoint-tmp-1"
        (partial / "params").mkdir(parents=True)
        (partial / "params" / "half").write_bytes(b"x" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ocp.CheckpointManager, "save", full_disk)
    with pytest.raises(checkpoint.SaveError) as info:
        saver.save(2, {"w": jnp.ones((4, 3))}, {"step": jnp.asarray(2)}, {"step": 2})
    message = str(info.value)
    assert "cannot write checkpoint step 2" in message and "no space left" in message
    assert "checkpoint step 1" in message and "run the same command again" in message
    assert not list((tmp_path / "checkpoints").glob("*tmp*"))
    monkeypatch.setattr(ocp.CheckpointManager, "save", real_save)
    assert saver.restore(params_like, train_like).step == 1
    saver.close()


def test_a_save_failing_while_waited_for_names_its_step(tmp_path, monkeypatch):
    """The save of step 2 is finalized but its checksums cannot be written when the run
    waits for it at the end: the error names step 2 (it said step -1)."""
    import jax.numpy as jnp

    saver, _, _ = _save_steps(tmp_path, [1])
    monkeypatch.setattr(checkpoint, "write_checksums",
                        lambda step_dir: (_ for _ in ()).throw(OSError(28, "No space left")))
    saver.save(2, {"w": jnp.ones((4, 3))}, {"step": jnp.asarray(2)}, {"step": 2})
    with pytest.raises(checkpoint.SaveError) as info:
        saver.wait()
    message = str(info.value)
    assert "cannot write checkpoint step 2 in" in message and "no space left" in message
    saver.close()


def test_a_failed_save_of_a_step_again_keeps_its_first_checkpoint(tmp_path, monkeypatch):
    """A run saves its last step again at stop (the closing log line changes its bookkeeping):
    if that save fails, the step's first checkpoint is still there, readable, not deleted to
    make room for the new one."""
    import errno

    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    saver, params_like, train_like = _save_steps(tmp_path, [1, 2])
    real_save = ocp.CheckpointManager.save

    def full_disk(self, step, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ocp.CheckpointManager, "save", full_disk)
    with pytest.raises(checkpoint.SaveError, match="checkpoint step 2 .* is intact"):
        saver.save(2, {"w": jnp.full((4, 3), 9.0)}, {"step": jnp.asarray(2)}, {"step": 22})
    monkeypatch.setattr(ocp.CheckpointManager, "save", real_save)
    assert saver.steps() == [1, 2] and not list((tmp_path / "checkpoints").glob("*replaced"))
    restored = saver.restore(params_like, train_like)
    assert (restored.step, restored.data, float(restored.params["w"][0, 0])) == (2, {"step": 2},
                                                                                2.0)
    saver.save(2, {"w": jnp.full((4, 3), 9.0)}, {"step": jnp.asarray(2)}, {"step": 22})
    saver.wait()  # saved again: the new one replaces the first
    assert saver.steps() == [1, 2] and not list((tmp_path / "checkpoints").glob("*replaced"))
    assert saver.restore(params_like, train_like).data == {"step": 22}
    saver.close()


def test_a_step_set_aside_by_a_process_killed_while_saving_it_again_comes_back(tmp_path):
    saver, params_like, train_like = _save_steps(tmp_path, [1, 2])
    saver.close()
    steps = tmp_path / "checkpoints"
    (steps / "2").rename(steps / f"2{checkpoint.ASIDE_SUFFIX}")  # killed before the new 2
    (steps / "2").mkdir()                                       # had begun to be written
    restored = checkpoint.Checkpointer(tmp_path).restore(params_like, train_like)
    assert (restored.step, restored.data) == (2, {"step": 2})
    assert sorted(p.name for p in steps.iterdir()) == ["1", "2"]


def _metrics(loss: float) -> dict:
    return {"loss": np.float32(loss), "is_finite": np.bool_(True), "grad_norm": np.float32(1),
            "learning_rate": np.float32(1e-3), "tokens": np.float32(10)}


@pytest.mark.parametrize("spike,losses,stops_at", [
    (10.0, [5.0] * 20 + [4.0, 80.0, 5.0], 22),   # 16 times the median: stops
    (10.0, [5.0] * 20 + [9.0, 30.0], None),       # 6 times: goes on
    (0.0, [5.0] * 20 + [1e6], None),              # off
    (10.0, [0.01] * 20 + [0.5], None),            # 50 times, but not a nat above: noise
    (10.0, [90.0] * 5, None),                     # no history yet
])
def test_a_loss_far_above_its_recent_level_stops_the_run(spike, losses, stops_at):
    stopped = []

    def diverged(step, metrics, why):
        stopped.append((step, why))
        return RuntimeError(why)

    window = MetricsWindow([], 1, diverged, spike=spike)
    for loss in losses:
        window.add(_metrics(loss))
    if stops_at is None:
        window.read_back()
        assert not stopped
    else:
        with pytest.raises(RuntimeError, match="times the median"):
            window.read_back()
        assert stopped[0][0] == stops_at


def _mo_file(path: Path, entries: dict[bytes, bytes]) -> None:
    """A compiled gettext catalog (little-endian) with `entries`, sorted as msgfmt writes."""
    keys = sorted(entries)
    header_size, count = 28, len(keys)
    originals = header_size
    translations = originals + 8 * count
    data_start = translations + 8 * count
    blob, o_table, t_table = b"", [], []
    for key in keys:
        o_table.append((len(key), data_start + len(blob)))
        blob += key + b"\0"
    for key in keys:
        t_table.append((len(entries[key]), data_start + len(blob)))
        blob += entries[key] + b"\0"
    head = struct.pack("<7I", 0x950412DE, 0, count, originals, translations, 0, 0)
    tables = b"".join(struct.pack("<2I", *e) for e in o_table + t_table)
    path.write_bytes(head + tables + blob)


def test_gettext_catalogs_are_read_in_their_declared_charset(tmp_path):
    from data.corpus import read_gettext_pairs

    messages = tmp_path / "de" / "LC_MESSAGES"
    messages.mkdir(parents=True)
    header = ("Last-Translator: Jörg Müller\nContent-Type: text/plain; charset=ISO-8859-1\n")
    _mo_file(messages / "latin1.mo", {
        b"": header.encode("latin-1"),
        b"Open file": "Datei öffnen".encode("latin-1"),
        b"Close": "Schließen".encode("latin-1")})
    _mo_file(messages / "utf8.mo", {
        b"": b"Content-Type: text/plain; charset=UTF-8\n",
        b"Save": "Speichern".encode()})
    pairs, stats = read_gettext_pairs("de", tmp_path)
    assert sorted(pairs) == [("Close", "Schließen"), ("Open file", "Datei öffnen"),
                             ("Save", "Speichern")]
    assert stats.catalogs_read == 2 and stats.catalogs_skipped == 0


# ----------------------------------------------------------------------------- corpora


def test_a_recipe_whose_corpus_is_missing_says_where_to_get_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MULTI30K", str(tmp_path / "none"))
    monkeypatch.chdir(REPO)
    status, line = _exit_status(train_cli.main, ["--config", "configs/multi30k_small.yaml",
                                                 "--output-dir", tmp_path / "run"], capsys)
    assert status == 2
    assert f"{tmp_path / 'none' / 'train.en'}: file not found" in line
    assert "Multi30k" in line and "python -m data.download multi30k" in line
    assert not (tmp_path / "run").exists()  # nothing trained, nothing compiled


def test_recipe_variables_need_a_value_or_a_default(tmp_path, monkeypatch):
    from nmt.settings import recipes
    from nmt.settings.config import SettingsError

    recipe = tmp_path / "r.yaml"
    recipe.write_text("data:\n  train_prefix: ${CORPUS_DIR}/train\n"
                      "  valid_prefix: ${CORPUS_DIR:-/default}/valid\n")
    monkeypatch.delenv("CORPUS_DIR", raising=False)
    with pytest.raises(SettingsError, match=r"r.yaml line 2: data.train_prefix: needs the "
                                            r"environment variable CORPUS_DIR"):
        recipes.read_recipe(recipe)
    monkeypatch.setenv("CORPUS_DIR", "/mine")
    layer = recipes.read_recipe(recipe)
    assert layer["data"]["train_prefix"][0] == "/mine/train"
    assert layer["data"]["valid_prefix"][0] == "/mine/valid"


@pytest.mark.parametrize("name, text", [
    ("r.yaml", "model:\n  preset: ${PRESET:-tiny}\ndata:\n  train_prefix: ${CORPUS_DIR}/train\n"),
    ("r.json", '{"preset": "${PRESET:-tiny}", "train-prefix": "${CORPUS_DIR}/train"}'),
])
def test_recipe_variables_in_every_value_and_format(tmp_path, monkeypatch, name, text):
    from nmt.settings import recipes
    from nmt.settings.config import SettingsError

    recipe = tmp_path / name
    recipe.write_text(text)
    monkeypatch.delenv("PRESET", raising=False)
    monkeypatch.delenv("CORPUS_DIR", raising=False)
    with pytest.raises(SettingsError, match=r"needs the environment variable CORPUS_DIR"):
        recipes.read_recipe(recipe)
    monkeypatch.setenv("CORPUS_DIR", "/mine")
    layer = recipes.read_recipe(recipe)
    assert layer["model"]["preset"][0] == "tiny"
    assert layer["data"]["train_prefix"][0] == "/mine/train"
    monkeypatch.setenv("PRESET", "small")
    assert recipes.read_recipe(recipe)["model"]["preset"][0] == "small"
    # "~" is the home directory, as the shell has it on the command line.
    monkeypatch.setenv("HOME", "/home/me")
    recipe.write_text(text.replace("${CORPUS_DIR}", "~/corpus"))
    assert recipes.read_recipe(recipe)["data"]["train_prefix"][0] == "/home/me/corpus/train"


def test_downloading_offline_is_one_line(tmp_path, capsys, monkeypatch):
    import urllib.error

    from data import download

    def offline(*args, **kwargs):
        raise urllib.error.URLError("Temporary failure in name resolution")

    monkeypatch.setattr(download.urllib.request, "urlopen", offline)
    assert download.main(["multi30k", str(tmp_path / "m")]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "cannot fetch multi30k" in line and "network" in line
    # ... and how to do it by hand: the files, their decompression and their names here.
    assert "gunzip each .gz first" in line and "val.en.gz -> valid.en" in line


@pytest.mark.parametrize("cut", ["gzip cut short", "connection dropped", "corrupt gzip"])
def test_a_download_that_does_not_complete_is_one_line(cut, tmp_path, capsys, monkeypatch):
    """A .gz that ends early or is damaged, or a connection closed mid-file, is told as a
    failed fetch with the way to do it by hand, not as a traceback."""
    import gzip
    import http.client
    import io

    from data import download

    whole = gzip.compress(b"A man rides a bicycle.\n" * 100)
    body = {"gzip cut short": whole[:40], "corrupt gzip": whole[:10] + b"\x07" * 40,
            "connection dropped": b""}[cut]

    class Response(io.BytesIO):
        def read(self, *args):
            if cut == "connection dropped":
                raise http.client.IncompleteRead(b"A man", 1000)
            return super().read(*args)

    monkeypatch.setattr(download.urllib.request, "urlopen", lambda *a, **k: Response(body))
    assert download.main(["multi30k", str(tmp_path / "m")]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "cannot fetch multi30k" in line and "By hand:" in line and "Traceback" not in line
    assert not (tmp_path / "m").exists()


def test_a_download_whose_write_fails_leaves_the_earlier_files_as_they_were(
        tmp_path, capsys, monkeypatch):
    """A full disk on the second file must not leave the first one new beside an old second:
    aligned files that no longer match."""
    import errno

    from data import download

    target = tmp_path / "m"
    target.mkdir()
    names = list(download.CORPORA["multi30k"][1])
    for name in names:
        (target / name).write_text("old\n")
    fetched = {name: b"new\n" for name in names}
    monkeypatch.setattr(download, "fetch", lambda name: fetched)
    real_write, written = Path.write_bytes, []

    def write_bytes(path: Path, data: bytes) -> int:
        if written:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        written.append(path)
        return real_write(path, data)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    assert download.main(["multi30k", str(target)]) == 1
    assert "No space left on device" in _one_line(capsys.readouterr().err)
    assert sorted(p.name for p in target.iterdir()) == sorted(names)  # no temporaries left
    assert {(target / name).read_text() for name in names} == {"old\n"}
    monkeypatch.setattr(Path, "write_bytes", real_write)
    assert download.main(["multi30k", str(target)]) == 0
    assert {(target / name).read_text() for name in names} == {"new\n"}
