"""Train a Transformer translation model: `python train.py [--config RECIPE] [flags]`.

With no flags it trains a small model on the built-in offline en->de corpus for a few minutes
and prints sample translations and the translate.py command. Settings come from train.py's
defaults, then the recipe, then the flags; see `--help`. The command line lives in
`nmt.training.command`, the loop in `nmt.training.trainer`.
"""

from nmt.runtime.allocator import preload

if __name__ == "__main__":
    # Runs this command again with mimalloc loaded (nmt/runtime/allocator.py), before the
    # imports below are paid for twice.
    preload()

from nmt.runtime.cli import exit_quickly  # noqa: E402
from nmt.training.command import build_parser, main, resolve  # noqa: E402

__all__ = ["build_parser", "main", "resolve", "run"]


def run() -> None:
    """`nmt-train`, the installed command: this script, from any directory."""
    preload()
    exit_quickly(main())


if __name__ == "__main__":
    exit_quickly(main())
