"""The training loop: `train(run, workdir)`.

    run = nmt.settings.recipes.load("configs/multi30k_small.yaml")
    summary = train(run)

One loop serves one CPU, every device of a host, and many hosts (call
`nmt.runtime.distributed.initialize_distributed` first): batches are split over the mesh axis
"data", every process reads its own rows of each global batch, checkpoints are written by all
processes, and only process 0 prints, logs metrics and exports the model.

The run directory it leaves:

    config.yaml        every setting of the run (a recipe: `train.py --config` continues it)
    spm.model          the SentencePiece model
    checkpoints/<N>/   the last --keep-last --save-every checkpoints, and the newest
                       (nmt.rundir.checkpoints)
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
import functools
import logging
import time
from pathlib import Path
from typing import Any

import jax

from nmt.rundir import final_model, resume
from nmt.rundir.bookkeeping import Bookkeeping
from nmt.rundir.checkpoints import CHECKPOINTS_DIR, CheckpointError, SaveError, complete_steps
from nmt.rundir.lock import LOCK_FILE, RunLock
from nmt.runtime import allocator, cli
from nmt.runtime.compilation import CompileLog, enable_compilation_cache
from nmt.runtime.distributed import barrier
from nmt.runtime.files import write_atomically
from nmt.settings import recipes
from nmt.settings.config import RunConfig
from nmt.training import schedule_fit
from nmt.training.errors import (
    BudgetTooShort,
    TrainingError,
    divergence,
    lost_process,
    out_of_memory,
)
from nmt.training.hooks import Hooks, Periodic
from nmt.training.loader import BatchLoader, StopRequested
from nmt.training.metrics_log import MetricsWindow
from nmt.training.platform_check import BudgetForecast
from nmt.training.run_log import RunLog
from nmt.training.saving import CheckpointWriter
from nmt.training.starting import Start, prepare_start
from nmt.training.stopping import Limits, StopReason, StopSignal, steps_in_flight
from nmt.training.summary import announce, build_summary, echo, print_summary
from nmt.training.validation import best_note, describe, describe_bleu
from transformer.training import shard_batch

log = logging.getLogger(__name__)

__all__ = ["Trainer", "TrainingError", "train"]


def train(run: RunConfig, workdir: str | Path | None = None, started: float | None = None
          ) -> dict[str, Any]:
    """Train (or resume) a model in `workdir` (default: the run's output directory).
    --max-minutes counts from `started` (time.monotonic() when the command started; default
    now) and holds the whole run, the closing validation, checkpoint and export included.

    Returns a summary: run_dir, model_dir, steps, stopped (a `StopReason`),
    best_metric, best_score and best_step
    (None when no best was tracked), last_eval, minutes, translate_command, and test_command
    when a test split was given. Raises TrainingError when the loss stops being finite,
    memory runs out, or `workdir` holds a run with another model, tokenizer or seed
    (RunMismatch, a TrainingError); SaveError or
    MetricsWriteError when a file cannot be written (the checkpoints before it stay intact);
    RunDirectoryInUse when another trainer runs in `workdir`; BudgetTooShort (a
    TrainingError) when --max-minutes leaves no time for a step.
    """
    run_dir = Path(workdir) if workdir is not None else run.output_dir()
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = RunLock(run_dir) if jax.process_index() == 0 else contextlib.nullcontext()
    with lock:
        enable_compilation_cache()
        with CompileLog().active() as compile_log:
            try:
                trainer = Trainer(run, run_dir, compile_log, started)
            except BaseException as err:  # missing data, say: a run that never started
                if created:               # leaves none
                    with contextlib.suppress(OSError):  # not empty, or removed by another
                        (run_dir / LOCK_FILE).unlink()
                        run_dir.rmdir()
                error = out_of_memory(err, run)
                if error is not None:
                    raise error from None
                raise
            return trainer.train_and_export()


class Trainer:
    """One call of `train`: the loop from where the run starts (nmt.training.starting), the
    periodic work after its steps (nmt.training.hooks), and the export at the end."""

    def __init__(self, run: RunConfig, run_dir: Path, compile_log: CompileLog,
                 started: float | None = None):
        run = schedule_fit.resolve(run, _resumed_run(run_dir))
        self.run, self.run_dir, self.compile_log = run, run_dir, compile_log
        self.is_main = jax.process_index() == 0
        self.limits = Limits(run.trainer, started, averaging=bool(run.trainer.average_last),
                             in_flight=steps_in_flight(jax.devices()[0].platform),
                             schedule_end=schedule_fit.known_end(run.optimizer))
        self.start = start = prepare_start(run, run_dir, compile_log)
        # What changes as the run trains is the trainer's; the rest is read from `start`.
        self.state, self.step, self.train_step = start.state, start.step, start.train_step
        self.bookkeeping = start.bookkeeping
        # config.yaml is replaced only now: a resume that failed keeps the settings of the run.
        if self.is_main:
            _write_run_config(run_dir, run)
        resume.carry_over_best(self.bookkeeping, run, start.bleu_tokenizer, start.checkpoints,
                               self.step, self.state.params)
        self.signals = StopSignal()
        self.batches = _batch_loader(start, self.bookkeeping, self.step,
                                     run.trainer.loader_depth, self.signals)
        self.forecast = BudgetForecast(run.trainer.written_for, jax.devices()[0].platform,
                                       self.limits, self.batches.batches_per_epoch)
        self.run_log = RunLog(run_dir, self.step, self.is_main, compile_log)
        self.step_metrics = MetricsWindow(
            self.bookkeeping.window, self.step + 1,
            functools.partial(divergence, start.checkpoints, start.resumed_from),
            spike=run.trainer.loss_spike, recent=self.bookkeeping.recent_losses)
        self.checkpoint_writer = CheckpointWriter(start.checkpoints, start.saved, self.signals,
                                                  self.run_log.clock, run.trainer.save_interval,
                                                  self.limits.closing.saved)
        self.last_loss: jax.Array | None = None  # of the newest step, still on the device
        self.fitted_end = schedule_fit.FittedEnd(run, self.step, self.limits, self.run_log.clock,
                                                 self.batches.batches_per_epoch)
        self.hooks = self._periodic_work()

    def _periodic_work(self) -> Hooks:
        """The work after a step, registered in the order it runs at a shared step: a step's
        log line, then its validation, then its checkpoint; at stop, the closing ones."""
        trainer = self.run.trainer
        # After SIGINT/SIGTERM only the checkpoint: it keeps the unfinished log window, so the
        # resumed run logs and validates exactly what an uninterrupted one would. A validation
        # that stops early skips its step's save: the one at stop follows the closing log line.
        return Hooks([
            Periodic("schedule", 1, self._fit_schedule),
            Periodic("forecast", 1, self._forecast_budget),
            Periodic("log", trainer.log_every, self.log_window, at_stop=self.log_window),
            Periodic("validate", trainer.eval_every, self.validate,
                     at_stop=self._validate_unless_done),
            Periodic("save", trainer.save_interval, self.save,
                     at_stop=functools.partial(self.save, at_stop=True),
                     when_interrupted=True),
        ])

    # ------------------------------------------------------------------------- the loop

    def train_and_export(self) -> dict[str, Any]:
        """Train, then export, with signals deferred while files are written; on a failure,
        the files in flight are completed or removed before the error goes on."""
        cli.done_starting()
        try:
            with self.signals:
                stopped = self.loop()
                with self.signals.critical():
                    return self.finish(stopped)
        except BaseException as err:
            if (error := _closed_after(self, err)) is not None:
                raise error from None
            raise

    def loop(self) -> StopReason:
        """Train until a limit, early stopping or a signal; returns why it stopped."""
        stopped = self._announce()
        if self.is_main:
            self.run_log.progress.open(self.run.trainer, self.limits.total_steps(
                self.batches.batches_per_epoch), self.step)
        self.batches.start()  # the first batches are built while the train step compiles
        try:
            self.train_step.wait()
            if (too_short := self.limits.too_short()) is not None:
                raise BudgetTooShort(too_short)
            self.run_log.clock.restart()
            stopped = self._steps(stopped)
            self.run_log.steps_ended(self.step_metrics)
        finally:  # an error, Ctrl-C or the end: no thread left reading or sampling batches
            self.batches.close()
            self.start.data.close()
            self.run_log.progress.close()
        self.start.checkpoints.wait()
        return stopped

    def _announce(self) -> StopReason | None:
        """What the run is about to do, and EARLY_STOP if it already ran out of patience."""
        announce(self.run, self.state.params, self.start.model_config, self.start.data,
                 self.limits.describe(self.batches.batches_per_epoch), self.run_dir)
        if self.run.trainer.eval_sentences and self.is_main:
            given = self.run.trainer.bleu_tokenize is not None
            log.info(describe_bleu(self.start.bleu_tokenizer, given))
        stopped = _out_of_patience(self.bookkeeping, self.step,
                                   self.run.trainer.early_stop_patience)
        if (warning := self.forecast.at_start()) and self.is_main and stopped is None:
            log.warning(warning)
        return stopped

    def _steps(self, stopped: StopReason | None) -> StopReason:
        """Steps, each followed by the periodic work due after it, then the work at stop."""
        in_flight: collections.deque = collections.deque()
        while stopped is None:
            stopped = self.limits.reached(self.step, self.batches.epochs_completed, self.signals)
            if stopped is not None:
                break
            began = time.monotonic()
            try:
                self.last_loss = self._train_one_step()["loss"]
            except StopRequested:  # a signal came while the next batch was being built
                stopped = self.signals.received
                break
            # Let the host run at most `steps_in_flight` steps ahead of the device (waiting,
            # not reading values): the time budget and signals then act within a step or
            # two, and queued steps do not pile up in memory.
            in_flight.append(self.last_loss)
            if len(in_flight) > self.limits.closing.in_flight:
                in_flight.popleft().block_until_ready()
                self.limits.closing.stepped(time.monotonic() - began)
            stopped = self.hooks.run_due(self.step)
        self.hooks.run_at_stop(interrupted=stopped.interrupted)
        return stopped

    def _train_one_step(self) -> dict[str, jax.Array]:
        """One update on the next batch; its metrics stay on the device."""
        batch = shard_batch(next(self.batches), self.start.mesh)
        self.state, metrics = self.train_step(self.state, batch)
        self.step_metrics.add(metrics)
        self.step += 1
        self.run_log.progress.advance(self.limits.seconds_left())
        return metrics

    # ------------------------------------------------------------------------- periodic work

    def _fit_schedule(self) -> None:
        """A linear schedule without an end: fix it from the steps timed (refitted once after
        a validation), then run the step compiled for it (schedule_fit)."""
        fitted_end = self.fitted_end
        if fitted_end.compiled is not None:
            self.train_step = fitted_end.train_step(self.step, self.train_step)
        elif (end := fitted_end.end_after(self.step, self.last_loss)) is not None:
            self.run = schedule_fit.with_end(self.run, end)
            self.limits.schedule_end = end
            if self.is_main:
                _write_run_config(self.run_dir, self.run)
                log.info(fitted_end.describe(end, self.limits.max_minutes,
                                             self.run_dir / resume.RUN_CONFIG_FILE))
            fitted_end.compiled = self.start.train_step_compiling(self.run.optimizer, self.state,
                                                                  self.compile_log)

    def _forecast_budget(self) -> None:
        """Settings written for another platform: what their budget takes here, once."""
        if not self.forecast.timing:
            return
        self.last_loss.block_until_ready()  # the steps timed are finished, not only queued
        message = self.forecast.after_step(self.step, time.monotonic(),
                                           self.train_step.seconds_compiling_in_calls)
        if message and self.is_main:
            log.warning(message)

    def log_window(self) -> None:
        """The "train" line of the steps since the last, and a "compile" line per new program."""
        self.run_log.train_line(self.step, self.step_metrics, self.limits.started, self.batches)

    def save(self, at_stop: bool = False) -> None:
        """Write checkpoint `step`, again if the bookkeeping changed since it was written (the
        closing log line and validation change it without a step); `at_stop`: the run's last."""
        self.step_metrics.read_back()  # never save a state whose loss was not finite
        bookkeeping = self.bookkeeping
        bookkeeping.iterator, bookkeeping.window = self.batches.state, self.step_metrics.steps
        bookkeeping.recent_losses = list(self.step_metrics.recent)  # --loss-spike's reference
        self.checkpoint_writer.save(self.step, self.state, bookkeeping, at_stop)

    def validate(self, closing: bool = False) -> StopReason | None:
        """Validate, log, track the best metric; EARLY_STOP when early stopping says stop.
        `closing`: at a stop off the --eval-every grid; only this run's model/ counts it."""
        self.step_metrics.read_back()
        began = time.monotonic()
        with self.run_log.clock.paused():
            # What the steps' buffers kept is handed back before validation's own are
            # allocated, and theirs before the steps go on: neither adds to the other's peak.
            allocator.release_free_memory()
            result = self.start.validator.scores(self.start.graphdef, self.state.params,
                                                 self.step_metrics.not_finite,
                                                 self.limits.validation_deadline)
            allocator.release_free_memory()
            self.limits.closing.validated(time.monotonic() - began)
            self.run_log.write("eval", self.step, result | {"closing": True} if closing else result)
            bookkeeping = self.bookkeeping
            improved = bookkeeping.record(self.step, result, closing)
            if improved and not closing:
                # The checkpoint first: it records this best step, and a failure to write it
                # leaves best/ as it was (best/ keeps one step); checkpoints/<step> holds the
                # parameters a resumed run finds missing in best/ if best/ fails.
                self.save()
                self.checkpoint_writer.save_best(self.step, self.state.params, bookkeeping)
            echo(describe(self.step, result) + best_note(bookkeeping, improved, closing))
            stop = improved is not None and bookkeeping.out_of_patience(
                self.run.trainer.early_stop_patience)
            return StopReason.EARLY_STOP if stop else None

    def _validate_unless_done(self) -> None:
        """The closing validation, unless this step was validated or none was trained."""
        last = self.bookkeeping.last_eval
        if self.step > 0 and (last is None or last["step"] != self.step):
            self.validate(closing=self.step % self.run.trainer.eval_every != 0)

    # ------------------------------------------------------------------------- the end

    def finish(self, stopped: StopReason) -> dict[str, Any]:
        """Export the model translate.py loads (and the average), close, print the summary."""
        allocator.release_free_memory()  # the steps' buffers, before averaging's
        book = self.bookkeeping.reported(self.step, self.run.trainer.eval_every)
        model_dir = _export(self.run_dir, self.run, self.start, book, self.state.params,
                            self.step)
        barrier("exported")
        self.run_log.compilations(self.step)
        self.run_log.write("summary", self.step,
                           {**self.run_log.time_spent(self.train_step, self.batches),
                            "peak_rss_gb": allocator.peak_resident_gb()})
        self.close()
        summary = build_summary(self.run, self.run_dir, model_dir, self.step, stopped,
                                book, self.limits.minutes_so_far(),
                                self.start.data.valid_sources)
        summary["time"] = self.run_log.time_spent(self.train_step, self.batches)
        summary["peak_rss_gb"] = allocator.peak_resident_gb()
        if self.is_main:
            print_summary(summary, self.run_dir)
        return summary

    def close(self, quietly: bool = False) -> None:
        """Wait for checkpoints in flight and release the files. `quietly`: after an error,
        which a failing save in flight must not replace."""
        self.run_log.progress.close()
        try:
            self.start.checkpoints.wait()
        except SaveError:
            if not quietly:
                raise
        finally:
            self.start.checkpoints.close()
            self.run_log.metrics.close()


def _closed_after(trainer: Trainer, err: BaseException) -> BaseException | None:
    """Close `trainer` after `err`; returns the error to raise in its place (None: `err`).
    Another process gone, there is nothing to close: saves in flight wait for it."""
    if (lost := lost_process(err, trainer.start.checkpoints)) is not None:
        return lost
    trainer.close(quietly=True)
    if isinstance(err, KeyboardInterrupt):  # Ctrl-C twice: no more saving
        echo(_aborted(trainer.step, trainer.start.checkpoints.latest_step()))
    return out_of_memory(err, trainer.run)  # where a shape first runs


def _export(run_dir: Path, run: RunConfig, start: Start, bookkeeping: Bookkeeping,
            params: Any, step: int) -> Path:
    """model/ (the best step, else the last) and, with --average-last, averaged/; returns
    the one translate.py is pointed to. A checkpoint found unreadable here is a fault while
    running (exit 1), not a usage error as at the start."""
    try:
        model_dir = final_model.export_best_or_last(
            run_dir, run, start.model_config, start.data.tokenizer, bookkeeping,
            start.checkpoints, params, step)
        if run.trainer.average_last:
            model_dir, steps = final_model.average(run_dir, run, start.model_config,
                                                   start.data.tokenizer,
                                                   run.trainer.average_last)
            echo(f"Averaged checkpoints {steps} into {model_dir}")
    except CheckpointError as err:
        raise TrainingError(str(err)) from err
    return model_dir


def _batch_loader(start: Start, bookkeeping: Bookkeeping, step: int, depth: int,
                  signals: StopSignal) -> BatchLoader:
    """The training batches after `step`, built ahead on a thread. Alone, a signal ends a
    wait for one; several processes agree on stopping every 10 steps instead."""
    data, alone = start.data, jax.process_count() == 1
    return BatchLoader(
        resume.batch_iterator(data.train_examples, data.batch_config, bookkeeping, step,
                              data.train_sampling),
        depth, stop_requested=lambda: alone and signals.received is not None)


def _write_run_config(run_dir: Path, run: RunConfig) -> None:
    """config.yaml: the run's settings as they are now (process 0 writes it)."""
    write_atomically(run_dir / resume.RUN_CONFIG_FILE, recipes.dump(run))


def _resumed_run(run_dir: Path) -> RunConfig | None:
    """The settings of the run being resumed in `run_dir`; None for a new run."""
    if not complete_steps(run_dir / CHECKPOINTS_DIR):
        return None
    try:
        return resume.saved_run(run_dir)
    except resume.ResumeError as err:
        raise TrainingError(str(err)) from None


def _out_of_patience(bookkeeping: Bookkeeping, step: int, patience: int
                     ) -> StopReason | None:
    """EARLY_STOP for a run that stopped early and is started again, saying why it does not
    train on; None for one that may train."""
    if not bookkeeping.out_of_patience(patience):
        return None
    echo(f"Not training: this run stopped early at step {step}, {bookkeeping.bad_evals} "
         f"validations after its best {bookkeeping.metric_label} "
         f"({bookkeeping.best_score:.2f} at step {bookkeeping.best_step}), and "
         f"--early-stop-patience is {patience}; raise it to train on.")
    return StopReason.EARLY_STOP


def _aborted(step: int, last: int | None) -> str:
    """What a second Ctrl-C leaves, and how to go on."""
    return (f"Aborted at step {step}; "
            + (f"checkpoint step {last} is the newest, and the same command resumes "
               "from it." if last is not None else "no checkpoint was saved."))
