"""Every setting of a training run: `RunConfig` nests one frozen dataclass per concern.

    model      transformer.config.ModelConfig      (and the preset it starts from)
    tokenizer  data.config.TokenizerConfig
    data       data.config.CorpusSpec
    batching   data.config.BatchConfig
    optimizer  transformer.config.OptimizerConfig  (schedule, Adam, loss, accumulation, seed)
    search     transformer.config.SearchConfig     (validation, and stored with the model)
    trainer    TrainerConfig                       (below: length, validation, checkpoints, logs)

Older recipes, and the config.yaml of older run directories, call the optimizer section
`train`; `nmt.settings.recipes` reads it as `optimizer` (`RENAMED_SECTIONS`).

Each setting is declared once, in its dataclass; train.py's flags and the recipe schema
(`nmt.settings.recipes`) are derived from those declarations. Build one from a recipe with
`nmt.settings.recipes.load`, or from flag-style names with `nmt.settings.recipes.run_from_flat`:

    run = recipes.run_from_flat(preset="tiny", train_prefix="data/train", max_steps=100)
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Literal

from data.config import BatchConfig, CorpusSpec, TokenizerConfig
from transformer.config import (
    PRESETS,
    ModelConfig,
    OptimizerConfig,
    SearchConfig,
    check_finite_fields,
    setting,
)

# Default time budget when neither max_steps, max_minutes nor max_epochs is given: the
# no-argument `python train.py` must finish in a few minutes on a 2-core CPU.
DEFAULT_MAX_MINUTES = 4.0

# Validation scores that can pick the best checkpoint (best_metric): name in the validation
# results -> (name in messages, whether higher is better).
BEST_METRICS = {"bleu": ("BLEU", True), "chrf": ("chrF", True), "ppl": ("perplexity", False)}


# A layer of settings: {section: {name: (value, origin)}}, origin saying where the value was
# given ("--dropout", "recipe.yaml line 4 (model.dropout)"), for error messages
# (`nmt.settings.recipes`).
Layer = dict[str, dict[str, tuple[Any, str]]]


class SettingsError(ValueError):
    """Settings that cannot work together, or a recipe that cannot be read; the message names
    the flag, the file and key, and what to do."""


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """How the training loop runs: its length, validation, checkpoints and logging."""

    output_dir: str | None = setting(
        None, "run directory (default runs/<corpus>-<src>-<tgt>-<preset>); resumes if it holds "
              "checkpoints")
    init_from: str | None = setting(
        None, "fine-tune: start from the parameters of this model directory (a run's model/ or "
              "averaged/, or one imported with python -m nmt.convert from-marian), with its "
              "architecture and its tokenizer; dropout and dtype come from this run's settings")
    max_steps: int | None = setting(None, "stop after this many updates")
    max_minutes: float | None = setting(
        None, f"the whole run's wall-clock time, from the command's start to its last line "
              "(the steps stop in time for the closing validation, checkpoint and export, "
              f"whose time is reserved from measurement); {DEFAULT_MAX_MINUTES:g} when "
              "neither --max-steps nor --max-epochs is given")
    max_epochs: int | None = setting(None, "stop after this many passes over the training pairs")
    written_for: Literal["cpu", "gpu", "tpu"] | None = setting(
        None, "the platform whose speed the budget of steps and minutes was chosen for (cpu, "
              "gpu or tpu): on another, training says so at start and, once its first steps are "
              "timed, how long the budget takes there")
    early_stop_patience: int | None = setting(
        None, "stop after N validations without a better --best-metric score")
    eval_every: int = setting(1000, "validate every N steps")
    eval_sentences: int = setting(
        100, "translate at most N validation sentences for BLEU and chrF (0 = loss and "
             "perplexity only)")
    samples: int = setting(3, "sample translations printed per validation")
    best_metric: Literal["bleu", "chrf", "ppl"] | None = setting(
        None, "bleu, chrf or ppl: the validation score that picks the best checkpoint (best/, "
              "model/) and that --early-stop-patience watches; bleu and chrf need "
              "--eval-sentences >= 1 (default: bleu, or the resumed run's)")
    bleu_tokenize: str | None = setting(
        None, "sacreBLEU's BLEU tokenizer (13a, intl, zh, ja-mecab, ko-mecab, char, none, ...); "
              "default: zh, ja-mecab or ko-mecab for a Chinese, Japanese or Korean target, "
              "else 13a")
    save_every: int | None = setting(None, "checkpoint every N steps (default: --eval-every)")
    keep_last: int = setting(5, "keep the last K --save-every checkpoints (and the newest)")
    average_last: int | None = setting(
        None, "at the end of training, write averaged/: the mean of the last N checkpoints "
              "(train.py --average-only averages an existing run without training)")
    log_every: int = setting(50, "log metrics every N steps")
    loader_depth: int = setting(
        4, "training batches kept ready ahead of the train step, built on a thread (the log "
           "lines' data_wait_s: how long the steps still waited for data)")
    loss_spike: float = setting(
        10.0, "stop, as for a NaN loss, when a step's loss exceeds this many times the median "
              "loss of the previous 50 steps (0 = never)")
    async_checkpoints: bool = setting(True, "save checkpoints in the background")
    progress: bool = setting(True, "show a progress bar on a terminal")

    def __post_init__(self) -> None:
        try:
            check_finite_fields(self)
        except ValueError as err:
            raise SettingsError(str(err)) from None
        for name in ("eval_every", "log_every", "keep_last", "loader_depth"):
            if getattr(self, name) < 1:
                raise SettingsError(f"--{_flag(name)} must be >= 1, got {getattr(self, name)}.")
        for name in ("max_steps", "max_epochs", "average_last", "early_stop_patience",
                     "save_every"):
            value = getattr(self, name)
            least = 0 if name == "max_steps" else 1  # --max-steps 0: export, no training
            if value is not None and value < least:
                raise SettingsError(f"--{_flag(name)} must be >= {least}, got {value}.")
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise SettingsError(f"--max-minutes must be > 0, got {self.max_minutes}.")
        if self.eval_sentences < 0:
            raise SettingsError(f"--eval-sentences must be >= 0, got {self.eval_sentences}.")
        if not self.loss_spike >= 0 or (0 < self.loss_spike <= 1):
            raise SettingsError(f"--loss-spike must be 0 (off) or > 1, got {self.loss_spike}.")
        if self.samples < 0:
            raise SettingsError(f"--samples must be >= 0, got {self.samples}.")
        if self.best_metric is not None and self.best_metric not in BEST_METRICS:
            raise SettingsError(f"--best-metric must be one of {', '.join(BEST_METRICS)}, "
                                f"got {self.best_metric!r}.")
        if self.eval_sentences == 0 and self.best_metric != "ppl":
            label = BEST_METRICS[self.best_metric or "bleu"][0]
            if self.early_stop_patience is not None:
                raise SettingsError(
                    f"--early-stop-patience {self.early_stop_patience} counts validations "
                    f"without a better {label}, but --eval-sentences 0 computes no {label}; set "
                    f"--eval-sentences to 1 or more, use --best-metric ppl, or drop "
                    f"--early-stop-patience.")
            if self.best_metric is not None:  # bleu or chrf, asked for by name
                raise SettingsError(f"--best-metric {self.best_metric} needs --eval-sentences "
                                    f">= 1 (0 computes no {label}); or use --best-metric ppl.")

    @property
    def save_interval(self) -> int:
        """Steps between scheduled checkpoints."""
        return self.save_every or self.eval_every

    def limits(self) -> tuple[int | None, float | None]:
        """(max_steps, max_minutes) with the default time budget applied when no limit of
        steps, minutes or epochs is given."""
        if self.max_steps is None and self.max_minutes is None and self.max_epochs is None:
            return None, DEFAULT_MAX_MINUTES
        return self.max_steps, self.max_minutes


def _flag(name: str) -> str:
    return name.replace("_", "-")


# Sections of a recipe, in the order they are written: section name -> dataclass.
SECTIONS: dict[str, type] = {
    "model": ModelConfig, "tokenizer": TokenizerConfig, "data": CorpusSpec,
    "batching": BatchConfig, "optimizer": OptimizerConfig, "search": SearchConfig,
    "trainer": TrainerConfig,
}
# Sections' former names, still read in recipes and in run directories' config.yaml:
# old name -> section.
RENAMED_SECTIONS: dict[str, str] = {"train": "optimizer"}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A training run's settings, one section per concern (see the module docstring).

    `model` is the preset `preset` with the run's overrides; its vocabulary size and special
    ids are the tokenizer's, filled in when the tokenizer is known (`model_for`).
    """

    preset: str = "small"
    model: ModelConfig = PRESETS["small"]
    tokenizer: TokenizerConfig = TokenizerConfig()
    data: CorpusSpec = CorpusSpec()
    batching: BatchConfig = BatchConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    search: SearchConfig = SearchConfig()
    trainer: TrainerConfig = TrainerConfig()

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise SettingsError(f"--preset must be one of {', '.join(sorted(PRESETS))}, got "
                                f"{self.preset!r}.")
        self._check_schedule_end()

    def _check_schedule_end(self) -> None:
        """A linear schedule without --decay-steps ends at the run's limit of steps, epochs or
        minutes (nmt.training.schedule_fit): a limit of steps must leave it a decay."""
        optimizer = self.optimizer
        if optimizer.schedule != "linear" or optimizer.decay_steps is not None:
            return
        max_steps, max_minutes = self.trainer.limits()
        if max_minutes is None and max_steps is not None and max_steps <= optimizer.warmup_steps:
            raise SettingsError(f"--schedule linear ends at --max-steps {max_steps}, which must "
                                f"be above --warmup {optimizer.warmup_steps}; raise it or set "
                                f"--decay-steps.")

    def warmup_warning(self) -> str | None:
        """Why the learning rate never reaches its peak, a warm-up as long as the run; a
        warning, not a refusal: a smoke run may keep its recipe's warm-up. None when it does."""
        optimizer, max_steps = self.optimizer, self.trainer.max_steps
        fitted = optimizer.schedule == "linear" and optimizer.decay_steps is None  # refused above
        if fitted or not max_steps or optimizer.warmup_steps < max_steps:
            return None
        return (f"--warmup {optimizer.warmup_steps} is not below --max-steps {max_steps}: the "
                f"{optimizer.schedule} learning rate warms up for the whole run, reaching "
                f"{max_steps}/{optimizer.warmup_steps} of its peak at the last step; lower "
                "--warmup unless this is a short test")

    # ------------------------------------------------------------------ derived values

    def model_for(self, tokenizer) -> ModelConfig:
        """The model config with the tokenizer's vocabulary size and special ids."""
        return dataclasses.replace(self.model, vocab_size=tokenizer.vocab_size,
                                   **tokenizer.special_ids())

    def model_for_vocab(self, vocab_size: int) -> ModelConfig:
        """The model config for a vocabulary of `vocab_size` pieces with this project's
        special ids (`data.tokenizer`), before the tokenizer is loaded."""
        return dataclasses.replace(self.model, vocab_size=vocab_size)

    def replace(self, **sections: Any) -> "RunConfig":
        """A copy with some fields of some sections changed: replace(trainer={"max_steps": 5})."""
        changed = {name: dataclasses.replace(getattr(self, name), **values)
                   for name, values in sections.items()}
        return dataclasses.replace(self, **changed)

    @property
    def corpus_name(self) -> str:
        """Short name of the training corpus, for the default run directory."""
        data = self.data
        if data.train_prefix:
            prefix = Path(data.train_prefix)
            return prefix.parent.name or prefix.name
        if data.train_file:
            return Path(data.train_file).stem
        if data.dataset:
            return Path(data.dataset).name
        return "builtin"

    def default_output_dir(self) -> Path:
        name = f"{self.corpus_name}-{self.data.src}-{self.data.tgt}-{self.preset}"
        return Path("runs") / re.sub(r"[^\w.-]+", "_", name)

    def output_dir(self) -> Path:
        """The run directory: trainer.output_dir, else `default_output_dir()`."""
        given = self.trainer.output_dir
        return Path(given) if given else self.default_output_dir()
