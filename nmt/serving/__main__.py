"""`python -m nmt.serving`: the translation server's command line (nmt.serving.command)."""

import sys

from nmt.runtime.allocator import preload
from nmt.serving.command import main

if __name__ == "__main__":
    preload()  # runs this command again with mimalloc loaded (nmt/runtime/allocator.py)
    sys.exit(main())
