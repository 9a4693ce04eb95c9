"""`RunConfig`: every setting of a training run, one field per train.py flag.

    run = RunConfig(preset="small", max_minutes=5)
    run.model_config(vocab_size=8000)   # the preset with the run's overrides
    run.train_config()                  # transformer.training.TrainConfig
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from transformer.config import PRESETS, DictConfig, ModelConfig, SearchConfig, get_preset
from transformer.training import TrainConfig

# Default time budget when neither max_steps nor max_minutes is given: the no-argument
# `python train.py` must finish in a few minutes on a 2-core CPU.
DEFAULT_MAX_MINUTES = 4.0

# ModelConfig fields that RunConfig can override (flag --d-model sets d_model, ...).
MODEL_OVERRIDES = ("d_model", "num_heads", "d_ff", "encoder_layers", "decoder_layers",
                   "dropout", "attention_dropout", "activation_dropout", "norm", "positional",
                   "share_embeddings", "dtype", "max_len")


# Validation scores that can pick the best checkpoint (--best-metric): name in the validation
# results -> (name in messages, whether higher is better).
BEST_METRICS = {"bleu": ("BLEU", True), "chrf": ("chrF", True), "ppl": ("perplexity", False)}


@dataclasses.dataclass(frozen=True)
class RunConfig(DictConfig):
    """Everything `train` needs, flat, one field per train.py flag (`--batch-tokens` ->
    `batch_tokens`). Fields left None take the preset's or TrainConfig's default."""

    # ---- model
    preset: str = "small"
    d_model: int | None = None
    num_heads: int | None = None
    d_ff: int | None = None
    encoder_layers: int | None = None
    decoder_layers: int | None = None
    dropout: float | None = None
    attention_dropout: float | None = None
    activation_dropout: float | None = None
    norm: str | None = None
    positional: str | None = None
    share_embeddings: bool | None = None
    dtype: str | None = None
    max_len: int | None = None
    # ---- data (see data.corpus.CorpusSpec)
    src: str = "en"
    tgt: str = "de"
    train_prefix: str | None = None
    valid_prefix: str | None = None
    test_prefix: str | None = None
    train_file: str | None = None
    valid_file: str | None = None
    test_file: str | None = None
    dataset: str | None = None
    dataset_config: str | None = None
    # Use only N training pairs: the first N of the training source, or, when the validation
    # split is held out of it (no --valid-prefix/--valid-file, no validation split in the
    # dataset), N of the seeded shuffle the hold-out leaves.
    max_train_pairs: int | None = None
    vocab_size: int = 4000
    tokenizer_type: str = "unigram"
    # An existing SentencePiece model (another run's spm.model, say) instead of training one;
    # tokenizer_type then does not apply, and train.py sets vocab_size to its size (the model's
    # vocabulary is the tokenizer's in any case). Its pad/unk/bos/eos ids must be 0-3.
    spm_model: str | None = None
    batch_tokens: int = 2048  # per micro-batch: rows x max(S, T), padding included
    max_tokens_per_sentence: int = 64
    # Padded lengths of batches; None = data.batching.DEFAULT_BUCKETS (little padding, a few
    # dozen shapes). Few buckets mean few compilations, which matters on a CPU.
    buckets: tuple[int, ...] | None = (16, 32, 64)
    # ---- optimisation (see transformer.training.TrainConfig)
    # Defaults for a few minutes on a CPU, not the paper's (recipes in configs/ have those):
    # a 200-step warm-up, scaled so that the peak, 0.4 * 256^-0.5 * 200^-0.5 = 1.8e-3 for
    # `small`, is not too high for 2k-token batches (lr_scale 1 stalled at valid ppl ~450
    # after 4 minutes on the built-in corpus; 0.4 reached ~140).
    schedule: str = "noam"
    warmup: int = 200
    lr_scale: float = 0.4
    peak_lr: float = 1e-3
    # The paper's settings, as TrainConfig holds them:
    adam_b1: float = TrainConfig.adam_b1
    adam_b2: float = TrainConfig.adam_b2
    adam_eps: float = TrainConfig.adam_eps
    label_smoothing: float = TrainConfig.label_smoothing
    clip_norm: float | None = TrainConfig.clip_norm
    accum: int = TrainConfig.accum_steps
    weight_decay: float = TrainConfig.weight_decay
    seed: int = TrainConfig.seed
    # ---- length of training
    max_steps: int | None = None
    max_minutes: float | None = None
    max_epochs: int | None = None  # passes over the (length-filtered) training pairs
    early_stop_patience: int | None = None  # validations without a better --best-metric
    # ---- validation
    eval_every: int = 1000
    eval_sentences: int = 100
    beam: int = 4
    alpha: float = 0.6
    samples: int = 3  # sample translations printed per validation
    # The validation score that picks best/ and model/ and that early stopping watches
    # (BEST_METRICS). None: the resumed run's metric, "bleu" for a new run. BLEU and chrF need
    # --eval-sentences >= 1; without them BLEU picks nothing and model/ is the last step.
    best_metric: str | None = None
    # sacreBLEU's BLEU tokenizer; None: its choice for `tgt` (zh, ja-mecab, ko-mecab or 13a)
    bleu_tokenize: str | None = None
    # ---- checkpoints and logging
    save_every: int | None = None  # default: eval_every
    keep_last: int = 5
    average_last: int | None = None
    log_every: int = 50
    async_checkpoints: bool = True
    progress: bool = True
    # ---- test hooks (not command-line flags)
    nan_at_step: int | None = None  # poison the parameters before this step

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"--preset must be one of {sorted(PRESETS)}, got {self.preset!r}.")
        for name in ("eval_every", "log_every", "keep_last", "batch_tokens", "accum",
                     "vocab_size", "max_tokens_per_sentence", "beam"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, "
                                 f"got {getattr(self, name)}.")
        for name in ("max_steps", "max_epochs", "average_last", "early_stop_patience",
                     "save_every", "max_train_pairs"):
            value = getattr(self, name)
            least = 0 if name == "max_steps" else 1  # --max-steps 0: export, no training
            if value is not None and value < least:
                raise ValueError(f"--{name.replace('_', '-')} must be >= {least}, got {value}.")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ValueError(f"--max-minutes must be > 0, got {self.max_minutes}.")
        if self.buckets is not None:
            object.__setattr__(self, "buckets", tuple(int(b) for b in self.buckets))
        if self.eval_sentences < 0:
            raise ValueError(f"--eval-sentences must be >= 0, got {self.eval_sentences}.")
        if self.best_metric is not None and self.best_metric not in BEST_METRICS:
            raise ValueError(f"--best-metric must be one of {', '.join(BEST_METRICS)}, "
                             f"got {self.best_metric!r}.")
        if self.eval_sentences == 0 and self.best_metric != "ppl":
            label = BEST_METRICS[self.best_metric or "bleu"][0]
            if self.early_stop_patience is not None:
                raise ValueError(
                    f"--early-stop-patience {self.early_stop_patience} counts validations "
                    f"without a better {label}, but --eval-sentences 0 computes no {label}; set "
                    f"--eval-sentences to 1 or more, use --best-metric ppl, or drop "
                    f"--early-stop-patience.")
            if self.best_metric == "chrf":
                raise ValueError("--best-metric chrf needs --eval-sentences >= 1 (0 computes no "
                                 "chrF); or use --best-metric ppl.")

    # ------------------------------------------------------------------ derived configs

    def model_config(self, vocab_size: int) -> ModelConfig:
        overrides = {name: getattr(self, name) for name in MODEL_OVERRIDES
                     if getattr(self, name) is not None}
        return get_preset(self.preset, vocab_size=vocab_size, **overrides)

    def train_config(self) -> TrainConfig:
        return TrainConfig(
            schedule=self.schedule, warmup_steps=self.warmup, lr_scale=self.lr_scale,
            peak_lr=self.peak_lr, adam_b1=self.adam_b1, adam_b2=self.adam_b2,
            adam_eps=self.adam_eps, label_smoothing=self.label_smoothing,
            clip_norm=self.clip_norm, accum_steps=self.accum, weight_decay=self.weight_decay,
            seed=self.seed)

    def bleu_settings(self) -> dict[str, str | None]:
        """The keyword arguments of `transformer.translation.evaluate` for validation BLEU.
        MetricError (a ValueError) if its tokenizer is unknown or cannot run here, e.g.
        ja-mecab for `--tgt ja` without MeCab: better said before training than at step 1000."""
        from transformer.translation import bleu_settings

        if not self.eval_sentences:  # no BLEU is computed: nothing to check
            return {"target_language": self.tgt, "bleu_tokenize": self.bleu_tokenize}
        return bleu_settings(self.tgt, self.bleu_tokenize)

    def bleu_tokenizer(self) -> str:
        """The name of the sacreBLEU tokenizer validation BLEU uses."""
        from transformer.translation import bleu_tokenizer_for

        return self.bleu_tokenize or bleu_tokenizer_for(self.tgt)

    def search_config(self) -> SearchConfig:
        return SearchConfig(beam_size=self.beam, alpha=self.alpha)

    def corpus_spec(self):
        from data.corpus import CorpusSpec

        return CorpusSpec(src=self.src, tgt=self.tgt, train_prefix=self.train_prefix,
                          valid_prefix=self.valid_prefix, test_prefix=self.test_prefix,
                          train_file=self.train_file, valid_file=self.valid_file,
                          test_file=self.test_file,
                          dataset=self.dataset, dataset_config=self.dataset_config,
                          seed=self.seed)

    @property
    def corpus_name(self) -> str:
        """Short name of the training corpus, for the default run directory."""
        if self.train_prefix:
            prefix = Path(self.train_prefix)
            return prefix.parent.name or prefix.name
        if self.train_file:
            return Path(self.train_file).stem
        if self.dataset:
            return Path(self.dataset).name
        return "builtin"

    def default_output_dir(self) -> Path:
        name = f"{self.corpus_name}-{self.src}-{self.tgt}-{self.preset}"
        return Path("runs") / re.sub(r"[^\w.-]+", "_", name)

    def limits(self) -> tuple[int | None, float | None]:
        """(max_steps, max_minutes) with the default time budget applied when no limit of
        steps, minutes or epochs is given."""
        if self.max_steps is None and self.max_minutes is None and self.max_epochs is None:
            return None, DEFAULT_MAX_MINUTES
        return self.max_steps, self.max_minutes
