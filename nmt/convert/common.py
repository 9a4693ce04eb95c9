"""What every conversion shares: its error, and output written as a whole directory or nothing
(`nmt.runtime.files.atomic_directory`)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Iterator

from nmt.runtime.files import atomic_directory


class ConversionError(ValueError):
    """A model or directory that cannot be converted exactly; the message names the option or
    file and what to do."""


def check_output_dir(path: Path) -> None:
    """Refuse an output path that is a file or a directory with something in it."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        what = "is a file" if not path.is_dir() else "exists and is not empty"
        raise ConversionError(f"output {path} {what}; choose a new directory (or remove it).")


@contextlib.contextmanager
def staged_directory(path: str | Path) -> Iterator[Path]:
    """`atomic_directory` (`.NAME.partial`, renamed onto `path` on success) for an output that
    must be new or empty, so that a conversion never overwrites anything."""
    path = Path(path)
    check_output_dir(path)
    with atomic_directory(path) as staging:
        yield staging


def write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def load_params(model_path):
    """(parameters as nested dicts of arrays, tokenizer, config values) of a model directory,
    checked whole by `load_model`."""
    from flax import nnx

    from nmt.models.model_dir import load_model

    model, tokenizer, values = load_model(model_path)
    return nnx.to_pure_dict(nnx.state(model, nnx.Param)), tokenizer, values
