"""What every conversion shares: its error, the model directory it reads, output written as a
whole directory or nothing (`nmt.runtime.files.atomic_directory`), and SIGINT and SIGTERM
as exceptions that stop a conversion before anything is published."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nmt.runtime.files import atomic_directory, staging_path

EXIT_TERMINATED = 128 + signal.SIGTERM


class ConversionError(ValueError):
    """A model or directory that cannot be converted exactly; the message names the option or
    file and what to do."""


class DamagedFile(ConversionError):
    """An input file that is there but cannot be read (truncated, not of its format, or one
    tensor unlike the rest): a fault in the input (exit 1), not in the command (exit 2)."""


class Terminated(SystemExit):
    """SIGTERM, unwinding like an error so that temporary files are removed (exit 143)."""

    def __init__(self) -> None:
        super().__init__(EXIT_TERMINATED)


# ----------------------------------------------------------------------------- interruptions

_received: list[int] = []  # the signals received while `interruptible` was active


def _raise(signum: int) -> None:
    if signum == signal.SIGTERM:
        raise Terminated()
    raise KeyboardInterrupt


def _on_signal(signum: int, frame) -> None:
    _received.append(signum)
    if len(_received) > 1:  # asked again: stop now, wherever that is
        _raise(signum)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGINT and SIGTERM (where not ignored, as they are for a background job) stop a
    conversion at its next `check_interrupted`, between its steps, with KeyboardInterrupt or
    `Terminated`; a second signal raises at once. Raising at the first could land inside a
    library's C++ code, which aborts the process (leaving its temporary files), or inside a
    garbage collection callback (JAX has one), where Python prints the exception and goes on.
    The earlier handlers are restored at the end."""
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, _on_signal)
    _received.clear()
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _received.clear()


def check_interrupted() -> None:
    """Raise the interruption that `interruptible` recorded, if any."""
    if _received:
        _raise(_received[0])


# ----------------------------------------------------------------------------- the model read


def model_directory(path: str | Path) -> Path:
    """`path` checked to be a model directory or a run directory (whose model/ is the model):
    a ConversionError (a usage error) names it otherwise. Whether the files in it are whole is
    `load_model`'s to say."""
    path = Path(path)
    fix = ("pass a model directory (runs/NAME/averaged, runs/NAME/model) or a run directory "
           "(runs/NAME)")
    if not path.exists():
        what = "does not exist"
    elif not path.is_dir():
        what = "is a file"
    elif is_ctranslate2_export(path):
        what = "is a CTranslate2 export (model.bin), not a model directory of this project"
        fix = ("pass the model directory it was exported from (translate.py reads the export "
               "with --engine ctranslate2)")
    elif not ((path / "config.json").is_file() or (path / "model").is_dir()):
        what = "has neither config.json (a model directory) nor model/ (a run directory)"
    elif (model_type := _transformers_model_type(path)) is not None:
        what = (f"is a transformers model (config.json: model_type {model_type}), not a model "
                "directory of this project")
        fix = f"import a MarianMT model first: python -m nmt.convert from-marian {path} OUT"
    else:
        return path
    raise ConversionError(f"MODEL {path} {what}; {fix}.")


def is_ctranslate2_export(path: Path) -> bool:
    """Whether `path` holds a CTranslate2 export (model.bin), which no conversion reads."""
    return (path / "model.bin").is_file() and not (path / "params.msgpack").exists()


def _transformers_model_type(path: Path) -> str | None:
    """config.json's model_type where `path` holds a transformers model, not one of ours."""
    if (path / "params.msgpack").exists() or not (path / "config.json").is_file():
        return None
    try:
        values = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (ValueError, OSError):  # load_model names what is wrong with it
        return None
    model_type = values.get("model_type") if isinstance(values, dict) else None
    return model_type if isinstance(model_type, str) else None


def load_params(model_path):
    """(parameters as nested dicts of arrays, tokenizer, config values) of a model directory,
    checked whole by `load_model`."""
    from flax import nnx

    from nmt.models.model_dir import load_model

    model, tokenizer, values = load_model(model_directory(model_path))
    check_interrupted()
    return nnx.to_pure_dict(nnx.state(model, nnx.Param)), tokenizer, values


# ----------------------------------------------------------------------------- the output


def check_output_dir(path: Path) -> None:
    """Refuse an output path that is a file, a directory with something in it, or a symbolic
    link (the finished directory is renamed onto the path, which would replace the link
    rather than fill the directory it points to)."""
    if path.is_symlink():
        raise ConversionError(
            f"OUT {path} is a symbolic link (to {os.readlink(path)}), which the output would "
            f"replace; give the directory it points to ({path.resolve()}) or a new path.")
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        what = "is a file" if not path.is_dir() else "exists and is not empty"
        raise ConversionError(f"output {path} {what}; choose a new directory (or remove it).")


@contextlib.contextmanager
def staged_directory(path: str | Path) -> Iterator[Path]:
    """`atomic_directory` (`.NAME.partial`, renamed onto `path` on success) for an output that
    must be new or empty, so that a conversion never overwrites anything.

    Nothing is published after an interruption (`check_interrupted`). An OSError that names
    no file (a write that found the disk full) is raised again naming the file it was writing,
    as it would have been called under `path`."""
    path = Path(path)
    check_output_dir(path)
    check_interrupted()
    try:
        with contextlib.ExitStack() as stack:
            try:
                staging = stack.enter_context(atomic_directory(path))
            except OSError as err:  # no directory can be made there (/proc/x): a usage error
                raise ConversionError(
                    f"OUT {path} cannot be created ({err.strerror or err}); choose another "
                    "directory.") from None
            try:
                yield staging
            except OSError as err:  # name it while the staging directory is still there
                raise _naming(err, staging, path, _newest_file(staging)) from None
            check_interrupted()
    except OSError as err:
        raise _naming(err, staging_path(path), path, None) from None


def _newest_file(directory: Path) -> Path | None:
    """The file last written under `directory`: the one a writer was filling when it failed."""
    files = [p for p in directory.rglob("*") if p.is_file() and not p.is_symlink()]
    return max(files, key=lambda p: p.stat().st_mtime_ns, default=None)


def _naming(err: OSError, staging: Path, path: Path, written: Path | None) -> OSError:
    """`err` with its file named as the user will know it: under `path`, not the staging
    directory; `written` (else `path` itself) when the error names no file."""
    if err.errno is None or not isinstance(err.filename, (str, type(None))):
        return err
    name = Path(err.filename if err.filename is not None else written or path)
    if name == staging or staging in name.parents:
        name = path / name.relative_to(staging)
    return err if str(name) == err.filename else OSError(err.errno, err.strerror, str(name))


def write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
