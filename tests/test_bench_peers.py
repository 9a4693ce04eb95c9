"""How the benchmarks call the peers: the command per device and dtype, and peer_gpu.py's
command line (its timing needs a GPU and torch, so it is not run here)."""

import json
import sys
from pathlib import Path

import pytest

from bench import common, peer_gpu


@pytest.mark.parametrize("script, mode", sorted(common.GPU_PEER_MODES.items()))
def test_on_a_gpu_every_peer_runs_through_peer_gpu_in_the_runs_dtype(script, mode):
    command = common.peer_command(script, ["--batch", "8"], "bfloat16", gpu=True)
    assert Path(command[1]).name == "peer_gpu.py"
    assert command[2:] == [mode, "--peers-dir", str(common.PEERS), "--batch", "8",
                           "--dtype", "bfloat16"]


def test_on_a_cpu_the_peer_script_runs_itself_or_under_autocast():
    float32 = common.peer_command("hf_train_step.py", ["--steps", "3"], "float32", gpu=False)
    assert float32[1:] == [str(common.PEERS / "hf_train_step.py"), "--steps", "3"]
    bfloat16 = common.peer_command("hf_train_step.py", ["--steps", "3"], "bfloat16", gpu=False)
    assert Path(bfloat16[1]).name == "peer_autocast.py"
    assert bfloat16[2:] == ["bfloat16", str(common.PEERS / "hf_train_step.py"), "--steps", "3"]


@pytest.mark.parametrize("argv, message", [
    ([], "usage"),
    (["decode", "--peers-dir", "x"], "usage"),           # the mode is generate
    (["train", "--batch", "8"], "usage"),                # --peers-dir must come second
    (["train", "--peers-dir", "/nonexistent/peers"], "/nonexistent/peers: no common.py"),
])
def test_peer_gpu_refuses_a_bad_command_line_before_touching_torch(argv, message):
    with pytest.raises(SystemExit, match=message):
        peer_gpu.parse_args(argv)


@pytest.mark.skipif(not (common.PEERS / "common.py").exists(), reason="no peer scripts here")
def test_peer_gpu_takes_the_peers_flags_and_a_dtype(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))       # parse_args adds the peers' folder
    monkeypatch.delitem(sys.modules, "common", raising=False)
    mode, peers, args = peer_gpu.parse_args(
        ["generate", "--peers-dir", str(common.PEERS), "--preset", "small", "--beams", "4",
         "--dtype", "bfloat16"])
    assert (mode, args.dtype, args.beams, args.batch, args.src_len) == (
        "generate", "bfloat16", [4], 64, 20)
    assert peers.model_config(args).d_model == 256
    with pytest.raises(SystemExit):
        peer_gpu.parse_args(["train", "--peers-dir", str(common.PEERS), "--dtype", "int8"])


def test_a_ctranslate2_that_cannot_run_on_the_gpu_is_recorded_as_unavailable(
        monkeypatch, capsys, tmp_path):
    """A CUDA 12 build of CTranslate2 on a CUDA 13 machine imports, then fails at its first
    call: bench.exported records why and times nothing of it, instead of dying mid-run."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from types import SimpleNamespace

    from bench import exported

    class BrokenCudaTranslator:
        def __init__(self, *args, **kwargs):
            pass

        def translate_batch(self, *args, **kwargs):
            raise RuntimeError("Library libcublas.so.12 is not found or cannot be loaded")

    monkeypatch.setattr(ctranslate2, "Translator", BrokenCudaTranslator)
    reported = []
    usable = exported.compare_ctranslate2(
        SimpleNamespace(device="cuda"), tmp_path, work=None, tokenizer=None, values=None,
        ours={}, report=lambda *args, **kwargs: reported.append(args))
    assert usable is False and reported == []
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["system"] for r in records] == ["ctranslate2"]
    assert "libcublas.so.12" in records[0]["unavailable"]
