"""A Hugging Face MarianMT directory (any OPUS-MT checkpoint a user has downloaded) -> our
model directory, which translate.py loads and `train.py --init-from` fine-tunes.

    python -m nmt.convert from-marian opus-mt-en-de/ models/opus-mt-en-de

What is read: `config.json` (model_type "marian"), the weights (`model.safetensors`, or
`pytorch_model.bin` when torch is installed), the tokenizer files MarianTokenizer reads
(`source.spm`, `target.spm`, `vocab.json`, and the special tokens of
`special_tokens_map.json` or `tokenizer_config.json`) and, if present,
`generation_config.json`. The model keeps Marian's ids (`data.tokenizer.VocabTokenizer`), its
activation, its output bias and its LayerNorm epsilon; its search settings are those of
`generate` (`nmt.convert.generation`: beam size or sampling, len ** alpha length penalty,
transformers' end-of-search rules, length limits, n-best), so that translate.py reproduces
transformers' output for it, except for a model exported from here, whose
generation_config.json carries its own (`nmt.convert.marian.SEARCH_FIELD`).

What cannot be expressed is refused by name: separate source and target vocabularies
(`target_vocab.json`, `separate_vocabs`), an activation other than relu or swish,
unscaled embeddings, different encoder and decoder widths. Files that do not describe one
model are refused too, before anything is written: a config.json without a dimension, weights
of other shapes than config.json gives, weights it does not account for (layers beyond
`encoder_layers`, say), SentencePiece models whose pieces vocab.json lacks.
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from nmt.convert.common import (
    ConversionError,
    DamagedFile,
    check_output_dir,
    is_ctranslate2_export,
    staged_directory,
)
from nmt.convert.generation import (
    REPLACING_LENGTHS,
    generate_settings,
    search_from_generate,
    warn_of_ignored,
)
from nmt.convert.marian import MARIAN_LAYER_NORM_EPS, SEARCH_FIELD, from_marian_state, marian_shapes
from nmt.models.model_files import PARAMS_FILE
from transformer.config import ModelConfig, SearchConfig

log = logging.getLogger(__name__)

_ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish"}
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# What config.json must give: transformers would fill a missing one with a default that is
# not the checkpoint's.
_DIMENSIONS = ("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
               "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim")
# config.json's integers, each with its least value (a token id may be 0).
_INTEGERS = {**dict.fromkeys((*_DIMENSIONS, "vocab_size", "decoder_vocab_size",
                              "max_position_embeddings"), 1),
             **dict.fromkeys(("pad_token_id", "eos_token_id", "decoder_start_token_id"), 0)}
_FRACTIONS = ("dropout", "attention_dropout", "activation_dropout", "layer_norm_eps")
# config.json's names of the ModelConfig fields whose names differ, for ModelConfig's errors.
_CONFIG_KEYS = {"num_heads": "encoder_attention_heads", "d_ff": "encoder_ffn_dim",
                "max_len": "max_position_embeddings", "layer_norm_epsilon": "layer_norm_eps",
                "share_embeddings": "share_encoder_decoder_embeddings"}
# OPUS-MT's vocab.json numbers the pieces of its training data, so a few pieces of its
# SentencePiece models may be missing (they read as unknown, in Marian too); more than this
# share means the files belong to different models.
MAX_MISSING_PIECES = 0.01


def _read_json(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise ConversionError(f"{path} is missing: {what}")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise DamagedFile(f"{path} is not valid JSON ({err}); download the file again.") from None
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
    for name in _DIMENSIONS:
        if name not in config:
            raise ConversionError(f"{path} has no {name!r}; add the value the weights were "
                                  "trained with, or use the config.json that came with them.")
    _check_numbers(config, path)
    checks = [
        (config.get("activation_function", "gelu") in _ACTIVATIONS, "activation_function",
         "our feed-forward layers have relu or swish"),
        (config.get("scale_embedding", False), "scale_embedding",
         "our embeddings are always scaled by sqrt(d_model)"),
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


def _check_numbers(config: dict[str, Any], path: Path) -> None:
    """Each numeric field of config.json that the import reads is a number of its kind, so
    that an error names the field (not a comparison of the values of two)."""
    def wrong(name: str, what: str) -> ConversionError:
        return ConversionError(f"{path}: {name} is {config[name]!r} but must be {what}; use the "
                               "config.json that came with the weights.")

    for name, least in _INTEGERS.items():
        value = config.get(name)
        if name in config and not (name == "decoder_vocab_size" and value is None):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                kind = "a positive integer" if least else "a token id (an integer >= 0)"
                raise wrong(name, kind)
    for name in _FRACTIONS:
        value = config.get(name)
        if name in config and (isinstance(value, bool) or not isinstance(value, (int, float))
                               or not math.isfinite(value) or value < 0):
            raise wrong(name, "a number >= 0")


def weights_file(directory: Path) -> Path:
    """model.safetensors, else pytorch_model.bin."""
    for name in _WEIGHT_FILES:
        if (directory / name).is_file():
            return directory / name
    raise ConversionError(f"{directory} has no weights ({' or '.join(_WEIGHT_FILES)}); "
                          "download the model's weights into it.")


def read_weights(path: Path) -> dict[str, np.ndarray]:
    """The state dict in model.safetensors (or pytorch_model.bin, which needs torch)."""
    if path.suffix == ".safetensors":
        from safetensors.numpy import load_file
        try:
            return load_file(str(path))
        except Exception as err:  # noqa: BLE001 - safetensors' errors name no file
            raise DamagedFile(f"{path} cannot be read ({_one_line(err)}); download it "
                              "again.") from None
    try:
        import torch
    except ImportError:
        raise ConversionError(f"{path} is a PyTorch file and torch is not installed: pip "
                              "install torch, or convert it to model.safetensors") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch's errors name no file
        raise _torch_failure(path, err) from None
    return {name: value.float().numpy() for name, value in state.items()}


def _torch_failure(path: Path, err: Exception) -> ConversionError:
    """Why torch.load failed, in words: for a file that is not a zip archive (torch.save's
    format) torch falls back to its legacy unpickler, whose errors say nothing (KeyError(36)).
    A file misnamed is the command's mistake; any other, a damaged file."""
    with open(path, "rb") as f:
        head = f.read(9)
    if head[8:9] == b"{" and head[:4] != b"PK\x03\x04":  # an 8-byte header length, then JSON
        return ConversionError(f"{path} cannot be read: it holds safetensors data, not a "
                               "PyTorch checkpoint; rename it model.safetensors.")
    if head[:4] == b"PK\x03\x04":
        return DamagedFile(f"{path} cannot be read: a damaged or truncated zip archive "
                           f"({_one_line(err)}); download it again.")
    return DamagedFile(f"{path} cannot be read: not a PyTorch checkpoint (torch.save's zip "
                       f"archive), or a truncated one ({path.stat().st_size} bytes); download it "
                       "again.")


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())[:300] or type(err).__name__


def read_tokenizer(directory: Path, decoder_start: int | None = None):
    """MarianTokenizer's files as a VocabTokenizer (special tokens as its configs name them;
    the decoder starts from `decoder_start`, by default the pad id)."""
    from data.config import DataError
    from data.tokenizer import (
        SOURCE_SPM,
        TARGET_SPM,
        VOCAB_FILE,
        VocabTokenizer,
        read_special_tokens,
    )

    special: dict[str, str] = {}
    try:
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            if (directory / name).is_file():
                special.update(read_special_tokens(directory / name))
        special.pop("bos_token", None)  # MarianMT's decoder start is config.json's to say
        tokenizer = VocabTokenizer.load(directory, special)
        if decoder_start is None or decoder_start == tokenizer.ids.pad:
            return tokenizer
        # A decoder that starts from its own token (BOS), as models exported from here do.
        if decoder_start not in tokenizer.id_to_piece:
            raise ConversionError(f"{directory / 'config.json'}: decoder_start_token_id "
                                  f"{decoder_start} is not in vocab.json.")
        return VocabTokenizer(*tokenizer.sentencepiece_models(), tokenizer.vocab,
                              {**special, "bos_token": tokenizer.id_to_piece[decoder_start]})
    except DataError as err:  # a file left out is the command's mistake; any other, damaged
        whole = all((directory / name).is_file() for name in (SOURCE_SPM, TARGET_SPM, VOCAB_FILE))
        raise (DamagedFile if whole else ConversionError)(
            f"{err}; download the tokenizer files with the model.") from None


def check_pieces(directory: Path, tokenizer) -> None:
    """Refuse SentencePiece models more than MAX_MISSING_PIECES of whose pieces vocab.json
    lacks (they belong to another model: its pieces would read as unknown); a warning counts
    the few that OPUS-MT's own may lack."""
    from data.tokenizer import SOURCE_SPM, TARGET_SPM

    for name, processor in ((SOURCE_SPM, tokenizer.source), (TARGET_SPM, tokenizer.target)):
        pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())
                  if not (processor.is_control(i) or processor.is_unknown(i))]
        missing = [piece for piece in pieces if piece not in tokenizer.vocab]
        if not missing:
            continue
        what = (f"{directory / name}: {len(missing)} of its {len(pieces)} pieces are not in "
                f"vocab.json ({', '.join(map(repr, missing[:3]))}{', ...' * (len(missing) > 3)})")
        if len(missing) > MAX_MISSING_PIECES * len(pieces):
            raise ConversionError(
                f"{what}, so they would read as unknown: the SentencePiece model and vocab.json "
                f"belong to different models (at most {MAX_MISSING_PIECES:.0%} of its pieces may "
                "be missing); use the tokenizer files that came with the weights.")
        log.warning("%s; they read as unknown, as in Marian.", what)


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
    for name in ("vocab_size", "decoder_vocab_size"):  # the one that disagrees is at fault
        if config.get(name) not in (None, tokenizer.vocab_size):
            raise ConversionError(
                f"{path / 'config.json'}: {name} is {config[name]} but vocab.json has "
                f"{tokenizer.vocab_size} pieces (our source and target share one vocabulary); "
                "use the config.json that came with the weights.")
    bias = state.get("final_logits_bias")
    try:  # the dimensions are there (read_marian_config)
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
    except (ValueError, TypeError) as err:
        message = re.sub(r"ModelConfig\.(\w+)", lambda m: _CONFIG_KEYS.get(m[1], m[1]), str(err))
        raise ConversionError(f"{path / 'config.json'}: {message}") from None


def search_config(directory: Path, never_generated: set[int], max_len: int) -> SearchConfig:
    """The imported model's search settings: those a model exported from here carries
    (generation_config.json's SEARCH_FIELD), so that it searches as before; else those with
    which `generate` searches, read from generation_config.json (or config.json) by
    `nmt.convert.generation` (`never_generated`: PAD and the decoder's start token; `max_len`:
    the model's positions)."""
    path = directory / "generation_config.json"
    if not path.is_file():
        path = directory / "config.json"
    values = _read_json(path, "")
    search = (_exported_search(values, path, max_len) if SEARCH_FIELD in values
              else search_from_generate(values, path, never_generated))
    warn_of_ignored(values, path, never_generated)
    return search


def _exported_search(values: dict[str, Any], path: Path, max_len: int) -> SearchConfig:
    """SEARCH_FIELD's settings, refused if invalid or if generate's own fields were edited
    since (they would be ignored; settings our search has no form for are `warn_of_ignored`'s
    to name)."""
    remove = f"or remove {SEARCH_FIELD} to import generate's settings instead"
    try:
        if not isinstance(values[SEARCH_FIELD], dict):
            raise TypeError("not a JSON object")
        search = SearchConfig.from_dict(values[SEARCH_FIELD])
    except (ValueError, TypeError) as err:
        raise ConversionError(f"{path}: {SEARCH_FIELD} holds no valid search settings ({err}); "
                              f"correct it, {remove}.") from None
    told = {**generate_settings(search, max_len), **dict.fromkeys(REPLACING_LENGTHS)}
    # What earlier exports wrote: the beam size before greedy search was num_beams 1, the
    # model's positions before a flat output limit was max_length.
    earlier = {"num_beams": search.beam_size, "max_length": max_len + 1}
    for name, ours in told.items():
        if name in values and values[name] not in (ours, earlier.get(name, ours)):
            gives = "leaves it unset" if ours is None else f"gives {json.dumps(ours)}"
            raise ConversionError(
                f"{path}: {name} is {json.dumps(values[name])} but {SEARCH_FIELD} (the search "
                f"settings the model was exported with) {gives}; make them agree, {remove}.")
    return search


_LAYER = re.compile(r"model\.(encoder|decoder)\.layers\.(\d+)\.")


def check_weights(state: dict[str, np.ndarray], config: ModelConfig, weights: Path,
                  directory: Path) -> None:
    """Before anything is read: the weights hold as many layers as config.json says, every
    tensor of that model with the shape config.json gives it, and nothing else (a repeated
    copy of a tied embedding table must equal it). A ConversionError names the first tensor
    that is not so and the config.json field it disagrees with."""
    conf = directory / "config.json"
    for side in ("encoder", "decoder"):
        _check_layer_count(state, side, getattr(config, f"{side}_layers"), weights, conf)
    shapes = marian_shapes(config)
    optional = {"final_logits_bias", "model.encoder.embed_positions.weight",
                "model.decoder.embed_positions.weight"}
    copies: set[str] = set()
    if config.share_embeddings:
        table = ("model.shared.weight" if "model.shared.weight" in state
                 else "model.encoder.embed_tokens.weight")
        shapes = {table if name == "model.shared.weight" else name: dims
                  for name, dims in shapes.items()}
        copies = {"model.shared.weight", "model.encoder.embed_tokens.weight",
                  "model.decoder.embed_tokens.weight", "lm_head.weight"} - {table}
    else:
        optional.add("lm_head.weight")  # an output tied to the decoder's table is left out
    extra = sorted(set(state) - set(shapes) - copies)
    if extra:
        raise ConversionError(
            f"{weights} has tensors that a MarianMT model of {conf} does not: "
            f"{', '.join(extra[:3])}{', ...' * (len(extra) > 3)}; the files belong to "
            "different models.")
    for name, dims in shapes.items():
        if name not in state and name not in optional:
            raise ConversionError(f"{weights} has no {name}, which a MarianMT model of {conf} "
                                  "has; the files belong to different models.")
        if name in state:
            _check_shape(name, np.shape(state[name]), dims, config, weights, conf)
    for name in sorted(copies & set(state)):
        same = (np.shape(state[name]) == np.shape(state[table])
                and np.array_equal(state[name], state[table]))
        if not same:
            raise ConversionError(
                f"{weights}: {name} differs from {table}, but {conf} ties them "
                "(share_encoder_decoder_embeddings, tie_word_embeddings); a model whose tables "
                "differ cannot be imported exactly with this config.json.")


def _check_layer_count(state, side: str, layers: int, weights: Path, conf: Path) -> None:
    found = 1 + max((int(m[2]) for m in map(_LAYER.match, state) if m and m[1] == side),
                    default=-1)
    if found == layers:
        return
    key = f"{side}_layers"
    if found > layers:
        extra = f"model.{side}.layers.{layers}.*"
        if found - 1 > layers:
            extra += f" to model.{side}.layers.{found - 1}.*"
        what = f"{extra} are in {weights} but {conf} has {key} {layers}"
    else:
        what = (f"{conf} has {key} {layers} but {weights} has {found} {side} layers (no "
                f"model.{side}.layers.{found}.*)")
    raise ConversionError(f"{what}; set {key} to {found}, or use the config.json that came "
                          "with the weights.")


def _check_shape(name: str, shape: tuple, dims: tuple, config: ModelConfig, weights: Path,
                 conf: Path) -> None:
    """One tensor's shape against the one config.json gives (`dims`: ModelConfig fields)."""
    shape = tuple(shape)
    expected = tuple(d if isinstance(d, int) else getattr(config, d) for d in dims)
    if shape == expected:
        return
    keys = {"d_model": "d_model", "vocab_size": "vocab_size",
            "max_len": "max_position_embeddings",
            "d_ff": "decoder_ffn_dim" if name.startswith("model.decoder") else "encoder_ffn_dim"}
    if len(shape) == len(dims):
        for dim, size, wanted in zip(dims, shape, expected):
            if size != wanted and not isinstance(dim, int) and _shows(name, dim):
                raise ConversionError(
                    f"{weights}: {name} has shape {shape} but {conf}'s {keys[dim]} {wanted} "
                    f"makes it {expected}; the weights have {keys[dim]} {size}: use the "
                    "config.json that came with them.")
            if size != wanted and not isinstance(dim, int):
                raise DamagedFile(
                    f"{weights}: {name} has shape {shape} but the other tensors (and {conf}'s "
                    f"{keys[dim]} {wanted}) make it {expected}; the file is damaged: download "
                    "it again.")
    raise ConversionError(f"{weights}: {name} has shape {shape} but {conf} makes it "
                          f"{expected}; the files belong to different models.")


def _shows(name: str, dim: str) -> bool:
    """Whether `name` is the tensor that shows the weights' `dim`, checked before the others
    that have it (`marian_shapes`' order): where it agrees with config.json, another tensor
    that does not is the one at fault."""
    if dim in ("vocab_size", "d_model"):
        return name in ("model.shared.weight", "model.encoder.embed_tokens.weight")
    if dim == "max_len":
        return name.endswith(".embed_positions.weight")
    return re.fullmatch(r"model\.(encoder|decoder)\.layers\.0\.fc1\.weight", name) is not None


def import_marian(marian_dir: str | Path, out_dir: str | Path) -> Path:
    """Write the MarianMT model in `marian_dir` as our model directory `out_dir`.

    Raises ConversionError naming the file or option that cannot be imported; checks every
    file before writing, and writes everything or nothing.
    """
    from flax import nnx

    from nmt.models.model_dir import abstract_params, export_model

    directory, out = Path(marian_dir), Path(out_dir)
    if not directory.is_dir():
        hub_id = not directory.exists() and len(Path(marian_dir).parts) == 2 \
            and not str(marian_dir).startswith((".", "/"))
        hint = (f" {marian_dir} looks like a Hugging Face hub id: download it first, e.g. "
                f"huggingface-cli download {marian_dir} --local-dir {directory.name}, then "
                f"pass {directory.name}" if hub_id else "")
        raise ConversionError(f"{directory} is not a directory; pass a MarianMT model's "
                              f"directory (config.json, weights, tokenizer files).{hint}")
    if is_ctranslate2_export(directory):
        raise ConversionError(f"MARIAN_DIR {directory} is a CTranslate2 export (model.bin), not "
                              "a MarianMT model directory; pass a MarianMT model's directory "
                              "(translate.py reads the export with --engine ctranslate2).")
    if (directory / PARAMS_FILE).is_file():
        raise ConversionError(f"MARIAN_DIR {directory} is already a model directory of this "
                              f"project ({PARAMS_FILE}), not a MarianMT model directory; use it as "
                              "it is with translate.py, to-marian or to-ctranslate2.")
    check_output_dir(out)
    raw = read_marian_config(directory)
    tokenizer = read_tokenizer(directory, raw.get("decoder_start_token_id"))
    check_pieces(directory, tokenizer)
    weights = weights_file(directory)
    state = read_weights(weights)
    config = model_config(raw, state, tokenizer, directory)
    check_weights(state, config, weights, directory)
    search = search_config(directory, {tokenizer.ids.pad, tokenizer.ids.bos}, config.max_len)
    _, params, _ = abstract_params(config)
    nnx.replace_by_pure_dict(params, from_marian_state(state, config))
    languages = {key: raw[key] for key in ("source_lang", "target_lang") if key in raw}
    tok_config = directory / "tokenizer_config.json"
    if tok_config.is_file():
        languages.update({k: v for k, v in _read_json(tok_config, "").items()
                          if k in ("source_lang", "target_lang") and isinstance(v, str)})
    # export_model writes its directory whole itself; inside our staging directory an
    # interruption that a library swallowed still stops the import before it is published.
    with staged_directory(out) as staging:
        export_model(staging, params, config, tokenizer, search,
                     {**languages, "imported_from": str(directory.resolve())})
    return out
