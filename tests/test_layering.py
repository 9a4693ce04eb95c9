"""The layers stay layers. Our own imports run one way (`transformer` <- `data` <- `nmt` <-
the scripts, and within `nmt` from plumbing up to the commands), with no cycle; the library
builds, trains a step and searches, and a model directory loads and translates, without the
training application's dependencies; `train.py --help` starts without JAX."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
APPLICATION_ONLY = ("orbax", "sacrebleu", "tqdm", "tensorboardX", "matplotlib", "datasets")

# Who may import whom. A module may import its own package and the layers listed for it;
# `nmt`'s subpackages are ordered from process plumbing up to the commands.
NMT_ORDER = ("runtime", "models", "convert", "engines", "settings", "rundir", "translation",
             "distillation", "serving", "training")
SCRIPTS = ("train", "translate")


def _layer(module: str) -> tuple[int, int]:
    """(top-level rank, rank within nmt) of a module of ours."""
    parts = module.split(".")
    if parts[0] == "transformer":
        return 0, 0
    if parts[0] == "data":
        return 1, 0
    if parts[0] == "nmt":
        return 2, (NMT_ORDER.index(parts[1]) + 1 if len(parts) > 2 else 0)
    return 3, 0  # train.py, translate.py


# What `data` may take from the library: neither imports JAX. `config` holds the `setting`
# that data's settings use; `atomic_files` is the one way to write a file whole.
DATA_USES = ("transformer.config", "transformer.atomic_files")


def _may_import(importer: str, imported: str) -> bool:
    if importer.startswith("data.") and imported.startswith("transformer."):
        return imported in DATA_USES
    if importer.split(".")[:2] == imported.split(".")[:2]:
        return True  # within one package
    return _layer(imported) <= _layer(importer)


def _our_modules() -> dict[str, Path]:
    paths = [*REPO.glob("transformer/**/*.py"), *REPO.glob("data/**/*.py"),
             *REPO.glob("nmt/**/*.py"), *(REPO / f"{name}.py" for name in SCRIPTS)]
    modules = {}
    for path in paths:
        parts = path.relative_to(REPO).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of ours it imports, function-local imports included."""
    modules = _our_modules()
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                    + ([base] if base else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            else:
                continue
            imported |= {target for target in targets if target in modules and target != name}
        graph[name] = imported
    return graph


def test_the_import_graph_sees_function_local_imports():
    graph = import_graph()
    assert "nmt.training.trainer" in graph["nmt.training.command"]  # imported inside _run
    assert graph["transformer.kernels"] == {"transformer.config"}


def test_imports_run_one_way():
    against = sorted(f"{importer} -> {imported}"
                     for importer, targets in import_graph().items()
                     for imported in targets if not _may_import(importer, imported))
    assert not against, against


def test_the_layer_rule_refuses_what_it_should():
    assert not _may_import("transformer.model", "data.tokenizer")
    assert not _may_import("data.batching", "transformer.model")
    assert not _may_import("data.encoding", "transformer.stored")
    assert not _may_import("nmt.models.translator", "nmt.settings.config")
    assert not _may_import("nmt.settings.recipes", "translate")
    assert _may_import("nmt.training.trainer", "nmt.models.model_dir")


def test_what_data_takes_from_the_library_loads_no_jax():
    code = f"import sys, {', '.join(DATA_USES)}\nprint('jax' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr[-2000:]


def test_no_import_cycles():
    graph = import_graph()
    cycles, state = [], {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                cycles.append(" -> ".join(path[path.index(imported):] + [imported]))
            elif imported not in state:
                visit(imported, path + [imported])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, cycles

_USE_THE_LIBRARY = """
import json, sys
import numpy as np
from transformer import cache, config, ensemble, kernels, layers, model, search, training
from nmt.models import model_dir, translator

loaded, tokenizer, values = model_dir.load_model(sys.argv[1])
searcher = translator.Translator(loaded, tokenizer, values["search"])
assert len(searcher.translate(["Ein Mann liest."])) == 1
optimizer_config = config.OptimizerConfig(warmup_steps=2)
mesh = training.make_mesh()
graphdef, _, state = training.create_train_state(values["model"], optimizer_config, mesh)
step = training.make_train_step(graphdef, optimizer_config, mesh)
batch = {k: np.full((2, 4), 5, np.int32) for k in ("src", "tgt_in", "tgt_out")}
state, metrics = step(state, training.shard_batch(batch, mesh))
loaded_modules = sorted({name.split(".")[0] for name in sys.modules})
print(json.dumps(loaded_modules))
"""


def test_the_library_loads_none_of_the_application_dependencies(tmp_path):
    from translate_model import make_model

    run_dir = make_model(tmp_path)
    result = subprocess.run([sys.executable, "-c", _USE_THE_LIBRARY, str(run_dir)], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = set(json.loads(result.stdout.splitlines()[-1]))
    assert "jax" in loaded and "flax" in loaded  # it did run
    assert loaded.isdisjoint(APPLICATION_ONLY), sorted(loaded & set(APPLICATION_ONLY))


def test_train_py_help_imports_no_jax():
    code = ("import runpy, sys\n"
            "sys.argv = ['train.py', '--help']\n"
            "try:\n"
            "    runpy.run_path('train.py', run_name='__main__')\n"
            "except SystemExit:\n"
            "    pass\n"
            "print('JAX LOADED' if 'jax' in sys.modules else 'NO JAX', file=sys.stderr)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert "--warmup N" in result.stdout and "--max-tokens-per-sentence N" in result.stdout
    assert result.stderr.strip().endswith("NO JAX"), result.stderr[-2000:]


_WRITE_METRICS = """
import json, sys
from pathlib import Path
from nmt.training.metrics_log import MetricsWriter
writer = MetricsWriter(Path(sys.argv[1]), resume_step=0, enabled=True)
writer.write("train", 1, {"loss": 2.5})
loaded_torch = "torch" in sys.modules
import torch  # still importable afterwards
print(json.dumps([loaded_torch, writer.tb is not None, torch.tensor([1.0]).sum().item()]))
"""


def test_the_metrics_writer_leaves_torch_unloaded_and_importable(tmp_path):
    """tensorboardX imports torch when it is installed (2 s at every start of train.py); the
    writer imports it without, and torch stays importable for whoever needs it later."""
    pytest.importorskip("torch")
    result = subprocess.run([sys.executable, "-c", _WRITE_METRICS, str(tmp_path)], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1]) == [False, True, 1.0]
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
