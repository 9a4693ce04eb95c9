"""How far the bfloat16 paths' gradients are from float32's, on one batch of real pairs.

    python -m bench.grad_precision --spm RUN/spm.model \\
        --prefix data/multi30k/train --src en --tgt de [--preset base]

Builds one batch from the first --rows pairs the trainer's filters keep at --width tokens
(EOS or BOS included; length ratio at most 9) and, as the trainer lays batches out, takes the
gradient of the label-smoothed token loss (no dropout) for the same initial parameters under
three settings of the model's dtypes, and prints one JSON line for each bfloat16 setting:

  products bfloat16, activations float32   the CPU default for --dtype bfloat16
  products bfloat16, activations bfloat16  the GPU and TPU default

with, over parameters, the relative error |g - g_float32| / |g_float32| (Frobenius norms):
its median, the worst parameters and the embedding table's. The key projections' biases are
left out: their true gradient is zero (a constant added to every score of a query changes no
softmax weight), so their relative error only compares rounding noise with rounding noise.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench.common import bench_prog, usage_errors
from data.batching import PlannedBatch, batch_arrays, load_examples
from data.config import BatchConfig, DataError
from data.corpus import read_prefix
from data.encoding import encode_split
from data.store import TokenStore
from data.tokenizer import Tokenizer
from transformer.config import get_preset
from transformer.model import Transformer
from transformer.training import _forward_sums

SETTINGS = (("bfloat16", "float32"), ("bfloat16", "bfloat16"))  # (products, activations)


def make_batch(encoded: TokenStore, rows: int, width: int) -> dict[str, jax.Array]:
    """src / tgt_in / tgt_out int32 [rows', width]: the first `rows` pairs of an encoded split
    that the trainer's filters keep at --max-tokens-per-sentence
    `width`, laid out as the trainer's batches are (EOS after the source, BOS before the
    target input, EOS after the target output, 0 pads)."""
    try:
        examples = load_examples(encoded, BatchConfig(max_len=width), "grad_precision")
    except DataError:  # its message names the trainer's flags
        raise DataError(f"none of the {len(encoded)} pairs fits --width {width} tokens (EOS or "
                        "BOS included, length ratio at most 9); raise --width") from None
    picked = PlannedBatch(width, width, np.arange(min(rows, len(examples))))
    return {name: jnp.asarray(ids) for name, ids in batch_arrays(examples, picked).items()}


def gradients(preset: str, vocab_size: int, batch: dict[str, jax.Array], dtype: str,
              activation_dtype: str, label_smoothing: float = 0.1) -> dict[str, np.ndarray]:
    """{parameter path: float64 gradient} of the mean token loss (the train step's, without
    dropout), parameters from seed 0."""
    config = get_preset(preset, vocab_size=vocab_size, dtype=dtype,
                        activation_dtype=activation_dtype)
    graphdef, params = nnx.split(Transformer(config, rngs=nnx.Rngs(0)), nnx.Param)

    def mean_loss(params):
        sums = _forward_sums(graphdef, params, batch, label_smoothing, rng=None)
        return sums["loss_sum"] / sums["tokens"]

    grads = jax.jit(jax.grad(mean_loss))(params)
    return {"/".join(map(str, path)): np.asarray(leaf[...], np.float64)
            for path, leaf in nnx.to_flat_state(grads)}


def relative_errors(grads: dict[str, np.ndarray], reference: dict[str, np.ndarray]
                    ) -> dict[str, float]:
    """{path: |g - ref| / |ref|} for every parameter but the key biases (see the docstring)."""
    return {path: float(np.linalg.norm(grads[path] - ref) / max(np.linalg.norm(ref), 1e-30))
            for path, ref in reference.items() if not path.endswith("key/bias")}


def summary(errors: dict[str, float], worst: int = 5) -> dict[str, Any]:
    ranked = sorted(errors.items(), key=lambda kv: -kv[1])
    table = [v for k, v in errors.items() if "embedding" in k]
    return {"median_rel_err": round(float(np.median(list(errors.values()))), 5),
            "worst": [[k, round(v, 5)] for k, v in ranked[:worst]],
            "embedding_rel_err": round(table[0], 5) if table else None}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=bench_prog(), description=__doc__.split("\n\n")[0])
    parser.add_argument("--spm", required=True, help="SentencePiece model, e.g. RUN/spm.model")
    parser.add_argument("--prefix", required=True, help="pairs in PREFIX.SRC and PREFIX.TGT")
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    parser.add_argument("--preset", default="base")
    parser.add_argument("--rows", type=int, default=340)
    parser.add_argument("--width", type=int, default=24)
    args = parser.parse_args(argv)

    with usage_errors():
        tokenizer = Tokenizer.load(args.spm)
        pairs = read_prefix(args.prefix, args.src, args.tgt)
        pairs = pairs.select(range(min(len(pairs), 20 * args.rows)))  # enough to fill the batch
        batch = make_batch(encode_split(pairs, tokenizer), args.rows, args.width)
    vocab = tokenizer.vocab_size
    reference = gradients(args.preset, vocab, batch, "float32", "float32")
    for dtype, activations in SETTINGS:
        errors = relative_errors(gradients(args.preset, vocab, batch, dtype, activations),
                                 reference)
        print(json.dumps({"preset": args.preset, "products": dtype, "activations": activations,
                          "pairs": int(batch["src"].shape[0]),
                          "target_tokens": int((batch["tgt_out"] != 0).sum()),
                          **summary(errors)}), flush=True)


if __name__ == "__main__":
    main()
