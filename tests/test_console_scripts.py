"""The installed commands (pyproject's [project.scripts]) run from any directory, and a
recipe path that is not found from the current directory is looked for in the project's
folder, with one line naming both places when neither holds it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.settings import recipes
from nmt.settings.config import SettingsError

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def script(name: str) -> str:
    path = BIN / name
    if not path.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{path} is not installed: pip install -e . installs it")
        pytest.skip(f"{name} is not installed here (pip install -e . installs it)")
    return str(path)


def run(tmp_path: Path, env, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)


def test_commands_run_from_another_directory(run_dir, env, tmp_path):
    done = run(tmp_path, env, script("nmt-translate"), "--model", str(run_dir), "-q",
               "Ein Mann fährt.")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1
    done = run(tmp_path, env, script("nmt-serve"), "--help")
    assert done.returncode == 0 and "--cors-origins" in done.stdout
    done = run(tmp_path, env, script("nmt-train"), "--config", "missing.yaml")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"train.py: error: --config missing.yaml: no such file in the current directory "
        f"({tmp_path / 'missing.yaml'}) nor in the project's folder ({REPO / 'missing.yaml'} "
        f"or {REPO / 'configs/missing.yaml'}); the recipes in {REPO / 'configs'}: "
        f"{', '.join(sorted(p.stem for p in (REPO / 'configs').glob('*.yaml')))} "
        "(--config NAME runs one)"]


def test_a_recipe_is_read_from_here_first_then_from_the_project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert recipes.find_recipe("configs/multi30k_cpu.yaml") == REPO / "configs/multi30k_cpu.yaml"
    mine = tmp_path / "configs" / "multi30k_cpu.yaml"
    mine.parent.mkdir()
    mine.write_text("train:\n  max_steps: 5\n")
    assert recipes.find_recipe("configs/multi30k_cpu.yaml") == Path("configs/multi30k_cpu.yaml")
    with pytest.raises(SettingsError, match="nor in the project's folder"):
        recipes.find_recipe("configs/none.yaml")


def test_a_shipped_recipe_is_found_by_its_name(tmp_path, monkeypatch):
    """`--config multi30k_cpu` or `multi30k_cpu.yaml` from anywhere is configs/multi30k_cpu.yaml;
    a name that is no recipe lists those that are."""
    monkeypatch.chdir(tmp_path)
    for name in ("multi30k_cpu", "multi30k_cpu.yaml"):
        assert recipes.find_recipe(name) == REPO / "configs/multi30k_cpu.yaml"
    with pytest.raises(SettingsError) as raised:
        recipes.find_recipe("multi30k_cpux")
    assert str(raised.value).endswith(
        f"{REPO / 'configs/multi30k_cpux.yaml'}); the recipes in {REPO / 'configs'}: "
        "enja_small, enja_student, multi30k_base_gpu, multi30k_cpu, multi30k_cpu_distilled, "
        "multi30k_gpu, multi30k_small, multi30k_student, wmt_base_paper (--config NAME runs "
        "one)"), raised.value


def test_a_cache_directory_that_cannot_be_written_is_one_line(run_dir, env, tmp_path):
    """train.py keeps the encoded corpus there: it stops, naming the directory and the fix;
    translating only loses the compiled programs it would keep: one warning, and it goes on."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    unwritable = {**env, "FLAX_NMT_CACHE": str(blocker / "cache")}
    done = run(tmp_path, unwritable, script("nmt-train"), "--max-steps", "1")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"train.py: error: the cache directory {blocker / 'cache'}: {blocker} is a file, not a "
        "directory; train.py keeps the encoded corpus and compiled programs there: set "
        "FLAX_NMT_CACHE to a writable directory."]
    done = run(tmp_path, unwritable, script("nmt-translate"), "--model", str(run_dir), "-q",
               "Ein Mann fährt.")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1
    # The untrained model's translation may reach its output limit: translate.py says so.
    lines = [line for line in done.stderr.strip().splitlines()
             if "reached the output limit" not in line]
    assert lines == [
        f"translate.py: WARNING: compiled programs are not kept, so every start "
        f"compiles them again: the cache directory {blocker / 'cache' / 'jax'}: {blocker} is a "
        "file, not a directory; set FLAX_NMT_CACHE to a writable directory"]
