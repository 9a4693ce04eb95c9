"""A Hugging Face MarianMT directory (any OPUS-MT checkpoint a user has downloaded) -> our
model directory, which translate.py loads and `train.py --init-from` fine-tunes.

    python -m nmt.convert from-marian opus-mt-en-de/ models/opus-mt-en-de

What is read: `config.json` (model_type "marian"), the weights (`model.safetensors`, or
`pytorch_model.bin` when torch is installed), the tokenizer files MarianTokenizer reads
(`source.spm`, `target.spm`, `vocab.json`, and the special tokens of
`special_tokens_map.json` or `tokenizer_config.json`) and, if present,
`generation_config.json`. The model keeps Marian's ids (`data.tokenizer.VocabTokenizer`), its
activation, its output bias and its LayerNorm epsilon; its search settings are those of
`generate` (beam size, len ** alpha length penalty, transformers' end-of-search rules), so that
translate.py reproduces transformers' output for it.

What cannot be expressed is refused by name: separate source and target vocabularies
(`target_vocab.json`, `separate_vocabs`), an activation other than relu or swish,
unscaled embeddings, different encoder and decoder widths.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from nmt.convert.common import ConversionError, check_output_dir
from nmt.convert.marian import MARIAN_LAYER_NORM_EPS, from_marian_state
from transformer.config import ModelConfig, SearchConfig

_ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish"}
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def _read_json(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise ConversionError(f"{path} is missing: {what}")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise ConversionError(f"{path} is not valid JSON ({err}); download the file again.")
    if not isinstance(value, dict):
        raise ConversionError(f"{path} must hold a JSON object.")
    return value


def read_marian_config(directory: Path) -> dict[str, Any]:
    """config.json of a MarianMT model, checked to be one we can express."""
    path = directory / "config.json"
    config = _read_json(path, "a MarianMT model directory has config.json (as "
                              "save_pretrained writes it); pass the directory of one")
    if config.get("model_type") != "marian":
        raise ConversionError(f"{path}: model_type is {config.get('model_type')!r}, not "
                              "'marian'; only MarianMT models (OPUS-MT) can be imported.")
    checks = [
        (config.get("activation_function", "gelu") in _ACTIVATIONS, "activation_function",
         "our feed-forward layers have relu or swish"),
        (config.get("scale_embedding", False), "scale_embedding",
         "our embeddings are always scaled by sqrt(d_model)"),
        (config.get("decoder_vocab_size") in (None, config.get("vocab_size")),
         "decoder_vocab_size", "our source and target share one vocabulary"),
        (config.get("encoder_attention_heads") == config.get("decoder_attention_heads"),
         "decoder_attention_heads", "our encoder and decoder have the same number of heads"),
        (config.get("encoder_ffn_dim") == config.get("decoder_ffn_dim"), "decoder_ffn_dim",
         "our encoder and decoder have the same feed-forward width"),
        (not config.get("normalize_before", False), "normalize_before",
         "MarianMT models are post-norm"),
    ]
    for ok, name, why in checks:
        if not ok:
            raise ConversionError(f"{path}: {name}={config.get(name)!r} cannot be imported "
                                  f"exactly: {why}.")
    if (directory / "target_vocab.json").is_file() or config.get("separate_vocabs"):
        raise ConversionError(f"{directory} has separate source and target vocabularies "
                              "(target_vocab.json): our model shares one vocabulary between "
                              "source and target; such checkpoints cannot be imported.")
    return config


def read_weights(directory: Path) -> dict[str, np.ndarray]:
    """The state dict, from model.safetensors (or pytorch_model.bin, which needs torch)."""
    if (directory / "model.safetensors").is_file():
        from safetensors.numpy import load_file
        try:
            return load_file(str(directory / "model.safetensors"))
        except Exception as err:  # noqa: BLE001 - safetensors' errors name no file
            raise ConversionError(f"{directory / 'model.safetensors'} cannot be read ({err}); "
                                  "download it again.") from None
    if (directory / "pytorch_model.bin").is_file():
        try:
            import torch
        except ImportError:
            raise ConversionError(
                f"{directory / 'pytorch_model.bin'} is a PyTorch file and torch is not "
                "installed: pip install torch, or convert it to model.safetensors") from None
        state = torch.load(directory / "pytorch_model.bin", map_location="cpu",
                           weights_only=True)
        return {name: value.float().numpy() for name, value in state.items()}
    raise ConversionError(f"{directory} has no weights ({' or '.join(_WEIGHT_FILES)}); "
                          "download the model's weights into it.")


def read_tokenizer(directory: Path, decoder_start: int | None = None):
    """MarianTokenizer's files as a VocabTokenizer (special tokens as its configs name them;
    the decoder starts from `decoder_start`, by default the pad id)."""
    from data.config import DataError
    from data.tokenizer import VocabTokenizer, read_special_tokens

    special: dict[str, str] = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if (directory / name).is_file():
            special.update(read_special_tokens(directory / name))
    special.pop("bos_token", None)  # MarianMT's decoder start is config.json's to say
    try:
        tokenizer = VocabTokenizer.load(directory, special)
        if decoder_start is None or decoder_start == tokenizer.ids.pad:
            return tokenizer
        # A decoder that starts from its own token (BOS), as models exported from here do.
        if decoder_start not in tokenizer.id_to_piece:
            raise ConversionError(f"{directory / 'config.json'}: decoder_start_token_id "
                                  f"{decoder_start} is not in vocab.json.")
        return VocabTokenizer(*tokenizer.sentencepiece_models(), tokenizer.vocab,
                              {**special, "bos_token": tokenizer.id_to_piece[decoder_start]})
    except DataError as err:
        raise ConversionError(f"{err}; download the tokenizer files with the model.") from None


def model_config(config: dict[str, Any], state: dict[str, np.ndarray], tokenizer,
                 path: Path) -> ModelConfig:
    """Our ModelConfig of a MarianMT config.json, its weights and its tokenizer."""
    ids = tokenizer.ids
    named = {"pad_token_id": ids.pad, "eos_token_id": ids.eos, "decoder_start_token_id": ids.bos}
    for name, value in named.items():
        if name in config and config[name] != value:
            raise ConversionError(f"{path / 'config.json'}: {name} is {config[name]} but the "
                                  f"tokenizer's vocab.json gives {value}; the files belong to "
                                  "different models.")
    embedding = state.get("model.shared.weight", state.get("model.encoder.embed_tokens.weight"))
    rows = None if embedding is None else embedding.shape[0]
    if rows is not None and rows != tokenizer.vocab_size:
        raise ConversionError(f"{path / 'vocab.json'} has {tokenizer.vocab_size} pieces but the "
                              f"weights' embedding has {rows} rows; the files belong to different "
                              "models.")
    if config.get("vocab_size", tokenizer.vocab_size) != tokenizer.vocab_size:
        raise ConversionError(f"{path / 'config.json'}: vocab_size is {config['vocab_size']} but "
                              f"vocab.json has {tokenizer.vocab_size} pieces.")
    bias = state.get("final_logits_bias")
    try:
        return ModelConfig(
            vocab_size=tokenizer.vocab_size, d_model=config["d_model"],
            num_heads=config["encoder_attention_heads"], d_ff=config["encoder_ffn_dim"],
            encoder_layers=config["encoder_layers"], decoder_layers=config["decoder_layers"],
            dropout=config.get("dropout", 0.1),
            attention_dropout=config.get("attention_dropout", 0.0),
            activation_dropout=config.get("activation_dropout", 0.0),
            activation=_ACTIVATIONS[config.get("activation_function", "gelu")],
            max_len=config.get("max_position_embeddings", 512),
            share_embeddings=config.get("share_encoder_decoder_embeddings", True),
            output_bias=bias is not None and bool(np.any(bias != 0)),
            layer_norm_epsilon=config.get("layer_norm_eps", MARIAN_LAYER_NORM_EPS),
            **ids.as_model_fields())
    except KeyError as err:
        raise ConversionError(f"{path / 'config.json'} has no {err.args[0]!r}.") from None
    except (ValueError, TypeError) as err:
        raise ConversionError(f"{path / 'config.json'}: {err}") from None


def search_config(directory: Path) -> SearchConfig:
    """generate's defaults of generation_config.json (else config.json) as search settings:
    its beam size and len ** alpha penalty, and transformers' rules for when beams finish."""
    path = directory / "generation_config.json"
    values = _read_json(path, "") if path.is_file() else _read_json(directory / "config.json", "")
    beams = int(values.get("num_beams") or 4)
    return SearchConfig(beam_size=beams, alpha=float(values.get("length_penalty", 1.0)),
                        length_penalty="power", beam_rules="transformers",
                        strategy="beam" if beams > 1 else "greedy")


def _check_shapes(found: Any, expected: Any, directory: Path) -> None:
    """Every weight has the shape config.json describes (a ConversionError names the first
    that does not)."""
    import jax

    shapes = {jax.tree_util.keystr(k): np.shape(v)
              for k, v in jax.tree_util.tree_leaves_with_path(found)}
    for key, leaf in jax.tree_util.tree_leaves_with_path(expected):
        name = jax.tree_util.keystr(key)
        if shapes.get(name) != tuple(leaf.shape):
            raise ConversionError(f"{directory}: the weights give {name} the shape "
                                  f"{shapes.get(name)} but config.json describes "
                                  f"{tuple(leaf.shape)}; the files belong to different models.")


def import_marian(marian_dir: str | Path, out_dir: str | Path) -> Path:
    """Write the MarianMT model in `marian_dir` as our model directory `out_dir`.

    Raises ConversionError naming the file or option that cannot be imported; writes
    everything or nothing.
    """
    from flax import nnx

    from nmt.models.model_dir import abstract_params, export_model

    directory, out = Path(marian_dir), Path(out_dir)
    if not directory.is_dir():
        raise ConversionError(f"{directory} is not a directory; pass a MarianMT model's "
                              "directory (config.json, weights, tokenizer files).")
    check_output_dir(out)
    raw = read_marian_config(directory)
    tokenizer = read_tokenizer(directory, raw.get("decoder_start_token_id"))
    state = read_weights(directory)
    config = model_config(raw, state, tokenizer, directory)
    pure = from_marian_state(state, config)
    _, params, _ = abstract_params(config)
    _check_shapes(pure, nnx.to_pure_dict(params), directory)
    nnx.replace_by_pure_dict(params, pure)
    languages = {key: raw[key] for key in ("source_lang", "target_lang") if key in raw}
    tok_config = directory / "tokenizer_config.json"
    if tok_config.is_file():
        languages.update({k: v for k, v in _read_json(tok_config, "").items()
                          if k in ("source_lang", "target_lang") and isinstance(v, str)})
    if out.exists():
        out.rmdir()  # empty (checked above); export_model writes it whole or not at all
    return export_model(out, params, config, tokenizer, search_config(directory),
                        {**languages, "imported_from": str(directory.resolve())})
