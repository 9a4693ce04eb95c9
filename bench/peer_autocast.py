"""Runs a peer benchmark script under torch.autocast:
`python peer_autocast.py bfloat16 SCRIPT ARGS`.

The peer's own scripts (../shared/tools/peers) time transformers in float32 only. For the
bfloat16 comparison, `python -m bench.train --dtype bfloat16 --compare` runs the unchanged
script inside `torch.autocast("cpu", dtype=torch.bfloat16)`, PyTorch's mixed precision for
CPUs: linear layers and matrix products in bfloat16 (oneDNN, AMX where the CPU has it),
LayerNorm, softmax and the loss in float32, float32 master weights and Adam. That is the
same split as ours with `--dtype bfloat16` on CPU.

Runs with the peers' python (torch installed), not ours: it imports nothing of this project.
"""

import runpy
import sys
from pathlib import Path

import torch


def main() -> None:
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
        return
    if len(sys.argv) < 3:
        raise SystemExit(f"usage: {sys.argv[0]} DTYPE SCRIPT [ARGS...]")
    dtype_name, script = sys.argv[1], Path(sys.argv[2])
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise SystemExit(f"{dtype_name!r} is not a torch dtype; pass e.g. bfloat16.")
    sys.path.insert(0, str(script.parent))     # the peers import their common.py
    sys.argv = [str(script), *sys.argv[3:]]
    with torch.autocast("cpu", dtype=dtype):
        runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
