"""The training loop: `train(run, workdir)`.

    run = nmt.settings.recipes.load("configs/multi30k_small.yaml")
    summary = train(run)

One loop serves one CPU, every device of a host, and many hosts (call
`nmt.runtime.distributed.initialize_distributed` first): batches are split over the mesh axis
"data", every process reads its own rows of each global batch, checkpoints are written by all
processes, and only process 0 prints, logs metrics and exports the model.

The run directory it leaves:

    config.yaml        every setting of the run (a recipe: `train.py --config` runs it again)
    spm.model          the SentencePiece model
    checkpoints/<N>/   the last --keep-last checkpoints (nmt.rundir.checkpoints)
    best/<N>/          parameters with the best validation score so far (--best-metric)
    model/             the model translate.py loads: the best step, else the last
    averaged/          with --average-last N: the mean of the last N checkpoints
    metrics.jsonl      one JSON object per log line ("train") and per validation ("eval")
    tb/                TensorBoard event files
    .lock              held while a trainer runs here (nmt.rundir.lock): one trainer per run

Exact resumption: a checkpoint holds everything the next step depends on (parameters,
optimizer state, step, rng, the data position) and the per-step metrics of the unfinished
log window, so a run interrupted at any step and resumed writes the same metrics.jsonl lines
(wall-clock fields aside) as one that never stopped.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from data.tokenizer import load_tokenizer
from nmt.rundir import final_model, resume
from nmt.settings import recipes
from nmt.translation import scoring
from nmt.rundir.bookkeeping import Bookkeeping
from nmt.rundir.checkpoints import CHECKPOINTS_DIR, Checkpointer, SaveError, complete_steps
from data.packing import PACKED_KEYS
from nmt.runtime.compilation import AheadOfTime, CompileLog, enable_compilation_cache
from nmt.settings.config import RunConfig
from nmt.runtime.distributed import barrier, local_copy
from nmt.training.metrics_log import MetricsWindow, MetricsWriteError, MetricsWriter
from nmt.training.platform_check import BudgetForecast
from nmt.training.run_data import prepare_data
from nmt.rundir.lock import LOCK_FILE, RunLock
from nmt.training.stopping import Limits, PausableClock, StopSignal
from nmt.training.summary import announcement, build_summary, echo, print_summary, progress_bar
from nmt.training.validation import Validator, describe
from transformer.training import (batch_sharding, create_train_state, make_eval_step,
                                  make_mesh, make_train_step, shard_batch)

log = logging.getLogger(__name__)


class TrainingError(RuntimeError):
    """Training cannot go on (diverged, bad settings); the message says what to do."""


def train(run: RunConfig, workdir: str | Path | None = None) -> dict[str, Any]:
    """Train (or resume) a model in `workdir` (default: the run's output directory).

    Returns a summary: run_dir, model_dir, steps, stopped ("max_steps", "max_epochs",
    "max_minutes", "early_stop", "SIGINT"/"SIGTERM"), best_metric, best_score and best_step
    (None when no best was tracked), last_eval, minutes, translate_command, and test_command
    when a test split was given. Raises TrainingError when the loss stops being finite or
    `workdir` holds a run with another model, tokenizer or seed; SaveError or
    MetricsWriteError when a file cannot be written (the checkpoints before it stay intact);
    RunDirectoryInUse when another trainer runs in `workdir`.
    """
    run_dir = Path(workdir) if workdir is not None else run.output_dir()
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = RunLock(run_dir) if jax.process_index() == 0 else contextlib.nullcontext()
    with lock:
        enable_compilation_cache()
        with CompileLog().active() as compile_log:
            try:
                trainer = Trainer(run, run_dir, compile_log)
            except BaseException:  # missing data, say: a run that never started leaves none
                if created:
                    with contextlib.suppress(OSError):  # not empty, or removed by another
                        (run_dir / LOCK_FILE).unlink()
                        run_dir.rmdir()
                raise
            return trainer.train_and_export()


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
    return jax.tree.map(lambda new, old: jax.device_put(new.astype(old.dtype), old.sharding),
                        loaded, like)


class Trainer:
    """One call of `train`: the state, the data, the bookkeeping, and the loop over them."""

    def __init__(self, run: RunConfig, run_dir: Path, compile_log: CompileLog):
        self.run, self.run_dir, self.compile_log = run, run_dir, compile_log
        self.is_main = jax.process_index() == 0
        self.limits = Limits(run.trainer)
        bleu = scoring.bleu_settings(run.data.tgt, run.trainer.bleu_tokenize) if (
            run.trainer.eval_sentences) else {"target_language": run.data.tgt,
                                              "bleu_tokenize": run.trainer.bleu_tokenize}
        self.mesh = make_mesh()
        # The tokenizer will have tokenizer.vocab_size pieces: the model is initialized (and
        # its initialization compiled) in the background while the data is prepared.
        self.model_config = (run.model_for(load_tokenizer(run.trainer.init_from))
                             if run.trainer.init_from
                             else run.model_for_vocab(run.tokenizer.vocab_size))
        with ThreadPoolExecutor(1) as pool:
            state = pool.submit(self._create_state)
            self.data = self._prepare_data()
            self.graphdef, self.state, self.train_step = state.result()
        self._start_compiling_the_train_step()
        self.saver = Checkpointer(run_dir, keep_last=run.trainer.keep_last,
                                  async_save=run.trainer.async_checkpoints)
        tokenizer_name = run.trainer.bleu_tokenize or scoring.bleu_tokenizer_for(run.data.tgt)
        self.book = Bookkeeping(best_metric=run.trainer.best_metric or "bleu",
                                bleu_tokenizer=tokenizer_name)
        self.resumed_from: int | None = None
        self.saved = self._restore()  # (step, bookkeeping) of the checkpoint on disk
        self._check_tokenizer_unchanged()
        self.step = int(local_copy(self.state.step))
        # config.yaml is replaced only now: a resume that failed keeps the settings of the run.
        if self.is_main:
            _write_atomically(run_dir / resume.RUN_CONFIG_FILE, recipes.dump(run))
        resume.carry_over_best(self.book, run, tokenizer_name, self.saver, self.step,
                               self.state.params)
        self.batches = resume.batch_iterator(self.data.train_examples, self.data.batch_config,
                                             self.book, self.step)
        self.forecast = BudgetForecast(run.trainer.written_for, jax.devices()[0].platform,
                                       self.limits, self.batches.batches_per_epoch)
        self.writer = MetricsWriter(run_dir, self.step, self.is_main)
        self.window = MetricsWindow(self.book.window, self.step + 1, self._diverged,
                                    spike=run.trainer.loss_spike)
        self.clock = PausableClock()  # of the log window: tokens/s leaves out eval and saving
        self.validator = Validator(self.data, make_eval_step(self.graphdef, self.mesh, run.train),
                                   self.mesh, run.search, run.trainer.eval_sentences,
                                   run.trainer.samples, bleu, echo, compile_log)
        self.signals = StopSignal()
        self.bar = None
        self.compilations_logged = 0
        self.step_seconds = 0.0  # in train steps, validation and saving left out

    def _prepare_data(self):
        """The run's data, after checking that the run directory holds a run these settings
        can continue."""
        run, run_dir = self.run, self.run_dir
        saved = resume.saved_run(run_dir)
        try:
            resume.check_tokenizer_present(run_dir)
            resume.check_same_tokenizer(run_dir, run, saved)
            data = prepare_data(run, run_dir, run.model.max_len)
            if complete_steps(run_dir / CHECKPOINTS_DIR):
                resume.check_same_model(run_dir, self.model_config, saved)
                resume.check_same_seed(run_dir, run, saved)
        except resume.ResumeError as err:
            raise TrainingError(str(err)) from None
        if run.model_for(data.tokenizer) != self.model_config:
            raise TrainingError(
                f"the tokenizer in {run_dir} has {data.tokenizer.vocab_size} pieces but the run's "
                f"vocabulary size (--vocab-size) is {self.model_config.vocab_size}; set "
                f"--vocab-size {data.tokenizer.vocab_size}.")
        return data

    def _create_state(self):
        with self.compile_log.labelled("init"):
            graphdef, _, state = create_train_state(self.model_config, self.run.train,
                                                    self.mesh)
        init_from = self.run.trainer.init_from
        if init_from and not complete_steps(self.run_dir / CHECKPOINTS_DIR):
            state = state.replace(params=initial_params(init_from, state.params))
            echo(f"Starting from the parameters of {init_from}.")
        step = AheadOfTime(make_train_step(graphdef, self.run.train, self.mesh),
                           self.compile_log, "train_step")
        return graphdef, state, step

    def _start_compiling_the_train_step(self) -> None:
        """Packed batches have one shape: compile its step while the setup goes on."""
        config = self.data.batch_config
        if not config.packing:
            return  # bucketed batches: each shape compiles at its first step
        spec = {key: jax.ShapeDtypeStruct((config.rows_per_batch, config.width), jnp.int32,
                                          sharding=batch_sharding(self.mesh))
                for key in PACKED_KEYS}
        self.train_step.start(self.state, spec)

    def _restore(self) -> tuple[int, str] | None:
        """Restore the latest checkpoint into the state and the bookkeeping."""
        state = self.state
        restored = self.saver.restore(state.params, {"step": state.step,
                                                     "opt_state": state.opt_state,
                                                     "rng": state.rng})
        if restored is None:
            return None
        self.state = state.replace(params=restored.params, step=restored.train["step"],
                                   opt_state=restored.train["opt_state"],
                                   rng=restored.train["rng"])
        self.book = Bookkeeping.from_json(restored.data)
        self.resumed_from = restored.step
        echo(f"Resuming {self.run_dir} from step {restored.step}.")
        return restored.step, self.book.fingerprint()

    def _check_tokenizer_unchanged(self) -> None:
        """The checkpoint's model was trained with the tokenizer it recorded: refuse another."""
        sha256 = self.data.tokenizer.sha256
        if self.book.tokenizer_sha256 not in (None, sha256):
            step = self.saved[0] if self.saved else "?"
            self.saver.close()
            names = ", ".join(self.data.tokenizer.files())
            raise TrainingError(
                f"{self.run_dir / next(iter(self.data.tokenizer.files()))} is not the tokenizer "
                f"that checkpoint step {step} in {self.run_dir / CHECKPOINTS_DIR} was trained with "
                f"(the SHA-256 of {names} differs from the one the checkpoint recorded); put the "
                f"run's own files back (the copies in {self.run_dir / 'model'}, if present), or "
                "use a new --output-dir.")
        self.book.tokenizer_sha256 = sha256

    # ------------------------------------------------------------------------- the loop

    def train_and_export(self) -> dict[str, Any]:
        """Train, then export, with signals deferred while files are written; on a failure,
        the files in flight are completed or removed before the error goes on."""
        try:
            with self.signals:
                stopped = self.loop()
                with self.signals.critical():
                    return self.finish(stopped)
        except (TrainingError, SaveError, MetricsWriteError):
            self.close(quietly=True)
            raise
        except KeyboardInterrupt:  # Ctrl-C twice: no more saving, but nothing left half-done
            self.close(quietly=True)
            last = self.saver.latest_step()
            echo(f"Aborted at step {self.step}; "
                 + (f"checkpoint step {last} is the newest, and the same command resumes "
                    "from it." if last is not None else "no checkpoint was saved."))
            raise

    def loop(self) -> str:
        """Train until a limit, early stopping or a signal; returns why it stopped."""
        echo(announcement(self.run, self.state.params, self.model_config, self.data,
                          self.limits.describe(self.batches.batches_per_epoch), self.run_dir))
        stopped = None
        if self.book.out_of_patience(self.run.trainer.early_stop_patience):
            echo(f"Not training: this run stopped early at step {self.step}, "
                 f"{self.book.bad_evals} validations after its best {self.book.metric_label} "
                 f"({self.book.best_score:.2f} at step {self.book.best_step}), and "
                 f"--early-stop-patience is {self.run.trainer.early_stop_patience}; raise it to "
                 "train on.")
            stopped = "early_stop"
        warning = self.forecast.at_start()
        if warning and self.is_main and stopped is None:
            log.warning(warning)
        self.bar = progress_bar(self.run.trainer, self.limits.total_steps(
            self.batches.batches_per_epoch), self.step) if self.is_main else None
        self.train_step.wait()
        self.clock.restart()
        try:
            stopped = self._steps(stopped)
        finally:
            self._close_bar()
        self.saver.wait()
        return stopped

    def _steps(self, stopped: str | None) -> str:
        trainer = self.run.trainer
        in_flight: collections.deque = collections.deque()
        signals = self.signals
        while stopped is None:
            stopped = self.limits.reached(self.step, self.batches.epochs_completed, signals)
            if stopped is not None:
                break
            metrics = self._train_one_step()
            # Let the host run at most two steps ahead of the device (waiting, not reading
            # values): the time budget and signals then act within a step or two, and
            # queued batches do not pile up in device memory.
            in_flight.append(metrics["loss"])
            if len(in_flight) > 2:
                in_flight.popleft().block_until_ready()
            self._forecast_budget(metrics["loss"])
            if self.step % trainer.log_every == 0:
                self.log_window()
            if self.step % trainer.eval_every == 0 and self.validate():
                stopped = "early_stop"  # saved below, with the closing log line
                break
            if self.step % (trainer.save_every or trainer.eval_every) == 0:
                self.save()
        if stopped not in ("SIGINT", "SIGTERM"):
            # An interrupted run keeps its unfinished log window in the checkpoint, so
            # the resumed run logs exactly what an uninterrupted one would.
            self.log_window()
            last = self.book.last_eval
            if self.step > 0 and (last is None or last["step"] != self.step):
                self.validate()
        self.save(force_sync=True)
        return stopped

    def _train_one_step(self) -> dict[str, jax.Array]:
        batch = shard_batch(next(self.batches), self.mesh)
        self.state, metrics = self.train_step(self.state, batch)
        self.window.add(metrics)
        self.step += 1
        if self.bar is not None:
            self.bar.update(1)
            left = self.limits.seconds_left()
            if self.bar.total is None and left is not None:
                self.bar.set_description(f"ETA {int(left // 60)}:{int(left % 60):02d}",
                                         refresh=False)
        return metrics

    def _forecast_budget(self, loss: jax.Array) -> None:
        """Settings written for another platform: what their budget takes here, once."""
        if not self.forecast.timing:
            return
        loss.block_until_ready()  # the steps timed are finished, not only queued
        message = self.forecast.after_step(self.step, time.monotonic(),
                                           self.train_step.seconds_compiling_in_calls)
        if message and self.is_main:
            log.warning(message)

    # ------------------------------------------------------------------------- records

    def _diverged(self, bad_step: int, metrics: dict, why: str) -> TrainingError:
        self.saver.wait()  # a save in flight holds an earlier, finite state
        latest = self.saver.latest_step()
        loss, norm = float(metrics["loss"]), float(metrics["grad_norm"])
        what = (f"the loss or gradient norm became {loss}/{norm}" if why == "not finite"
                else f"the loss jumped to {loss:.4g}, {why}")
        if self.resumed_from is not None and bad_step == self.resumed_from + 1:
            return TrainingError(
                f"Training diverged at step {bad_step}, the first after resuming from "
                f"checkpoint {self.resumed_from}: {what}. That checkpoint itself is the likely "
                f"cause: move {self.saver.directory / str(self.resumed_from)} away and rerun "
                "the same command to resume from the checkpoint before it.")
        where = (f"the newest checkpoint is step {latest} in {self.saver.directory}"
                 if latest is not None else "no checkpoint was saved yet")
        return TrainingError(
            f"Training diverged: {what} at step {bad_step} (learning rate "
            f"{float(metrics['learning_rate']):.3g}); {where}. Lower --lr-scale/--peak-lr, "
            "raise --warmup or set --clip-norm 1.0, then rerun (it resumes from that "
            "checkpoint).")

    def log_window(self) -> None:
        """Write one "train" line for the steps since the last one, and a "compile" line for
        each program compiled since."""
        seconds = self.clock.elapsed()
        self._log_compilations()
        line = self.window.close(seconds, self.limits.started)
        if line is None:
            return
        self.step_seconds += seconds
        self.writer.write("train", self.step, line)
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{line['loss']:.3f}", lr=f"{line['lr']:.2e}",
                                 tok_s=f"{line['tokens_per_s']:.0f}", refresh=False)
        self.clock.restart()

    def _log_compilations(self) -> None:
        for record in self.compile_log.since(self.compilations_logged):
            self.writer.write("compile", self.step, record.to_dict())
            self.compilations_logged += 1

    def save(self, force_sync: bool = False) -> None:
        """Write checkpoint `step`, again if the bookkeeping changed since it was written (the
        closing log line and validation change it without a step)."""
        self.window.read_back()  # never save a state whose loss was not finite
        self.book.iterator, self.book.window = self.batches.state, self.window.steps
        current = self.book.fingerprint()
        if self.saved == (self.step, current):
            return
        state = self.state
        with self.clock.paused(), self.signals.critical():
            self.saver.save(self.step, state.params, {"step": state.step,
                                                      "opt_state": state.opt_state,
                                                      "rng": state.rng}, self.book.to_json())
            if force_sync:
                self.saver.wait()
        self.saved = (self.step, current)

    def validate(self) -> bool:
        """Validate, log, track the best metric; True when early stopping says stop."""
        self.window.read_back()
        with self.clock.paused():
            result = self.validator.scores(self.graphdef, self.state.params)
            self.writer.write("eval", self.step, result)
            text, book = describe(self.step, result), self.book
            improved = book.record(self.step, result)
            if improved:
                with self.signals.critical():
                    self.saver.save_best(self.step, self.state.params,
                                         {book.best_metric: book.best_score, "step": self.step})
                # The checkpoint of the same step records this best step: best/ and the
                # bookkeeping a resumed run reads always agree.
                self.save()
                text += f" (best {book.metric_label})"
            elif improved is False:
                text += f" (best {book.metric_label} {book.best_score:.2f} at step " \
                        f"{book.best_step})"
            echo(text)
            return improved is not None and book.out_of_patience(
                self.run.trainer.early_stop_patience)

    # ------------------------------------------------------------------------- the end

    def finish(self, stopped: str) -> dict[str, Any]:
        """Export the model translate.py loads (and the average), close, print the summary."""
        run, book = self.run, self.book
        tokenizer = self.data.tokenizer
        model_dir = final_model.export_best_or_last(
            self.run_dir, run, self.model_config, tokenizer, book, self.saver,
            self.state.params, self.step)
        if run.trainer.average_last:
            model_dir, steps = final_model.average(self.run_dir, run, self.model_config,
                                                   tokenizer, run.trainer.average_last)
            echo(f"Averaged checkpoints {steps} into {model_dir}")
        barrier("exported")
        self._log_compilations()
        self.writer.write("summary", self.step, self._time_spent())
        self.close()
        summary = build_summary(run, self.run_dir, model_dir, self.step, stopped, book,
                                self.limits.minutes_so_far(), self.data.valid_sources)
        summary["time"] = self._time_spent()
        if self.is_main:
            print_summary(summary, self.run_dir)
        return summary

    def _time_spent(self) -> dict[str, Any]:
        """Seconds compiling (every program of this process) and in train steps (their
        compilations left out), and how many programs were compiled or read from the
        cache."""
        compiled = self.compile_log.summary()
        in_steps = self.train_step.seconds_compiling_in_calls
        return {**compiled, "steps_s": round(max(self.step_seconds - in_steps, 0.0), 1)}

    def close(self, quietly: bool = False) -> None:
        """Wait for checkpoints in flight and release the files. `quietly`: after an error,
        which a failing save in flight must not replace."""
        self._close_bar()
        try:
            self.saver.wait()
        except SaveError:
            if not quietly:
                raise
        finally:
            self.saver.close()
            self.writer.close()

    def _close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError:  # disk full, say: the file already there stays as it was
        tmp.unlink(missing_ok=True)
        raise
