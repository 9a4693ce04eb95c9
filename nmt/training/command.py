"""train.py's command line: its flags, the checks before training, and the exit status.

Settings come from train.py's defaults, then the recipe, then the flags (`nmt.settings.recipes`).
Every mistake or fault ends in one line, `train.py: error: ...` (exit 2 for bad flags, values
and paths, 1 for faults while running); NMT_DEBUG=1 shows the traceback of an unexpected error.
A run stopped by SIGINT or SIGTERM saves, prints how to resume, and exits 130 or 143.
Nothing here imports JAX before the flags are checked: `train.py --help` answers at once.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
import time
from pathlib import Path

from nmt.runtime import cli
from nmt.settings import recipes
from nmt.settings.config import RunConfig, SettingsError

PROG = "train.py"


def build_parser() -> argparse.ArgumentParser:
    parser = cli.OneLineParser(
        prog=PROG, description="Train a Transformer (Vaswani et al. 2017) translation model.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog="""\
examples:
  python train.py                                     # minutes, on an offline corpus
  python train.py --config configs/multi30k_cpu.yaml  # a recipe (configs/ has more)
  python train.py --train-prefix data/train --src en --tgt de --preset small

A recipe (--config) is a YAML file with one section per settings group below
(configs/ has examples), or a flat JSON object of flag names; flags given on the
command line override it. On Linux train.py runs on mimalloc, which keeps
XLA:CPU's step buffers mapped between steps; NMT_ALLOCATOR=system in the
environment turns it off (nmt/runtime/allocator.py).""")
    parser.add_argument("--config", metavar="RECIPE", type=cli.given,
                        help="recipe file (.yaml, or .json), e.g. configs/multi30k_small.yaml, "
                             "or a recipe of configs/ by name (multi30k_small)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --output-dir (an error if it has none); "
                             "rerunning the same command without it resumes too")
    parser.add_argument("--average-only", action="store_true",
                        help="do not train: write averaged/, the mean of the last "
                             "--average-last checkpoints of the run in --output-dir")
    recipes.add_flags(parser, recipes.defaults())
    multi = parser.add_argument_group("several processes (multi-host)")
    multi.add_argument("--coordinator", metavar="HOST:PORT", type=cli.given,
                       help="process 0's address and a free port, the same on every process")
    multi.add_argument("--num-processes", type=int, metavar="N",
                       help="how many processes run this training (one per host, say)")
    multi.add_argument("--process-id", type=int, metavar="K",
                       help="this process's number, 0 to N-1; without these three a launcher "
                            "(SLURM, Open MPI, a TPU slice) that set them is read instead")
    return parser


def resolve(argv: list[str] | None = None) -> tuple[RunConfig, argparse.Namespace]:
    """The run's settings from train.py's defaults, the recipe and the flags, as
    `recipes.resolve` builds them; SettingsError names the flag or the recipe's file, line
    and key at fault."""
    args = build_parser().parse_args(argv)
    layers = [recipes.read_recipe(args.config)] if args.config else []
    return recipes.resolve(recipes.defaults(), *layers, recipes.from_args(args)), args


def _setup_logging() -> None:
    cli.setup_logging(logging.INFO, "%(levelname)s %(name)s: %(message)s",
                      ("absl", "jax", "datasets", "orbax", "tensorboardX"))


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()  # --max-minutes holds the whole command from here
    return cli.guarded(PROG, lambda: _main(argv, started), _tell_other_processes)


def _tell_other_processes(line: str, status: int) -> None:
    """With several processes, the others end with this one's error instead of waiting for
    it, and this one exits at once (`end_after_failure`); nothing with one process."""
    if "jax" in sys.modules:  # not imported: no distributed runtime was started
        from nmt.runtime.distributed import end_after_failure

        end_after_failure(line, status)


def _main(argv: list[str] | None, started: float) -> int:
    _setup_logging()  # the settings' own warnings (nmt.settings.derived) come formatted
    try:
        run, args = resolve(argv)
    except SettingsError as err:
        raise cli.UsageError(str(err)) from None
    if args.average_only and not run.trainer.average_last:
        raise cli.UsageError("--average-only needs --average-last N (how many checkpoints).")
    average, keep = run.trainer.average_last, run.trainer.keep_last
    if not args.average_only and average and average > keep:
        # Found before training, not in a warning at its end.
        raise cli.UsageError(f"--average-last {average} averages the last {average} "
                             f"checkpoints, but --keep-last {keep} keeps only {keep}; raise "
                             f"--keep-last to {average} or more, or average fewer.")
    cli.writable_directory(run.output_dir(), "--output-dir")
    _not_an_exported_model(run.output_dir())
    cli.writable_cache(PROG)
    # Before anything touches JAX devices; and not before parsing: --help loads no JAX.
    from nmt.runtime.distributed import PeerFailed, check_process_flags, initialize_distributed

    try:
        check_process_flags(args.coordinator, args.num_processes, args.process_id)
    except ValueError as err:
        raise cli.UsageError(str(err)) from None
    cli.allocator_status()  # a bad NMT_ALLOCATOR ends here; the trainer logs the line
    try:
        initialize_distributed(args.coordinator, args.num_processes, args.process_id)
    except ValueError as err:  # no coordinator, another --num-processes on another process
        raise cli.UsageError(str(err)) from None
    except PeerFailed as err:  # another process failed or went silent while comparing counts
        raise cli.Fault(str(err)) from None
    cli.check_jax_platforms()
    _setup_logging()
    _same_settings_on_every_process(run, args)
    _warn_of_r_drop_without_dropout(run)
    return _run(run, args, started)


def _warn_of_r_drop_without_dropout(run: RunConfig) -> None:
    """R-Drop compares two dropout passes: with every dropout 0 they are one pass twice."""
    model = run.model
    if run.optimizer.rdrop and not (model.dropout or model.attention_dropout
                                    or model.activation_dropout):
        logging.getLogger(PROG).warning(
            "--rdrop %g with every dropout 0: the two passes are the same, so the KL term is "
            "always 0 and each step costs twice; give --dropout (0.1, say) or leave --rdrop "
            "out", run.optimizer.rdrop)


def _same_settings_on_every_process(run: RunConfig, args: argparse.Namespace) -> None:
    """UsageError naming the settings in which the processes of one run differ (checked
    here, before they fail far apart in a collective); nothing with one process."""
    import json

    from nmt.runtime.distributed import PeerFailed, gather

    values = {"--preset": run.preset, "--average-only": args.average_only,
              **{field.flag: getattr(getattr(run, field.section), field.name)
                 for field in recipes.FIELDS}}
    try:
        texts = gather("settings", json.dumps(values, sort_keys=True, default=str))
    except PeerFailed as err:
        raise cli.Fault(str(err)) from None
    if len(set(texts)) == 1:
        return
    each = [json.loads(text) for text in texts]
    differ = [flag for flag in each[0] if any(other.get(flag) != each[0][flag] for other in each)]
    described = "; ".join(
        f"{flag} is " + ", ".join(f"{json.dumps(v.get(flag))} on process {k}"
                                  for k, v in enumerate(each)) for flag in differ[:3])
    raise cli.UsageError(f"the processes were given different settings: {described}; give "
                         "every process the same flags and recipe, and start them again.")


def _not_an_exported_model(run_dir: Path) -> None:
    """UsageError for an --output-dir that holds an exported model (this project's,
    transformers' or CTranslate2's: each has a config.json, and no checkpoints/ as a run
    directory has), before a run's files are mixed into it."""
    from nmt.models.model_files import CONFIG_FILE
    from nmt.rundir.checkpoints import CHECKPOINTS_DIR

    if (run_dir / CONFIG_FILE).is_file() and not (run_dir / CHECKPOINTS_DIR).exists():
        raise cli.UsageError(
            f"--output-dir {run_dir} holds an exported model ({CONFIG_FILE}), not a run; give a "
            f"new directory for the run (to fine-tune that model: --init-from {run_dir}).")


def _run(run: RunConfig, args: argparse.Namespace, started: float) -> int:
    # JAX, datasets and the trainer load only now: --help and bad flags answer at once.
    import datasets

    from data.config import DataError
    from data.corpus import check_files
    from data.disk import DiskFull
    from data.encoding import WorkerDied
    from nmt.rundir import resume
    from nmt.rundir.checkpoints import CHECKPOINTS_DIR, CheckpointError, SaveError, complete_steps
    from nmt.rundir.lock import LockingUnsupported, RunDirectoryInUse
    from nmt.runtime.distributed import PeerFailed
    from nmt.training.errors import BudgetTooShort, RunMismatch
    from nmt.training.metrics_log import MetricsWriteError
    from nmt.training.trainer import TrainingError, train
    from nmt.translation.scoring import MetricError, bleu_settings

    datasets.disable_progress_bars()
    run_dir = run.output_dir()
    has_checkpoints = bool(complete_steps(run_dir / CHECKPOINTS_DIR))
    if (args.resume or args.average_only) and not has_checkpoints:
        raise _no_checkpoints("--resume" if args.resume else "--average-only", run_dir)
    try:
        if args.average_only:
            return _average_only(run, run_dir)
        check_files(run.data)  # a missing corpus, before any tokenizer or compilation
        if run.trainer.eval_sentences:  # MeCab for a Japanese or Korean target, say
            bleu_settings(run.data.tgt, run.trainer.bleu_tokenize)
        summary = train(run, run_dir, started)
    except (RunMismatch, BudgetTooShort) as err:  # flags that do not fit the run
        raise cli.UsageError(str(err)) from None
    except (TrainingError, SaveError, MetricsWriteError, RunDirectoryInUse, PeerFailed,
            WorkerDied, DiskFull) as err:
        raise cli.Fault(str(err)) from None
    except (DataError, CheckpointError, MetricError, resume.ResumeError,
            LockingUnsupported) as err:
        raise cli.UsageError(str(err)) from None
    # Saved and resumable, but not finished: `train.py ... && translate.py ...` stops here.
    return cli.EXIT_SIGNALLED.get(summary["stopped"], 0)


def _no_checkpoints(flag: str, run_dir: Path) -> cli.UsageError:
    """The error for --resume or --average-only of a run with nothing saved: a path that is
    no run at all is most likely a mistyped --output-dir."""
    from nmt.rundir.checkpoints import CHECKPOINTS_DIR

    if not run_dir.is_dir():
        return cli.UsageError(f"{flag}: there is no run directory {run_dir}; check "
                              "--output-dir (or the recipe's output_dir).")
    fix = ("drop it to start a new run there" if flag == "--resume" else
           "train there first, or give the --output-dir of a run that has saved checkpoints")
    return cli.UsageError(f"{flag}: {run_dir / CHECKPOINTS_DIR} holds no complete checkpoint; "
                          f"{fix}.")


def _average_only(run: RunConfig, run_dir) -> int:
    """Write averaged/ from the run's checkpoints, process 0 holding the run directory's
    lock (as the trainer's does); the others join it in reading the checkpoints."""
    import contextlib

    import jax

    from data.tokenizer import load_tokenizer
    from nmt.rundir import final_model, resume
    from nmt.rundir.lock import RunLock
    from nmt.runtime.distributed import barrier

    lock = RunLock(run_dir) if jax.process_index() == 0 else contextlib.nullcontext()
    with lock:
        barrier("run directory locked")  # the others wait for process 0's lock, or its error
        saved = resume.saved_run(run_dir)  # the run's model, not today's flags
        config = run_dir / resume.RUN_CONFIG_FILE
        settings = str(config) if saved else f"the flags given ({config} is missing)"
        saved = saved or run
        tokenizer = load_tokenizer(run_dir)
        out, steps = final_model.average(run_dir, saved, saved.model_for(tokenizer), tokenizer,
                                         run.trainer.average_last, settings)
    print(f"Averaged checkpoints {steps} into {out}")
    print(f"Translate: python translate.py --model {shlex.quote(str(out))} \"...\"")
    return 0

