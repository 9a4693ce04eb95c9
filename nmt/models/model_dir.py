"""A trained model on disk: the self-contained directory translate.py and the Python API load.

    model/params.msgpack   parameters, flax.serialization msgpack of nnx.to_pure_dict (float32)
    model/config.json      {"model": ModelConfig, "search": SearchConfig, "tokenizer": ...,
                            and what the trainer recorded: languages, step, scores}
    model/spm.model        the SentencePiece model (or, for a model imported from MarianMT,
                           source.spm, target.spm and vocab.json: `data.tokenizer`)

    model, tokenizer, values = load_model("runs/NAME")   # a run directory uses its model/

Training checkpoints (optimizer state, data position) are the application's business
(`nmt.rundir.checkpoints`); this directory holds only what translating needs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
from pathlib import Path
from typing import Any, Iterator, Sequence

import jax
import jax.core
import numpy as np
from flax import nnx, serialization

from data.tokenizer import TokenizerBase, load_tokenizer, tokenizer_present
from nmt.runtime.cpu_features import bfloat16_warning
from nmt.runtime.files import atomic_directory
from transformer.config import ModelConfig, SearchConfig
from transformer.ensemble import Ensemble
from transformer.model import Transformer

log = logging.getLogger(__name__)

MODEL_DIR = "model"
PARAMS_FILE = "params.msgpack"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "spm.model"  # of a model trained here; see data.tokenizer for the other layout


class ModelDirError(RuntimeError):
    """A model directory is missing, incomplete or inconsistent; the message says which file."""


def abstract_params(config: ModelConfig) -> tuple[nnx.GraphDef, Any, Any]:
    """(graphdef, params as ShapeDtypeStructs, other state) of a Transformer, nothing allocated."""
    with _quiet_sharding_probes():
        abstract_model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    return nnx.split(abstract_model, nnx.Param, ...)


@contextlib.contextmanager
def _quiet_sharding_probes() -> Iterator[None]:
    """Make `getattr(tracer, "sharding", None)` cheap while a model is built abstractly.

    flax's Variable probes `value.sharding` at every update, the random generator's counter
    included (twice per parameter). On a tracer JAX answers with an AttributeError whose
    message walks every equation traced so far, which makes building a model quadratic in its
    size: 0.4 s of every translate.py start for the `compact` model, 0.1 s without the message
    (jax-ml/jax pull request 40041 describes the problem). The probe's outcome is the same.
    """
    tracer = getattr(jax.core, "Tracer", None)
    probe = getattr(tracer, "__dict__", {}).get("sharding")
    if not isinstance(probe, property):  # another JAX: leave it alone
        yield
        return

    def no_sharding(self):
        raise AttributeError("a tracer has no sharding")

    tracer.sharding = property(no_sharding)
    try:
        yield
    finally:
        tracer.sharding = probe


def read_model_config(model_dir: str | Path) -> tuple[ModelConfig, dict[str, Any]]:
    """(model config, whole JSON) from `model_dir/config.json`."""
    path = Path(model_dir) / CONFIG_FILE
    if not path.is_file():
        raise ModelDirError(f"{path} is missing: this is not a model directory.")
    try:
        values = json.loads(path.read_text())
        if not isinstance(values, dict) or "model" not in values:
            raise ModelDirError(f"{path} has no 'model' section.")
        return ModelConfig.from_dict(values["model"]), values
    except (ValueError, TypeError) as err:  # not JSON, or settings this code does not know
        raise ModelDirError(
            f"{path}: not a valid model configuration ({type(err).__name__}: {err}); "
            "restore the config.json written with the model.") from None


def read_search_config(model_dir: Path, values: dict[str, Any]) -> SearchConfig:
    """The SearchConfig stored in `model_dir/config.json` (whose JSON is `values`), validated
    as the declaration demands: a NaN alpha written by an older version is refused here, not
    turned into empty translations."""
    path = model_dir / CONFIG_FILE
    stored = values.get("search", {})
    try:
        if not isinstance(stored, dict):
            raise TypeError(f"expected an object of settings, got {stored!r}")
        return SearchConfig.from_dict(stored)
    except (ValueError, TypeError) as err:
        raise ModelDirError(
            f"{path}: invalid 'search' settings ({type(err).__name__}: {err}); correct that "
            "value in the file (or restore the config.json written with the model), or "
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


def export_model(model_dir: str | Path, params: Any, model_config: ModelConfig,
                 tokenizer: TokenizerBase | str | Path,
                 search_config: SearchConfig | None = None,
                 extra: dict[str, Any] | None = None) -> Path:
    """Write a self-contained model directory that `load_model` reads.

    `tokenizer` is a tokenizer, or the path of one (`spm.model`, or a directory holding either
    layout).

    Written with `atomic_directory`, so a reader never sees a partial model and a failed
    write (disk full, say) leaves the model already there as it was.
    With several processes only one should call this (the parameters must be fully
    addressable, e.g. replicated).
    """
    model_dir = Path(model_dir)
    with atomic_directory(model_dir) as staging:
        pure = jax.tree.map(lambda x: np.asarray(jax.device_get(x), np.float32),
                            nnx.to_pure_dict(params))
        _write(staging, model_dir, PARAMS_FILE, serialization.msgpack_serialize(pure))
        if isinstance(tokenizer, (str, Path)):
            tokenizer = load_tokenizer(tokenizer)
        tokenizer.save(staging)
        files = list(tokenizer.files())
        config = {"model": model_config.to_dict(),
                  "search": dataclasses.asdict(search_config or SearchConfig()),
                  "tokenizer": files[0] if len(files) == 1 else files, **(extra or {})}
        text = json.dumps(config, indent=2, sort_keys=True) + "\n"
        _write(staging, model_dir, CONFIG_FILE, text.encode("utf-8"))
    return model_dir


def _write(staging: Path, model_dir: Path, name: str, data: bytes) -> None:
    """Write `staging`/`name`; an OSError names the file as it would be, `model_dir`/`name`
    (a full disk's error names no file of its own)."""
    try:
        (staging / name).write_bytes(data)
    except OSError as err:
        raise OSError(err.errno, err.strerror, str(model_dir / name)) from None


def check_tokenizer(model_dir: Path, config: ModelConfig, tokenizer: TokenizerBase) -> None:
    """The tokenizer must be the one the parameters were trained with: same size, same
    special ids (a different one would crash mid-translation or translate nonsense)."""
    conf = model_dir / CONFIG_FILE
    tok = model_dir / next(iter(tokenizer.files()))
    if tokenizer.vocab_size != config.vocab_size:
        raise ModelDirError(
            f"{tok} has {tokenizer.vocab_size} pieces but {conf} describes a model with "
            f"{config.vocab_size} (its embedding rows): the SentencePiece model is not the one "
            "the model was trained with; copy the run's own spm.model into the directory.")
    for name, value in tokenizer.special_ids().items():
        if getattr(config, name) != value:
            raise ModelDirError(
                f"{tok} has {name} {value} but {conf} says {getattr(config, name)}: the "
                "SentencePiece model is not the one the model was trained with.")


def check_shapes(model_dir: Path, abstract: Any, pure: Any) -> None:
    """Every parameter the config describes is in the file, with the config's shape."""
    expected = {jax.tree_util.keystr(path): leaf.shape for path, leaf in
                jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(abstract))}
    try:
        found = {jax.tree_util.keystr(path): np.shape(leaf) for path, leaf in
                 jax.tree_util.tree_leaves_with_path(pure)}
    except Exception:  # noqa: BLE001 - not a tree of arrays at all
        found = {}
    params, conf = model_dir / PARAMS_FILE, model_dir / CONFIG_FILE
    for name, shape in expected.items():
        if name not in found:
            raise ModelDirError(f"{params} has no parameter {name}, which {conf} describes: "
                                "the two files belong to different models; export the model "
                                "again.")
        if tuple(found[name]) != tuple(shape):
            raise ModelDirError(f"{params}: parameter {name} has shape {tuple(found[name])} but "
                                f"{conf} describes {tuple(shape)}: the two files belong to "
                                "different models; export the model again.")
    extra = sorted(set(found) - set(expected))
    if extra:
        raise ModelDirError(f"{params} has parameters {conf} does not describe ({extra[0]}, "
                            "...): the two files belong to different models.")


def resolve_model_dir(path: str | Path) -> Path:
    """A model directory, given either itself or a run directory containing `model/`."""
    path = Path(path)
    if not path.exists():
        raise ModelDirError(f"{path} does not exist; pass a run directory or its model/ folder.")
    if not (path / PARAMS_FILE).exists() and (path / MODEL_DIR).is_dir():
        return path / MODEL_DIR
    return path


def load_model(path: str | Path, dtype: str | None = None
               ) -> tuple[Transformer, Any, dict[str, Any]]:
    """Load an exported model: returns (Transformer, tokenizer, config dict).

    `path` is a model directory (`runs/NAME/model`, `runs/NAME/averaged`) or a run directory,
    whose `model/` is used. `dtype` overrides the compute dtype ("float32"/"bfloat16").
    The config dict has "model" (a ModelConfig), "search" (a SearchConfig) and whatever else
    the trainer recorded (step, BLEU, source and target languages).
    """

    model_dir = resolve_model_dir(path)
    check_not_transformers(model_dir)
    for name, what in ((CONFIG_FILE, "model configuration"), (PARAMS_FILE, "parameters")):
        if not (model_dir / name).is_file():
            raise ModelDirError(
                f"{model_dir} is not a complete model directory: {name} ({what}) is missing; "
                f"train with train.py, or write one with export_model.")
    if not tokenizer_present(model_dir):
        raise ModelDirError(
            f"{model_dir} is not a complete model directory: {TOKENIZER_FILE} (SentencePiece "
            "model) is missing; copy the run's spm.model into it, or export the model again.")
    model_config, values = read_model_config(model_dir)
    search = read_search_config(model_dir, values)  # before the slow part: a bad file fails fast
    if dtype is not None:
        model_config = dataclasses.replace(model_config, dtype=dtype)
    _warn_once(bfloat16_warning(jax.devices()[0].platform, model_config.dtype))
    tokenizer = load_tokenizer(model_dir)
    check_tokenizer(model_dir, model_config, tokenizer)
    graphdef, params, rest = abstract_params(model_config)
    try:
        pure = serialization.msgpack_restore((model_dir / PARAMS_FILE).read_bytes())
    except Exception as err:  # noqa: BLE001 - name the file whatever went wrong
        raise ModelDirError(f"{model_dir / PARAMS_FILE} is damaged (cannot be read: {err}); "
                            "export the model again.") from err
    check_shapes(model_dir, params, pure)
    nnx.replace_by_pure_dict(params, pure)
    params = jax.device_put(params)  # one transfer, where jnp.asarray runs a program per shape
    model = nnx.merge(graphdef, params, rest)
    values = dict(values)
    values["model"] = model_config
    values["search"] = search
    return model, tokenizer, values


@functools.cache
def _warn_once(message: str | None) -> None:
    """Log `message` (if any) once per process, however many models are loaded."""
    if message is not None:
        log.warning(message)


def load_models(paths: Sequence[str | Path], dtype: str | None = None
                ) -> tuple[Transformer | Ensemble, Any, dict[str, Any]]:
    """`model_dir.load_model` for one path; an `Ensemble` for several.

    Returns (model, tokenizer, the first model's config dict). Raises ModelDirError naming
    the directory whose SentencePiece model or vocabulary differs from the first one's.
    """
    model, tokenizer, values = load_model(paths[0], dtype=dtype)
    if len(paths) == 1:
        return model, tokenizer, values
    models = [model]
    for path in paths[1:]:
        other, other_tokenizer, _ = load_model(path, dtype=dtype)
        if other_tokenizer.fingerprint != tokenizer.fingerprint:
            raise ModelDirError(
                f"{resolve_model_dir(path)} has another SentencePiece model than "
                f"{resolve_model_dir(paths[0])}; only models trained with the same spm.model "
                "can be ensembled.")
        models.append(other)
    try:
        return Ensemble(models), tokenizer, values
    except ValueError as err:
        raise ModelDirError(f"cannot ensemble {', '.join(map(str, paths))}: {err}") from None
