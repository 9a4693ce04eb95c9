"""A model directory's files read without JAX: its settings and tokenizer, checked.

What translating with another engine (`nmt.engines`) needs of a model directory, and what
`nmt.models.model_dir.load_model` checks before it reads the parameters. The layout is
described in `nmt.models.model_dir`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from data.tokenizer import (
    SPECIAL_TOKENS_FILE,
    VOCAB_FILE,
    TokenizerBase,
    VocabTokenizer,
    load_tokenizer,
    tokenizer_present,
)
from transformer.config import ModelConfig, SearchConfig
from transformer.shortlist import SHORTLIST_FILE, Shortlist

MODEL_DIR = "model"
PARAMS_FILE = "params.msgpack"
CONFIG_FILE = "config.json"
# The model directory's config.json as a CTranslate2 export keeps it: its settings (search,
# languages, positions) for translating the export with --engine ctranslate2.
EXPORT_SETTINGS_FILE = "nmt_config.json"
# EXPORT_SETTINGS_FILE's record of the weight type a CTranslate2 export stores (its quantization),
# which CTranslate2's own files do not say.
EXPORT_WEIGHTS_FIELD = "ctranslate2_weights"
TOKENIZER_FILE = "spm.model"  # of a model trained here; see data.tokenizer for the other layout
# config.json's record of the tokenizer's files (`TokenizerBase.sha256`): another of the same
# size and special ids would translate nonsense without an error.
TOKENIZER_SHA256 = "tokenizer_sha256"
# The ModelConfig fields every exported config.json has held, from the first export on: one
# without them is damaged, not old. Fields added since (activation_dtype, activation,
# output_bias) take their defaults when an older export lacks them.
STORED_MODEL_FIELDS = (
    "vocab_size", "d_model", "num_heads", "d_ff", "encoder_layers", "decoder_layers", "dropout",
    "attention_dropout", "activation_dropout", "norm", "positional", "max_len",
    "share_embeddings", "layer_norm_epsilon", "dtype", "attention_impl", "pad_id", "unk_id",
    "bos_id", "eos_id")


# What marks a run directory (nmt.rundir's CHECKPOINTS_DIR and RUN_CONFIG_FILE): one without
# MODEL_DIR is still training, or stopped before its export.
RUN_MARKERS = ("checkpoints", "config.yaml")


class ModelDirError(RuntimeError):
    """A model directory is missing, incomplete or inconsistent; the message says which file."""


def read_model_config(model_dir: str | Path, name: str = CONFIG_FILE
                      ) -> tuple[ModelConfig, dict[str, Any]]:
    """(model config, whole JSON) from `model_dir/config.json` (or `name`)."""
    path = Path(model_dir) / name
    if not path.is_file():
        raise ModelDirError(f"{path} is missing: this is not a model directory.")
    try:
        values = json.loads(path.read_text())
        if not isinstance(values, dict) or "model" not in values:
            raise ModelDirError(f"{path} has no 'model' section.")
        return ModelConfig.from_dict(values["model"], STORED_MODEL_FIELDS), values
    except (ValueError, TypeError) as err:  # not JSON, or settings this code does not know
        raise ModelDirError(
            f"{path}: not a valid model configuration ({type(err).__name__}: {err}); "
            f"restore the {name} written with the model, or export the model again."
            ) from None


def read_search_config(model_dir: Path, values: dict[str, Any], name: str = CONFIG_FILE
                       ) -> SearchConfig:
    """The SearchConfig stored in `model_dir/config.json` (whose JSON is `values`), validated
    as the declaration demands: a NaN alpha written by an older version is refused here, not
    turned into empty translations."""
    path = model_dir / name
    stored = values.get("search", {})
    try:
        if not isinstance(stored, dict):
            raise TypeError(f"expected an object of settings, got {stored!r}")
        return SearchConfig.from_dict(stored)
    except (ValueError, TypeError) as err:
        raise ModelDirError(
            f"{path}: invalid 'search' settings ({type(err).__name__}: {err}); correct that "
            f"value in the file (or restore the {name} written with the model), or "
            "export the model again.") from None


def check_not_transformers(model_dir: Path) -> None:
    """ModelDirError pointing to the converter when `model_dir` holds a transformers model
    (a config.json with a model_type, no params.msgpack) rather than one of ours."""
    path = model_dir / CONFIG_FILE
    if (model_dir / PARAMS_FILE).exists() or not path.is_file():
        return
    try:
        model_type = json.loads(path.read_text()).get("model_type")
    except (ValueError, OSError, AttributeError):  # not JSON, or not an object
        return
    if not isinstance(model_type, str):
        return
    if model_type == "marian":
        raise ModelDirError(
            f"{model_dir} is a transformers MarianMT model ({path}: model_type marian), not a "
            f"model directory of this project; convert it with `python -m nmt.convert "
            f"from-marian {model_dir} OUT` and pass OUT to --model.")
    raise ModelDirError(
        f"{model_dir} is a transformers model ({path}: model_type {model_type}), not a model "
        "directory of this project; only MarianMT models can be converted (python -m "
        "nmt.convert from-marian).")


def check_tokenizer(model_dir: Path, config: ModelConfig, tokenizer: TokenizerBase,
                    recorded: str | None = None) -> None:
    """The tokenizer must be the one the parameters were trained with: same size, same
    special ids (a different one would crash mid-translation or translate nonsense), and the
    same files where config.json records their sha256 (`recorded`; older exports do not)."""
    conf = model_dir / CONFIG_FILE
    sizes, ids = _tokenizer_tables(model_dir, tokenizer)
    if tokenizer.vocab_size != config.vocab_size:
        raise ModelDirError(
            f"{sizes} has {tokenizer.vocab_size} pieces but {conf} describes a model with "
            f"{config.vocab_size} (its embedding rows): the tokenizer is not the one the model "
            f"was trained with; {_restore_tokenizer(list(tokenizer.files()))}.")
    for name, value in tokenizer.special_ids().items():
        if getattr(config, name) != value:
            raise ModelDirError(
                f"{ids} has {name} {value} but {conf} says {getattr(config, name)}: the "
                f"tokenizer is not the one the model was trained with; "
                f"{_restore_tokenizer(list(tokenizer.files()))}.")
    if recorded is not None and tokenizer.sha256 != recorded:
        raise ModelDirError(f"{_differs_from_record(model_dir, tokenizer)}; "
                            f"{_restore_tokenizer(list(tokenizer.files()))}.")


def _differs_from_record(model_dir: Path, tokenizer: TokenizerBase) -> str:
    """What differs when the tokenizer's sha256 is not config.json's: one sha256 covers all
    its files (`TokenizerBase.sha256`), so the file at fault is only known if there is one."""
    conf, names = model_dir / CONFIG_FILE, list(tokenizer.files())
    if len(names) == 1:
        return (f"{model_dir / names[0]} is not the tokenizer the model was trained with: its "
                f"sha256 differs from the one {conf} records ({TOKENIZER_SHA256})")
    return (f"the tokenizer files ({', '.join(names)}) in {model_dir} differ from those "
            f"recorded in {conf} ({TOKENIZER_SHA256}): the tokenizer is not the one the model "
            "was trained with")


def _tokenizer_tables(model_dir: Path, tokenizer: TokenizerBase) -> tuple[str, str]:
    """(the file that gives the tokenizer's size, the files that give its special ids)."""
    if isinstance(tokenizer, VocabTokenizer):  # Marian's layout: the table, not the models
        return (str(model_dir / VOCAB_FILE),
                f"{model_dir / VOCAB_FILE} with {model_dir / SPECIAL_TOKENS_FILE}")
    first = str(model_dir / next(iter(tokenizer.files())))
    return first, first


def _restore_tokenizer(names: list[str]) -> str:
    """What to do about a model directory's tokenizer files (`names`) that are not the
    model's: an spm.model is the run's; Marian's layout comes from a conversion or export."""
    if len(names) > 1:
        return (f"restore {', '.join(names)} from the model this one was converted or exported "
                "from, or convert (python -m nmt.convert from-marian) or export the model again")
    return f"copy the run's own {TOKENIZER_FILE} into the directory, or export the model again"


def check_tokenizer_listed(model_dir: Path, values: dict[str, Any]) -> None:
    """Every tokenizer file config.json lists ("tokenizer") is there: without
    special_tokens_map.json, Marian's layout would read other special ids and be refused
    as another tokenizer."""
    listed = values.get("tokenizer")
    names = [listed] if isinstance(listed, str) else listed if isinstance(listed, list) else []
    names = [name for name in names if isinstance(name, str)]
    for name in names:
        if not (model_dir / name).is_file():
            raise ModelDirError(
                f"{model_dir / name} is missing: {model_dir / CONFIG_FILE} lists it among the "
                f"tokenizer's files; {_restore_tokenizer(names)}.")


def resolve_model_dir(path: str | Path) -> Path:
    """A model directory, given either itself or a run directory containing `model/`."""
    path = Path(path)
    if not path.exists():
        raise ModelDirError(f"{path} does not exist; pass a run directory or its model/ folder.")
    if not (path / PARAMS_FILE).exists() and (path / MODEL_DIR).is_dir():
        return path / MODEL_DIR
    return path


def check_exported(model_dir: Path) -> None:
    """ModelDirError for a run directory that has not exported its model yet: it has no
    MODEL_DIR, and is itself no model directory."""
    if (model_dir / CONFIG_FILE).exists() or (model_dir / PARAMS_FILE).exists():
        return
    if any((model_dir / marker).exists() for marker in RUN_MARKERS):
        raise ModelDirError(
            f"{model_dir} is a run directory that has not exported its model yet (no "
            f"{MODEL_DIR}/): wait for its training to finish, or write averaged/ from its latest "
            f"checkpoint with python train.py --average-only --average-last 1 --output-dir "
            f"{model_dir} and pass {model_dir / 'averaged'} to --model.")


def read_model_files(path: str | Path) -> tuple[Path, TokenizerBase, dict[str, Any]]:
    """(model directory, tokenizer, config dict) of a model or run directory, every file
    checked but the parameters, which are only checked present; ModelDirError naming the
    file otherwise. The config dict has "model" (a ModelConfig) and "search" (a SearchConfig)
    as `load_model`'s has."""
    model_dir = resolve_model_dir(path)
    check_not_transformers(model_dir)
    if not (model_dir / PARAMS_FILE).exists() and (model_dir / "model.bin").is_file():
        raise ModelDirError(
            f"{model_dir} is a CTranslate2 export (model.bin), not a model directory of the JAX "
            "engine; translate with it by adding --engine ctranslate2, or pass the model "
            "directory it was exported from.")
    check_exported(model_dir)
    for name, what in ((CONFIG_FILE, "model configuration"), (PARAMS_FILE, "parameters")):
        if not (model_dir / name).is_file():
            raise ModelDirError(
                f"{model_dir} is not a complete model directory: {name} ({what}) is missing; "
                f"train with train.py, or write one with export_model.")
    model_config, values = read_model_config(model_dir)
    check_tokenizer_listed(model_dir, values)
    if not tokenizer_present(model_dir):
        raise ModelDirError(
            f"{model_dir} is not a complete model directory: {TOKENIZER_FILE} (SentencePiece "
            "model) is missing; copy the run's spm.model into it, or export the model again.")
    search = read_search_config(model_dir, values)
    tokenizer = load_tokenizer(model_dir)
    check_tokenizer(model_dir, model_config, tokenizer, values.get(TOKENIZER_SHA256))
    return model_dir, tokenizer, {**values, "model": model_config, "search": search}


def read_shortlist(path: str | Path, tokenizer: TokenizerBase) -> Shortlist:
    """The shortlist stored in a model or run directory; ModelDirError if there is none, it
    is damaged, or it was built for another SentencePiece model."""
    model_dir = resolve_model_dir(path)
    shortlist_path = model_dir / SHORTLIST_FILE
    if not shortlist_path.is_file():
        raise ModelDirError(f"{model_dir} has no {SHORTLIST_FILE}: build one with python -m "
                            f"nmt.distillation.shortlist --model {model_dir} --train-prefix "
                            "PREFIX, or translate without --shortlist.")
    try:
        shortlist = Shortlist.load(shortlist_path)
    except ValueError as err:
        raise ModelDirError(str(err)) from None
    if shortlist.tokenizer != tokenizer.fingerprint:
        raise ModelDirError(f"{shortlist_path} was built for another SentencePiece model than "
                            f"{model_dir}'s; build it again for this model.")
    return shortlist


def stored_languages(values: dict[str, Any]) -> tuple[str | None, str | None]:
    """(source, target) language codes stored with a model, None where it stores none."""
    data = values.get("data", {})
    return (values.get("source_lang") or data.get("src"),
            values.get("target_lang") or data.get("tgt"))


def contradicted_language(src: str | None, tgt: str | None,
                          stored: tuple[str | None, str | None]) -> tuple[str, str, str] | None:
    """(flag, given, stored) of the first of --src and --tgt given as another language than
    the model stores (`stored_languages`), or None: it would translate, or pair a corpus's
    sides, in a direction the model never learned."""
    for flag, given, recorded in (("--src", src, stored[0]), ("--tgt", tgt, stored[1])):
        if given and recorded and given != recorded:
            return flag, given, recorded
    return None
