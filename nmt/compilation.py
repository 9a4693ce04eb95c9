"""JAX's persistent compilation cache: a rerun or a resume skips most compilation."""

from __future__ import annotations

from pathlib import Path

import jax

from data.config import default_cache_dir


def enable_compilation_cache(directory: str | Path | None = None,
                             min_compile_seconds: float = 1.0) -> None:
    """Keep compiled programs that took at least `min_compile_seconds` in `directory`
    (default: the project's cache directory, `$FLAX_NMT_CACHE/jax`)."""
    directory = default_cache_dir() / "jax" if directory is None else directory
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_seconds)
    if min_compile_seconds == 0:
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
