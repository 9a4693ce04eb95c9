"""Train a Transformer translation model: `python train.py [--config RECIPE] [flags]`.

With no flags it trains a small model on the built-in offline en->de corpus for a few minutes
and prints sample translations and the translate.py command. Settings come from train.py's
defaults, then the recipe, then the flags; see `--help`. The command line lives in
`nmt.training.command`, the loop in `nmt.training.trainer`.
"""

from nmt.runtime.allocator import preload

__all__ = ["run"]  # and, imported when first asked for, those of __getattr__


def run() -> None:
    """This command, as `python train.py` and as the installed `nmt-train`: it runs again
    with mimalloc loaded (nmt/runtime/allocator.py) before the command's modules are
    imported, so that they are not imported twice."""
    preload()
    from nmt.runtime.cli import exit_quickly, start_without_collecting

    start_without_collecting()  # until the run is ready to step
    from nmt.training.command import main

    exit_quickly(main())


def __getattr__(name: str):
    """`build_parser`, `main` and `resolve` of nmt.training.command, imported when first
    asked for."""
    if name in ("build_parser", "main", "resolve"):
        from nmt.training import command

        return getattr(command, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    run()
