"""Where a run starts: its data, and the model's state, restored from the run directory's
newest checkpoint or freshly initialized, after checking that the directory holds a run these
settings can continue.

    start = prepare_start(run, run_dir, compile_log)
    start.state, start.step, start.bookkeeping   # what the loop goes on from
"""

from __future__ import annotations

import dataclasses
import functools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from data.batching import BatchIterator
from data.config import DataError
from data.packing import PACKED_KEYS
from data.tokenizer import load_tokenizer, tokenizer_present
from nmt.models.model_files import resolve_model_dir
from nmt.rundir import resume
from nmt.rundir.bookkeeping import Bookkeeping
from nmt.rundir.checkpoints import (
    CHECKPOINTS_DIR,
    Checkpointer,
    CheckpointError,
    complete_steps,
    epochs_trained,
)
from nmt.runtime.compilation import AheadOfTime, CompileLog
from nmt.runtime.distributed import local_copy
from nmt.settings.config import RunConfig
from nmt.training import schedule_fit
from nmt.training.errors import RunMismatch, TrainingError
from nmt.training.run_data import PreparedCorpus, prepare_data
from nmt.training.summary import echo
from nmt.training.validation import Validator
from nmt.translation import scoring
from transformer.config import ModelConfig, OptimizerConfig
from transformer.training import (
    batch_sharding,
    create_train_state,
    make_eval_step,
    make_mesh,
    make_train_step,
    place_replicated,
)


@dataclasses.dataclass
class Start:
    """What the loop starts from, built in one place so that the trainer only runs it.

    saved: (step, bookkeeping fingerprint) of the checkpoint restored, None without one; a
    save of the same step with the same bookkeeping is skipped.
    """

    mesh: jax.sharding.Mesh
    model_config: ModelConfig
    data: PreparedCorpus
    graphdef: Any
    state: Any
    train_step: AheadOfTime
    validator: Validator
    checkpoints: Checkpointer  # checkpoints/<N>/ and best/<N>/ of the run directory
    bookkeeping: Bookkeeping
    bleu_tokenizer: str  # the tokenizer BLEU is scored with (--bleu-tokenize or the language's)
    resumed_from: int | None
    saved: tuple[int, str] | None

    @property
    def step(self) -> int:
        """The step the state has reached: the checkpoint's, or 0."""
        return int(local_copy(self.state.step))

    def train_step_compiling(self, optimizer: OptimizerConfig, state: Any,
                             compile_log: CompileLog) -> AheadOfTime:
        """A train step for `optimizer` (a fitted schedule's), compiling in the background."""
        train_step = train_step_for(self.graphdef, optimizer, self.mesh, compile_log)
        start_compiling_the_train_step(train_step, state, self.data, self.mesh)
        return train_step


def prepare_start(run: RunConfig, run_dir: Path, compile_log: CompileLog) -> Start:
    """The run's data, and its state restored from `run_dir` (or initialized); raises
    RunMismatch when `run_dir` holds a run with another model, tokenizer, seed or
    --init-from, TrainingError when its files are missing or damaged."""
    bleu = validation_bleu(run)  # before any work: a BLEU tokenizer that is missing fails
    _check_schedule_left(run, run_dir, None)
    mesh = make_mesh()
    _discard_unused_tokenizer(run, run_dir)
    # The model is initialized (and its initialization compiled) in the background while the
    # data is prepared, for the vocabulary the tokenizer is expected to have.
    model_config = _expected_model(run, run_dir)
    with ThreadPoolExecutor(1) as pool:
        created = pool.submit(_create_state, run, run_dir, model_config, mesh, compile_log)
        data = _prepare_data(run, run_dir, model_config)
        _check_schedule_left(run, run_dir, data)
        graphdef, state, train_step = created.result()
    if run.model_for(data.tokenizer) != model_config:  # a vocabulary fitted to a small corpus
        model_config = run.model_for(data.tokenizer)
        graphdef, state, train_step = _create_state(run, run_dir, model_config, mesh,
                                                    compile_log)
    start_compiling_the_train_step(train_step, state, data, mesh)
    checkpoints = Checkpointer(run_dir, keep_last=run.trainer.keep_last,
                               async_save=run.trainer.async_checkpoints)
    bleu_tokenizer = run.trainer.bleu_tokenize or scoring.bleu_tokenizer_for(run.data.tgt)
    bookkeeping = Bookkeeping(best_metric=run.trainer.best_metric or "bleu",
                              bleu_tokenizer=bleu_tokenizer)
    state, bookkeeping, resumed_from = _restore(checkpoints, state, bookkeeping, run_dir)
    saved = (resumed_from, bookkeeping.fingerprint()) if resumed_from is not None else None
    _check_tokenizer_unchanged(bookkeeping, data, checkpoints, run_dir, resumed_from)
    _check_seed_unchanged(bookkeeping, run.optimizer.seed, checkpoints, resumed_from)
    validator = Validator(data, make_eval_step(graphdef, mesh, run.optimizer), mesh, run.search,
                          run.trainer.eval_sentences, run.trainer.samples, bleu, echo,
                          compile_log)
    return Start(mesh=mesh, model_config=model_config, data=data, graphdef=graphdef,
                 state=state, train_step=train_step, validator=validator,
                 checkpoints=checkpoints, bookkeeping=bookkeeping,
                 bleu_tokenizer=bleu_tokenizer, resumed_from=resumed_from, saved=saved)


def _check_schedule_left(run: RunConfig, run_dir: Path, data: PreparedCorpus | None) -> None:
    """RunMismatch for a run resumed at the end of its linear schedule with a limit that
    allows more steps (`schedule_fit.nothing_left`). Before the data is prepared (`data`
    None) an epoch the checkpoint had begun counts as trained, so that what is refused then,
    before anything compiles, is refused for certain; after, that epoch's batches tell
    whether it had trained its last (a checkpoint at an epoch's end saves its last position)."""
    steps = complete_steps(run_dir / CHECKPOINTS_DIR)
    if not steps:
        return
    try:
        saved = resume.saved_run(run_dir)
    except resume.ResumeError:
        return  # an unreadable config.yaml: _prepare_data says so
    newest = run_dir / CHECKPOINTS_DIR / str(steps[-1])
    batches_in = None if data is None else functools.partial(_batches_in, data)
    why = schedule_fit.nothing_left(run, saved, steps[-1],
                                    lambda: epochs_trained(newest, batches_in),
                                    run_dir / resume.RUN_CONFIG_FILE)
    if why is not None:
        raise RunMismatch(why)


def _batches_in(data: PreparedCorpus, epoch: int) -> int:
    """The batches of `epoch`, as the training iterator plans them (`resume.batch_iterator`)."""
    sampling = data.train_sampling
    return BatchIterator(data.train_examples, data.batch_config,
                         state={"epoch": epoch, "position": 0},
                         resegmented=None if sampling is None else sampling.examples,
                         grid=None if sampling is None else sampling.grid,
                         describe=False).batches_per_epoch


def _discard_unused_tokenizer(run: RunConfig, run_dir: Path) -> None:
    """Process 0 removes a tokenizer that a start which took no step left and this run would
    not reuse (`resume.discard_unused_tokenizer`); the others load the one it then writes."""
    if jax.process_index() != 0:
        return
    try:
        saved = resume.saved_run(run_dir)
    except resume.ResumeError:
        return  # an unreadable config.yaml: _prepare_data says so
    resume.discard_unused_tokenizer(run_dir, run, saved)


def _expected_model(run: RunConfig, run_dir: Path) -> ModelConfig:
    """The model config for the tokenizer the run will have: --init-from's, the run
    directory's (a resumed run), else one of --vocab-size pieces (fewer if the corpus is too
    small for them: then the model is built again for the tokenizer trained)."""
    if run.trainer.init_from:
        return run.model_for(load_tokenizer(run.trainer.init_from))
    if tokenizer_present(run_dir) and not run.tokenizer.spm_model:
        try:
            return run.model_for(load_tokenizer(run_dir))
        except (DataError, OSError, RuntimeError):
            pass  # damaged: the checks of the run directory say how (_prepare_data)
    return run.model_for_vocab(run.tokenizer.vocab_size)


def validation_bleu(run: RunConfig) -> dict[str, str | None]:
    """The BLEU settings validation scores with, checked only when it translates sentences."""
    if run.trainer.eval_sentences:
        return scoring.bleu_settings(run.data.tgt, run.trainer.bleu_tokenize)
    return {"target_language": run.data.tgt, "bleu_tokenize": run.trainer.bleu_tokenize}


def initial_params(model_path: str, like: Any) -> Any:
    """The parameters of the model directory `model_path`, placed as `like` (the freshly
    initialised ones) is; TrainingError if their shapes differ."""
    from flax import nnx

    from nmt.models.model_dir import ModelDirError, load_model

    try:
        model, _, _ = load_model(model_path)
    except ModelDirError as err:
        raise TrainingError(f"--init-from: {err}") from None
    loaded = nnx.state(model, nnx.Param)
    if jax.tree.structure(loaded) != jax.tree.structure(like) or any(
            a.shape != b.shape for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(like))):
        raise TrainingError(f"--init-from {model_path}: its parameters do not fit this run's "
                            "model; the architecture settings must be the model's own.")
    # Every process read the same file: each fills its own devices from its copy.
    return jax.tree.map(lambda new, old: place_replicated(new.astype(old.dtype), old.sharding),
                        loaded, like)


def _prepare_data(run: RunConfig, run_dir: Path, model_config: ModelConfig) -> PreparedCorpus:
    """The run's data, after checking that the run directory holds a run these settings
    can continue."""
    saved = resume.saved_run(run_dir)
    try:
        resume.check_tokenizer_present(run_dir)
        resuming = bool(complete_steps(run_dir / CHECKPOINTS_DIR))
        if resuming:
            resume.check_same_tokenizer(run_dir, run, saved)
            resume.check_same_languages(run_dir, run, saved)
        data = prepare_data(run, run_dir, run.model.max_len)
        if resuming:
            resume.check_same_model(run_dir, model_config, saved, run.preset)
            resume.note_changed_training(run, saved)
            resume.check_same_seed(run_dir, run, saved)
    except resume.SettingsMismatch as err:
        raise RunMismatch(str(err)) from None
    except resume.ResumeError as err:
        raise TrainingError(str(err)) from None
    return data


def _create_state(run: RunConfig, run_dir: Path, model_config: ModelConfig, mesh,
                  compile_log: CompileLog) -> tuple[Any, Any, AheadOfTime]:
    """The initialized state (from --init-from's parameters on a fresh run) and its step."""
    optimizer = schedule_fit.for_compiling(run.optimizer)
    with compile_log.labelled("init"):
        graphdef, _, state = create_train_state(model_config, optimizer, mesh)
    init_from = run.trainer.init_from
    if init_from and not complete_steps(run_dir / CHECKPOINTS_DIR):
        state = state.replace(params=initial_params(init_from, state.params))
        echo(f"Starting from the parameters of {resolve_model_dir(init_from)}.")  # a run's model/
    step = train_step_for(graphdef, optimizer, mesh, compile_log)
    return graphdef, state, step


def train_step_for(graphdef, optimizer: OptimizerConfig, mesh, compile_log: CompileLog
                   ) -> AheadOfTime:
    return AheadOfTime(make_train_step(graphdef, optimizer, mesh), compile_log, "train_step")


def start_compiling_the_train_step(train_step: AheadOfTime, state: Any, data: PreparedCorpus,
                                   mesh) -> None:
    """Packed batches have one shape: compile its step while other work goes on."""
    config = data.batch_config
    if not config.packing:
        return  # bucketed batches: each shape compiles at its first step
    spec = {key: jax.ShapeDtypeStruct((config.rows_per_batch, config.width), jnp.int32,
                                      sharding=batch_sharding(mesh))
            for key in PACKED_KEYS}
    # Shapes only: the steps running meanwhile donate (delete) the state's buffers.
    state_spec = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    train_step.start(state_spec, spec)


def checkpoint_items(state: Any) -> dict[str, Any]:
    """What a checkpoint holds of the train state besides the parameters."""
    return {"step": state.step, "opt_state": state.opt_state, "rng": state.rng}


def _restore(checkpoints: Checkpointer, state: Any, bookkeeping: Bookkeeping, run_dir: Path
             ) -> tuple[Any, Bookkeeping, int | None]:
    """The state and bookkeeping of the latest checkpoint, and its step; those given (and
    None) when there is none."""
    try:
        restored = checkpoints.restore(state.params, checkpoint_items(state))
    except CheckpointError:
        checkpoints.close()  # its threads, left running, abort the interpreter at exit
        raise
    if restored is None:
        return state, bookkeeping, None
    state = state.replace(params=restored.params, step=restored.train["step"],
                          opt_state=restored.train["opt_state"], rng=restored.train["rng"])
    echo(f"Resuming {run_dir} from step {restored.step}.")
    return state, Bookkeeping.from_json(restored.data), restored.step


def _check_tokenizer_unchanged(bookkeeping: Bookkeeping, data: PreparedCorpus,
                               checkpoints: Checkpointer, run_dir: Path,
                               resumed_from: int | None) -> None:
    """The checkpoint's model was trained with the tokenizer it recorded: refuse another."""
    sha256 = data.tokenizer.sha256
    if bookkeeping.tokenizer_sha256 not in (None, sha256):
        step = resumed_from if resumed_from is not None else "?"
        checkpoints.close()
        names = ", ".join(data.tokenizer.files())
        raise TrainingError(
            f"{run_dir / next(iter(data.tokenizer.files()))} is not the tokenizer "
            f"that checkpoint step {step} in {run_dir / CHECKPOINTS_DIR} was trained with "
            f"(the SHA-256 of {names} differs from the one the checkpoint recorded); put the "
            f"run's own files back (the copies in {run_dir / 'model'}, if present), or "
            "use a new --output-dir.")
    bookkeeping.tokenizer_sha256 = sha256


def _check_seed_unchanged(bookkeeping: Bookkeeping, seed: int, checkpoints: Checkpointer,
                          resumed_from: int | None) -> None:
    """The seed the checkpoint recorded (`resume.check_same_seed` reads config.yaml, which
    may be gone): another would repeat and skip pairs mid-epoch."""
    if bookkeeping.seed not in (None, seed):
        checkpoints.close()
        raise RunMismatch(resume.seed_mismatch(
            f"checkpoint step {resumed_from} in {checkpoints.directory} was trained", "",
            bookkeeping.seed, seed))
    bookkeeping.seed = seed
