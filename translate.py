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

__all__ = ["run"]  # and, imported when first asked for, those of __getattr__


def run() -> None:
    """This command, as `python translate.py` and as the installed `nmt-translate`: it runs
    again with mimalloc loaded (nmt/runtime/allocator.py) before the command's modules are
    imported, so that they are not imported twice."""
    if engine_in(sys.argv[1:]) == "jax":
        preload()
    from nmt.runtime.cli import exit_quickly, start_without_collecting

    start_without_collecting()  # until the model is loaded
    from nmt.translation.command import main

    exit_quickly(main())


def __getattr__(name: str):
    """`build_parser` and `main` of nmt.translation.command, imported when first asked for."""
    if name in ("build_parser", "main"):
        from nmt.translation import command

        return getattr(command, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    run()
