"""Training checkpoints, checkpoint averaging and the exported model directory.

A run directory holds two kinds of saved state:

- `checkpoints/<step>/`: everything needed to continue training exactly, written with
  orbax-checkpoint's `CheckpointManager` from every process, asynchronously and atomically
  (orbax writes `<step>.orbax-checkpoint-tmp-*` and renames it when complete). Items:
    params  the model parameters (nnx.State of nnx.Param), StandardSave;
    train   {"step", "opt_state", "rng"}, StandardSave;
    data    JSON: the data iterator's state, the trainer's bookkeeping (the best
            --best-metric score and its step, patience, metrics of the unfinished log window).
  The last `keep_last` are kept. Parameters are a separate item so that averaging and export
  read them without knowing the optimizer's state structure.
- `best/<step>/`: parameters of the checkpoint with the best validation score so far (BLEU by
  default; `--best-metric`), kept by a second manager with `max_to_keep=1`. The trainer saves
  here only when the score improves
  (and writes `checkpoints/<step>/` at the same step, so the bookkeeping that names the best
  step is saved with it), so the newest save is the best one.

The exported model (`model/`, or `averaged/` from `--average-last`) is what translate.py
loads through `load_model`:

    model/params.msgpack   parameters, flax.serialization msgpack of nnx.to_pure_dict
    model/config.json      {"model": ModelConfig, "search": SearchConfig, ...}
    model/spm.model        the SentencePiece model
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx, serialization

from transformer.config import ModelConfig, SearchConfig
from transformer.model import Transformer

log = logging.getLogger("checkpoint")

CHECKPOINTS_DIR = "checkpoints"
BEST_DIR = "best"
MODEL_DIR = "model"
AVERAGED_DIR = "averaged"
PARAMS_FILE = "params.msgpack"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "spm.model"
# Files orbax writes into a step directory when (and only when) the step is finalized.
_FINALIZED_MARKER = "_CHECKPOINT_METADATA"
_ITEMS = ("params", "train", "data")


class CheckpointError(RuntimeError):
    """A checkpoint or model directory is missing or incomplete; the message says which."""


class Restored(NamedTuple):
    step: int
    params: Any  # nnx.State
    train: dict[str, Any]  # {"step", "opt_state", "rng"}
    data: dict[str, Any]


# ----------------------------------------------------------------------------- checkpoints


def is_complete_step_dir(path: Path) -> bool:
    """True when `path` is a finalized checkpoint step directory with every item present.

    orbax renames a step directory into place only after writing it, so a crash leaves a
    `*.orbax-checkpoint-tmp-*` directory, never a half-written `<step>/`. A step directory can
    still be incomplete when it was copied or synced partially; requiring orbax's finalization
    metadata, and a non-empty directory for "params" and for every item that metadata lists
    (params, train, data in checkpoints/; params, data in best/), catches that too.
    """
    if not path.is_dir() or not path.name.isdigit():
        return False
    try:
        metadata = json.loads((path / _FINALIZED_MARKER).read_text())
        items = set(metadata.get("item_handlers") or {}) | {"params"}
    except (OSError, ValueError, AttributeError):  # missing, unreadable or not a JSON object
        return False
    return all((path / item).is_dir() and any((path / item).iterdir()) for item in items)


def complete_steps(directory: str | Path) -> list[int]:
    """Steps of the finalized checkpoints under `directory`, ascending."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    steps = []
    for child in directory.iterdir():
        if child.name.isdigit():
            if is_complete_step_dir(child):
                steps.append(int(child.name))
            else:
                log.warning("ignoring incomplete checkpoint %s", child)
    return sorted(steps)


def _clear_step(manager: ocp.CheckpointManager, directory: Path, step: int) -> None:
    """Remove an existing `step` before saving it again.

    Happens after a resume from an earlier step: the run died after writing `best/<step>`
    but before `checkpoints/<step>`, or `checkpoints/<step>` was unreadable and skipped.
    """
    manager.wait_until_finished()
    if step in manager.all_steps():
        manager.delete(step)
    path = directory / str(step)
    if path.exists() and jax.process_index() == 0:
        shutil.rmtree(path)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(f"clear {directory} {step}")


def _brief(err: Exception, limit: int = 300) -> str:
    """The start of an error message: orbax's can list every path of a tree."""
    text = str(err).strip().rstrip(".") or type(err).__name__
    return text if len(text) <= limit else text[:limit] + " ..."


def _abstract(tree: Any) -> Any:
    """ShapeDtypeStructs (with shardings) describing `tree`, the target for a restore."""
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


class Checkpointer:
    """The run's two orbax managers: the last `keep_last` steps and the best by BLEU (one).

    Every process must call `save`, `save_best`, `restore`, `wait` and `close` (orbax
    coordinates the processes and writes each array shard from the process holding it).
    """

    def __init__(self, run_dir: str | Path, keep_last: int = 5, async_save: bool = True):
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}.")
        self.run_dir = Path(run_dir).absolute()
        self.directory = self.run_dir / CHECKPOINTS_DIR
        self.best_directory = self.run_dir / BEST_DIR
        self._last = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep_last, enable_async_checkpointing=async_save,
                cleanup_tmp_directories=True, create=True),
            item_names=_ITEMS)
        self._best = ocp.CheckpointManager(
            self.best_directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=1, enable_async_checkpointing=async_save,
                cleanup_tmp_directories=True, create=True),
            item_names=("params", "data"))

    # ------------------------------------------------------------------ saving

    def save(self, step: int, params: Any, train: dict[str, Any], data: dict[str, Any]) -> None:
        """Start saving step `step` in the background; returns once arrays are copied."""
        _clear_step(self._last, self.directory, step)
        self._last.save(step, args=ocp.args.Composite(
            params=ocp.args.StandardSave(params),
            train=ocp.args.StandardSave(train),
            data=ocp.args.JsonSave(data)), force=True)

    def save_best(self, step: int, params: Any, metrics: dict[str, float]) -> None:
        """Save `params` as the best checkpoint, replacing the previous one (the caller saves
        only improvements); `metrics` ({METRIC: score, "step"}) are stored with them."""
        _clear_step(self._best, self.best_directory, step)
        self._best.save(step, args=ocp.args.Composite(
            params=ocp.args.StandardSave(params),
            data=ocp.args.JsonSave({k: float(v) for k, v in metrics.items()})), force=True)

    def discard_best(self, keep: int | None) -> list[int]:
        """Delete every step of best/ but `keep` (None: all); returns the steps deleted.

        On resume, best/ can hold a step saved after the checkpoint the run resumes from (the
        run crashed before that checkpoint was written); the bookkeeping restored does not
        know it, and the resumed run must not export it.
        """
        self._best.wait_until_finished()
        on_disk = ({int(p.name) for p in self.best_directory.iterdir() if p.name.isdigit()}
                   if self.best_directory.is_dir() else set())
        stale = sorted((on_disk | set(self._best.all_steps())) - {keep})
        for step in stale:
            _clear_step(self._best, self.best_directory, step)
        return stale

    def wait(self) -> None:
        """Block until background saves are committed."""
        self._last.wait_until_finished()
        self._best.wait_until_finished()

    def close(self) -> None:
        self._last.close()
        self._best.close()

    # ------------------------------------------------------------------ restoring

    def steps(self) -> list[int]:
        return complete_steps(self.directory)

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def best_step(self) -> int | None:
        steps = complete_steps(self.best_directory)
        return steps[-1] if steps else None

    def restore(self, params_like: Any, train_like: dict[str, Any], step: int | None = None
                ) -> Restored | None:
        """Restore the newest complete checkpoint (or `step`) onto the given templates.

        The templates (live arrays or ShapeDtypeStructs) give structure, dtypes and shardings.
        A checkpoint that fails to read is skipped in favour of the one before it. Returns None
        when there is no complete checkpoint; raises CheckpointError when there are some but
        none can be restored (most often: the model or optimizer state no longer matches the
        templates), rather than let the caller start over in a directory that holds a run.
        """
        candidates = [step] if step is not None else list(reversed(self.steps()))
        failures = []
        for candidate in candidates:
            try:
                restored = self._last.restore(candidate, args=ocp.args.Composite(
                    params=ocp.args.StandardRestore(_abstract(params_like)),
                    train=ocp.args.StandardRestore(_abstract(train_like)),
                    data=ocp.args.JsonRestore()))
            except Exception as err:  # noqa: BLE001 - any unreadable checkpoint is skipped
                if step is not None:
                    raise CheckpointError(
                        f"{self.directory / str(candidate)}: cannot restore ({_brief(err)})."
                    ) from err
                log.warning("skipping unreadable checkpoint %s: %s",
                            self.directory / str(candidate), _brief(err))
                failures.append((candidate, err))
                continue
            return Restored(candidate, restored.params, dict(restored.train), dict(restored.data))
        if failures:
            newest, err = failures[0]
            raise CheckpointError(
                f"{self.directory}: none of the complete checkpoints (steps "
                f"{sorted(candidates)}) can be restored; step {newest}: {_brief(err)}. They "
                f"were written with other settings or another version of this code, or are "
                f"damaged: use another --output-dir, or delete {self.directory} and "
                f"{self.best_directory} to start this run over.") from err
        return None

    def restore_params(self, params_like: Any, step: int, best: bool = False) -> Any:
        """Only the parameters of checkpoint `step` (of `best/` when `best`)."""
        manager, directory = ((self._best, self.best_directory) if best
                              else (self._last, self.directory))
        try:
            restored = manager.restore(step, args=ocp.args.Composite(
                params=ocp.args.StandardRestore(_abstract(params_like))))
        except Exception as err:  # noqa: BLE001 - name the directory whatever went wrong
            raise CheckpointError(
                f"{directory / str(step)}: cannot restore the parameters ({_brief(err)})."
            ) from err
        return restored.params


# ----------------------------------------------------------------------------- averaging


def abstract_params(config: ModelConfig) -> tuple[nnx.GraphDef, Any, Any]:
    """(graphdef, params as ShapeDtypeStructs, other state) of a Transformer, nothing allocated."""
    abstract_model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    return nnx.split(abstract_model, nnx.Param, ...)


def average_checkpoints(run_dir: str | Path, last: int, config: ModelConfig | None = None
                        ) -> tuple[Any, list[int]]:
    """Mean of the parameters of the newest `last` complete checkpoints of `run_dir`.

    Averages in float32 with a running sum, so memory is two copies of the parameters.
    Returns (params as nnx.State, the steps averaged).
    """
    run_dir = Path(run_dir)
    if last < 1:
        raise ValueError(f"--average-last must be >= 1, got {last}.")
    if config is None:
        config = read_run_config(run_dir)[0]
    steps = complete_steps(run_dir / CHECKPOINTS_DIR)
    if not steps:
        raise CheckpointError(f"{run_dir / CHECKPOINTS_DIR}: no complete checkpoints to average.")
    if len(steps) < last:
        log.warning("averaging %d checkpoints: only %d of the requested %d exist",
                    len(steps), len(steps), last)
    steps = steps[-last:]
    _, params_like, _ = abstract_params(config)
    manager = ocp.CheckpointManager(run_dir.absolute() / CHECKPOINTS_DIR,
                                    options=ocp.CheckpointManagerOptions(read_only=True),
                                    item_names=_ITEMS)
    total = None
    try:
        for step in steps:
            params = manager.restore(step, args=ocp.args.Composite(
                params=ocp.args.StandardRestore(params_like))).params
            params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
            total = params if total is None else jax.tree.map(jnp.add, total, params)
    finally:
        manager.close()
    mean = jax.tree.map(lambda x: x / len(steps), total)
    return mean, steps


# ----------------------------------------------------------------------------- model directory


def read_run_config(run_dir: str | Path) -> tuple[ModelConfig, dict[str, Any]]:
    """(model config, whole JSON) from `run_dir/config.json`."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: this is not a run or model directory.")
    try:
        values = json.loads(path.read_text())
        if not isinstance(values, dict) or "model" not in values:
            raise CheckpointError(f"{path} has no 'model' section.")
        return ModelConfig.from_dict(values["model"]), values
    except (ValueError, TypeError) as err:  # not JSON, or settings this code does not know
        raise CheckpointError(
            f"{path}: not a valid run or model configuration ({type(err).__name__}: {err}); "
            "restore the config.json written with the run or model.") from None


def export_model(model_dir: str | Path, params: Any, model_config: ModelConfig,
                 tokenizer_file: str | Path, search_config: SearchConfig | None = None,
                 extra: dict[str, Any] | None = None) -> Path:
    """Write a self-contained model directory that `load_model` reads.

    Written into a temporary sibling and renamed, so a reader never sees a partial model.
    Only process 0 should call this (the parameters must be fully addressable, e.g. replicated).
    """
    model_dir = Path(model_dir)
    tmp = model_dir.with_name(model_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    pure = jax.tree.map(lambda x: np.asarray(jax.device_get(x), np.float32),
                        nnx.to_pure_dict(params))
    (tmp / PARAMS_FILE).write_bytes(serialization.msgpack_serialize(pure))
    shutil.copyfile(tokenizer_file, tmp / TOKENIZER_FILE)
    config = {"model": model_config.to_dict(),
              "search": dataclasses.asdict(search_config or SearchConfig()),
              "tokenizer": TOKENIZER_FILE, **(extra or {})}
    (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    old = model_dir.with_name(model_dir.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if model_dir.exists():
        model_dir.rename(old)
    tmp.rename(model_dir)
    shutil.rmtree(old, ignore_errors=True)
    return model_dir


def resolve_model_dir(path: str | Path) -> Path:
    """A model directory, given either itself or a run directory containing `model/`."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path} does not exist; pass a run directory or its model/ folder.")
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
    from data.tokenizer import Tokenizer  # data/ imports heavy libraries; load lazily

    model_dir = resolve_model_dir(path)
    for name, what in ((CONFIG_FILE, "model configuration"), (PARAMS_FILE, "parameters"),
                       (TOKENIZER_FILE, "SentencePiece model")):
        if not (model_dir / name).is_file():
            raise CheckpointError(
                f"{model_dir} is not a complete model directory: {name} ({what}) is missing; "
                f"train with train.py or export one with --average-last.")
    model_config, values = read_run_config(model_dir)
    if dtype is not None:
        model_config = ModelConfig.from_dict({**model_config.to_dict(), "dtype": dtype})
    graphdef, params, rest = abstract_params(model_config)
    try:
        pure = serialization.msgpack_restore((model_dir / PARAMS_FILE).read_bytes())
        nnx.replace_by_pure_dict(params, pure)
    except Exception as err:  # noqa: BLE001 - name the file whatever went wrong
        raise CheckpointError(f"{model_dir / PARAMS_FILE} does not match {model_dir / CONFIG_FILE}"
                              f" or is damaged: {err}") from err
    params = jax.tree.map(jnp.asarray, params)
    model = nnx.merge(graphdef, params, rest)
    tokenizer = Tokenizer.load(model_dir / TOKENIZER_FILE)
    values = dict(values)
    values["model"] = model_config
    try:
        values["search"] = SearchConfig(**values.get("search", {}))
    except (ValueError, TypeError) as err:
        raise CheckpointError(
            f"{model_dir / CONFIG_FILE}: invalid 'search' settings ({type(err).__name__}: "
            f"{err}); restore the config.json written with the model.") from None
    return model, tokenizer, values
