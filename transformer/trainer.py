"""The training loop: data, steps, validation, checkpoints, logging; `train(run, workdir)`.

Its settings are a `transformer.run_config.RunConfig`; metrics go out through
`transformer.run_log`, and several processes meet through `transformer.distributed`.

    run = RunConfig(preset="small", max_minutes=5)
    summary = train(run, "runs/builtin-en-de-small")

One loop serves one CPU, every device of a host, and many hosts (call
`transformer.distributed.initialize_distributed` first): batches are split over the mesh
axis "data", every process reads its own rows of each global batch, checkpoints are written
by all processes, and only process 0 prints, logs metrics and exports the model.

The run directory it leaves:

    config.json        resolved model, train, data and run settings
    spm.model          the SentencePiece model
    checkpoints/<N>/   the last --keep-last checkpoints (orbax): params, optimizer, step, rng,
                       data iterator position, trainer bookkeeping
    best/<N>/          parameters with the best validation score so far (--best-metric: BLEU
                       by default; checkpoints/<N>/ is written at the same step, with the
                       bookkeeping that records it)
    model/             the model translate.py loads (`checkpoint.load_model`): parameters of
                       the best step (the last step when no validation chose one)
    averaged/          with --average-last N: the mean of the last N checkpoints, same layout
    metrics.jsonl      one JSON object per log line ("train") and per validation ("eval")
    tb/                TensorBoard event files

Exact resumption: the checkpoint holds everything the next step depends on (parameters,
optimizer state, step, rng, the iterator's {"epoch", "position"}) and the per-step metrics of
the unfinished log window, so a run interrupted at any step and resumed writes the same
metrics.jsonl lines (wall-clock fields aside) as one that never stopped.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import math
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from transformer import checkpoint as ckpt
from transformer.config import ModelConfig, SearchConfig
from transformer.distributed import any_process, barrier, local_copy
from transformer.run_config import BEST_METRICS, RunConfig
from transformer.run_log import MetricsWriter, summarize_window

log = logging.getLogger("trainer")


class TrainingError(RuntimeError):
    """Training cannot go on (diverged, bad settings); the message says what to do."""


# ----------------------------------------------------------------------------- timing


class PausableClock:
    """Seconds since `restart()`, less the time spent inside `paused()` blocks (they nest)."""

    def __init__(self):
        self._depth = 0
        self.restart()

    def restart(self) -> None:
        self._start, self._paused = time.monotonic(), 0.0

    @contextlib.contextmanager
    def paused(self):
        self._depth += 1
        begin = time.monotonic()
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._paused += time.monotonic() - begin

    def elapsed(self) -> float:
        return time.monotonic() - self._start - self._paused


# ----------------------------------------------------------------------------- stopping


class StopSignal:
    """SIGINT/SIGTERM set a flag the loop checks after each step; a second SIGINT aborts."""

    def __init__(self):
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "StopSignal":
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: signals stay with the caller
                pass
        return self

    def _handle(self, signum, frame) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name
        print(f"\n{self.received} received: finishing the current step and saving "
              "(press Ctrl-C again to abort without saving).", file=sys.stderr, flush=True)

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


# ----------------------------------------------------------------------------- data


@dataclasses.dataclass
class Data:
    tokenizer: Any
    tokenizer_file: Path
    train_examples: Any
    valid_examples: Any
    batch_config: Any  # training batches: accum x rows
    eval_batch_config: Any
    valid_sources: list[str]
    valid_targets: list[str]
    counts: dict[str, int]


def _eval_batch_config(run: RunConfig, model_max_len: int, devices: int):
    """Batching of the validation loss: every pair the model can take, whatever its length
    or length ratio (--max-tokens-per-sentence and --max-ratio only filter training)."""
    from data.batching import DEFAULT_BUCKETS, BatchConfig

    buckets = [b for b in run.buckets or DEFAULT_BUCKETS if b < model_max_len]
    # Widths past the training buckets double up to the model's limit: long validation pairs
    # are few, and each width compiles the eval step once.
    while not buckets or buckets[-1] < model_max_len:
        buckets.append(min(2 * buckets[-1], model_max_len) if buckets else model_max_len)
    return BatchConfig(batch_tokens=max(run.batch_tokens, model_max_len * devices),
                       max_len=model_max_len, max_ratio=float("inf"), buckets=tuple(buckets),
                       num_devices=devices, seed=run.seed)


def prepare_data(run: RunConfig, run_dir: Path, model_max_len: int) -> Data:
    """Read the corpus, train (or reuse) the tokenizer, encode and filter train and validation.

    A test split is read (load_corpus reads what the spec names) but not encoded: training
    never uses it; the summary gives the translate.py command that scores it.
    """
    from data.batching import BatchConfig, load_examples
    from data.corpus import load_corpus
    from data.tokenizer import MODEL_FILE, TokenizerConfig, Tokenizer, encode_split
    from data.tokenizer import train_or_load_tokenizer

    corpus = load_corpus(run.corpus_spec())
    if run.max_train_pairs is not None and len(corpus["train"]) > run.max_train_pairs:
        corpus["train"] = corpus["train"].select(range(run.max_train_pairs))
    tokenizer_config = TokenizerConfig(vocab_size=run.vocab_size, model_type=run.tokenizer_type,
                                       seed=run.seed)
    # One process trains the tokenizer (SentencePiece training is multi-threaded and not
    # bit-reproducible); the others load the file it wrote to the shared run directory.
    if jax.process_index() == 0:
        tokenizer = train_or_load_tokenizer(run_dir, corpus, tokenizer_config,
                                            given=run.spm_model)
    barrier("tokenizer")
    if jax.process_index() != 0:
        tokenizer = Tokenizer.load(run_dir / MODEL_FILE)
    encoded = {name: encode_split(corpus[name], tokenizer) for name in ("train", "validation")}
    max_len = min(run.max_tokens_per_sentence, model_max_len)
    devices = jax.device_count()
    buckets = {} if run.buckets is None else {"buckets": run.buckets}
    # With --accum K a batch holds K micro-batches of the same shape, K x rows.
    batch_config = BatchConfig(batch_tokens=run.batch_tokens * run.accum, max_len=max_len,
                               num_devices=devices * run.accum, seed=run.seed, **buckets)
    eval_batch_config = _eval_batch_config(run, model_max_len, devices)
    train_examples = load_examples(encoded["train"], batch_config, "train")
    valid_examples = load_examples(encoded["validation"], eval_batch_config, "validation")
    valid = corpus["validation"]
    return Data(tokenizer=tokenizer, tokenizer_file=run_dir / MODEL_FILE,
                train_examples=train_examples, valid_examples=valid_examples,
                batch_config=batch_config, eval_batch_config=eval_batch_config,
                valid_sources=list(valid["source"]), valid_targets=list(valid["target"]),
                counts={name: len(split) for name, split in corpus.items()})


# ----------------------------------------------------------------------------- config.json


def write_run_config(run_dir: Path, run: RunConfig, model_config: ModelConfig,
                     data: Data) -> None:
    values = {
        "model": model_config.to_dict(),
        "train": run.train_config().to_dict(),
        "search": dataclasses.asdict(run.search_config()),
        "data": {"corpus": run.corpus_name, "src": run.src, "tgt": run.tgt,
                 "pairs": data.counts, "tokenizer": data.tokenizer_file.name,
                 "batch": dataclasses.asdict(data.batch_config)},
        "run": run.to_dict(),
    }
    tmp = run_dir / (ckpt.CONFIG_FILE + ".tmp")
    tmp.write_text(json.dumps(values, indent=2, sort_keys=True, default=str) + "\n")
    tmp.replace(run_dir / ckpt.CONFIG_FILE)


def _saved_run_settings(run_dir: Path) -> dict:
    """The RunConfig fields the earlier run in `run_dir` recorded; {} when it recorded none."""
    if not (run_dir / ckpt.CONFIG_FILE).is_file():
        return {}
    return ckpt.read_run_config(run_dir)[1].get("run", {})


def _check_same_tokenizer(run_dir: Path, run: RunConfig) -> None:
    """An existing spm.model is reused; fail if this run asks for a different one."""
    path = run_dir / ckpt.CONFIG_FILE
    if not (run_dir / ckpt.TOKENIZER_FILE).is_file():
        return
    saved = _saved_run_settings(run_dir)
    if saved.get("spm_model") and not run.spm_model:
        raise TrainingError(
            f"the run in {run_dir} uses the SentencePiece model of --spm-model "
            f"{saved['spm_model']} (see {path}): pass that flag again to resume it.")
    if run.spm_model:
        return  # data.tokenizer checks that it is the run's spm.model
    for name in ("tokenizer_type", "vocab_size"):
        flag, now = "--" + name.replace("_", "-"), getattr(run, name)
        if name in saved and saved[name] != now:
            raise TrainingError(
                f"{run_dir / ckpt.TOKENIZER_FILE} was trained with {flag} {saved[name]} (see "
                f"{path}), this run asks for {flag} {now}: pass {flag} {saved[name]} to resume "
                f"with it, or use a new --output-dir to train a new tokenizer.")


def _check_same_seed(run_dir: Path, run: RunConfig) -> None:
    """The seed fixes each epoch's batch order and the validation pairs held out of the
    training data: resuming with another would repeat and skip pairs mid-epoch and could move
    validation pairs into training."""
    path = run_dir / ckpt.CONFIG_FILE
    saved = _saved_run_settings(run_dir).get("seed")
    if saved is not None and saved != run.seed:
        raise TrainingError(
            f"{run_dir} was trained with --seed {saved} (see {path}), this run asks for --seed "
            f"{run.seed}: the seed fixes the order of the training pairs and the validation "
            f"pairs held out of them, so pass --seed {saved} to resume, or use a new "
            "--output-dir.")


def _check_same_model(run_dir: Path, model_config: ModelConfig) -> None:
    """Resuming with a different model would fail deep inside orbax; say so up front."""
    path = run_dir / ckpt.CONFIG_FILE
    if not path.is_file():
        return
    saved = ckpt.read_run_config(run_dir)[0]
    if saved != model_config:
        diff = {k: (v, getattr(model_config, k)) for k, v in saved.to_dict().items()
                if getattr(model_config, k) != v}
        changes = ", ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in diff.items())
        raise TrainingError(
            f"{path} was trained with a different model ({changes}); "
            "pass the same model flags to resume, or a new --output-dir.")


# ----------------------------------------------------------------------------- training


def enable_compilation_cache(directory: str | Path | None = None) -> None:
    """Keep compiled steps on disk: a rerun or resume skips most compilation (minutes on CPU)."""
    if directory is None:
        from data.tokenizer import default_cache_dir

        directory = default_cache_dir() / "jax"
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def _echo(message: str) -> None:
    if jax.process_index() == 0:
        from tqdm import tqdm

        tqdm.write(message)


def translate_command(model_dir: Path, example: str = "Hello world!") -> str:
    return f'python translate.py --model {model_dir} "{example}"'


def scoring_command(model_dir: Path, run: RunConfig) -> str:
    """The translate.py command that scores the model on the run's test split
    (--test-prefix or --test-file)."""
    if run.test_prefix:
        test = ["--test-prefix", run.test_prefix]
    else:
        test = ["--test-file", run.test_file]
    tokenizer = ["--bleu-tokenize", run.bleu_tokenize] if run.bleu_tokenize else []
    return shlex.join(["python", "translate.py", "--model", str(model_dir), "--evaluate",
                       *test, "--src", run.src, "--tgt", run.tgt, *tokenizer])


def train(run: RunConfig, workdir: str | Path | None = None) -> dict[str, Any]:
    """Train (or resume) a model in `workdir`; returns a summary dict.

    Summary keys: run_dir, model_dir, steps, stopped ("max_steps", "max_epochs", "max_minutes",
    "early_stop", "SIGINT"/"SIGTERM"), best_metric, best_score and best_step (None when no
    best was tracked), last_eval, translate_command, and test_command when a test split
    (--test-prefix or --test-file) was given.
    Raises TrainingError when the loss stops being finite or `workdir` holds a run with
    another model or tokenizer, CheckpointError when its checkpoints cannot be restored.
    """
    run_dir = Path(workdir) if workdir is not None else run.default_output_dir()
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    enable_compilation_cache()
    try:
        session = TrainingSession(run, run_dir)
    except BaseException:  # missing data, say: a run that never started leaves no directory
        if created:
            with contextlib.suppress(OSError):  # not empty, or another process removed it
                run_dir.rmdir()
        raise
    try:
        stopped = session.loop()
    except TrainingError:
        session.close()
        raise
    return session.finish(stopped)


class TrainingSession:
    """One call of `train`: the model and optimizer state, the data iterator and the
    bookkeeping that the loop, logging, validation and checkpoints share.

    `book` is what a checkpoint stores besides the arrays (the best --best-metric score and
    its step, validations without improvement, the last validation) and, when saved, the
    iterator position and the per-step metrics of the unfinished log window.
    """

    def __init__(self, run: RunConfig, run_dir: Path):
        from transformer.training import (create_train_state, make_eval_step, make_mesh,
                                          make_train_step)

        self.run, self.run_dir = run, run_dir
        self.started = time.monotonic()
        self.is_main = jax.process_index() == 0
        self.max_steps, self.max_minutes = run.limits()
        self.deadline = (self.started + self.max_minutes * 60
                         if self.max_minutes is not None else None)

        self.bleu = run.bleu_settings()
        _check_same_tokenizer(run_dir, run)
        self.data = prepare_data(run, run_dir, run.model_config(run.vocab_size).max_len)
        self.model_config = run.model_config(self.data.tokenizer.vocab_size)
        if ckpt.complete_steps(run_dir / ckpt.CHECKPOINTS_DIR):
            _check_same_model(run_dir, self.model_config)
            _check_same_seed(run_dir, run)
        train_config = run.train_config()
        self.search_config = run.search_config()

        self.mesh = make_mesh()
        self.graphdef, _, self.state = create_train_state(self.model_config, train_config,
                                                          self.mesh)
        self.train_step = make_train_step(self.graphdef, train_config, self.mesh)
        self.eval_step = make_eval_step(self.graphdef, self.mesh, train_config)
        self.saver = ckpt.Checkpointer(run_dir, keep_last=run.keep_last,
                                       async_save=run.async_checkpoints)
        self.book = {"best_metric": run.best_metric or "bleu", "best_score": None,
                     "best_step": None, "bad_evals": 0, "bleu_tokenizer": run.bleu_tokenizer(),
                     "window": [],
                     "iterator": {"epoch": 0, "position": 0}, "last_eval": None}
        restored_bookkeeping = self._resume()
        self.step = int(local_copy(self.state.step))
        # config.json is replaced only now: a resume that failed keeps the settings of the run.
        if self.is_main:
            write_run_config(run_dir, run, self.model_config, self.data)
        self._check_best_metric()
        self._check_best_directory()

        self.batches = self._batch_iterator()
        self.writer = MetricsWriter(run_dir, self.step, self.is_main)
        self.window: list[dict[str, float]] = [dict(m) for m in self.book["window"]]
        self.window_tokens_before = sum(m["tokens"] for m in self.window)
        self.pending: list[dict[str, jax.Array]] = []  # device metrics not yet read back
        self.pending_first_step = self.step + 1
        self.clock = PausableClock()  # of the log window: tokens/s leaves out eval and saving
        # (step, bookkeeping) of the last checkpoint written or restored
        self.saved = ((self.step, restored_bookkeeping) if restored_bookkeeping is not None
                      else None)
        self.bar = None

    # ------------------------------------------------------------------------- resume

    def _resume(self) -> str | None:
        """Restore the latest checkpoint into `state` and `book`; returns the restored
        bookkeeping as `bookkeeping()` writes it, or None when there is no checkpoint."""
        state = self.state
        restored = self.saver.restore(state.params, {"step": state.step,
                                                     "opt_state": state.opt_state,
                                                     "rng": state.rng})
        if restored is None:
            return None
        self.state = state.replace(params=restored.params, step=restored.train["step"],
                                   opt_state=restored.train["opt_state"],
                                   rng=restored.train["rng"])
        data = dict(restored.data)
        if "best_bleu" in data:  # written before --best-metric existed: BLEU was the metric
            data.update(best_metric="bleu", best_score=data.pop("best_bleu"))
        data.setdefault("bleu_tokenizer", "13a")  # the only one before --bleu-tokenize
        self.book.update(data)
        _echo(f"Resuming {self.run_dir} from step {restored.step}.")
        return json.dumps(self.book, sort_keys=True, default=float)

    def _batch_iterator(self):
        """The training batches from the saved position, unless the batch plan it indexes
        has changed (--batch-tokens, --buckets, --accum, the device count or the training
        data did). Then the epoch in progress is cut short: its pairs are no longer where the
        position says, so going on would repeat some and skip others."""
        from data.batching import BatchIterator, plan_fingerprint

        position = self.book["iterator"]
        examples, config = self.data.train_examples, self.data.batch_config
        batches = BatchIterator(examples, config, state=position)
        saved = self.book.get("plan")  # {"epoch", "fingerprint"} of the run that saved it
        if saved is not None and position["position"] > 0 and plan_fingerprint(
                batches.plan(saved["epoch"])) != saved["fingerprint"]:
            log.warning("the batch plan changed since step %d was saved (--batch-tokens, "
                        "--buckets, --accum, the device count or the training data); the "
                        "rest of epoch %d is skipped and training goes on with epoch %d",
                        self.step, position["epoch"], position["epoch"] + 1)
            batches = BatchIterator(examples, config,
                                    state={"epoch": position["epoch"] + 1, "position": 0})
        epoch = batches.state["epoch"]
        self.book["plan"] = {"epoch": epoch, "fingerprint": plan_fingerprint(batches.plan(epoch))}
        return batches

    def _check_best_metric(self) -> None:
        """A run resumed with another --best-metric, or with BLEU tokenized another way,
        tracks the best afresh: the saved best score does not compare with the new ones.
        The validation of the step resumed from starts it when it holds the new score."""
        book, run = self.book, self.run
        metric = run.best_metric or book["best_metric"]  # no flag: keep the run's metric
        tokenizer, old_tokenizer = run.bleu_tokenizer(), book["bleu_tokenizer"]
        book["bleu_tokenizer"] = tokenizer
        comparable = metric != "bleu" or tokenizer == old_tokenizer  # earlier scores still count
        if book["best_metric"] == metric and comparable:
            return
        old = BEST_METRICS[book["best_metric"]][0] + (
            f" tokenized with {old_tokenizer}" if book["best_metric"] == metric else "")
        self.saver.discard_best(keep=None)
        book.update(best_metric=metric, best_score=None, best_step=None, bad_evals=0)
        if comparable:
            self._start_best_from_last_validation()
        now = BEST_METRICS[metric][0] + (f" tokenized with {tokenizer}" if metric == "bleu"
                                         else "")
        start = (f"from the validation of step {self.step}" if book["best_step"] is not None
                 else "at the next validation")
        log.warning("the best step so far was chosen by %s; from now on %s chooses best/ and "
                    "model/, starting %s", old, now, start)

    def _start_best_from_last_validation(self) -> None:
        """The validation of the step resumed from is the first best, if it holds the score."""
        book, metric = self.book, self.book["best_metric"]
        last = book["last_eval"]
        if last and last["step"] == self.step and last.get(metric) is not None:
            book.update(best_score=last[metric], best_step=self.step)
            self.saver.save_best(self.step, self.state.params, {metric: last[metric],
                                                                "step": self.step})

    def _check_best_directory(self) -> None:
        """best/ must hold the best step the bookkeeping records and nothing else: a step
        saved there after the checkpoint resumed from belongs to a run being redone."""
        book, saver = self.book, self.saver
        discarded = saver.discard_best(keep=book["best_step"])
        if discarded:
            log.warning("deleted %s steps %s: saved after step %d, where this run starts",
                        saver.best_directory, discarded, self.step)
        if book["best_step"] is not None and saver.best_step() != book["best_step"]:
            label = BEST_METRICS[book["best_metric"]][0]
            log.warning("%s holds no step %d, which checkpoint %d records as the best (%s "
                        "%.2f); tracking the best %s afresh from here", saver.best_directory,
                        book["best_step"], self.step, label, book["best_score"], label)
            book.update(best_score=None, best_step=None, bad_evals=0)

    # ------------------------------------------------------------------------- the loop

    def loop(self) -> str:
        """Train until a limit, early stopping or a signal; returns why it stopped."""
        self._announce()
        stopped = self._stopped_early_before()
        self.bar = self._progress_bar()
        try:
            stopped = self._steps(stopped)
        finally:
            self._close_bar()
        self.saver.wait()
        return stopped

    def _steps(self, stopped: str | None) -> str:
        in_flight: collections.deque = collections.deque()
        with StopSignal() as signals:
            while stopped is None:
                stopped = self._limit_reached(signals)
                if stopped is not None:
                    break
                metrics = self._train_one_step()
                # Let the host run at most two steps ahead of the device (waiting, not reading
                # values): the time budget and signals then act within a step or two, and
                # queued batches do not pile up in device memory.
                in_flight.append(metrics["loss"])
                if len(in_flight) > 2:
                    in_flight.popleft().block_until_ready()
                if self.step % self.run.log_every == 0:
                    self.log_window()
                if self.step % self.run.eval_every == 0 and self.validate():
                    stopped = "early_stop"  # saved below, with the closing log line
                    break
                if self.step % (self.run.save_every or self.run.eval_every) == 0:
                    self.save()
            if stopped not in ("SIGINT", "SIGTERM"):
                # An interrupted run keeps its unfinished log window in the checkpoint, so
                # the resumed run logs exactly what an uninterrupted one would.
                self.log_window()
                last = self.book["last_eval"]
                if self.step > 0 and (last is None or last["step"] != self.step):
                    self.validate()
            self.save(force_sync=True)
        return stopped

    def _train_one_step(self) -> dict[str, jax.Array]:
        from transformer.training import shard_batch

        batch = shard_batch(next(self.batches), self.mesh)
        if self.run.nan_at_step is not None and self.step + 1 == self.run.nan_at_step:
            self.state = self.state.replace(
                params=jax.tree.map(lambda x: x * jnp.nan, self.state.params))
        self.state, metrics = self.train_step(self.state, batch)
        self.pending.append(metrics)
        self.step += 1
        if self.bar is not None:
            self.bar.update(1)
            if self.max_steps is None and self.run.max_epochs is None and self.deadline:
                left = max(0.0, self.deadline - time.monotonic())
                self.bar.set_description(f"ETA {int(left // 60)}:{int(left % 60):02d}",
                                         refresh=False)
        return metrics

    def _limit_reached(self, signals: StopSignal) -> str | None:
        """Why to stop before the next step, or None. Several processes agree on the time
        budget and signals every 10 steps (a collective), so they stop at the same step."""
        if self.max_steps is not None and self.step >= self.max_steps:
            return "max_steps"
        epochs = self.run.max_epochs
        if epochs is not None and self.batches.epochs_completed >= epochs:
            return "max_epochs"
        if jax.process_count() > 1 and self.step % 10:
            return None
        want = signals.received is not None or (self.deadline is not None
                                                and time.monotonic() >= self.deadline)
        if any_process(want):
            return signals.received or "max_minutes"
        return None

    def _stopped_early_before(self) -> str | None:
        """"early_stop" when the resumed run had already run out of --early-stop-patience."""
        book, patience = self.book, self.run.early_stop_patience
        if patience is None or book["bad_evals"] < patience:
            return None
        _echo(f"Not training: this run stopped early at step {self.step}, {book['bad_evals']} "
              f"validations after its best {BEST_METRICS[book['best_metric']][0]} "
              f"({book['best_score']:.2f} at step {book['best_step']}), and "
              f"--early-stop-patience is {patience}; raise it to train on.")
        return "early_stop"

    def _announce(self) -> None:
        if not self.is_main:
            return
        budget = []
        if self.max_steps is not None:
            budget.append(f"{self.max_steps} steps")
        if self.run.max_epochs is not None:
            budget.append(f"{self.run.max_epochs} epochs of {self.batches.batches_per_epoch} "
                          "steps")
        if self.max_minutes is not None:
            budget.append(f"{self.max_minutes:g} minutes")
        n_params = sum(x.size for x in jax.tree.leaves(self.state.params))
        model, data = self.model_config, self.data
        _echo(f"Training {self.run.preset} ({n_params:,} parameters, vocabulary "
              f"{model.vocab_size}) on {data.counts.get('train', 0)} pairs "
              f"({len(data.train_examples)} after length filtering), {jax.device_count()} "
              f"{jax.devices()[0].platform} device(s), {jax.process_count()} process(es); "
              f"budget {' or '.join(budget)}; run directory {self.run_dir}")

    def _progress_bar(self):
        """A tqdm bar on process 0's terminal; its total is the step or epoch limit."""
        if not (self.is_main and self.run.progress):
            return None
        from tqdm import tqdm

        limits = []
        if self.max_steps is not None:
            limits.append(self.max_steps)
        if self.run.max_epochs is not None:
            limits.append(self.run.max_epochs * self.batches.batches_per_epoch)
        # disable=None: no bar when stderr is not a terminal (logs, CI); metrics.jsonl has it all.
        return tqdm(total=min(limits, default=None), initial=self.step, unit="step",
                    dynamic_ncols=True, disable=None, smoothing=0.1)

    def _close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    # ------------------------------------------------------------------------- metrics

    def read_back(self) -> None:
        """Move pending device metrics into the window; TrainingError on a non-finite loss."""
        if not self.pending:
            return
        host = jax.device_get(self.pending)
        for offset, metrics in enumerate(host):
            if not bool(metrics["is_finite"]):
                raise self._diverged(self.pending_first_step + offset, metrics)
            self.window.append({k: float(v) for k, v in metrics.items()})
        self.pending = []
        self.pending_first_step = self.step + 1

    def _diverged(self, bad_step: int, metrics: dict) -> TrainingError:
        self.saver.wait()  # a save in flight holds an earlier, finite state
        last_good = self.saver.latest_step()
        where = (f"the last good checkpoint is step {last_good} in {self.saver.directory}"
                 if last_good is not None else "no checkpoint was saved yet")
        return TrainingError(
            f"Training diverged: the loss or gradient norm became "
            f"{float(metrics['loss'])}/{float(metrics['grad_norm'])} at step {bad_step} "
            f"(learning rate {float(metrics['learning_rate']):.3g}); {where}. Lower "
            f"--lr-scale/--peak-lr, raise --warmup or set --clip-norm 1.0, then rerun "
            f"(it resumes from the last good checkpoint).")

    def log_window(self) -> None:
        """Write one "train" line for the steps since the last one."""
        self.read_back()
        if not self.window:
            return
        line = summarize_window(self.window)
        elapsed = self.clock.elapsed()
        new_tokens = line["tokens"] - self.window_tokens_before
        line["tokens_per_s"] = round(new_tokens / elapsed, 1) if elapsed > 0 else 0.0
        line["elapsed_s"] = round(time.monotonic() - self.started, 1)
        self.writer.write("train", self.step, line)
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{line['loss']:.3f}", lr=f"{line['lr']:.2e}",
                                 tok_s=f"{line['tokens_per_s']:.0f}", refresh=False)
        self.window, self.window_tokens_before = [], 0
        self.clock.restart()

    # ------------------------------------------------------------------------- checkpoints

    def bookkeeping(self) -> str:
        """What a checkpoint stores besides the arrays, as JSON (compared to skip re-saves)."""
        return json.dumps({**self.book, "iterator": self.batches.state, "window": self.window},
                          sort_keys=True, default=float)

    def save(self, force_sync: bool = False) -> None:
        """Write checkpoint `step`, again if the bookkeeping changed since it was written (the
        closing log line and validation change it without a step)."""
        self.read_back()  # never save a state whose loss was not finite
        current = self.bookkeeping()
        if self.saved == (self.step, current):
            return
        state = self.state
        with self.clock.paused():
            self.saver.save(self.step, state.params, {"step": state.step,
                                                      "opt_state": state.opt_state,
                                                      "rng": state.rng}, json.loads(current))
            if force_sync:
                self.saver.wait()
        self.saved = (self.step, current)

    # ------------------------------------------------------------------------- validation

    def validate(self) -> bool:
        """Validate, log, track the best --best-metric; True when early stopping says stop."""
        self.read_back()
        with self.clock.paused():
            result = self.validation_scores()
            book, step = self.book, self.step
            book["last_eval"] = {"step": step, **result}
            self.writer.write("eval", step, result)
            bleu = result.get("bleu")
            text = (f"step {step}: valid loss {result['loss']:.3f} ppl {result['ppl']:.2f}"
                    + (f" BLEU {bleu:.2f} chrF {result['chrf']:.1f}" if bleu is not None
                       else ""))
            metric = book["best_metric"]
            score = result.get(metric)
            if score is None:  # BLEU or chrF with --eval-sentences 0
                _echo(text)
                return False
            label, higher_is_better = BEST_METRICS[metric]
            best = book["best_score"]
            if best is None or (score > best if higher_is_better else score < best):
                book.update(best_score=score, best_step=step, bad_evals=0)
                self.saver.save_best(step, self.state.params, {metric: score, "step": step})
                # The checkpoint of the same step records this best step: best/ and the
                # bookkeeping a resumed run reads always agree.
                self.save()
                text += f" (best {label})"
            else:
                book["bad_evals"] += 1
                text += f" (best {label} {best:.2f} at step {book['best_step']})"
            _echo(text)
            patience = self.run.early_stop_patience
            return patience is not None and book["bad_evals"] >= patience

    def validation_scores(self) -> dict[str, Any]:
        """Loss, nll, perplexity and accuracy on the validation split; BLEU and chrF of the
        first --eval-sentences pairs, translated as translate.py would."""
        from data.batching import eval_batches
        from transformer.training import shard_batch

        sums = None
        for batch in eval_batches(self.data.valid_examples, self.data.eval_batch_config):
            out = self.eval_step(self.state.params, shard_batch(batch, self.mesh))
            sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
        sums = {k: float(v) for k, v in local_copy(sums).items()}
        tokens = max(sums["tokens"], 1.0)
        result = {"loss": sums["loss_sum"] / tokens, "nll": sums["nll_sum"] / tokens,
                  "ppl": math.exp(min(sums["nll_sum"] / tokens, 700.0)),
                  "accuracy": sums["correct"] / tokens}
        n = min(self.run.eval_sentences, len(self.data.valid_sources))
        if n:
            result.update(self._translation_scores(n))
        return result

    def _translation_scores(self, n: int) -> dict[str, Any]:
        from flax import nnx

        from transformer.translation import Translator, evaluate as score

        data = self.data
        model = nnx.merge(self.graphdef, local_copy(self.state.params))
        sources, refs = data.valid_sources[:n], data.valid_targets[:n]
        t0 = time.monotonic()
        hyps = Translator(model, data.tokenizer, self.search_config).translate(sources)
        scores = score(hyps, refs, **self.bleu)
        for src, ref, hyp in list(zip(sources, refs, hyps))[: self.run.samples]:
            _echo(f"  SRC: {src}\n  REF: {ref}\n  HYP: {hyp}")
        return {"bleu": scores.bleu, "chrf": scores.chrf, "sentences": n,
                "translate_s": round(time.monotonic() - t0, 1)}

    # ------------------------------------------------------------------------- the end

    def finish(self, stopped: str) -> dict[str, Any]:
        """Export the model translate.py loads (and the average), close, print the summary."""
        run, book = self.run, self.book
        model_dir = self._export_model()
        averaged_dir = None
        if run.average_last:
            averaged_dir = average(self.run_dir, run.average_last, self.model_config)
        barrier("exported")
        self.close()
        final_dir = averaged_dir or model_dir
        summary = {
            "run_dir": str(self.run_dir), "model_dir": str(final_dir), "steps": self.step,
            "stopped": stopped, "best_metric": book["best_metric"],
            "best_score": book["best_score"], "best_step": book["best_step"],
            "last_eval": book["last_eval"],
            "minutes": round((time.monotonic() - self.started) / 60, 2),
            "translate_command": translate_command(final_dir, _example(self.data)),
        }
        if run.test_prefix or run.test_file:
            summary["test_command"] = scoring_command(final_dir, run)
        if self.is_main:
            print_summary(summary, self.run_dir)
        return summary

    def _export_model(self) -> Path:
        """Write model/: the parameters of the best step by --best-metric, else of the last
        step."""
        book = self.book
        if book["best_step"] is not None:
            params = self.saver.restore_params(self.state.params, book["best_step"], best=True)
            metric = book["best_metric"]
            source = {"step": book["best_step"], metric: book["best_score"],
                      "chosen": f"best validation {BEST_METRICS[metric][0]}"}
        else:
            params = self.state.params
            source = {"step": self.step, "chosen": "last step"}
        model_dir = self.run_dir / ckpt.MODEL_DIR
        params = local_copy(params)
        if self.is_main:
            ckpt.export_model(model_dir, params, self.model_config, self.data.tokenizer_file,
                              self.search_config, {"source_lang": self.run.src,
                                                   "target_lang": self.run.tgt, **source})
        return model_dir

    def close(self) -> None:
        """Wait for checkpoints in flight and release the files (also after an error)."""
        self._close_bar()
        self.saver.wait()
        self.saver.close()
        self.writer.close()


def _example(data: Data) -> str:
    return data.valid_sources[0].replace('"', "'") if data.valid_sources else "Hello world!"


def average(run_dir: str | Path, last: int, model_config: ModelConfig | None = None) -> Path:
    """Write `run_dir/averaged/`: the mean of the last `last` checkpoints (process 0 writes)."""
    run_dir = Path(run_dir)
    params, steps = ckpt.average_checkpoints(run_dir, last, model_config)
    model_config = model_config or ckpt.read_run_config(run_dir)[0]
    values = json.loads((run_dir / ckpt.CONFIG_FILE).read_text())
    search = SearchConfig(**values["search"]) if "search" in values else SearchConfig()
    out = run_dir / ckpt.AVERAGED_DIR
    if jax.process_index() == 0:
        ckpt.export_model(out, local_copy(params), model_config, run_dir / ckpt.TOKENIZER_FILE,
                          search, {"source_lang": values.get("data", {}).get("src"),
                                   "target_lang": values.get("data", {}).get("tgt"),
                                   "averaged_steps": steps,
                                   "chosen": f"mean of the last {len(steps)} checkpoints"})
        _echo(f"Averaged checkpoints {steps} into {out}")
    return out


def print_summary(summary: dict[str, Any], run_dir: Path) -> None:
    lines = [f"Finished after {summary['steps']} steps ({summary['stopped']}, "
             f"{summary['minutes']} min)."]
    if summary["best_score"] is not None:
        lines.append(f"Best validation {BEST_METRICS[summary['best_metric']][0]} "
                     f"{summary['best_score']:.2f} at step {summary['best_step']}.")
    if summary["stopped"] in ("SIGINT", "SIGTERM"):
        lines.append(f"Interrupted; checkpoint saved. Resume with the same command, or: "
                     f"python train.py --resume --output-dir {run_dir}")
    lines.append(f"Model: {summary['model_dir']}")
    lines.append(f"Translate: {summary['translate_command']}")
    if summary.get("test_command"):
        lines.append(f"Score the test set: {summary['test_command']}")
    print("\n".join(lines), flush=True)
