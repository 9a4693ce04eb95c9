"""A trained model on disk: the self-contained directory translate.py and the Python API load.

    model/params.msgpack   parameters, flax.serialization msgpack of nnx.to_pure_dict (float32)
    model/config.json      {"model": ModelConfig, "search": SearchConfig, "tokenizer": ...,
                            and what the trainer recorded: languages, step, scores}
    model/spm.model        the SentencePiece model (or, for a model imported from MarianMT,
                           source.spm, target.spm and vocab.json: `data.tokenizer`)
    model/shortlist.npz    optional: a vocabulary shortlist (`transformer.shortlist`), added
                           by python -m nmt.distillation.shortlist, used with --shortlist

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
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.core
import numpy as np
from flax import nnx, serialization

from data.tokenizer import TokenizerBase, load_tokenizer
from nmt.models.model_files import (  # noqa: F401 - the directory's names, importable here too
    CONFIG_FILE,
    MODEL_DIR,
    PARAMS_FILE,
    TOKENIZER_FILE,
    TOKENIZER_SHA256,
    ModelDirError,
    read_model_config,
    read_model_files,
    resolve_model_dir,
    stored_languages,
)
from nmt.runtime.cpu_features import bfloat16_warning
from nmt.runtime.files import atomic_directory
from transformer.config import ModelConfig, SearchConfig
from transformer.ensemble import Ensemble
from transformer.model import Transformer

log = logging.getLogger(__name__)

def abstract_params(config: ModelConfig) -> tuple[nnx.GraphDef, Any, Any]:
    """(graphdef, params as ShapeDtypeStructs, other state) of a Transformer, nothing allocated."""
    with _quiet_sharding_probes():
        abstract_model = nnx.eval_shape(lambda: Transformer(config, rngs=_OneKey()))
    return nnx.split(abstract_model, nnx.Param, ...)


class _OneKey:
    """Stands in for nnx.Rngs when only shapes are wanted: every stream gives the same key.

    The model reads its generators only to initialize parameters, and shapes do not depend on
    the key; this spares tracing a key derivation and a counter update for every parameter.
    """

    def __init__(self):
        self._key = jax.random.key(0)

    def __getattr__(self, stream: str) -> Callable[[], jax.Array]:
        if stream.startswith("_"):
            raise AttributeError(stream)
        return lambda: self._key


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
                  "tokenizer": files[0] if len(files) == 1 else files,
                  TOKENIZER_SHA256: tokenizer.sha256, **(extra or {})}
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


def load_model(path: str | Path, dtype: str | None = None
               ) -> tuple[Transformer, Any, dict[str, Any]]:
    """Load an exported model: returns (Transformer, tokenizer, config dict).

    `path` is a model directory (`runs/NAME/model`, `runs/NAME/averaged`) or a run directory,
    whose `model/` is used. `dtype` overrides the compute dtype ("float32"/"bfloat16").
    The config dict has "model" (a ModelConfig), "search" (a SearchConfig) and whatever else
    the trainer recorded (step, BLEU, source and target languages).
    """
    # Every file but the parameters first: a bad one fails before the slow part.
    model_dir, tokenizer, values = read_model_files(path)
    model_config = inference_config(values["model"], dtype, jax.devices()[0].platform)
    _warn_once(bfloat16_warning(jax.devices()[0].platform, model_config.dtype))
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
    return model, tokenizer, {**values, "model": model_config}


def inference_config(stored: ModelConfig, dtype: str | None, platform: str) -> ModelConfig:
    """The stored model's config for translating on `platform` ("cpu", "gpu", "tpu"), in
    `dtype` where given. float32 means float32 throughout: a model trained with bfloat16
    activations gets "auto" ones. cuDNN's attention, which a run that trained with it
    records, is kept only where it runs (a GPU, in bfloat16); elsewhere XLA's."""
    cudnn_here = platform == "gpu" and (dtype or stored.dtype) == "bfloat16"
    attention = None if stored.attention_impl == "cudnn" and not cudnn_here \
        else stored.attention_impl
    if dtype is None:
        return dataclasses.replace(stored, attention_impl=attention)
    activations = "auto" if dtype == "float32" else stored.activation_dtype
    return dataclasses.replace(stored, dtype=dtype, activation_dtype=activations,
                               attention_impl=attention)


@functools.cache
def _warn_once(message: str | None) -> None:
    """Log `message` (if any) once per process, however many models are loaded."""
    if message is not None:
        log.warning(message)


def _check_same_pair(first, first_pair, path, pair) -> None:
    """ModelDirError for ensemble members that record different language pairs (one
    spm.model can serve both directions): their mean would translate neither."""
    if None not in first_pair and None not in pair and pair != first_pair:
        raise ModelDirError(f"{resolve_model_dir(path)} translates {'->'.join(pair)} but "
                            f"{resolve_model_dir(first)} translates {'->'.join(first_pair)}; "
                            "an ensemble's models translate one pair.")


def load_models(paths: Sequence[str | Path], dtype: str | None = None
                ) -> tuple[Transformer | Ensemble, Any, dict[str, Any]]:
    """`model_dir.load_model` for one path; an `Ensemble` for several.

    Returns (model, tokenizer, the first model's config dict). Raises ModelDirError naming
    the directory whose SentencePiece model, vocabulary or recorded language pair differs from
    the first one's.
    """
    model, tokenizer, values = load_model(paths[0], dtype=dtype)
    if len(paths) == 1:
        return model, tokenizer, values
    models = [model]
    for path in paths[1:]:
        other, other_tokenizer, other_values = load_model(path, dtype=dtype)
        if other_tokenizer.fingerprint != tokenizer.fingerprint:
            raise ModelDirError(
                f"{resolve_model_dir(path)} has another SentencePiece model than "
                f"{resolve_model_dir(paths[0])}; only models trained with the same spm.model "
                "can be ensembled.")
        _check_same_pair(paths[0], stored_languages(values), path, stored_languages(other_values))
        models.append(other)
    try:
        return Ensemble(models), tokenizer, values
    except ValueError as err:
        raise ModelDirError(f"cannot ensemble {', '.join(map(str, paths))}: {err}") from None
