"""Train a Transformer translation model: `python train.py [--config RECIPE] [flags]`.

With no flags it trains the `small` model on the built-in offline en->de corpus for a few
minutes and prints sample translations and the translate.py command. Settings come from
train.py's defaults, then the recipe, then the flags (`nmt.recipes`); see `--help`.
This file only parses arguments; the loop is `nmt.trainer.train`. Every mistake or fault ends
in one line, `train.py: error: ...` (exit 2 for bad flags, values and paths, 1 for faults
while running); NMT_DEBUG=1 shows the traceback of an unexpected error.
"""

from __future__ import annotations

import argparse
import logging
import sys

from nmt import cli, recipes
from nmt.config import RunConfig, SettingsError

PROG = "train.py"


def build_parser() -> argparse.ArgumentParser:
    parser = cli.OneLineParser(
        prog=PROG, description="Train a Transformer (Vaswani et al. 2017) translation model.",
        epilog="A recipe (--config) is a YAML file with one section per settings group below "
               "(configs/ has examples), or a flat JSON object of flag names; flags given on "
               "the command line override it. NMT_KEEP_HOST_MEMORY=1 in the environment keeps "
               "XLA:CPU's per-step buffers mapped between steps (Linux, CPU runs): faster "
               "steps, possibly gigabytes more memory (nmt/host_memory.py).")
    parser.add_argument("--config", metavar="RECIPE",
                        help="recipe file (.yaml, or .json), e.g. configs/multi30k_small.yaml")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --output-dir (an error if it has none); "
                             "rerunning the same command without it resumes too")
    parser.add_argument("--average-only", action="store_true",
                        help="do not train: write averaged/, the mean of the last "
                             "--average-last checkpoints of the run in --output-dir")
    recipes.add_flags(parser, recipes.defaults())
    multi = parser.add_argument_group("several processes (multi-host)")
    multi.add_argument("--coordinator", help="address:port of process 0")
    multi.add_argument("--num-processes", type=int)
    multi.add_argument("--process-id", type=int)
    return parser


def resolve(argv: list[str] | None = None) -> tuple[RunConfig, argparse.Namespace]:
    """The run's settings from train.py's defaults, the recipe and the flags; SettingsError
    names the flag or the recipe's file, line and key at fault."""
    parser = build_parser()
    args = parser.parse_args(argv)
    layers = [recipes.defaults()]
    if args.config:
        layers.append(recipes.read_recipe(args.config))
    layers.append(recipes.from_args(args))
    merged = recipes.merge(*layers)
    spm_model = merged["tokenizer"].get("spm_model", (None,))[0]
    init_from = merged["trainer"].get("init_from", (None,))[0]
    if init_from and spm_model:
        raise SettingsError(f"--init-from {init_from} brings its own tokenizer: drop "
                            f"--spm-model {spm_model}.")
    if spm_model:
        layers.append(_spm_model_vocabulary(spm_model, layers))
    if init_from:
        layers.append(_init_from_architecture(init_from, layers))
    return recipes.build(*layers), args


def _init_from_architecture(path: str, layers: list[recipes.Layer]) -> recipes.Layer:
    """With --init-from, the model's architecture is that model's: a layer setting it.
    SettingsError if the directory is no model, or the recipe or flags ask for another
    architecture."""
    from transformer.config import ARCHITECTURE
    from transformer.model_dir import ModelDirError, read_model_config, resolve_model_dir

    try:
        config, _ = read_model_config(resolve_model_dir(path))
    except ModelDirError as err:
        raise SettingsError(f"--init-from: {err}") from None
    origin = f"--init-from {path}"
    asked = recipes.merge(*layers[1:])  # the defaults do not count
    for name in ARCHITECTURE:
        if name in asked["model"] and asked["model"][name][0] != getattr(config, name):
            value, where = asked["model"][name]
            raise SettingsError(
                f"{where} conflicts with {origin}, whose model has {name} "
                f"{getattr(config, name)!r}: a fine-tuned model keeps the architecture it "
                f"starts from; drop {where}.")
    if "vocab_size" in asked["tokenizer"] and (
            asked["tokenizer"]["vocab_size"][0] != config.vocab_size):
        raise SettingsError(f"--vocab-size {asked['tokenizer']['vocab_size'][0]}, but the model "
                            f"of {origin} has {config.vocab_size} pieces; drop --vocab-size.")
    layer = {section: {} for section in asked}
    layer["model"] = {name: (getattr(config, name), origin) for name in ARCHITECTURE}
    return layer  # the vocabulary is the model's tokenizer's (no tokenizer is trained)


def _spm_model_vocabulary(path: str, layers: list[recipes.Layer]) -> recipes.Layer:
    """With --spm-model, the run's vocabulary is that model's: a layer setting vocab_size to
    its size. SettingsError if the file is no usable SentencePiece model or the recipe or
    flags ask for another size; --tokenizer-type does not apply (a warning says so)."""
    from data.config import DataError
    from data.tokenizer import Tokenizer  # loads SentencePiece: only when a model is given

    try:
        pieces = Tokenizer.load(path).vocab_size
    except DataError as err:
        raise SettingsError(f"--spm-model: {err}") from None
    asked = recipes.merge(*layers[1:])["tokenizer"]  # the defaults' size does not count
    if "vocab_size" in asked and asked["vocab_size"][0] != pieces:
        value, origin = asked["vocab_size"]
        where = "" if origin.startswith("--vocab-size") else f" (the size from {origin})"
        raise SettingsError(
            f"--vocab-size {value} but --spm-model {path} has {pieces} pieces{where}; drop "
            f"--vocab-size (or set it to {pieces}), or train a new tokenizer without "
            "--spm-model.")
    if "model_type" in asked:
        logging.getLogger(PROG).warning(
            "--tokenizer-type does not apply with --spm-model %s: no tokenizer is trained", path)
    layer = recipes.from_flat({"vocab_size": pieces}, f"--spm-model {path}")
    return layer


def _setup_logging() -> None:
    cli.setup_logging(logging.INFO, "%(levelname)s %(name)s: %(message)s",
                      ("absl", "jax", "datasets", "orbax", "tensorboardX"))


def main(argv: list[str] | None = None) -> int:
    return cli.guarded(PROG, lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    try:
        run, args = resolve(argv)
    except SettingsError as err:
        raise cli.UsageError(str(err)) from None
    if args.average_only and not run.trainer.average_last:
        raise cli.UsageError("--average-only needs --average-last N (how many checkpoints).")
    cli.writable_directory(run.output_dir(), "--output-dir")
    # Before anything touches JAX devices; and not before parsing: --help loads no JAX.
    from nmt.distributed import initialize_distributed
    from nmt.host_memory import reuse_freed_host_memory

    try:
        reuse_freed_host_memory()  # only with NMT_KEEP_HOST_MEMORY=1
    except ValueError as err:
        raise cli.UsageError(str(err)) from None
    initialize_distributed(args.coordinator, args.num_processes, args.process_id)
    _setup_logging()
    return _run(run, args)


def _run(run: RunConfig, args: argparse.Namespace) -> int:
    # JAX, datasets and the trainer load only now: --help and bad flags answer at once.
    import datasets

    from data.config import DataError
    from data.corpus import check_files
    from nmt import resume
    from nmt.checkpoints import CHECKPOINTS_DIR, CheckpointError, SaveError, complete_steps
    from nmt.metrics_log import MetricsWriteError
    from nmt.run_lock import RunDirectoryInUse
    from nmt.scoring import MetricError, bleu_settings
    from nmt.trainer import TrainingError, train

    datasets.disable_progress_bars()
    run_dir = run.output_dir()
    has_checkpoints = bool(complete_steps(run_dir / CHECKPOINTS_DIR))
    if (args.resume or args.average_only) and not has_checkpoints:
        flag = "--resume" if args.resume else "--average-only"
        raise cli.UsageError(f"{flag}: {run_dir / CHECKPOINTS_DIR} holds no complete checkpoint"
                             "; drop it to start a new run there.")
    try:
        if args.average_only:
            return _average_only(run, run_dir)
        check_files(run.data)  # a missing corpus, before any tokenizer or compilation
        if run.trainer.eval_sentences:  # MeCab for a Japanese or Korean target, say
            bleu_settings(run.data.tgt, run.trainer.bleu_tokenize)
        train(run, run_dir)
    except (TrainingError, SaveError, MetricsWriteError, RunDirectoryInUse) as err:
        raise cli.Fault(str(err)) from None
    except (DataError, CheckpointError, MetricError, resume.ResumeError) as err:
        raise cli.UsageError(str(err)) from None
    return 0


def _average_only(run: RunConfig, run_dir) -> int:
    """Write averaged/ from the run's checkpoints, holding the run directory's lock."""
    from data.tokenizer import load_tokenizer
    from nmt import final_model, resume
    from nmt.run_lock import RunLock

    with RunLock(run_dir):
        saved = resume.saved_run(run_dir) or run  # the run's model, not today's flags
        tokenizer = load_tokenizer(run_dir)
        out, steps = final_model.average(run_dir, saved, saved.model_for(tokenizer), tokenizer,
                                         run.trainer.average_last)
    print(f"Averaged checkpoints {steps} into {out}")
    print(f"Translate: python translate.py --model {out} \"...\"")
    return 0


if __name__ == "__main__":
    sys.exit(main())
