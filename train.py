"""Train a Transformer translation model: `python train.py [flags]`.

With no flags it trains the `small` model on the built-in offline en->de corpus for a few
minutes and prints sample translations and the translate.py command. See `--help`.
This file only parses arguments; the loop is `transformer.trainer.train`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

# Flags and the RunConfig field each sets: (flag, type, help). Booleans are handled apart.
_GROUPS = {
    "model": [
        ("--preset", str, "model size: tiny, small, base or big"),
        ("--d-model", int, "override the preset's model width"),
        ("--num-heads", int, "attention heads"),
        ("--d-ff", int, "feed-forward width"),
        ("--encoder-layers", int, "encoder layers"),
        ("--decoder-layers", int, "decoder layers"),
        ("--dropout", float, "residual/embedding dropout (P_drop)"),
        ("--attention-dropout", float, "dropout on attention weights"),
        ("--activation-dropout", float, "dropout inside the feed-forward layer"),
        ("--norm", str, "post (paper) or pre layer normalisation"),
        ("--positional", str, "sinusoidal (paper) or learned positions"),
        ("--dtype", str, "compute dtype: float32 or bfloat16 (parameters stay float32)"),
        ("--max-len", int, "longest sequence the model supports"),
    ],
    "data": [
        ("--src", str, "source language code"),
        ("--tgt", str, "target language code"),
        ("--train-prefix", str, "training files PREFIX.SRC and PREFIX.TGT"),
        ("--valid-prefix", str, "validation files PREFIX.SRC and PREFIX.TGT"),
        ("--test-prefix", str, "test files PREFIX.SRC and PREFIX.TGT"),
        ("--train-file", str, "training pairs as .tsv, .jsonl or .parquet"),
        ("--valid-file", str, "validation pairs as .tsv, .jsonl or .parquet"),
        ("--test-file", str, "test pairs as .tsv, .jsonl or .parquet"),
        ("--dataset", str, "Hugging Face dataset name or save_to_disk directory"),
        ("--dataset-config", str, "its configuration, e.g. de-en"),
        ("--max-train-pairs", int, "use only N training pairs: the first N, or a seeded random "
         "N when validation is held out of the training data"),
        ("--vocab-size", int, "SentencePiece vocabulary size"),
        ("--tokenizer-type", str, "unigram (default) or bpe"),
        ("--spm-model", str, "use this SentencePiece model (e.g. another run's spm.model) "
                             "instead of training one: its size is the vocabulary size, and "
                             "its ids 0-3 must be pad, unk, bos, eos"),
        ("--batch-tokens", int, "tokens per micro-batch, padding included (an update holds "
                                "K times that under --accum K)"),
        ("--max-tokens-per-sentence", int, "drop training pairs longer than this"),
        ("--buckets", str, "padded batch lengths, comma-separated"),
    ],
    "optimisation": [
        ("--schedule", str, "noam (paper) or inverse_sqrt"),
        ("--warmup", int, "warm-up steps"),
        ("--lr-scale", float, "noam: multiplier of d_model^-0.5 * min(...)"),
        ("--peak-lr", float, "inverse_sqrt: learning rate after warm-up"),
        ("--adam-b1", float, "Adam beta1"),
        ("--adam-b2", float, "Adam beta2"),
        ("--adam-eps", float, "Adam epsilon"),
        ("--label-smoothing", float, "label smoothing"),
        ("--clip-norm", float, "clip the global gradient norm (default: no clipping)"),
        ("--accum", int, "accumulate K batches per update"),
        ("--weight-decay", float, "decoupled weight decay on matrices"),
        ("--seed", int, "random seed"),
    ],
    "length of training": [
        ("--max-steps", int, "stop after this many updates"),
        ("--max-minutes", float, "stop after this much wall-clock time"),
        ("--max-epochs", int, "stop after this many passes over the training pairs"),
        ("--early-stop-patience", int, "stop after N validations without a better "
         "--best-metric score"),
    ],
    "validation": [
        ("--eval-every", int, "validate every N steps"),
        ("--eval-sentences", int, "translate at most N validation sentences for BLEU and "
                                  "chrF (0 = loss and perplexity only)"),
        ("--beam", int, "beam size for validation translations"),
        ("--alpha", float, "length penalty alpha"),
        ("--samples", int, "sample translations printed per validation"),
        ("--best-metric", str, "bleu, chrf or ppl: the validation score that picks "
         "the best checkpoint (best/, model/) and that --early-stop-patience watches; bleu "
         "and chrf need --eval-sentences >= 1 (default: bleu, or the resumed run's)"),
        ("--bleu-tokenize", str, "sacreBLEU's BLEU tokenizer (13a, intl, zh, ja-mecab, "
         "ko-mecab, char, none, ...); default: zh, ja-mecab or ko-mecab for a Chinese, "
         "Japanese or Korean target, else 13a"),
    ],
    "checkpoints and logging": [
        ("--save-every", int, "checkpoint every N steps (default: --eval-every)"),
        ("--keep-last", int, "keep the last K checkpoints"),
        ("--average-last", int, "write averaged/: the mean of the last N checkpoints. With an "
                                "output directory that already holds checkpoints and no "
                                "--resume, only average (no training)"),
        ("--log-every", int, "log metrics every N steps"),
    ],
}
_BOOLEANS = [
    ("--share-embeddings", "model", "share source/target/output embeddings (preset default)"),
    ("--async-checkpoints", "checkpoints and logging", "save checkpoints in the background"),
    ("--progress", "checkpoints and logging", "show a progress bar on a terminal"),
]


def _field(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Train a Transformer (Vaswani et al. 2017) translation model.",
        epilog="Recipe files (--config) hold flag names as JSON keys; flags given on the "
               "command line override them. NMT_KEEP_HOST_MEMORY=1 in the environment keeps "
               "XLA:CPU's per-step buffers mapped between steps (Linux, CPU runs): faster "
               "steps, possibly gigabytes more memory (transformer/host_memory.py).")
    parser.add_argument("--config", help="JSON recipe, e.g. configs/multi30k_small.json")
    parser.add_argument("--output-dir", help="run directory (default "
                        "runs/<corpus>-<src>-<tgt>-<preset>); resumes if it holds checkpoints")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --output-dir (an error if it has none)")
    from transformer.run_config import DEFAULT_MAX_MINUTES, RunConfig  # imports JAX, no devices

    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    defaults["max_minutes"] = (f"{DEFAULT_MAX_MINUTES:g} when neither --max-steps nor "
                               "--max-epochs is given")
    defaults["buckets"] = ",".join(map(str, defaults["buckets"]))
    groups = {}
    for title, flags in _GROUPS.items():
        group = groups[title] = parser.add_argument_group(title)
        for flag, kind, text in flags:
            default = defaults.get(_field(flag))
            if default is not None:
                text = f"{text} (default {default})"
            group.add_argument(flag, type=kind, default=None, help=text)
    for flag, title, text in _BOOLEANS:
        groups[title].add_argument(flag, action=argparse.BooleanOptionalAction, default=None,
                                   help=text)
    multi = parser.add_argument_group("several processes (multi-host)")
    multi.add_argument("--coordinator", help="address:port of process 0")
    multi.add_argument("--num-processes", type=int)
    multi.add_argument("--process-id", type=int)
    return parser


def _flag_types() -> dict[str, type]:
    """The type of each setting a recipe may hold, keyed by RunConfig field."""
    types = {_field(flag): kind for flags in _GROUPS.values() for flag, kind, _ in flags}
    types.update({_field(flag): bool for flag, _, _ in _BOOLEANS})
    types["output_dir"] = str
    return types


def _flag_names() -> set[str]:
    return set(_flag_types())


_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _recipe_value(path: str, key: str, name: str, value, kind: type):
    """`value` checked against the flag's type (JSON numbers for numeric flags, no strings)."""
    if name == "buckets":
        return value  # a string or a JSON list of lengths; _parse_buckets checks it
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    # bool is a subclass of int in Python, but true is not a batch size.
    if isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
        return value
    hint = "; remove the key to use the default" if value is None else ""
    if isinstance(value, str) and kind in (int, float):
        try:
            kind(value)
            hint = f"; write {value} without quotes"
        except ValueError:
            pass
    raise SystemExit(f"error: --config {path}: {key!r} must be {_TYPE_NAMES[kind]} (as --"
                     f"{name.replace('_', '-')} takes), got {json.dumps(value)}{hint}")


def read_recipe(path: str) -> dict:
    """Settings from a JSON recipe; keys are flag names ("batch-tokens" or "batch_tokens")."""
    file = Path(path)
    if not file.is_file():
        raise SystemExit(f"error: --config {path}: no such file")
    try:
        # utf-8-sig: a byte order mark that an editor put first is not JSON.
        values = json.loads(file.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as err:
        raise SystemExit(f"error: --config {path}: not valid JSON ({err})") from None
    if not isinstance(values, dict):
        raise SystemExit(f"error: --config {path}: expected a JSON object of flag: value")
    settings, types = {}, _flag_types()
    for key, value in values.items():
        if key.startswith("#") or key.startswith("_"):
            continue  # comments
        name = _field(key)
        if name not in types:
            raise SystemExit(f"error: --config {path}: unknown setting {key!r}; keys are "
                             f"train.py flag names, e.g. \"batch-tokens\"")
        settings[name] = _recipe_value(path, key, name, value, types[name])
    return settings


def resolve(argv: list[str] | None = None) -> tuple[dict, argparse.Namespace]:
    """Run settings (RunConfig fields + output_dir) from recipe file and flags."""
    args = build_parser().parse_args(argv)
    settings = read_recipe(args.config) if args.config else {}
    for name in _flag_names():
        value = getattr(args, name, None)
        if value is not None:
            settings[name] = value
    if "buckets" in settings:
        recipe = None if args.buckets is not None else args.config
        settings["buckets"] = _parse_buckets(settings["buckets"], recipe)
    return settings, args


def _parse_buckets(value, recipe: str | None = None) -> tuple[int, ...] | None:
    """Bucket lengths from "16,32,64" or a recipe's [16, 32, 64]; None for "default".

    `recipe` names the --config file the value came from, for the error message.
    """
    where = f" (\"buckets\" in --config {recipe})" if recipe else ""
    if value == "default":
        return None
    buckets = ()
    if isinstance(value, str):
        try:
            buckets = tuple(int(v) for v in value.split(",") if v.strip())
        except ValueError:
            pass
    elif isinstance(value, list) and all(type(v) is int for v in value):
        buckets = tuple(value)
    if not buckets:
        shown = json.dumps(value, ensure_ascii=False)
        raise SystemExit(f"error: --buckets {shown}{where}: expected comma-separated integers "
                         "such as 16,32,64, or 'default'")
    from data.batching import check_buckets
    from data.corpus import DataError

    try:
        check_buckets(buckets)
    except DataError as err:
        raise SystemExit(f"error: {err}{where}") from None
    return buckets


def _adopt_spm_model(settings: dict) -> str | None:
    """With --spm-model, the run's vocabulary is that model's: set vocab_size to its size.

    Returns an error message if the file is no usable SentencePiece model or --vocab-size
    (from the flags or the recipe) asks for another size; --tokenizer-type is dropped with a
    warning, since no tokenizer is trained.
    """
    import logging

    from data.corpus import DataError
    from data.tokenizer import Tokenizer

    path = settings["spm_model"]
    try:
        pieces = Tokenizer.load(path).vocab_size
    except DataError as err:
        return f"--spm-model: {err}"
    wanted = settings.get("vocab_size", pieces)
    if wanted != pieces:
        return (f"--vocab-size {wanted} but --spm-model {path} has {pieces} pieces; drop "
                f"--vocab-size (or set it to {pieces}), or train a new tokenizer without "
                "--spm-model.")
    settings["vocab_size"] = pieces
    if settings.pop("tokenizer_type", None) is not None:
        logging.getLogger("train.py").warning(
            "--tokenizer-type does not apply with --spm-model %s: no tokenizer is trained", path)
    return None


def main(argv: list[str] | None = None) -> int:
    settings, args = resolve(argv)

    # Before anything touches JAX devices.
    from transformer.host_memory import reuse_freed_host_memory
    from transformer.distributed import initialize_distributed

    try:
        reuse_freed_host_memory()  # only with NMT_KEEP_HOST_MEMORY=1
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    initialize_distributed(args.coordinator, args.num_processes, args.process_id)

    import logging

    from transformer import checkpoint as ckpt
    from transformer.run_config import RunConfig
    from transformer.trainer import TrainingError, average, train

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s",
                        force=True)
    import datasets

    datasets.disable_progress_bars()
    for noisy in ("absl", "jax", "datasets", "orbax", "tensorboardX"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    output_dir = settings.pop("output_dir", None)
    if settings.get("spm_model"):
        conflict = _adopt_spm_model(settings)
        if conflict:
            print(f"error: {conflict}", file=sys.stderr)
            return 2
    try:
        run = RunConfig(**settings)
    except (TypeError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    run_dir = Path(output_dir) if output_dir else run.default_output_dir()
    has_checkpoints = bool(ckpt.complete_steps(run_dir / ckpt.CHECKPOINTS_DIR))
    if args.resume and not has_checkpoints:
        print(f"error: --resume: {run_dir / ckpt.CHECKPOINTS_DIR} holds no complete "
              "checkpoint; drop --resume to start a new run there.", file=sys.stderr)
        return 2
    if run.average_last and has_checkpoints and not args.resume:
        out = average(run_dir, run.average_last)
        print(f"Translate: python translate.py --model {out} \"...\"")
        return 0
    try:
        run.bleu_settings()  # MeCab for a Japanese or Korean target, say: before training
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from data.corpus import DataError

    try:
        train(run, run_dir)
    except TrainingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except (DataError, ckpt.CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
