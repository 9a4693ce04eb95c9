"""How far the bfloat16 paths' gradients are from float32's, on one batch of real pairs.

    python -m bench.grad_precision --spm RUN/spm.model \\
        --prefix ../shared/data/multi30k/train --src en --tgt de [--preset base]

Builds one batch from the first --rows pairs that fit --width tokens on both sides, takes the
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

from transformer.config import get_preset
from transformer.model import Transformer
from transformer.training import token_loss_sums

SETTINGS = (("bfloat16", "float32"), ("bfloat16", "bfloat16"))  # (products, activations)


def make_batch(sources: list[list[int]], targets: list[list[int]], rows: int, width: int,
               bos_id: int = 2, eos_id: int = 3) -> dict[str, jax.Array]:
    """src / tgt_in / tgt_out int32 [rows', width] from the first pairs that fit `width`
    (EOS on the source and target side, BOS before the target input; 0 pads)."""
    src, tgt_in, tgt_out = [], [], []
    for source, target in zip(sources, targets):
        if len(source) + 1 > width or len(target) + 1 > width:
            continue
        pad = lambda ids: ids + [0] * (width - len(ids))  # noqa: E731
        src.append(pad(source + [eos_id]))
        tgt_in.append(pad([bos_id] + target))
        tgt_out.append(pad(target + [eos_id]))
        if len(src) == rows:
            break
    if not src:
        raise ValueError(f"no pair fits --width {width} tokens; raise --width")
    return {name: jnp.array(rows_, jnp.int32)
            for name, rows_ in (("src", src), ("tgt_in", tgt_in), ("tgt_out", tgt_out))}


def gradients(preset: str, vocab_size: int, batch: dict[str, jax.Array], dtype: str,
              activation_dtype: str, label_smoothing: float = 0.1) -> dict[str, np.ndarray]:
    """{parameter path: float64 gradient} of the mean token loss, parameters from seed 0."""
    config = get_preset(preset, vocab_size=vocab_size, dtype=dtype,
                        activation_dtype=activation_dtype)
    graphdef, params = nnx.split(Transformer(config, rngs=nnx.Rngs(0)), nnx.Param)

    def mean_loss(params):
        model = nnx.merge(graphdef, params)
        logits = model(batch["src"], batch["tgt_in"], rng=None)
        sums = token_loss_sums(logits, batch["tgt_out"], label_smoothing, config.pad_id)
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
    from data.tokenizer import Tokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spm", required=True, help="SentencePiece model, e.g. RUN/spm.model")
    parser.add_argument("--prefix", required=True, help="pairs in PREFIX.SRC and PREFIX.TGT")
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    parser.add_argument("--preset", default="base")
    parser.add_argument("--rows", type=int, default=340)
    parser.add_argument("--width", type=int, default=24)
    args = parser.parse_args(argv)

    tokenizer = Tokenizer.load(args.spm)
    lines = {}
    for lang in (args.src, args.tgt):
        with open(f"{args.prefix}.{lang}", encoding="utf-8") as f:
            lines[lang] = f.read().splitlines()[: 20 * args.rows]
    batch = make_batch(tokenizer.encode(lines[args.src]), tokenizer.encode(lines[args.tgt]),
                       args.rows, args.width)
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
