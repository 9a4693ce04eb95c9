"""The library stays a library: `transformer/` builds, trains a step, searches and loads a
model without the application's dependencies, and `train.py --help` starts without JAX."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
APPLICATION_ONLY = ("orbax", "sacrebleu", "tqdm", "tensorboardX", "matplotlib", "datasets")

_USE_THE_LIBRARY = """
import json, sys
import numpy as np
from transformer import cache, config, decoding, ensemble, kernels, layers, model, model_dir
from transformer import training, translation

loaded, tokenizer, values = model_dir.load_model(sys.argv[1])
translator = translation.Translator(loaded, tokenizer, values["search"])
assert len(translator.translate(["Ein Mann liest."])) == 1
train_config = config.TrainConfig(warmup_steps=2)
mesh = training.make_mesh()
graphdef, _, state = training.create_train_state(values["model"], train_config, mesh)
step = training.make_train_step(graphdef, train_config, mesh)
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
