"""Encoder-decoder attention heatmaps: which source subwords each output subword attended to.

`cross_attention` runs the model teacher-forced on its own translation (BOS + output ids) and
returns one layer's attention, averaged over heads or of one head; `plot_attention` draws it
with matplotlib's Agg renderer straight to a file, so it needs no display and never touches
pyplot's global state.
"""

from __future__ import annotations

import argparse
import logging
import textwrap
from pathlib import Path
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from nmt.runtime.cli import UsageError
from nmt.runtime.files import atomic_file
from nmt.translation.errors import InputError

log = logging.getLogger("translate.py")


def check_layer_and_head(config, layer: int, head: int | None) -> None:
    """ValueError unless decoder layer `layer` and head `head` exist in a model of `config`."""
    if not -config.decoder_layers <= layer < config.decoder_layers:
        raise ValueError(f"attention layer {layer} does not exist: the decoder has "
                         f"{config.decoder_layers} layers (0..{config.decoder_layers - 1}, "
                         "or -1 for the last).")
    if head is not None and not 0 <= head < config.num_heads:
        raise ValueError(f"attention head {head} does not exist: the model has "
                         f"{config.num_heads} heads (0..{config.num_heads - 1}).")


def cross_attention(model, src_ids: Sequence[int], out_ids: Sequence[int], layer: int = -1,
                    head: int | None = None) -> np.ndarray:
    """Attention of output token t (row) over source token s (column): float32 [out, src].

    `src_ids` is the source as the encoder saw it (EOS included), `out_ids` the translation
    (EOS included). Row t is the attention while predicting `out_ids[t]`, i.e. with decoder
    input BOS + out_ids[:t]. `layer` indexes the decoder layers (negative counts from the
    last); `head` picks one head, None averages over all heads.
    """
    config = model.config
    check_layer_and_head(config, layer, head)
    if not src_ids or not out_ids:
        raise ValueError("cross_attention needs at least one source and one output token.")
    src = jnp.asarray([list(src_ids)], dtype=jnp.int32)  # [1, src_len]
    tgt_in = jnp.asarray([[config.bos_id, *out_ids[:-1]]], dtype=jnp.int32)  # [1, out_len]
    weights = np.asarray(model.cross_attention_weights(src, tgt_in))  # [L, 1, H, out, src]
    weights = weights[layer, 0]  # [H, out, src]
    return weights.mean(axis=0) if head is None else weights[head]


def plot_attention(weights: np.ndarray, src_labels: Sequence[str], out_labels: Sequence[str],
                   path: str | Path, title: str | None = None) -> Path:
    """Save `weights` [out, src] as a PNG (or any format matplotlib knows by the suffix)."""
    # matplotlib is optional (the `plot` extra): loaded only to draw.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    weights = np.asarray(weights, dtype=np.float32)
    if weights.shape != (len(out_labels), len(src_labels)):
        raise ValueError(f"attention weights have shape {weights.shape} but there are "
                         f"{len(out_labels)} output and {len(src_labels)} source labels.")
    # About a third of an inch per token, within limits that keep labels readable.
    width = min(max(4.0, 1.8 + 0.32 * len(src_labels)), 40.0)
    height = min(max(3.0, 1.2 + 0.32 * len(out_labels)), 40.0)
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    image = axes.imshow(weights, cmap="viridis", vmin=0.0, vmax=float(max(weights.max(), 1e-9)),
                        aspect="auto", interpolation="nearest")
    axes.set_xticks(range(len(src_labels)), list(src_labels), rotation=90, fontsize=8)
    axes.set_yticks(range(len(out_labels)), list(out_labels), fontsize=8)
    axes.set_xlabel("source")
    axes.set_ylabel("output")
    if title:
        # Wrapped to the figure's width (about 11 characters of 9-point text an inch): a
        # short sentence's narrow plot would cut a one-line title off.
        axes.set_title(textwrap.fill(title, max(20, int(width * 11))), fontsize=9)
    figure.colorbar(image, ax=axes, fraction=0.05, pad=0.02)
    path = Path(path)
    with atomic_file(path, "wb") as out:  # in the format the suffix names, PNG without one
        figure.savefig(out, format=path.suffix.lower().removeprefix(".") or "png", dpi=100)
    return path


# ----------------------------------------------------------------------------- translate.py


def save_attention_plot(model, tokenizer, translator, sentence: str, hypothesis,
                        args: argparse.Namespace) -> None:
    """Heatmap of the attention while the model, teacher-forced, reproduces `hypothesis`."""
    config = model.config
    src_ids = tokenizer.encode([sentence])[0][: translator.max_source_len - 1] + [config.eos_id]
    out_ids = list(hypothesis.tokens) + [config.eos_id]
    weights = cross_attention(model, src_ids, out_ids, args.attention_layer,
                              args.attention_head)
    layer = args.attention_layer % config.decoder_layers
    heads = "mean over heads" if args.attention_head is None else f"head {args.attention_head}"
    path = plot_attention(weights, tokenizer.pieces(src_ids), tokenizer.pieces(out_ids),
                          args.plot_attention,
                          title=f"encoder-decoder attention, decoder layer {layer}, {heads}")
    log.info("attention plot written to %s", path)


def check_plot_path(path: str) -> None:
    """--plot-attention's file, before the model loads: InputError without matplotlib,
    UsageError unless its suffix names a format matplotlib writes."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise InputError("--plot-attention needs matplotlib: pip install matplotlib "
                         "(or pip install -e '.[plot]').") from None
    kind = Path(path).suffix.lower().removeprefix(".")
    formats = FigureCanvasBase.get_supported_filetypes()
    if kind not in formats:
        found = f"its suffix .{kind} is no image format" if kind else "it has no suffix"
        raise UsageError(f"--plot-attention {path}: {found}; end the name in one of "
                         f"{', '.join('.' + f for f in sorted(formats))}.")


def check_plot_settings(model, args: argparse.Namespace) -> None:
    """translate.py's plot flags for `model`: UsageError for a layer or head the model does
    not have (matplotlib and the file were checked before it loaded: `check_plot_path`)."""
    try:
        check_layer_and_head(model.config, args.attention_layer, args.attention_head)
    except ValueError as err:
        raise UsageError(f"--attention-layer/--attention-head: {err}") from None
