"""bench/gpu_check.sh: its --dry-run path runs every step end to end on the CPU, and a missing
GPU, package or corpus stops it with one line."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from synthetic_corpus import write_corpus

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu_check.sh"


def _check(*args: str, env_extra: dict | None = None, timeout: int = 600
           ) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", **(env_extra or {})}
    env.pop("OUT", None)
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def multi30k_like(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("multi30k")
    write_corpus(root, 100, 0, "train")
    write_corpus(root, 20, 1, "valid")
    write_corpus(root, 12, 2, "test2016")
    return root


def test_dry_run_does_every_step_and_writes_its_records(multi30k_like, tmp_path):
    out = tmp_path / "out"
    every_step = "env,tests,train,decode,recipe,exported,serve,students"
    result = _check("--dry-run", "--only", every_step, "--out", str(out), "--data",
                    str(multi30k_like))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    summary = [json.loads(line) for line in (out / "summary.jsonl").read_text().splitlines()]
    assert [s["step"] for s in summary] == ["env", "tests", "train-tiny", "decode", "recipe",
                                            "exported", "serve", "students"]
    assert all(s["status"] == 0 for s in summary)
    assert json.loads((out / "env.json").read_text())["backend"] == "cpu"
    train = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()
             if line.startswith("{")]
    assert train and train[0]["tokens_per_s"] > 0
    decode = [json.loads(line) for line in (out / "decode.jsonl").read_text().splitlines()
              if line.startswith("{")]
    assert decode
    report = json.loads((out / "recipe.json").read_text())
    assert report["sentences"] == 12 and "bleu" in report
    exported = [json.loads(line) for line in (out / "exported.jsonl").read_text().splitlines()
                if line.startswith("{")]
    searched = {(e["system"], e["search"]) for e in exported if "bleu" in e}
    assert {("ours float32", "beam 4"), ("ours float32", "greedy"), ("ours bfloat16", "beam 4"),
            ("ours bfloat16", "greedy"), ("ctranslate2 float32", "beam 4"),
            ("ctranslate2 int8", "greedy")} <= searched, searched
    serve = json.loads((out / "serve.json").read_text())
    assert serve["batched"][0]["clients"] == 2 and serve["batched"][0]["errors"] == 0
    assert serve["batched"][0]["sentences"] > 0 and serve["ceiling"]["sent_per_s"] > 0
    calls = serve["calls"][0]
    assert calls["clients"] == 2 and calls["sentences"] == 12 and calls["sent_per_s"] > 0
    frontier = [json.loads(line) for line in (out / "frontier.jsonl").read_text().splitlines()
                if line.startswith("{")]
    measured = {(f["model"], f["system"]) for f in frontier if "bleu" in f}
    assert {(model, system) for model in ("teacher", "student-6-2") for system in (
        "ours float32", "ours float32 shortlist 64", "ctranslate2 int8",
        "ctranslate2 int8 vmap")} <= measured, measured
    assert all(f["sentences"] == 6 and f["sentences_per_s"] > 0 for f in frontier
               if "bleu" in f)
    table = (out / "frontier.jsonl").read_text().splitlines()  # and its table, a row each
    for model in ("teacher", "student-6-2"):
        assert sum(line.startswith(f"| {model} |") for line in table) == 4, table
    assert (out / "frontier.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "student" / "config.yaml").read_text().count("student-6-2") == 1
    host = json.loads((out / "recipe_host.json").read_text())
    assert host["status"] == 0 and host["command"][1] == "train.py"
    assert host["user_s"] > 0 and host["minor_faults"] > 0 and host["max_rss_mib"] > 0
    with tarfile.open(out / "gpu_check.tgz") as bundle:
        bundled = {Path(name).as_posix().removeprefix("./") for name in bundle.getnames()}
    assert {"summary.jsonl", "env.json", "train.jsonl", "recipe.json", "serve.json",
            "recipe_host.json", "tests.log"} <= bundled, bundled
    assert not any(name.endswith((".msgpack", ".model")) for name in bundled), bundled


def test_steps_past_the_deadline_are_skipped_and_recorded(tmp_path):
    """A call cut short still hands back what it has: each step that would start past
    --deadline is recorded with status 124, the exit status says the check is incomplete,
    and the bundle holds the records."""
    out = tmp_path / "out"
    result = _check("--dry-run", "--only", "env,tests", "--deadline", "1", "--out", str(out))
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    summary = [json.loads(line) for line in (out / "summary.jsonl").read_text().splitlines()]
    assert [(s["step"], s["status"]) for s in summary] == [("env", 124), ("tests", 124)]
    assert "skipped, the --deadline of 1 s has passed" in result.stdout
    with tarfile.open(out / "gpu_check.tgz") as bundle:
        assert "./summary.jsonl" in bundle.getnames()


@pytest.mark.parametrize("args,named", [
    (["--only", "train"], "JAX sees no GPU (backend 'cpu')"),
    (["--dry-run", "--only", "everything"], "unknown step 'everything'"),
    (["--dry-run", "--only", "recipe", "--data", "/nonexistent"], "train.en is missing"),
    (["--bogus"], "unknown argument '--bogus'"),
    (["--dry-run", "--recipe-minutes", "0"], "--recipe-minutes '0': give a positive number"),
    (["--dry-run", "--serve-seconds", "2.5"], "--serve-seconds '2.5': give a whole number"),
    (["--dry-run", "--deadline", "soon"], "--deadline 'soon': give a whole number of seconds"),
    (["--dry-run", "--only", "train", "--presets", "tiny,huge"], "unknown preset 'huge'"),
])
def test_what_it_cannot_do_is_one_line(args, named, tmp_path):
    result = _check(*args, "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check.sh: error: ") and named in lines[0]


def test_missing_packages_are_named(tmp_path):
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/bash\nexport PYTHONPATH=\n"
                    f"exec {os.environ.get('PYTHON_FOR_TESTS', 'python3')} -S \"$@\"\n")
    fake.chmod(0o755)
    result = _check("--dry-run", "--out", str(tmp_path / "out"),
                    env_extra={"PYTHON": str(fake)})
    assert result.returncode == 2
    assert "missing Python packages: jax" in result.stderr and "--wheels" in result.stderr
