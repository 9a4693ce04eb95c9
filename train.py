"""Train a Transformer translation model: `python train.py [--config RECIPE] [flags]`.

With no flags it trains a small model on the built-in offline en->de corpus for a few minutes
and prints sample translations and the translate.py command. Settings come from train.py's
defaults, then the recipe, then the flags; see `--help`. The command line lives in
`nmt.training.command`, the loop in `nmt.training.trainer`.
"""

import sys

from nmt.runtime.allocator import preload
from nmt.training.command import build_parser, main, resolve

__all__ = ["build_parser", "main", "resolve"]

if __name__ == "__main__":
    preload()  # runs this command again with mimalloc loaded (nmt/runtime/allocator.py)
    sys.exit(main())
