"""A few train steps of the tiny model, run in this process or as a child process.

The parallelism tests compare runs on different device and process counts, which must be set
before JAX starts, so each such run is a child process:

    python tests/multiprocess_worker.py --devices 4 --out run.npz
    python tests/multiprocess_worker.py --devices 2 --num-processes 2 --process-id 0 \
        --port 12345 --out run0.npz          # and the same with --process-id 1

Every run starts from the same initialisation (seed 0) and sees the same global batches,
packed rows as the trainer feeds them (or pairs padded one per row with --padded); each
process feeds only its own rows, as a data loader would. The .npz holds the per-step
metrics and the final parameters, keyed by their path.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROWS = 8  # global rows per step: divisible by 1, 2 and 4 devices and by 2 micro-batches
SRC_LEN, TGT_LEN, VOCAB = 9, 7, 64


def make_batch(step: int, rows: int = ROWS, packed: bool = True) -> dict[str, np.ndarray]:
    """A batch of random pairs of varied lengths: packed rows of width SRC_LEN, or one pair
    per row (the last row all padding)."""
    if packed:
        return make_packed_batch(step, rows)
    rng = np.random.default_rng(1000 + step)
    src = np.zeros((rows, SRC_LEN), np.int32)
    tgt_in = np.zeros((rows, TGT_LEN), np.int32)
    tgt_out = np.zeros((rows, TGT_LEN), np.int32)
    for row in range(rows - 1):
        n_src = rng.integers(1, SRC_LEN)            # tokens before EOS
        n_tgt = rng.integers(1, TGT_LEN)
        src[row, :n_src] = rng.integers(4, VOCAB, n_src)
        src[row, n_src] = 3
        target = rng.integers(4, VOCAB, n_tgt)
        tgt_in[row, 0] = 2
        tgt_in[row, 1:n_tgt + 1] = target
        tgt_out[row, :n_tgt] = target
        tgt_out[row, n_tgt] = 3
    return {"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out}


def make_packed_batch(step: int, rows: int = ROWS) -> dict[str, np.ndarray]:
    """`rows` packed rows of width SRC_LEN holding random pairs (`data.packing`); the last row
    empty, and every pair's target shorter than its source, as TGT_LEN < SRC_LEN above."""
    from data.batching import Examples
    from data.packing import PackedBatch, pack_rows, packed_arrays
    from data.store import Ragged, TokenStore

    rng = np.random.default_rng(2000 + step)
    src_len = rng.integers(2, SRC_LEN // 2, 3 * rows)          # tokens + EOS
    tgt_len = rng.integers(2, SRC_LEN // 2, 3 * rows)          # BOS + tokens
    order = np.arange(3 * rows)
    packed = pack_rows(src_len, tgt_len, order, SRC_LEN)[:rows - 1]
    src = Ragged(rng.integers(4, VOCAB, int(src_len.sum())).astype(np.int32),
                 np.concatenate([[0], np.cumsum(src_len - 1)]))
    tgt = Ragged(rng.integers(4, VOCAB, int(tgt_len.sum())).astype(np.int32),
                 np.concatenate([[0], np.cumsum(tgt_len - 1)]))
    pairs = Examples.of_store(TokenStore(src, tgt))
    empty = [np.zeros(0, np.int64)] * (rows - len(packed))
    return packed_arrays(pairs, PackedBatch.of_rows(SRC_LEN, packed + empty))


def run(num_steps: int = 3, dropout: float = 0.1, accum_steps: int = 1,
        devices=None, packed: bool = True) -> dict[str, np.ndarray]:
    """Train `num_steps` steps on `devices` (default: all, of all processes).

    Returns {"metric/<name>": [num_steps] values, "param/<path>": final values}.
    """
    import jax

    from transformer import training
    from transformer.config import get_preset

    model_config = get_preset("tiny", dropout=dropout, attention_dropout=dropout,
                              activation_dropout=dropout)
    optimizer_config = training.OptimizerConfig(schedule="inverse_sqrt", peak_lr=3e-3,
                                                warmup_steps=2, accum_steps=accum_steps,
                                                clip_norm=1.0)
    mesh = training.make_mesh(devices)
    graphdef, _, state = training.create_train_state(model_config, optimizer_config, mesh)
    train_step = training.make_train_step(graphdef, optimizer_config, mesh)

    process, processes = jax.process_index(), jax.process_count()
    local_rows = ROWS // processes
    history: dict[str, list[np.ndarray]] = {}
    for step in range(num_steps):
        batch = make_batch(step, packed=packed)
        local = {k: v[process * local_rows:(process + 1) * local_rows] for k, v in batch.items()}
        state, metrics = train_step(state, training.shard_batch(local, mesh))
        for name, value in metrics.items():
            history.setdefault(name, []).append(_local_value(value))

    out = {f"metric/{name}": np.stack(values) for name, values in history.items()}
    for path, value in jax.tree_util.tree_leaves_with_path(state.params):
        out["param/" + jax.tree_util.keystr(path)] = _local_value(value)
    return out


def _local_value(x) -> np.ndarray:
    """A replicated array's value, read from this process's first copy."""
    return np.asarray(x.addressable_data(0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--devices", type=int, required=True, help="CPU devices in this process")
    ap.add_argument("--num-processes", type=int, default=1)
    ap.add_argument("--process-id", type=int, default=0)
    ap.add_argument("--port", type=int, help="coordinator port (with --num-processes > 1)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--accum-steps", type=int, default=1)
    ap.add_argument("--padded", action="store_true", help="one pair per row, not packed")
    ap.add_argument("--out", required=True, help=".npz this process writes")
    args = ap.parse_args()

    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={args.devices}")
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    if args.num_processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}",
                                   num_processes=args.num_processes,
                                   process_id=args.process_id)
    assert jax.device_count() == args.devices * args.num_processes, jax.devices()
    result = run(args.steps, args.dropout, args.accum_steps, packed=not args.padded)
    if args.num_processes > 1:
        jax.distributed.shutdown()
    np.savez(args.out, **result)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
