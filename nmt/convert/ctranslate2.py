"""Our model directory -> a CTranslate2 model directory (float32, or quantized as CTranslate2
offers: int8, int8_float32, int16, float16, bfloat16, ...).

The weights are MarianMT's (`nmt.convert.marian.to_marian_state`: the residual stream in
sines-then-cosines order, which is CTranslate2's positional layout too), laid into
CTranslate2's `TransformerSpec` directly rather than through its MarianMT loader, which
assumes Marian's own ids (PAD last, the decoder starting from a zero vector). Here the
decoder starts from our BOS, EOS is added to every source (`add_source_eos`, as our
training did), and LayerNorm keeps the model's own epsilon, so the export is exact.

    import ctranslate2, sentencepiece
    translator = ctranslate2.Translator("exported/ct2")
    sp = sentencepiece.SentencePieceProcessor(model_file="exported/ct2/spm.model")
    result = translator.translate_batch([sp.encode("A dog.", out_type=str)], beam_size=4)
    print(sp.decode(result[0].hypotheses[0]))
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from nmt.convert.common import ConversionError, load_params, staged_directory, write_json
from nmt.convert.marian import to_marian_state
from nmt.models.model_files import (
    CONFIG_FILE,
    EXPORT_SETTINGS_FILE,
    EXPORT_WEIGHTS_FIELD,
    resolve_model_dir,
)
from transformer.atomic_files import atomic_file
from transformer.shortlist import SHORTLIST_FILE, Shortlist

# A model's shortlist as CTranslate2's vocabulary map, in the export (`write_vocabulary_map`).
VMAP_FILE = "vmap.txt"
QUANTIZATIONS = ("float32", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16",
                 "float16", "bfloat16")


def _linear(spec, state: dict[str, np.ndarray], *names: str) -> None:
    """Fill a LinearSpec with the named projections stacked along the output axis (one
    fused product for query, key and value)."""
    spec.weight = np.concatenate([state[f"{name}.weight"] for name in names], axis=0)
    spec.bias = np.concatenate([state[f"{name}.bias"] for name in names], axis=0)


def _norm(spec, state: dict[str, np.ndarray], name: str) -> None:
    spec.gamma = state[f"{name}.weight"]
    spec.beta = state[f"{name}.bias"]


def _attention(spec, state, prefix: str, self_attention: bool) -> None:
    q, k, v, out = (f"{prefix}.{p}_proj" for p in ("q", "k", "v", "out"))
    if self_attention:
        _linear(spec.linear[0], state, q, k, v)
    else:
        _linear(spec.linear[0], state, q)
        _linear(spec.linear[1], state, k, v)
    _linear(spec.linear[-1], state, out)


def _feed_forward(spec, state, prefix: str) -> None:
    _linear(spec.linear_0, state, f"{prefix}.fc1")
    _linear(spec.linear_1, state, f"{prefix}.fc2")
    _norm(spec.layer_norm, state, f"{prefix}.final_layer_norm")


def build_spec(params: Any, config, tokenizer):
    """A validated `ctranslate2.specs.TransformerSpec` holding our model."""
    from ctranslate2.specs import common_spec, transformer_spec

    # MarianMT's layout, with what CTranslate2's holds besides: pre-norm, learned positions.
    state = to_marian_state(params, config, ctranslate2=True)
    activation = {"relu": common_spec.Activation.RELU,
                  "swish": common_spec.Activation.SWISH}[config.activation]
    pre_norm = config.norm == "pre"
    # Attention returned (for word alignments) is the last decoder layer's, averaged over
    # all its heads, as `nmt.models.alignment` reads it.
    spec = transformer_spec.TransformerSpec.from_config(
        (config.encoder_layers, config.decoder_layers), config.num_heads, pre_norm=pre_norm,
        activation=activation, alignment_layer=-1, alignment_heads=config.num_heads)
    positions = state["model.encoder.embed_positions.weight"]
    if config.share_embeddings:
        source = target = output = state["model.shared.weight"]
    else:
        source = state["model.encoder.embed_tokens.weight"]
        target = state["model.decoder.embed_tokens.weight"]
        output = state["lm_head.weight"]

    encoder, decoder = spec.encoder, spec.decoder
    encoder.embeddings[0].weight = source
    decoder.embeddings.weight = target
    for side in (encoder, decoder):
        side.scale_embeddings = True  # sqrt(d_model)
        side.position_encodings.encodings = positions
    for i, layer in enumerate(encoder.layer):
        prefix = f"model.encoder.layers.{i}"
        _attention(layer.self_attention, state, f"{prefix}.self_attn", True)
        _norm(layer.self_attention.layer_norm, state, f"{prefix}.self_attn_layer_norm")
        _feed_forward(layer.ffn, state, prefix)
    for i, layer in enumerate(decoder.layer):
        prefix = f"model.decoder.layers.{i}"
        _attention(layer.self_attention, state, f"{prefix}.self_attn", True)
        _norm(layer.self_attention.layer_norm, state, f"{prefix}.self_attn_layer_norm")
        _attention(layer.attention, state, f"{prefix}.encoder_attn", False)
        _norm(layer.attention.layer_norm, state, f"{prefix}.encoder_attn_layer_norm")
        _feed_forward(layer.ffn, state, prefix)
    if pre_norm:  # the stacks' final LayerNorms
        _norm(encoder.layer_norm, state, "model.encoder.layer_norm")
        _norm(decoder.layer_norm, state, "model.decoder.layer_norm")
    decoder.projection.weight = output
    if config.output_bias:
        decoder.projection.bias = state["final_logits_bias"].reshape(-1)

    pieces = tokenizer.vocabulary()
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    spec.config.unk_token = pieces[config.unk_id]
    spec.config.bos_token = pieces[config.bos_id]
    spec.config.eos_token = pieces[config.eos_id]
    spec.config.decoder_start_token = pieces[config.bos_id]
    spec.config.add_source_eos = True
    spec.config.layer_norm_epsilon = config.layer_norm_epsilon
    spec.validate()
    return spec


def export_ctranslate2(model_path: str | Path, out_dir: str | Path,
                       quantization: str = "float32") -> Path:
    """Write a model directory as a CTranslate2 model directory, with the tokenizer's files
    (`spm.model`, or an imported model's source.spm, target.spm and vocab.json) beside it for
    tokenizing and the model's settings (EXPORT_SETTINGS_FILE, with the weight type stored as
    EXPORT_WEIGHTS_FIELD). Everything or nothing is written."""
    if quantization not in QUANTIZATIONS:
        raise ConversionError(f"quantization {quantization!r} is not one of CTranslate2's: "
                              f"{', '.join(QUANTIZATIONS)}.")
    _check_bfloat16_converter(quantization)
    params, tokenizer, values = load_params(model_path)
    spec = build_spec(params, values["model"], tokenizer)
    with warnings.catch_warnings():
        # bfloat16: CTranslate2 converts our read-only arrays with torch.from_numpy, which
        # warns of writes that nothing makes.
        warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
        spec.optimize(quantization=quantization)
    settings = json.loads((resolve_model_dir(model_path) / CONFIG_FILE).read_text("utf-8"))
    settings[EXPORT_WEIGHTS_FIELD] = quantization
    shortlist_path = resolve_model_dir(model_path) / SHORTLIST_FILE
    with staged_directory(out_dir) as tmp:
        spec.save(str(tmp))
        tokenizer.save(tmp)  # for tokenizing
        write_json(tmp / EXPORT_SETTINGS_FILE, settings)  # for translate.py --engine ctranslate2
        if shortlist_path.is_file():  # CTranslate2's translate_batch(use_vmap=True) reads it
            write_vocabulary_map(Shortlist.load(shortlist_path), tokenizer, tmp / VMAP_FILE)
    return Path(out_dir)


def _check_bfloat16_converter(quantization: str) -> None:
    """CTranslate2 converts weights to bfloat16 with torch: without it, say so before any work
    (CTranslate2 would stop halfway with a RuntimeError)."""
    if "bfloat16" not in quantization:
        return
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ConversionError(
            f"--quantization {quantization} needs torch, with which CTranslate2 converts weights "
            "to bfloat16, and it is not installed: pip install torch --index-url "
            "https://download.pytorch.org/whl/cpu (the CPU build), or choose another "
            "quantization (float16, int8_float16).") from None


def write_vocabulary_map(shortlist, tokenizer, path: str | Path) -> None:
    """The table as CTranslate2's vocabulary map: a line per source token with its target
    tokens, after a first line (empty source) of the tokens every batch gets."""
    with atomic_file(path, "w") as out:
        always = tokenizer.pieces(shortlist.by_frequency[:shortlist.always], "target")
        out.write("\t" + " ".join(always) + "\n")
        for source, targets in enumerate(shortlist.translations):
            targets = targets[targets >= 0]
            if source < shortlist.special or not len(targets):
                continue
            piece = tokenizer.pieces([source], "source")[0]
            out.write(f"{piece}\t{' '.join(tokenizer.pieces(targets, 'target'))}\n")

