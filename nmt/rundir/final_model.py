"""The models a run leaves for translate.py: model/ (the best step, else the last) and
averaged/ (the mean of the last checkpoints)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import jax

from nmt.models.model_dir import MODEL_DIR, export_model
from nmt.rundir.bookkeeping import Bookkeeping
from nmt.rundir.checkpoints import (
    AVERAGED_DIR,
    CHECKPOINTS_DIR,
    Checkpointer,
    SaveError,
    average_checkpoints,
    complete_steps,
)
from nmt.runtime.distributed import local_copy
from nmt.settings.config import RunConfig
from transformer.config import ModelConfig

log = logging.getLogger(__name__)


def _export(model_dir: Path, *args, **kwargs) -> None:
    """`export_model`, with a failed write (disk full, say) as a SaveError naming what is
    intact."""
    try:
        export_model(model_dir, *args, **kwargs)
    except OSError as err:
        raise SaveError(
            f"cannot write {model_dir}: {err.strerror}; the checkpoints and the earlier "
            f"{model_dir.name}/ (if any) are intact: free some space (or fix the cause), then "
            f"run the same command again, which writes {model_dir.name}/ from the "
            "checkpoints.") from err


def languages(run: RunConfig) -> dict[str, str]:
    return {"source_lang": run.data.src, "target_lang": run.data.tgt}


def export_best_or_last(run_dir: Path, run: RunConfig, model_config: ModelConfig,
                        tokenizer, book: Bookkeeping, saver: Checkpointer,
                        last_params: Any, last_step: int) -> Path:
    """Write model/: the parameters of the best step by the best metric, else of the last
    step. Every process calls it (restoring is collective); process 0 writes. The best step
    may be the last, whose closing validation best/ does not hold (`Bookkeeping.reported`)."""
    params = last_params
    if book.best_step is None:
        source = {"step": last_step, "chosen": "last step"}
    else:
        if book.best_step != last_step:
            params = saver.restore_params(last_params, book.best_step, best=True)
        source = {"step": book.best_step, book.best_metric: book.best_score,
                  "chosen": f"best validation {book.metric_label}"}
    model_dir = run_dir / MODEL_DIR
    params = local_copy(params)
    if jax.process_index() == 0:
        _export(model_dir, params, model_config, tokenizer, run.search,
                     {**languages(run), **source})
    return model_dir


def average(run_dir: Path, run: RunConfig, model_config: ModelConfig, tokenizer,
            last: int, settings: str = "the run's settings") -> tuple[Path, list[int]]:
    """Write averaged/: the mean of the last `last` checkpoints (process 0 writes); returns
    the directory and the steps averaged."""
    params, steps = average_checkpoints(run_dir, last, model_config, settings)
    if jax.process_index() == 0:
        complete = len(complete_steps(run_dir / CHECKPOINTS_DIR))
        for warning in (fewer_than_asked(steps, last, complete),
                        warm_up_in_average(steps, run)):
            if warning:
                log.warning(warning)
    out = run_dir / AVERAGED_DIR
    if jax.process_index() == 0:
        _export(out, local_copy(params), model_config, tokenizer, run.search,
                     {**languages(run), "averaged_steps": steps,
                      "chosen": f"mean of the last {len(steps)} checkpoints"})
    return out, steps


def fewer_than_asked(steps: list[int], last: int, complete: int) -> str | None:
    """That the average holds fewer checkpoints than --average-last asked for (a run shorter
    than that many saves, or of `complete` checkpoints some left out as damaged), or None."""
    if len(steps) >= last:
        return None
    skipped = complete - len(steps)
    why = (f"{skipped} more were left out as damaged or unreadable (the warnings above name "
           "them)" if skipped > 0 else "the run has no more complete ones")
    return (f"{AVERAGED_DIR}/ is the mean of {len(steps)} checkpoint(s), steps {steps}, fewer "
            f"than --average-last {last}: {why}")


def warm_up_in_average(steps: list[int], run: RunConfig) -> str | None:
    """Why an average may translate worse than model/: it reaches back into the learning-rate
    warm-up (a run stopped early by its time budget, say), where the weights are far from
    those it ended with. None when it does not."""
    warmup = run.optimizer.warmup_steps
    if not steps or steps[0] > warmup:
        return None
    return (f"the averaged checkpoints start at step {steps[0]}, within the {warmup}-step "
            f"learning-rate warm-up: {AVERAGED_DIR}/ may translate worse than {MODEL_DIR}/; "
            f"compare them on the validation set, or average fewer (train.py --average-only "
            f"--average-last N with the same --output-dir)")
