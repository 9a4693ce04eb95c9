"""The engines that search: JAX (`nmt.models.translator`, the default, exact on every device)
and CTranslate2 (`nmt.engines.ctranslate2`: int8 on CPUs, a start without JAX)."""

from __future__ import annotations

from collections.abc import Sequence

ENGINES = ("jax", "ctranslate2")
CTRANSLATE2_INSTALL = "pip install -e '.[ct2]'"
# --compute-type: CTranslate2's types; "auto" is the fastest the device runs.
COMPUTE_TYPES = ("auto", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16",
                 "float32", "float16", "bfloat16")


def searches_beyond_threads(searches: int | None, threads: int | None) -> str | None:
    """CTranslate2's refusal of more batches at once (--searches) than threads in all
    (--threads), each batch taking a thread of its own; None where they fit."""
    if searches is None or not threads or searches <= threads:
        return None
    return (f"--searches {searches} with --threads {threads}: each batch translated at once "
            f"takes a thread of its own; give --searches at most {threads}, or more --threads.")


def engine_in(argv: Sequence[str]) -> str:
    """The engine `--engine` selects in `argv`, read before the parser runs: the commands
    re-execute themselves with mimalloc for JAX (`nmt.runtime.allocator`) and not for
    CTranslate2, which allocates in its own way and starts in a fraction of a second."""
    for i, arg in enumerate(argv):
        if arg == "--engine" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--engine="):
            return arg.partition("=")[2]
    return "jax"
