"""Translate with a trained model: `python translate.py --model runs/NAME [SENTENCE ...]`.

    python translate.py --model runs/NAME "Ein Mann fährt Fahrrad."   # the arguments
    cat test.de | python translate.py --model runs/NAME > test.hyp      # stdin
    python translate.py --model runs/NAME --input test.de --output test.hyp
    python translate.py --model runs/NAME --evaluate --src-file test.en --ref-file test.de

See `--help` and docs/translating.md; the command line lives in `nmt.translation.command`.
"""

import sys

from nmt.engines import engine_in
from nmt.runtime.allocator import preload

if __name__ == "__main__" and engine_in(sys.argv[1:]) == "jax":
    # Runs this command again with mimalloc loaded (nmt/runtime/allocator.py), before the
    # imports below are paid for twice.
    preload()

from nmt.runtime.cli import exit_quickly  # noqa: E402
from nmt.translation.command import build_parser, main  # noqa: E402

__all__ = ["build_parser", "main", "run"]


def run() -> None:
    """`nmt-translate`, the installed command: this script, from any directory."""
    if engine_in(sys.argv[1:]) == "jax":
        preload()
    exit_quickly(main())


if __name__ == "__main__":
    exit_quickly(main())
