"""python -m nmt.convert: models to and from transformers' MarianMT, and to CTranslate2.

    python -m nmt.convert to-marian runs/NAME/averaged exported/marian
    python -m nmt.convert to-ctranslate2 runs/NAME/averaged exported/ct2 --quantization int8
    python -m nmt.convert from-marian opus-mt-en-de models/opus-mt-en-de

from-marian reads a MarianMT directory (an OPUS-MT checkpoint as downloaded from the Hugging
Face hub) and writes a model directory that translate.py loads and train.py --init-from
fine-tunes.

MODEL is a model directory (runs/NAME/model, runs/NAME/averaged) or a run directory (its
model/ is used). OUT must not exist or be empty, and not be a symbolic link; it is written
whole or not at all: after an error, Ctrl-C (exit status 130) or SIGTERM (143) nothing of it
is left.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from nmt.convert.common import Terminated, interruptible
from nmt.runtime import cli

PROG = "python -m nmt.convert"


def build_parser() -> cli.OneLineParser:
    from nmt.convert.ctranslate2 import QUANTIZATIONS

    parser = cli.OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0],
                               epilog=f"Set {cli.DEBUG_VARIABLE}=1 for a traceback on errors.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=cli.OneLineParser)
    marian = commands.add_parser(
        "to-marian", help="a MarianMTModel directory (config.json, model.safetensors, "
                          "MarianTokenizer files) for transformers")
    ct2 = commands.add_parser("to-ctranslate2", help="a CTranslate2 model directory")
    for sub in (marian, ct2):
        sub.add_argument("model", metavar="MODEL", help="model or run directory")
        sub.add_argument("out", metavar="OUT", help="output directory (new or empty)")
    importer = commands.add_parser(
        "from-marian", help="a model directory from a MarianMTModel directory (OPUS-MT)")
    importer.add_argument("model", metavar="MARIAN_DIR", help="MarianMT model directory")
    importer.add_argument("out", metavar="OUT", help="output directory (new or empty)")
    ct2.add_argument("--quantization", default="float32", choices=QUANTIZATIONS,
                     help="weight type of the exported model (default float32)")
    return parser


def check_paths_given(args) -> None:
    """UsageError for an empty MODEL (MARIAN_DIR) or OUT: as a path it would mean the current
    directory, and the error would name "." instead of the argument."""
    source = (("MARIAN_DIR", "a MarianMT model directory") if args.command == "from-marian"
              else ("MODEL", "a model or run directory"))
    for (name, what), value in ((source, args.model),
                                (("OUT", "a new or empty output directory"), args.out)):
        if value == "":
            raise cli.UsageError(f"{name} was given an empty path; give {what}.")


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    from data.config import DataError
    from nmt.convert.common import ConversionError, DamagedFile, check_interrupted
    from nmt.models.model_dir import ModelDirError

    check_paths_given(args)
    cli.writable_directory(Path(args.out), "OUT")
    try:
        if args.command == "to-marian":
            from nmt.convert.marian import export_marian
            out = export_marian(args.model, args.out)
        elif args.command == "from-marian":
            from nmt.convert.marian_import import import_marian
            out = import_marian(args.model, args.out)
        else:
            from nmt.convert.ctranslate2 import export_ctranslate2
            out = export_ctranslate2(args.model, args.out, args.quantization)
    except ImportError as err:
        raise cli.UsageError(f"{err.name or err} is not installed: the conversions need the "
                             "export extra; pip install -e '.[export]'") from None
    except DamagedFile as err:
        raise cli.Fault(str(err)) from None
    except ConversionError as err:
        raise cli.UsageError(str(err)) from None
    except (ModelDirError, DataError) as err:  # a damaged file of MODEL (its tokenizer)
        raise cli.Fault(str(err)) from None
    check_interrupted()
    print(f"Wrote {out}", file=sys.stderr)
    if args.command == "from-marian":
        print(f"Translate: python translate.py --model {out} \"...\"", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command's exit status: 0, 1 for a fault, 2 for a usage error, 130 after SIGINT and
    143 after SIGTERM."""
    warnings = logging.StreamHandler(sys.stderr)  # the importer's notes, one line each
    warnings.setFormatter(logging.Formatter(f"{PROG}: warning: %(message)s"))
    logger = logging.getLogger("nmt.convert")
    logger.addHandler(warnings)
    logger.propagate = False
    try:
        with interruptible():
            return cli.guarded(PROG, lambda: _main(argv))
    except Terminated as stop:
        print(f"{PROG}: terminated", file=sys.stderr, flush=True)
        return stop.code
    finally:
        logger.removeHandler(warnings)
        logger.propagate = True


if __name__ == "__main__":
    sys.exit(main())
