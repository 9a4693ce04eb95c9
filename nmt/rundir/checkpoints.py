"""Training checkpoints and checkpoint averaging (orbax-checkpoint).

A run directory holds two kinds of saved state:

- `checkpoints/<step>/`: everything needed to continue training exactly, written with
  orbax-checkpoint's `CheckpointManager` from every process, asynchronously and atomically
  (orbax writes `<step>.orbax-checkpoint-tmp-*` and renames it when complete). Items:
    params  the model parameters (nnx.State of nnx.Param), StandardSave;
    train   {"step", "opt_state", "rng"}, StandardSave;
    data    JSON: the data iterator's state, the trainer's bookkeeping (the best
            --best-metric score and its step, patience, metrics of the unfinished log window).
  The last `keep_last` steps of the --save-every schedule are kept, and the newest. A step
  saved off the schedule (for a best score, or because the run stopped there: a signal, a
  time limit; an "interim" step, marked by an INTERIM file) never counts among them, and is
  deleted once a later step is saved: a run interrupted and resumed keeps, and averages, the
  steps an uninterrupted one keeps. Parameters are a separate item so that averaging and export
  read them without knowing the optimizer's state structure.
- `best/<step>/`: parameters of the checkpoint with the best validation score so far (BLEU by
  default; `--best-metric`), kept by a second manager with `max_to_keep=1`. The trainer saves
  here only when the score improves, after writing `checkpoints/<step>/` at the same step
  (whose bookkeeping names the best step, and whose parameters stand in for a damaged or
  missing best/<step>), so the newest save is the best one, and a failure to write the
  checkpoint leaves the previous best in place.

The exported model (`model/`, or `averaged/` from `--average-last`) is what translate.py
loads: see `nmt.models.model_dir`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from nmt.models.model_dir import abstract_params
from nmt.runtime.distributed import PeerFailed, barrier
from nmt.runtime.files import partial_path, write_atomically
from transformer.config import ModelConfig

log = logging.getLogger("checkpoint")

CHECKPOINTS_DIR = "checkpoints"
BEST_DIR = "best"
AVERAGED_DIR = "averaged"
# Files orbax writes into a step directory when (and only when) the step is finalized.
_FINALIZED_MARKER = "_CHECKPOINT_METADATA"
_ITEMS = ("params", "train", "data")
# Written into a step directory once orbax has finalized it: `sha256sum -c SHA256SUMS` format.
CHECKSUMS_FILE = "SHA256SUMS"
ASIDE_SUFFIX = ".replaced"  # a step set aside while it is saved again (`_set_aside`)
SKIPPED_SUFFIX = ".skipped"  # a step a restore skipped, damaged or unreadable (`_move_skipped`)
INTERIM_FILE = "INTERIM"  # in a step saved only because the run stopped there
# Beside the steps: an interim step's mark until it is sealed (a process killed before then
# must not leave it counted as scheduled).
INTERIM_PENDING = "interim-{step}"


class CheckpointError(RuntimeError):
    """A checkpoint or model directory is missing or incomplete; the message says which."""


class SaveError(RuntimeError):
    """A checkpoint could not be written (disk full, say); the earlier ones are intact."""


class Restored(NamedTuple):
    step: int
    params: Any  # nnx.State
    train: dict[str, Any]  # {"step", "opt_state", "rng"}
    data: dict[str, Any]


# ----------------------------------------------------------------------------- checkpoints


def is_complete_step_dir(path: Path) -> bool:
    """True when `path` is a finalized checkpoint step directory with every item present.

    orbax renames a step directory into place only after writing it, so a crash leaves a
    `*.orbax-checkpoint-tmp-*` directory, never a half-written `<step>/`. A step directory can
    still be incomplete when it was copied or synced partially; requiring orbax's finalization
    metadata, and a non-empty directory for "params" and for every item that metadata lists
    (params, train, data in checkpoints/; params, data in best/), catches that too.
    """
    if not path.is_dir() or not path.name.isdigit():
        return False
    try:
        metadata = json.loads((path / _FINALIZED_MARKER).read_text())
        items = set(metadata.get("item_handlers") or {}) | {"params"}
    except (OSError, ValueError, AttributeError):  # missing, unreadable or not a JSON object
        return False
    return all((path / item).is_dir() and any((path / item).iterdir()) for item in items)


def complete_steps(directory: str | Path) -> list[int]:
    """Steps of the finalized checkpoints under `directory`, ascending."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    steps = []
    for child in directory.iterdir():
        if child.name.isdigit():
            if is_complete_step_dir(child):
                steps.append(int(child.name))
            elif child not in _warned_incomplete:  # once: this is called many times a run
                _warned_incomplete.add(child)
                log.warning("ignoring incomplete checkpoint %s", child)
    return sorted(steps)


_warned_incomplete: set[Path] = set()


def write_checksums(step_dir: Path) -> None:
    """Record the SHA-256 of every file of a finalized step directory (atomically)."""
    lines = [f"{_sha256(path)}  {path.relative_to(step_dir).as_posix()}\n"
             for path in _files(step_dir)]
    write_atomically(step_dir / CHECKSUMS_FILE, "".join(lines))


def damaged_file(step_dir: Path) -> str | None:
    """None when every file a step directory's checksums list is intact (or it has none, as
    a step written by an earlier version); else what is wrong, naming the file."""
    sums = step_dir / CHECKSUMS_FILE
    if not sums.is_file():
        return None
    for number, line in enumerate(sums.read_text(errors="replace").splitlines(), start=1):
        digest, _, name = line.partition("  ")
        if not name:
            return f"{sums} line {number} is damaged"
        path = step_dir / name
        if not path.is_file():
            return f"{path} is missing"
        if _sha256(path) != digest:
            return f"{path} does not match its checksum in {sums}"
    return None


def _files(directory: Path) -> list[Path]:
    unlisted = (CHECKSUMS_FILE, partial_path(CHECKSUMS_FILE).name)
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name not in unlisted)


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _size_mb(directory: Path) -> float:
    return sum(p.stat().st_size for p in _files(directory)) / 2**20


def _is_out_of_space(err: BaseException) -> bool:
    while err is not None:
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(err)
        if "No space left" in text or "RESOURCE_EXHAUSTED" in text or "quota" in text.lower():
            return True
        err = err.__cause__ or err.__context__
    return False


def _clear_step(manager: ocp.CheckpointManager, directory: Path, step: int) -> None:
    """Remove `step` (every process calls it): one no longer kept, or a stale best/ step.

    A stale best step is left by a run that died after writing `best/<step>` but before
    `checkpoints/<step>`, or whose `checkpoints/<step>` was unreadable and skipped.
    """
    manager.wait_until_finished()
    if step in manager.all_steps():
        manager.delete(step)
    path = directory / str(step)
    if path.exists() and jax.process_index() == 0:
        shutil.rmtree(path)
    barrier(f"clear {directory} {step}")


def _set_aside(manager: ocp.CheckpointManager, directory: Path, step: int) -> None:
    """Move an existing `step` out of the managers' sight before it is saved again: renamed
    `<step>.replaced` (`complete_steps` reads only numbers), removed once the new one is
    sealed, put back if it fails (`_put_back`). A run saves its last step again at stop, when
    the closing log line or validation has changed the bookkeeping; a failure of that save
    must not lose the step."""
    manager.wait_until_finished()
    path, aside = directory / str(step), _aside(directory, step)
    if jax.process_index() == 0 and path.exists():
        if aside.exists():
            shutil.rmtree(aside)
        if is_complete_step_dir(path):
            path.rename(aside)
        else:
            shutil.rmtree(path)
    barrier(f"set aside {directory} {step}")
    manager.reload()


def _aside(directory: Path, step: int) -> Path:
    return directory / f"{step}{ASIDE_SUFFIX}"


def _put_back(directory: Path) -> None:
    """Settle the steps set aside (process 0): one whose new save is complete is removed,
    any other takes its place again (after a failed save, or a process killed in it)."""
    if jax.process_index() != 0 or not directory.is_dir():
        return
    for aside in directory.glob(f"*{ASIDE_SUFFIX}"):
        step_dir = directory / aside.name.removesuffix(ASIDE_SUFFIX)
        if is_complete_step_dir(step_dir):
            shutil.rmtree(aside)
        else:
            shutil.rmtree(step_dir, ignore_errors=True)
            aside.rename(step_dir)


def _remove_partial_saves(directory: Path) -> None:
    """Remove the unfinished `<step>.orbax-checkpoint-tmp*` directories of a failed save."""
    for partial in directory.glob("*.orbax-checkpoint-tmp*"):
        shutil.rmtree(partial, ignore_errors=True)


_SHAPE_MISMATCH = re.compile(r"Requested shape: (\([^)]*\)) is not compatible with the stored "
                             r"shape: (\([^)]*\))")


def _brief(err: Exception, limit: int = 300) -> str:
    """The start of an error message: orbax's can list every path of a tree. A shape that
    differs is said in a phrase of ours: orbax's ends in advice on its own API."""
    text = str(err).strip().rstrip(".") or type(err).__name__
    if found := _SHAPE_MISMATCH.search(text):
        return _shapes_differ(found.group(1), found.group(2))
    return text if len(text) <= limit else text[:limit] + " ..."


def _shapes_differ(now: Any, stored: Any) -> str:
    return f"an array of the model is {now} now and {stored} in the checkpoint"


def _is_shape_mismatch(err: Exception) -> bool:
    return _SHAPE_MISMATCH.search(str(err)) is not None


def _abstract(tree: Any) -> Any:
    """ShapeDtypeStructs (with shardings) describing `tree`, the target for a restore."""
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def kept_steps(steps: list[int], keep_last: int, is_interim: Callable[[int], bool]
               ) -> set[int]:
    """The checkpoints --keep-last keeps of `steps`: the last `keep_last` of those the
    --save-every schedule saved, and the newest step, which a resumed run starts from. An
    interim step (saved for a best score, whose parameters best/ keeps, or because the run
    stopped there) counts in neither: an uninterrupted run keeps, and averages, the same steps
    whatever its best scores, as fairseq's --keep-interval-updates and Marian do."""
    steps = sorted(steps)
    scheduled = [step for step in steps if not is_interim(step)]
    return set(scheduled[-keep_last:]) | set(steps[-1:])


@dataclasses.dataclass(frozen=True)
class _KeepLast:
    """`kept_steps` as orbax's preservation policy, applied as soon as a save is final; an
    interim step goes only at the next seal (`Checkpointer._keep_last`), once the step after
    it has its checksums."""

    keep_last: int
    is_interim: Callable[[int], bool]

    def should_preserve(self, checkpoints: Sequence[Any], *, context: Any) -> list[bool]:
        kept = kept_steps([info.step for info in checkpoints], self.keep_last, self.is_interim)
        return [info.step in kept or self.is_interim(info.step) for info in checkpoints]


class Checkpointer:
    """The run's two orbax managers: the last `keep_last` steps and the best by BLEU (one).

    Every process must call `save`, `save_best`, `restore`, `wait` and `close` (orbax
    coordinates the processes and writes each array shard from the process holding it).
    """

    def __init__(self, run_dir: str | Path, keep_last: int = 5, async_save: bool = True):
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}.")
        self.run_dir, self.keep_last = Path(run_dir).absolute(), keep_last
        self.directory = self.run_dir / CHECKPOINTS_DIR
        self.best_directory = self.run_dir / BEST_DIR
        for directory in (self.directory, self.best_directory):
            _put_back(directory)  # a process killed while saving a step again
        barrier(f"put back {self.run_dir}")
        self._interim: set[int] = set()  # steps saved as interim, marked when sealed
        # Orbax deletes the scheduled steps no longer kept as soon as a save is finalized, by
        # the rule of `_keep_last`; the interim steps that rule passes over go at the next seal.
        self._last = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                preservation_policy=_KeepLast(keep_last, self._is_interim),
                enable_async_checkpointing=async_save, cleanup_tmp_directories=True,
                create=True),
            item_names=_ITEMS)
        self._best = ocp.CheckpointManager(
            self.best_directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=1, enable_async_checkpointing=async_save,
                cleanup_tmp_directories=True, create=True),
            item_names=("params", "data"))
        self._pending: tuple[Path, int] | None = None  # the save in flight
        self._failed = False  # a save failed: its partial files go again at close

    # ------------------------------------------------------------------ saving

    def save(self, step: int, params: Any, train: dict[str, Any], data: dict[str, Any],
             interim: bool = False) -> None:
        """Start saving step `step` in the background; returns once arrays are copied.
        `interim`: saved off the --save-every schedule (for a best score, or because the run
        stopped there); it never counts in the last `keep_last`, and goes once a later step
        is saved."""
        with self._writing(self.directory, step):
            self._seal()
            (self._interim.add if interim else self._interim.discard)(step)
            if jax.process_index() == 0:
                pending = self.directory / INTERIM_PENDING.format(step=step)
                pending.touch() if interim else pending.unlink(missing_ok=True)
            _set_aside(self._last, self.directory, step)
            self._pending = (self.directory, step)
            self._last.save(step, args=ocp.args.Composite(
                params=ocp.args.StandardSave(params),
                train=ocp.args.StandardSave(train),
                data=ocp.args.JsonSave(data)), force=True)

    def save_best(self, step: int, params: Any, metrics: dict[str, float]) -> None:
        """Save `params` as the best checkpoint, replacing the previous one (the caller saves
        only improvements); `metrics` ({METRIC: score, "step"}) are stored with them."""
        with self._writing(self.best_directory, step):
            self._seal()
            _set_aside(self._best, self.best_directory, step)
            self._pending = (self.best_directory, step)
            self._best.save(step, args=ocp.args.Composite(
                params=ocp.args.StandardSave(params),
                data=ocp.args.JsonSave({k: float(v) for k, v in metrics.items()})), force=True)

    @contextlib.contextmanager
    def _writing(self, directory: Path, step: int):
        """SaveError, naming what survived, when a save (or one still in flight) fails."""
        try:
            yield
        except PeerFailed:  # the save did not fail: another process did
            raise
        except Exception as err:  # noqa: BLE001 - orbax and tensorstore raise many kinds
            failed_dir, failed_step = self._pending or (directory, step)
            self._pending = None
            raise SaveError(self._failure(failed_dir, failed_step, err)) from err

    def _failure(self, directory: Path, step: int, err: Exception) -> str:
        self._failed = True
        _remove_partial_saves(directory)  # free the space it took
        _put_back(directory)
        steps = self.steps()
        if steps:
            last = self.directory / str(steps[-1])
            kept = (f"checkpoint step {steps[-1]} ({_size_mb(last):.0f} MB) is intact, and "
                    f"best/ and model/ are as they were")
        else:
            kept = "no earlier checkpoint exists"
        free = shutil.disk_usage(self.run_dir).free / 2**20
        if _is_out_of_space(err):
            cause = f"no space left on the device ({free:.0f} MB free)"
            todo = "free some space, then run the same command again to resume"
        else:
            cause = _brief(err)
            todo = "fix the cause, then run the same command again to resume"
        return f"cannot write checkpoint step {step} in {directory}: {cause}; {kept}; {todo}."

    def _seal(self) -> None:
        """Write the checksums (and interim marks) of every finalized step that has none yet
        (process 0), once no save is in flight; then keep the last `keep_last`."""
        self._last.wait_until_finished()
        self._best.wait_until_finished()
        if jax.process_index() == 0:
            for directory in (self.directory, self.best_directory):
                for step in complete_steps(directory):
                    step_dir = directory / str(step)
                    if not (step_dir / CHECKSUMS_FILE).exists():
                        if directory == self.directory and self._is_interim(step):
                            (step_dir / INTERIM_FILE).touch()
                        write_checksums(step_dir)
                _put_back(directory)  # the steps saved again are sealed: their old ones go
            for pending in self.directory.glob(INTERIM_PENDING.format(step="*")):
                pending.unlink()  # sealed, or of a save that never finished
        barrier(f"sealed {self.run_dir}")
        self._keep_last()

    def _keep_last(self) -> None:
        """Delete all but the steps `kept_steps` keeps."""
        steps = self.steps()
        for step in sorted(set(steps) - kept_steps(steps, self.keep_last, self._is_interim)):
            _clear_step(self._last, self.directory, step)

    def _is_interim(self, step: int) -> bool:
        """Saved as interim by this process, or marked on disk: sealed, or still pending
        (saved by a process killed before it sealed the step)."""
        return (step in self._interim or (self.directory / str(step) / INTERIM_FILE).exists()
                or (self.directory / INTERIM_PENDING.format(step=step)).exists())

    def discard_best(self, keep: int | None) -> list[int]:
        """Delete every step of best/ but `keep` (None: all); returns the steps deleted.

        On resume, best/ can hold a step saved after the checkpoint the run resumes from (the
        run crashed before that checkpoint was written); the bookkeeping restored does not
        know it, and the resumed run must not export it.
        """
        self._best.wait_until_finished()
        on_disk = ({int(p.name) for p in self.best_directory.iterdir() if p.name.isdigit()}
                   if self.best_directory.is_dir() else set())
        stale = sorted((on_disk | set(self._best.all_steps())) - {keep})
        for step in stale:
            _clear_step(self._best, self.best_directory, step)
        return stale

    def wait(self) -> None:
        """Block until background saves are committed (and checksummed)."""
        # A failure names the save in flight; with none, the newest step (the one sealed).
        with self._writing(self.directory, self.latest_step()):
            self._seal()
            self._pending = None

    def close(self) -> None:
        """Release orbax's threads; after a failed save, without a second error, and with
        whatever its writers still put on disk after the failure was reported removed."""
        for manager in (self._last, self._best):
            try:
                manager.close()
            except Exception as err:  # noqa: BLE001 - already reported by the save
                log.debug("closing %s: %s", manager.directory, err)
        if self._failed:
            for directory in (self.directory, self.best_directory):
                _remove_partial_saves(directory)

    # ------------------------------------------------------------------ restoring

    def steps(self) -> list[int]:
        return complete_steps(self.directory)

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def best_step(self) -> int | None:
        steps = complete_steps(self.best_directory)
        return steps[-1] if steps else None

    def restore(self, params_like: Any, train_like: dict[str, Any], step: int | None = None
                ) -> Restored | None:
        """Restore the newest complete checkpoint (or `step`) onto the given templates.

        The templates (live arrays or ShapeDtypeStructs) give structure, dtypes and shardings.
        A checkpoint that fails to read is skipped in favour of the one before it, and set
        aside (`_move_skipped`) once an older one restores. Returns None
        when there is no complete checkpoint; raises CheckpointError when there are some but
        none can be restored (most often: the model or optimizer state no longer matches the
        templates), rather than let the caller start over in a directory that holds a run.
        """
        candidates = [step] if step is not None else list(reversed(self.steps()))
        failures = []
        for candidate in candidates:
            damage = damaged_file(self.directory / str(candidate))
            if damage is not None:
                if step is not None:
                    raise CheckpointError(f"{self.directory / str(candidate)}: {damage}.")
                failures.append((candidate, CheckpointError(damage), "damaged"))
                continue
            try:
                restored = self._last.restore(candidate, args=ocp.args.Composite(
                    params=ocp.args.StandardRestore(_abstract(params_like)),
                    train=ocp.args.StandardRestore(_abstract(train_like)),
                    data=ocp.args.JsonRestore()))
            except Exception as err:  # noqa: BLE001 - any unreadable checkpoint is skipped
                if step is not None:
                    raise CheckpointError(
                        f"{self.directory / str(candidate)}: cannot restore ({_brief(err)})."
                    ) from err
                failures.append((candidate, err, "unreadable"))
                continue
            _move_skipped(self.directory, failures)
            self._last.reload()
            return Restored(candidate, restored.params, dict(restored.train), dict(restored.data))
        if failures:
            raise _none_restored(self.directory, self.best_directory, failures)
        return None

    def restore_params(self, params_like: Any, step: int, best: bool = False) -> Any:
        """Only the parameters of checkpoint `step`. `best`: of best/<step>, or, where that
        is damaged or missing, of checkpoints/<step>, which holds the same ones (a warning
        says so)."""
        if not best:
            step_dir = self.directory / str(step)
            if (damage := damaged_file(step_dir)) is not None:
                raise CheckpointError(f"{step_dir}: {damage}; delete it to fall back to the "
                                      "checkpoints before it.")
            return _read_params(self._last, step_dir, params_like)
        path = self.best_directory / str(step)
        try:
            if (problem := unusable(path)) is not None:
                raise CheckpointError(f"{path} {problem}")
            return _read_params(self._best, path, params_like)
        except CheckpointError as err:
            fallback = self.directory / str(step)
            if (gone := unusable(fallback)) is not None:
                raise CheckpointError(
                    f"{str(err).rstrip('.')}, and {fallback}, which holds the same parameters, "
                    f"{gone}: delete {path} (the run then tracks the best afresh), or restore "
                    "either.") from err
            log.warning("%s; reading best step %d's parameters from %s, which holds the same",
                        str(err).rstrip("."), step, fallback)
            return _read_params(self._last, fallback, params_like)


def epochs_trained(step_dir: Path, batches_in: Callable[[int], int] | None = None) -> int:
    """The epochs the step had completed, from the data position it saved (the JSON item
    "data"), read without restoring it: those before the epoch it was in, and that one too
    where the position is at its end. `batches_in(epoch)`: the batches of that epoch's plan
    (the training iterator's count); without it an epoch begun counts, one too many where
    the step was inside it. 0 when unreadable."""
    try:
        iterator = json.loads((step_dir / "data" / "metadata").read_text())["iterator"]
        epoch, position = int(iterator["epoch"]), int(iterator["position"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    if position == 0:
        return epoch
    return epoch + (batches_in is None or position >= batches_in(epoch))


def unusable(step_dir: Path) -> str | None:
    """Why the step directory `step_dir` cannot be read ("is missing", ...), or None."""
    if not step_dir.exists():
        return "is missing"
    if not is_complete_step_dir(step_dir):
        return "is incomplete"
    damage = damaged_file(step_dir)
    return None if damage is None else f"is damaged ({damage})"


def _read_params(manager: ocp.CheckpointManager, step_dir: Path, params_like: Any) -> Any:
    """The parameters in `step_dir`, whose checksums the caller verified (a big model's
    checkpoint takes seconds to hash: once is enough)."""
    try:
        restored = manager.restore(int(step_dir.name), args=ocp.args.Composite(
            params=ocp.args.StandardRestore(_abstract(params_like))))
    except Exception as err:  # noqa: BLE001 - name the directory whatever went wrong
        raise CheckpointError(
            f"{step_dir}: cannot restore the parameters ({_brief(err)}).") from err
    return restored.params


def _move_skipped(directory: Path, failures: list[tuple[int, Exception, str]]) -> None:
    """Set aside the steps a restore skipped for an older one: renamed `<step>.skipped`, so
    that neither --keep-last, the newest step nor --average-last counts them (a damaged or
    foreign step numbered above the run's would have the good ones deleted)."""
    moves = [(directory / str(step), _free_aside_name(directory, step), err, kind)
             for step, err, kind in failures]
    barrier(f"named skipped {directory}")  # every process names them before any is moved
    for path, aside, err, kind in moves:
        if jax.process_index() == 0:
            path.rename(aside)
        log.warning("skipping %s checkpoint %s: %s; moved it to %s, where the run no longer "
                    "counts it (delete it once looked at)", kind, path,
                    str(err) if kind == "damaged" else _brief(err), aside)
    barrier(f"skipped {directory}")


def _free_aside_name(directory: Path, step: int) -> Path:
    """`<step>.skipped`, or `.skipped2`, `.skipped3`, ... where that is taken."""
    aside = directory / f"{step}{SKIPPED_SUFFIX}"
    number = 1
    while aside.exists():
        number += 1
        aside = directory / f"{step}{SKIPPED_SUFFIX}{number}"
    return aside


def _none_restored(directory: Path, best_directory: Path,
                   failures: list[tuple[int, Exception, str]]) -> CheckpointError:
    """The error for checkpoints none of which restores: another model's shapes, or other."""
    steps = sorted(step for step, _, _ in failures)
    newest, err, _ = failures[0]
    if _is_shape_mismatch(err):
        return CheckpointError(
            f"{directory}: the model's shapes differ from those of its checkpoints (steps "
            f"{steps}; {_brief(err)}): the run was started with other model settings "
            "(--preset, --d-model, --vocab-size, ...); give the same ones again (the run's "
            "config.yaml, or model/config.json, records them), or use another --output-dir "
            "for these.")
    return CheckpointError(
        f"{directory}: none of the complete checkpoints (steps {steps}) can be restored; step "
        f"{newest}: {_brief(err)}. They were written with other settings or another version "
        f"of this code, or are damaged: use another --output-dir, or delete {directory} and "
        f"{best_directory} to start this run over.")


# ----------------------------------------------------------------------------- averaging


def _read_only_manager(directory: Path) -> ocp.CheckpointManager:
    """A manager that only restores; orbax's three warnings that it is read-only (which a user
    would read as a permission problem) are kept out of the log."""
    absl_log = logging.getLogger("absl")
    level = absl_log.level
    absl_log.setLevel(logging.ERROR)
    try:
        return ocp.CheckpointManager(directory,
                                     options=ocp.CheckpointManagerOptions(read_only=True),
                                     item_names=_ITEMS)
    finally:
        absl_log.setLevel(level)


def average_checkpoints(run_dir: str | Path, last: int, config: ModelConfig,
                        settings: str = "config.yaml") -> tuple[Any, list[int]]:
    """Mean of the parameters of the newest `last` complete checkpoints of `run_dir`, for a
    model of `config` (read from `settings`, named in the error when it is not the model the
    checkpoints hold). A damaged or unreadable checkpoint is left out, with a warning, for the
    one before it.

    Averages in float32 with a running sum, so memory is two copies of the parameters.
    Returns (params as nnx.State, the steps averaged).
    """
    run_dir = Path(run_dir)
    if last < 1:
        raise ValueError(f"--average-last must be >= 1, got {last}.")
    directory = run_dir.absolute() / CHECKPOINTS_DIR
    steps = complete_steps(directory)
    if not steps:
        raise CheckpointError(f"{run_dir / CHECKPOINTS_DIR}: no complete checkpoints to average.")
    _, params_like, _ = abstract_params(config)
    manager = _read_only_manager(directory)
    total, averaged = None, []
    try:
        for step in reversed(steps):
            if len(averaged) == last:
                break
            if (params := _params_to_average(manager, directory / str(step), params_like,
                                             settings)) is None:
                continue
            params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
            total = params if total is None else jax.tree.map(jnp.add, total, params)
            averaged.append(step)
    finally:
        manager.close()
    if not averaged:
        raise CheckpointError(f"{run_dir / CHECKPOINTS_DIR}: no checkpoint can be read (the "
                              "warnings above say why); nothing to average.")
    mean = jax.tree.map(lambda x: x / len(averaged), total)
    return mean, sorted(averaged)


def _params_to_average(manager: ocp.CheckpointManager, step_dir: Path, params_like: Any,
                       settings: str) -> Any | None:
    """The parameters of `step_dir`, or None (with a warning) when it is damaged or cannot be
    read; a CheckpointError when they are not the model's: every step's would differ."""
    damage = damaged_file(step_dir)
    if damage is not None:
        log.warning("not averaging damaged checkpoint %s: %s", step_dir, damage)
        return None
    try:
        params = manager.restore(int(step_dir.name), args=ocp.args.Composite(
            params=ocp.args.StandardRestore(params_like))).params
    except Exception as err:  # noqa: BLE001 - orbax and tensorstore raise many kinds
        shapes = _is_shape_mismatch(err)
        if shapes or "Structure mismatch" in str(err):
            differ = (_brief(err) if shapes
                      else "its parameters are not the model's (other layers or names)")
            raise _not_the_model(step_dir, differ, settings) from err
        log.warning("not averaging unreadable checkpoint %s: %s", step_dir, _brief(err))
        return None
    # Without shardings to place them, orbax returns the arrays as stored, whatever the shape.
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(params_like)):
        if got.shape != want.shape:
            raise _not_the_model(step_dir, _shapes_differ(want.shape, got.shape), settings)
    return params


def _not_the_model(step_dir: Path, differ: str, settings: str) -> CheckpointError:
    return CheckpointError(
        f"{step_dir}: {differ}: the model of {settings} is not the one the run trained; give "
        "the run's model settings (model/config.json records them).")
