"""What the trainer tells the user: progress lines, and the closing summary with the commands
that translate with the model and score it on the test split."""

from __future__ import annotations

import logging
import shlex
from pathlib import Path
from typing import Any

import jax
from tqdm import tqdm

from nmt.runtime import allocator
from nmt.runtime.cpu_features import bfloat16_warning
from nmt.runtime.distributed import coordinator_address
from nmt.settings.config import BEST_METRICS, RunConfig
from nmt.training.stopping import StopReason

log = logging.getLogger(__name__)


def echo(message: str) -> None:
    """Print on process 0, above the progress bar if one is shown."""
    if jax.process_index() == 0:
        tqdm.write(message)  # above the bar, which a plain print would tear


def announce(run: RunConfig, params, model_config, data, budget: str, run_dir: Path) -> None:
    """Log the allocator and a bfloat16 warning where the CPU lacks it, then print the line
    that starts training."""
    log.info(allocator.status().line)
    if warning := bfloat16_warning(jax.devices()[0].platform, model_config.dtype):
        log.warning(warning)
    echo(announcement(run, params, model_config, data, budget, run_dir))


def announcement(run: RunConfig, params, model_config, data, budget: str, run_dir: Path) -> str:
    """The line that starts training: model, data, devices, budget."""
    n_params = sum(x.size for x in jax.tree.leaves(params))
    model = f"the model of {run.trainer.init_from}" if run.trainer.init_from else run.preset
    return (f"Training {model} ({n_params:,} parameters, vocabulary "
            f"{model_config.vocab_size}) on {data.counts.get('train', 0)} pairs "
            f"({len(data.train_examples)} after length filtering), {jax.device_count()} "
            f"{jax.devices()[0].platform} device(s), {jax.process_count()} process(es); "
            f"budget {budget}; run directory {run_dir}")


def build_summary(run: RunConfig, run_dir: Path, model_dir: Path, steps: int, stopped: StopReason,
                  book, minutes: float, valid_sources: list[str]) -> dict[str, Any]:
    """What `nmt.training.trainer.train` returns and `print_summary` prints."""
    example = valid_sources[0].replace('"', "'") if valid_sources else "Hello world!"
    summary = {
        "run_dir": str(run_dir), "model_dir": str(model_dir), "steps": steps,
        "stopped": stopped, "best_metric": book.best_metric, "best_score": book.best_score,
        "best_step": book.best_step, "last_eval": book.last_eval, "minutes": minutes,
        "translate_command": translate_command(model_dir, example),
    }
    if run.data.test_prefix or run.data.test_file:
        summary["test_command"] = scoring_command(model_dir, run)
    return summary


def translate_command(model_dir: Path, example: str = "Hello world!") -> str:
    """The command line to paste, quoted for a shell: a directory may hold spaces or `$`."""
    return f"python translate.py --model {shlex.quote(str(model_dir))} {shlex.quote(example)}"


def scoring_command(model_dir: Path, run: RunConfig) -> str:
    """The translate.py command that scores the model on the run's test split
    (--test-prefix or --test-file)."""
    data = run.data
    test = ["--test-prefix", data.test_prefix] if data.test_prefix else ["--test-file",
                                                                        data.test_file]
    tokenize = run.trainer.bleu_tokenize
    tokenizer = ["--bleu-tokenize", tokenize] if tokenize else []
    return shlex.join(["python", "translate.py", "--model", str(model_dir), "--evaluate",
                       *test, "--src", data.src, "--tgt", data.tgt, *tokenizer])


def resume_command(run_dir: Path) -> str:
    """The command that continues the run in `run_dir` with exactly its recorded settings;
    with several processes, the one for each process K, with the flags that join them."""
    command = (f"python train.py --config {run_dir / 'config.yaml'} --output-dir {run_dir} "
               "--resume")
    count = jax.process_count()
    if count == 1:
        return command
    return (f"on each process K (0 to {count - 1}): {command} --coordinator "
            f"{coordinator_address()} --num-processes {count} --process-id K")


def print_summary(summary: dict[str, Any], run_dir: Path) -> None:
    peak = summary.get("peak_rss_gb")
    lines = [f"Finished after {summary['steps']} steps ({summary['stopped']}, "
             f"{summary['minutes']} min" + (f", peak memory {peak:.2f} GB" if peak else "")
             + ")."]
    if summary["best_score"] is not None:
        lines.append(f"Best validation {BEST_METRICS[summary['best_metric']][0]} "
                     f"{summary['best_score']:.2f} at step {summary['best_step']}.")
    time_spent = summary.get("time")
    if time_spent:
        lines.append(f"Compiled {time_spent['compiled']} programs and read "
                     f"{time_spent['cache_hits']} from the compilation cache in "
                     f"{time_spent['compile_s']:.1f} s; train steps took "
                     f"{time_spent['steps_s']:.1f} s, {time_spent['data_wait_s']:.1f} s of "
                     f"it waiting for data.")
    if StopReason(summary["stopped"]).interrupted:
        lines.append(f"Interrupted; checkpoint saved. Resume with the same command, or: "
                     f"{resume_command(run_dir)}")
    lines.append(f"Model: {summary['model_dir']}")
    lines.append(f"Translate: {summary['translate_command']}")
    if summary.get("test_command"):
        lines.append(f"Score the test set: {summary['test_command']}")
    print("\n".join(lines), flush=True)
