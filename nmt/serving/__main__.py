"""`python -m nmt.serving`: the translation server's command line (nmt.serving.command)."""

import sys

from nmt.engines import engine_in
from nmt.runtime.allocator import preload

# What the serve extra installs (pyproject.toml), by the module name an import fails on.
SERVE_EXTRA = {"uvicorn", "starlette", "multipart", "python_multipart", "prometheus_client",
               "py3langid", "docx"}


def run() -> None:
    """The server's command, as `python -m nmt.serving` and as the installed `nmt-serve`: it
    runs again with mimalloc loaded (nmt/runtime/allocator.py) before the server's modules
    are imported, so that they are not imported twice."""
    if engine_in(sys.argv[1:]) == "jax":
        preload()
    from nmt.runtime.cli import start_without_collecting

    start_without_collecting()  # until the models are loaded
    try:
        from nmt.serving.command import main
    except ModuleNotFoundError as err:
        if err.name is None or err.name.split(".")[0] not in SERVE_EXTRA:
            raise
        print(f"python -m nmt.serving: error: the server needs the serve extra ({err.name} is "
              "not installed): pip install -e '.[serve]'", file=sys.stderr)
        sys.exit(1)
    sys.exit(main())


if __name__ == "__main__":
    run()
