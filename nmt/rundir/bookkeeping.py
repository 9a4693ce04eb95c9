"""What a training checkpoint stores besides the arrays: the trainer's bookkeeping.

Saved as the checkpoint's JSON item "data" and restored on resume, so that a resumed run
tracks the same best step, patience and data position as one that never stopped.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from nmt.settings.config import BEST_METRICS


@dataclasses.dataclass
class Bookkeeping:
    """The trainer's state that is not arrays.

    best_metric:    the validation score that picks best/ and model/ ("bleu", "chrf", "ppl")
    best_score, best_step: the best score so far and its step (None before the first)
    bad_evals:      validations since the best one (early stopping's patience)
    bleu_tokenizer: the BLEU tokenizer the best BLEU was scored with
    last_eval:      the last validation's results and step
    iterator:       the training batches' position, {"epoch", "position"}
    plan:           {"epoch", "fingerprint"} of the batch plan the position indexes
    window:         per-step metrics of the log window not yet written
    recent_losses:  the losses of the last steps, which --loss-spike compares a loss with
    tokenizer_sha256: the SHA-256 of the run's spm.model (None: recorded by an older version)
    seed:           the run's --seed (None: recorded by an older version), checked on resume
                    even where config.yaml is gone
    """

    best_metric: str = "bleu"
    best_score: float | None = None
    best_step: int | None = None
    bad_evals: int = 0
    bleu_tokenizer: str = "13a"
    last_eval: dict[str, Any] | None = None
    iterator: dict[str, int] = dataclasses.field(
        default_factory=lambda: {"epoch": 0, "position": 0})
    plan: dict[str, Any] | None = None
    window: list[dict[str, float]] = dataclasses.field(default_factory=list)
    recent_losses: list[float] = dataclasses.field(default_factory=list)
    tokenizer_sha256: str | None = None
    seed: int | None = None

    @property
    def metric_label(self) -> str:
        """The best metric's name in messages: BLEU, chrF or perplexity."""
        return BEST_METRICS[self.best_metric][0]

    def to_json(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self), default=float))

    def fingerprint(self) -> str:
        """The bookkeeping as canonical JSON: equal bookkeeping, equal text (skips re-saves)."""
        return json.dumps(self.to_json(), sort_keys=True)

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> "Bookkeeping":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    def improves(self, score: float) -> bool:
        """Whether `score` of the best metric beats the best so far; NaN never does (nothing
        would beat it after), and any number beats a NaN an older version recorded."""
        if math.isnan(score):
            return False
        if self.best_score is None or math.isnan(self.best_score):
            return True
        higher_is_better = BEST_METRICS[self.best_metric][1]
        return score > self.best_score if higher_is_better else score < self.best_score

    def record(self, step: int, result: dict[str, Any], closing: bool = False) -> bool | None:
        """Record the validation of `step`; True if it is the new best, False if not, None
        when it has no score of the best metric (BLEU or chrF without translated sentences).

        `closing`: the validation that closes a run off the --eval-every grid (a --max-minutes
        stop, say), recorded as the last one only: the best and the patience stay those of the
        scheduled validations, which a resumed run continues from as an uninterrupted run
        would. `reported` counts it for the stopped run's own model/."""
        self.last_eval = {"step": step, **result}
        score = result.get(self.best_metric)
        if score is None or closing:
            return None if score is None else self.improves(score)
        if self.improves(score):
            self.best_score, self.best_step, self.bad_evals = score, step, 0
            return True
        self.bad_evals += 1
        return False

    def reported(self, step: int, eval_every: int) -> "Bookkeeping":
        """What the run stopped at `step` exports and reports: this bookkeeping, with the
        closing validation of `step` (`record`) counted as if scheduled."""
        last = self.last_eval
        if last is None or last["step"] != step or step % eval_every == 0:
            return self
        book = dataclasses.replace(self)  # record() replaces fields, and shares no list
        book.record(step, {k: v for k, v in last.items() if k != "step"})
        return book

    def restart_best(self, metric: str) -> None:
        """Track the best by `metric` from scratch."""
        self.best_metric, self.best_score, self.best_step, self.bad_evals = metric, None, None, 0

    def out_of_patience(self, patience: int | None) -> bool:
        return patience is not None and self.bad_evals >= patience
