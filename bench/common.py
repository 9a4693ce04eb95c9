"""Shared pieces of the benchmarks: FLOP count, peak FLOP/s, memory, the peer scripts, JSON.

FLOP count of a training step (`train_flops`), the same formula as the peer benchmarks'
(../shared/tools/peers/README.md, "FLOP formula"), so MFU figures compare. Matmul work only;
with S = batch * src_len source tokens, T = batch * tgt_len target tokens, width d, FFN size
f, vocabulary V, Le encoder and Ld decoder layers, the multiply-adds of one forward pass are

      S*Le*(4*d*d + 2*d*f) + S*Le*2*src_len*d        encoder projections + FFN, attention
    + T*Ld*4*d*d + T*Ld*2*tgt_len*d                  decoder self-attention (all positions)
    + T*Ld*2*d*d + S*Ld*2*d*d + T*Ld*2*src_len*d     cross-attention (K, V from the memory)
    + T*Ld*2*d*f                                     decoder FFN
    + T*d*V                                          output projection

and FLOP per step = 3 (forward + backward) x 2 (FLOP per multiply-add) x that sum. Softmax,
LayerNorm, embedding lookups, the loss and the optimizer are not counted.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import platform
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from data.config import DataError
from data.lines import read_lines
from nmt.models.model_files import ModelDirError, read_model_config, resolve_model_dir
from nmt.runtime import allocator
from nmt.runtime.cli import EXIT_USAGE, OneLineParser, fail
from transformer.config import ModelConfig

REPO = Path(__file__).resolve().parents[1]
PEERS = Path(os.environ.get("NMT_PEERS_DIR") or REPO.parent / "shared" / "tools" / "peers")
PEER_PYTHON = Path(os.environ.get("NMT_PEER_PYTHON")
                   or Path.home() / ".cache" / "nmt-peers-venv" / "bin" / "python")

# Dense peak FLOP/s per device, by the start of jax's device_kind (bf16 tensor cores for
# GPUs; float32 would be far lower, so MFU of a float32 run on a GPU reads low).
GPU_PEAK_FLOPS = {
    "NVIDIA H100": 989e12,  # SXM, bf16 dense
    "NVIDIA H200": 989e12,
    "NVIDIA A100": 312e12,
}


def train_flops(config: ModelConfig, batch: int, src_len: int, tgt_len: int) -> float:
    """Model FLOP of one training step; see the module docstring."""
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    le, ld = config.encoder_layers, config.decoder_layers
    s, t = batch * src_len, batch * tgt_len
    encoder = s * le * (4 * d * d + 2 * d * f) + s * le * 2 * src_len * d
    decoder_self = t * ld * 4 * d * d + t * ld * 2 * tgt_len * d
    decoder_cross = t * ld * 2 * d * d + s * ld * 2 * d * d + t * ld * 2 * src_len * d
    decoder_ffn = t * ld * 2 * d * f
    output = t * d * v
    multiply_adds = encoder + decoder_self + decoder_cross + decoder_ffn + output
    return 3.0 * 2.0 * multiply_adds


def measured_matmul_flops(n: int = 2048, reps: int = 10, dtype: str = "float32") -> float:
    """Best FLOP/s of a jitted n x n @ n x n with `dtype` operands (float32 accumulation) on
    the default device."""
    key_a, key_b = jax.random.split(jax.random.PRNGKey(0))
    a = jax.random.normal(key_a, (n, n), dtype)
    b = jax.random.normal(key_b, (n, n), dtype)
    matmul = jax.jit(functools.partial(jnp.dot, preferred_element_type=jnp.float32))
    # The fastest call: other work on a shared machine only slows calls down.
    return 2.0 * n ** 3 / min(call_times(matmul, a, b, reps=reps))


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (counts of steps, calls, rows, tokens)."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0 (untimed warm-up steps)."""
    return _int_at_least(text, 0)


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0 (loss weights)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"{text} is not a finite number >= 0")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (seconds to wait)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text} is not a finite number > 0")
    return value


def _int_at_least(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{value} is below {least}")
    return value


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now, for a server to be started on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bench_prog() -> str:
    """The running benchmark as it is started, `python -m bench.NAME` (a benchmark imports
    the bench package, so runs only so), for its usage errors and --help to name."""
    return f"python -m bench.{Path(sys.argv[0]).stem}"


def bench_parser(description: str, **options: Any) -> argparse.ArgumentParser:
    """A parser whose every refusal is one line naming the flag (exit status 2), as
    translate.py's, and naming the benchmark as `bench_prog`; `options` as argparse's
    (formatter_class)."""
    return OneLineParser(prog=bench_prog(), description=description, **options)


@contextlib.contextmanager
def usage_errors(*also: type[Exception]):
    """Within it, a model directory or data file that cannot be used (ModelDirError,
    DataError: their messages name the path and what to do), or an error of the types `also`
    (a config's ValueError naming the setting given), ends the command with one line and
    exit status 2, not a traceback."""
    try:
        yield
    except (ModelDirError, DataError, *also) as error:
        fail(bench_prog(), str(error), EXIT_USAGE)  # as bench_parser names it


def test_set_parser(description: str) -> argparse.ArgumentParser:
    """A parser with the flags of the benchmarks that translate a real test set: the model,
    PREFIX.SRC and PREFIX.TGT."""
    parser = bench_parser(description)
    parser.add_argument("--model", required=True, help="model or run directory")
    parser.add_argument("--test-prefix", required=True, help="PREFIX.SRC and PREFIX.TGT")
    parser.add_argument("--src", required=True)
    parser.add_argument("--tgt", required=True)
    return parser


def read_test_set(args: argparse.Namespace, limit: int = 0) -> tuple[list[str], list[str]]:
    """(sources, references) of `test_set_parser`'s flags; the first `limit` pairs if > 0.
    Lines end at "\n" only, as translate.py reads them (`data.lines`). DataError naming both
    files where they differ in length, whatever `limit`: every pair after the first missing
    line would be scored against another sentence's reference."""
    paths = [f"{args.test_prefix}.{lang}" for lang in (args.src, args.tgt)]
    sources, references = (read_lines(path) for path in paths)
    if len(sources) != len(references):
        raise DataError(f"{paths[0]} has {len(sources)} lines but {paths[1]} has "
                        f"{len(references)}; give a source and a reference file of one line "
                        "per pair")
    return (sources[:limit], references[:limit]) if limit else (sources, references)


def model_pair(model: str) -> tuple[str, str]:
    """(source, target) recorded with `model`, a model or run directory: the pair the server
    serves it as. ModelDirError if it records none."""
    model_dir = resolve_model_dir(model)
    _, values = read_model_config(model_dir)
    pair = values.get("source_lang"), values.get("target_lang")
    if not all(pair):
        raise ModelDirError(f"{model_dir / 'config.json'} records no source_lang and "
                            "target_lang: export the model again from its run")
    return pair


def call_times(function, *args, reps: int) -> list[float]:
    """Seconds of `reps` calls of a jitted function, each until its result is ready, after
    two untimed calls (the first compiles)."""
    for _ in range(2):
        jax.block_until_ready(function(*args))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(function(*args))
        times.append(time.perf_counter() - start)
    return times


def peak_flops(dtype: str = "float32") -> tuple[float, str]:
    """(peak FLOP/s of one device for products with `dtype` operands, where it comes from)."""
    device = jax.devices()[0]
    if device.platform == "gpu":
        for kind, flops in GPU_PEAK_FLOPS.items():
            if device.device_kind.startswith(kind):
                return flops, f"table: {kind} bf16 dense"
    return (measured_matmul_flops(dtype=dtype),
            f"measured: jitted 2048^3 {dtype} jnp.dot (float32 accumulation), best of 10")


def peak_memory_bytes() -> tuple[int, str]:
    """Peak memory: device peak_bytes_in_use on accelerators, else the process's max RSS."""
    device = jax.devices()[0]
    stats = device.memory_stats() if device.platform != "cpu" else None
    if stats and "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"]), "device peak_bytes_in_use"
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return int(kib) * 1024, "process max RSS"


def on_gpu() -> bool:
    """Whether JAX's default device is a GPU (then the peers run on it too)."""
    return jax.devices()[0].platform == "gpu"


# The peers' CPU scripts and what bench/peer_gpu.py calls the same work on a GPU.
GPU_PEER_MODES = {"hf_train_step.py": "train", "hf_decode.py": "generate",
                  "ct2_decode.py": "ctranslate2"}


def peer_command(script: str, args: list[str], dtype: str, gpu: bool) -> list[str]:
    """The command line that runs peer `script` with `args`: on a GPU bench/peer_gpu.py in
    `dtype`; on a CPU the script itself, under bench/peer_autocast.py unless float32."""
    if gpu:
        return [str(PEER_PYTHON), str(REPO / "bench" / "peer_gpu.py"), GPU_PEER_MODES[script],
                "--peers-dir", str(PEERS), *args, "--dtype", dtype]
    if dtype != "float32":
        return [str(PEER_PYTHON), str(REPO / "bench" / "peer_autocast.py"), dtype,
                str(PEERS / script), *args]
    return [str(PEER_PYTHON), str(PEERS / script), *args]


def run_peer(script: str, args: list[str], timeout: float = 1800, many: bool = False,
             dtype: str = "float32") -> Any:
    """Run a peer script (../shared/tools/peers/<script>); its last JSON line, or all if `many`.

    On a GPU (JAX's default device) the same work runs on the GPU through bench/peer_gpu.py,
    in `dtype`. On a CPU, a `dtype` other than float32 runs the script under torch.autocast
    (bench/peer_autocast.py) and the records carry "peer_autocast". $NMT_PEER_PYTHON and
    $NMT_PEERS_DIR override where the peers' python and scripts are.
    """
    if not PEER_PYTHON.exists():
        raise SystemExit(f"No peer python at {PEER_PYTHON}; run {PEERS / 'setup.sh'} first, "
                         f"or set NMT_PEER_PYTHON to a python with torch and transformers.")
    command = peer_command(script, args, dtype, on_gpu())
    autocast = dtype if Path(command[1]).name == "peer_autocast.py" else None
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=peer_environment())
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    records = [json.loads(line) for line in lines]
    if autocast:
        for record in records:
            record["peer_autocast"] = autocast
    return records if many else records[-1]


def peer_environment() -> dict[str, str]:
    """This process's environment less the mimalloc our commands preload: a peer runs on the
    malloc its own users get."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    ours = allocator.loaded_library()
    if ours is not None:
        kept = [path for path in env.get("LD_PRELOAD", "").split() if Path(path) != ours]
        env["LD_PRELOAD"] = " ".join(kept)
    return env


def user_environment() -> dict[str, str]:
    """The environment a user's shell gives our commands: without the preload and the
    re-execution mark this process has, so a command started from it loads mimalloc itself,
    as it would from the shell, and that start-up is counted."""
    env = peer_environment()
    # Python writes bytecode as a user's does: the first run compiles this repository's
    # modules, the timed ones read them (a peer's installed modules came compiled).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop(allocator.REEXECUTED, None)
    for name in allocator.SETTINGS:
        env.pop(name, None)
    return env


def emit(record: dict[str, Any]) -> None:
    """One JSON line on stdout."""
    record.setdefault("machine", platform.machine())
    print(json.dumps(record), flush=True)


def environment() -> dict[str, Any]:
    device = jax.devices()[0]
    return {"jax": jax.__version__, "backend": device.platform,
            "device_kind": device.device_kind, "devices": jax.device_count(),
            "python": sys.version.split()[0], "allocator": allocator.status().allocator}
