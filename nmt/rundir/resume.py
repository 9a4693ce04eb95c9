"""Resuming a run: what must match the run being resumed, and what is carried over.

A run directory is resumed with the settings it was trained with where they matter (the
model, the tokenizer, the seed); the batch plan, the metric that picks the best checkpoint and
the regularization may change, and the checks here say what happens then.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx, serialization

from data.batching import BatchIterator, Examples, plan_fingerprint
from data.config import BatchConfig, DataError
from data.sampling import SampledEpochs
from data.tokenizer import (
    MODEL_FILE,
    SOURCE_SPM,
    SPECIAL_TOKENS_FILE,
    TARGET_SPM,
    VOCAB_FILE,
    load_tokenizer,
    tokenizer_present,
)
from nmt.models.model_dir import ModelDirError, check_shapes
from nmt.models.model_files import CONFIG_FILE, MODEL_DIR, PARAMS_FILE
from nmt.rundir.bookkeeping import Bookkeeping
from nmt.rundir.checkpoints import (
    CHECKPOINTS_DIR,
    Checkpointer,
    CheckpointError,
    complete_steps,
    unusable,
)
from nmt.settings import recipes
from nmt.settings.config import RunConfig, SettingsError
from transformer.config import ModelConfig
from transformer.training import place_replicated

log = logging.getLogger("trainer")

RUN_CONFIG_FILE = "config.yaml"  # the run's resolved settings, a recipe


class ResumeError(RuntimeError):
    """The run directory holds a run that cannot be continued: its files are missing or
    damaged (`SettingsMismatch`: these settings are not the run's)."""


class SettingsMismatch(ResumeError):
    """The run directory holds a run that these settings (another model, tokenizer, seed or
    --init-from) cannot continue: a usage error."""


def saved_run(run_dir: Path) -> RunConfig | None:
    """The settings the run in `run_dir` recorded, or None when it recorded none."""
    path = run_dir / RUN_CONFIG_FILE
    if not path.is_file():
        return None
    try:
        return recipes.load_saved(path)
    except SettingsError as err:
        raise ResumeError(f"{path} cannot be read ({err}); restore it, or use a new "
                          "--output-dir.") from None


def check_tokenizer_present(run_dir: Path) -> None:
    """A run with checkpoints must keep its spm.model: a new one, trained on resume, would not
    be the one the parameters were trained with."""
    if tokenizer_present(run_dir) or not complete_steps(run_dir / CHECKPOINTS_DIR):
        return
    copy = run_dir / "model" / MODEL_FILE
    restore = (f"copy {copy} (the model's copy of it) back" if copy.is_file()
               else "restore it")
    raise ResumeError(
        f"{run_dir / MODEL_FILE} is missing, but {run_dir / CHECKPOINTS_DIR} holds a run "
        f"trained with it; {restore} to resume, or use a new --output-dir.")


def check_same_tokenizer(run_dir: Path, run: RunConfig, saved: RunConfig | None) -> None:
    """An existing spm.model is reused; fail if this run asks for a different one."""
    mismatch = tokenizer_mismatch(run_dir, run, saved)
    if mismatch is not None:
        raise SettingsMismatch(mismatch)


def tokenizer_mismatch(run_dir: Path, run: RunConfig, saved: RunConfig | None) -> str | None:
    """Why the run directory's tokenizer, by the settings it was recorded with, is not the one
    this run asks for; None when it is (or nothing was recorded)."""
    if saved is None or not tokenizer_present(run_dir):
        return None
    path = run_dir / RUN_CONFIG_FILE
    if run.trainer.init_from and not saved.trainer.init_from:  # its checkpoints would win
        return (f"the run in {run_dir} was trained from scratch (see {path}), this run asks for "
                f"--init-from {run.trainer.init_from}: drop --init-from to resume the run, or "
                "use a new --output-dir to fine-tune that model.")
    if saved.trainer.init_from and run.trainer.init_from != saved.trainer.init_from:
        return (f"the run in {run_dir} started from the model in --init-from "
                f"{saved.trainer.init_from} (see {path}), this run asks for "
                f"{run.trainer.init_from or 'none'}: pass --init-from {saved.trainer.init_from} "
                "to resume it, or use a new --output-dir.")
    if run.trainer.init_from:
        return None  # data.encoding checks that the run's tokenizer is the model's
    if saved.tokenizer.spm_model and not run.tokenizer.spm_model:
        return (f"the run in {run_dir} uses the SentencePiece model of --spm-model "
                f"{saved.tokenizer.spm_model} (see {path}): pass that flag again to resume it.")
    if run.tokenizer.spm_model:
        return None  # data.tokenizer checks that it is the run's spm.model
    for name, flag in (("model_type", "--tokenizer-type"), ("vocab_size", "--vocab-size")):
        then, now = getattr(saved.tokenizer, name), getattr(run.tokenizer, name)
        if then != now:
            return (f"{run_dir / MODEL_FILE} was trained with {flag} {then} (see {path}), this "
                    f"run asks for {flag} {now}: pass {flag} {then} to resume with it, or use a "
                    "new --output-dir to train a new tokenizer.")
    return None


TOKENIZER_FILES = (MODEL_FILE, SOURCE_SPM, TARGET_SPM, VOCAB_FILE, SPECIAL_TOKENS_FILE)


def discard_unused_tokenizer(run_dir: Path, run: RunConfig, saved: RunConfig | None) -> None:
    """A run directory without a checkpoint trained nothing with its tokenizer (a start that
    failed: its budget too short, a bad flag found late): one that these settings would not
    reuse, or whose settings no config.yaml recorded (the start failed before writing it), is
    removed, so that the run makes its own (from the tokenizer cache where the text and
    settings are the same) rather than being refused or training on another."""
    if complete_steps(run_dir / CHECKPOINTS_DIR) or not tokenizer_present(run_dir):
        return
    given = run.trainer.init_from or run.tokenizer.spm_model
    unrecorded = saved is None and not given  # a given one is compared with the file itself
    if (not unrecorded and tokenizer_mismatch(run_dir, run, saved) is None
            and not _other_than_given(run_dir, run)):
        return
    for name in TOKENIZER_FILES:
        (run_dir / name).unlink(missing_ok=True)
    log.info("%s holds no checkpoint: its tokenizer, left by a start that took no step, is "
             "replaced by this run's", run_dir)


def _other_than_given(run_dir: Path, run: RunConfig) -> bool:
    """Whether the run directory's tokenizer differs from the one --init-from or --spm-model
    gives (False when that one cannot be read: its own check says so later)."""
    given = run.trainer.init_from or run.tokenizer.spm_model
    if not given:
        return False
    try:
        wanted = load_tokenizer(given).fingerprint
    except (DataError, OSError, RuntimeError):
        return False
    try:
        return load_tokenizer(run_dir).fingerprint != wanted
    except (DataError, OSError, RuntimeError):
        return True  # damaged, and nothing was trained with it


def check_same_languages(run_dir: Path, run: RunConfig, saved: RunConfig | None) -> None:
    """Resuming with --src and --tgt swapped or changed would go on training the checkpoints
    in another direction, and record the run as that direction."""
    if saved is None:
        return
    then, now = (saved.data.src, saved.data.tgt), (run.data.src, run.data.tgt)
    if then != now:
        raise SettingsMismatch(
            f"the run in {run_dir} translates {'->'.join(then)} (see "
            f"{run_dir / RUN_CONFIG_FILE}), this run asks for {'->'.join(now)}: pass --src "
            f"{then[0]} --tgt {then[1]} to resume it, or use a new --output-dir (with "
            f"--init-from {run_dir / MODEL_DIR} to start from its parameters).")


def check_same_seed(run_dir: Path, run: RunConfig, saved: RunConfig | None) -> None:
    """The seed fixes each epoch's batch order and the validation pairs held out of the
    training data: resuming with another would repeat and skip pairs mid-epoch and could move
    validation pairs into training."""
    if saved is not None and saved.optimizer.seed != run.optimizer.seed:
        raise SettingsMismatch(seed_mismatch(f"{run_dir} was trained",
                                             f" (see {run_dir / RUN_CONFIG_FILE})",
                                             saved.optimizer.seed, run.optimizer.seed))


def seed_mismatch(trained: str, source: str, saved: int, seed: int) -> str:
    """The error for resuming `trained` ("RUN was trained"), whose seed `saved` was read from
    `source`, with another `seed`."""
    return (f"{trained} with --seed {saved}{source}, this run asks for --seed {seed}: the seed "
            "fixes the order of the training pairs and the validation pairs held out of them, "
            f"so pass --seed {saved} to resume, or use a new --output-dir.")


# Model settings a resumed run may change, as fairseq and Marian allow: they leave the
# parameters' layout as it is (parameters live in float32 whatever the compute dtype).
MAY_CHANGE_ON_RESUME = ("dropout", "attention_dropout", "activation_dropout", "dtype",
                        "activation_dtype", "attention_impl")


def check_same_model(run_dir: Path, model: ModelConfig, saved: RunConfig | None,
                     preset: str) -> None:
    """Resuming with a different model would fail deep inside orbax; say so up front, naming
    the run's --preset where this run's (`preset`) differs. The settings of
    MAY_CHANGE_ON_RESUME may change: one info line names them, once nothing is refused."""
    if saved is None:
        return
    then = saved.model
    changed = [name for name in ModelConfig.__dataclass_fields__
               if name not in ("vocab_size", "pad_id", "unk_id", "bos_id", "eos_id")
               and getattr(then, name) != getattr(model, name)]
    diff = [name for name in changed if name not in MAY_CHANGE_ON_RESUME]
    if diff:
        changes = ", ".join(f"{k}: saved {getattr(then, k)!r}, now {getattr(model, k)!r}"
                            for k in diff)
        flags = ("the same model flags" if saved.preset == preset else
                 f"--preset {saved.preset} (the run's, this run's is {preset}) and its model "
                 "flags")
        raise SettingsMismatch(f"{run_dir / RUN_CONFIG_FILE} was trained with a different "
                               f"model ({changes}); pass {flags} to resume, or a new "
                               "--output-dir.")
    allowed = [name for name in changed if name in MAY_CHANGE_ON_RESUME]
    if allowed:
        log.info("resuming with %s changed; the parameters' layout is the same",
                 _changes(then, model, allowed))


def _changes(then, now, names) -> str:
    """"name old -> new" for each of `names`, as the resume lines list changed settings."""
    return ", ".join(f"{name} {getattr(then, name)!r} -> {getattr(now, name)!r}"
                     for name in names)


# Training settings a resumed run may change, as fairseq and Marian allow: they change what
# the steps from the resume on optimize, not what the checkpoints hold.
TRAINING_NOTED_ON_RESUME = {"optimizer": ("rdrop", "label_smoothing"),
                            "tokenizer": ("subword_alpha", "subword_nbest")}


def note_changed_training(run: RunConfig, saved: RunConfig | None) -> None:
    """A flag left out on resume takes its default (R-Drop off, no subword sampling): one
    info line names each setting of TRAINING_NOTED_ON_RESUME that differs from the run's."""
    if saved is None:
        return
    changes = []
    for section, names in TRAINING_NOTED_ON_RESUME.items():
        then, now = getattr(saved, section), getattr(run, section)
        changed = [name for name in names if getattr(then, name) != getattr(now, name)]
        if changed:
            changes.append(_changes(then, now, changed))
    if changes:
        log.info("resuming with %s changed", ", ".join(changes))


def batch_iterator(examples: Examples, config: BatchConfig, book: Bookkeeping, step: int,
                   sampled: SampledEpochs | None = None) -> BatchIterator:
    """The training batches from the saved position, unless the batch plan it indexes has
    changed (batch settings, --accum, subword sampling, the device count or the training data
    did). Then the epoch in progress is cut short: its pairs are no longer where the position
    says, so going on would repeat some and skip others. Records the plan in `book` unless
    the recorded one still holds: any epoch's plan is checked the same way, and a rerun of a
    finished run, its bookkeeping unchanged, then writes no checkpoint again."""
    position = book.iterator
    resegmented = sampled.examples if sampled is not None else None
    grid = sampled.grid if sampled is not None else None
    batches = BatchIterator(examples, config, state=position, resegmented=resegmented,
                            grid=grid)
    saved = book.plan
    changed = saved is not None and position["position"] > 0 and plan_fingerprint(
        batches.plan(saved["epoch"])) != saved["fingerprint"]
    if changed:
        log.warning("the batch plan changed since step %d was saved (--batch-tokens, "
                    "--buckets, --accum, --subword-alpha, the device count, the training "
                    "data or this version's batching); the rest of epoch %d is skipped and "
                    "training goes on with epoch %d",
                    step, position["epoch"], position["epoch"] + 1)
        batches = BatchIterator(examples, config, resegmented=resegmented, grid=grid,
                                state={"epoch": position["epoch"] + 1, "position": 0})
    if saved is None or changed or position["position"] == 0:
        epoch = batches.state["epoch"]
        book.plan = {"epoch": epoch, "fingerprint": plan_fingerprint(batches.plan(epoch))}
    return batches


def carry_over_best(book: Bookkeeping, run: RunConfig, bleu_tokenizer: str,
                    saver: Checkpointer, step: int, params) -> None:
    """The best step of the resumed run, as far as it still counts.

    A run resumed with another --best-metric, or with BLEU tokenized another way, tracks the
    best afresh: the saved best score does not compare with the new ones. The validation of
    the step resumed from starts it when it holds the new score. A run resumed with
    --eval-sentences 0 computes no BLEU or chrF: a best by either is dropped, so that model/ is
    the last step, not one no later step can beat. best/ must then hold the best step the
    bookkeeping records and nothing else.
    """
    metric = run.trainer.best_metric or book.best_metric  # no flag: keep the run's metric
    old_tokenizer, book.bleu_tokenizer = book.bleu_tokenizer, bleu_tokenizer
    comparable = metric != "bleu" or bleu_tokenizer == old_tokenizer
    if book.best_metric != metric or not comparable:
        old = book.metric_label + (f" tokenized with {old_tokenizer}"
                                   if book.best_metric == metric else "")
        saver.discard_best(keep=None)
        book.restart_best(metric)
        if comparable:
            _start_best_from_last_validation(book, saver, step, params)
        now = book.metric_label + (f" tokenized with {bleu_tokenizer}" if metric == "bleu"
                                   else "")
        log.warning("the best step so far was chosen by %s; from now on %s chooses best/ and "
                    "model/, starting %s", old, now, _where_the_best_starts(book, step))
    elif metric != "ppl" and run.trainer.eval_sentences == 0 and book.best_step is not None:
        log.warning("--eval-sentences 0 scores no %s: the best step so far (%d) no longer "
                    "counts, and model/ is the last step (--best-metric ppl chooses by "
                    "perplexity)", book.metric_label, book.best_step)
        saver.discard_best(keep=None)
        book.restart_best(metric)
    _check_best_directory(book, saver, step, params)


def _start_best_from_last_validation(book: Bookkeeping, saver: Checkpointer, step: int,
                                     params) -> None:
    """The validation of the step resumed from is the first best, if it holds the score."""
    last = book.last_eval
    if last and last["step"] == step and last.get(book.best_metric) is not None:
        book.best_score, book.best_step = last[book.best_metric], step
        saver.save_best(step, params, {book.best_metric: book.best_score, "step": step})


def _where_the_best_starts(book: Bookkeeping, step: int) -> str:
    """Where a best tracked afresh from `step` starts, as the warnings say it."""
    return (f"from the validation of step {step}" if book.best_step is not None
            else "at the next validation")


def _check_best_directory(book: Bookkeeping, saver: Checkpointer, step: int, params) -> None:
    """best/ must hold the best step the bookkeeping records and nothing else: a step saved
    there after the checkpoint resumed from belongs to a run being redone. A best step whose
    best/ is damaged or missing is written again from checkpoints/<step>, which holds the
    same parameters, while that is kept, else from model/, while that holds the step."""
    discarded = saver.discard_best(keep=book.best_step)
    if discarded:
        log.warning("deleted %s steps %s: saved after step %d, where this run starts",
                    saver.best_directory, discarded, step)
    best = book.best_step
    if best is None or unusable(saver.best_directory / str(best)) is None:
        return
    try:
        best_params = saver.restore_params(params, best, best=True)  # warns of what it reads
    except CheckpointError as err:
        lost = str(err).split(": delete")[0]
        model_dir = saver.run_dir / MODEL_DIR
        best_params = _exported_best(model_dir, book, params)
        if best_params is None:
            _track_best_afresh(book, saver, step, params, lost)
            return
        log.warning("%s; writing best step %d again from %s, which holds the same parameters",
                    lost, best, model_dir)
    saver.save_best(best, best_params, {book.best_metric: book.best_score, "step": best})


def _track_best_afresh(book: Bookkeeping, saver: Checkpointer, step: int, params,
                       lost: str) -> None:
    """The best step's parameters are nowhere (`lost` says why): the best starts again from
    the validation of the step resumed from, as a run resumed with another metric does."""
    saver.discard_best(keep=None)
    book.restart_best(book.best_metric)
    _start_best_from_last_validation(book, saver, step, params)
    log.warning("%s, and %s/ does not hold that step; tracking the best %s afresh, starting "
                "%s", lost, MODEL_DIR, book.metric_label, _where_the_best_starts(book, step))


def _exported_best(model_dir: Path, book: Bookkeeping, like: Any) -> Any | None:
    """The best step's parameters as `model_dir` holds them (float32, as trained), placed as
    `like` is; None unless its config.json records that step with its score."""
    try:
        values = json.loads((model_dir / CONFIG_FILE).read_text(encoding="utf-8"))
        if (values.get("step"), values.get(book.best_metric)) != (book.best_step,
                                                                    book.best_score):
            return None
        pure = serialization.msgpack_restore((model_dir / PARAMS_FILE).read_bytes())
        check_shapes(model_dir, like, pure)
    except (OSError, ValueError, TypeError, AttributeError, ModelDirError):
        return None  # no model/, or one that is damaged: it holds nothing to read
    params = jax.tree.map(lambda leaf: leaf, like)  # a copy: the run's own are kept
    nnx.replace_by_pure_dict(params, pure)
    # Every process read the same file: each fills its own devices from its copy.
    return jax.tree.map(lambda new, old: place_replicated(np.asarray(new, old.dtype),
                                                          old.sharding), params, like)
