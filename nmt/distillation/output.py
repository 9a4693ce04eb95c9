"""A distillation's output directory: a teacher's translations of a corpus, written chunk by
chunk so that an interrupted run resumes where it stopped and a finished one is reused.

    OUT/distillation.json  what is distilled (`Recipe`): teachers, corpus digest, search,
                           sampling seed
    OUT/parts/000003.TGT   the translations of chunk 3, each part written whole
    OUT/parts/000003.dropped  the corpus lines of chunk 3 left out (too long to translate
                           whole), one number a line; written before the part
    OUT/train.SRC          the corpus, aligned line for line with
    OUT/train.TGT          the teacher's translations (after the original pairs, if kept),
                           both without the lines left out
    OUT/.lock              held while a command writes in OUT (`nmt.rundir.lock`)

The result files are written once every chunk is done; parts/ is then removed. A directory
holding another recipe's distillation is refused, never mixed into, and so is one that
another command is distilling into at the time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import errno
import json
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from data.lines import count_lines
from nmt.rundir.lock import LOCK_FILE, RunLock
from nmt.translation.streams import one_line
from transformer.atomic_files import atomic_file, write_atomically
from transformer.config import SearchConfig
from transformer.strategies import plan_search

RECIPE_FILE = "distillation.json"
PARTS_DIR = "parts"
# Part of every recipe: raise it when the same recipe would write something else.
FORMAT_VERSION = 1
# The flag that sets each recipe field set by one flag, to name it in a refusal.
FIELD_FLAGS = {"src": "--src", "tgt": "--tgt", "dtype": "--dtype", "chunk_lines": "--chunk-lines",
               "keep_original": "--keep-original", "seed": "--seed"}
# Fields that number the parts only: a finished output's files are the same whatever they say.
PARTS_ONLY_FIELDS = ("chunk_lines",)


class OtherDistillation(ValueError):
    """The output directory holds a distillation of something else."""


def search_recipe(search: SearchConfig) -> dict[str, Any]:
    """What of `search` the translations depend on: the strategy that runs, with the settings
    it reads only (a beam's --alpha under --greedy changes nothing), and the output limit."""
    strategy = plan_search(search)
    settings = {name: value.value if isinstance(value, enum.Enum) else value
                for name, value in dataclasses.asdict(strategy).items()}
    return {"strategy": search.strategy, **settings, "max_len_a": search.max_len_a,
            "max_len_b": search.max_len_b}


def stored_search(search: Any) -> Any:
    """A stored recipe's search as `search_recipe` words it: recipes written before it held
    the whole SearchConfig (with "beam_size"), which is read and narrowed alike."""
    if isinstance(search, dict) and "beam_size" in search:
        try:
            return search_recipe(SearchConfig.from_dict(search))
        except (TypeError, ValueError):  # damaged, or of another version: it differs
            return search
    return search


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Everything the translations depend on: equal recipes give equal files."""

    teachers: tuple[str, ...]  # each teacher's model checksum, in ensemble order
    corpus: str                # digest of the source file (and the target, if kept)
    src: str
    tgt: str
    search: dict[str, Any]     # the search the teachers ran (`search_recipe`)
    dtype: str
    chunk_lines: int
    keep_original: bool
    # The sampling seed; None where the search draws nothing (greedy and beam search), so
    # those recipes match whatever --seed says, as they did before the seed was recorded.
    seed: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT_VERSION, **dataclasses.asdict(self)}

    def differences(self, stored: dict[str, Any], finished: bool = False) -> list[str]:
        """The fields in which a stored recipe differs from this one (for a `finished`
        output, those its result files depend on)."""
        mine = json.loads(json.dumps(self.to_json()))  # tuples as lists, as stored
        ignored = PARTS_ONLY_FIELDS if finished else ()
        stored = {**stored, "search": stored_search(stored.get("search"))}
        return [name for name in mine if name not in ignored and stored.get(name) != mine[name]]


class DistillationDir:
    """OUT: its recipe, the chunks already translated, and the finished files."""

    def __init__(self, root: str | Path, recipe: Recipe):
        self.root = Path(root)
        self.recipe = recipe
        self.parts = self.root / PARTS_DIR

    @property
    def source_file(self) -> Path:
        return self.root / f"train.{self.recipe.src}"

    @property
    def target_file(self) -> Path:
        return self.root / f"train.{self.recipe.tgt}"

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold OUT's lock (with `with`, before `claim`), OUT made if new: a second command
        on the same OUT is refused with RunDirectoryInUse. An OUT holding files of anything
        else is refused first (`OtherDistillation`), so that no lock file is left in it.

        A finished OUT on storage this process cannot write (read-only, or another user's)
        is held without the lock, which cannot be taken there: it is only read, so that a
        pipeline can still run the command; an unfinished one raises the OSError."""
        self._refuse_foreign()
        self.root.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(RunLock(self.root, "distillation", "--out"))
            except OSError as err:
                if err.errno not in (errno.EROFS, errno.EACCES) or not self.finished():
                    raise
            yield

    def _refuse_foreign(self) -> None:
        if not (self.root / RECIPE_FILE).is_file() and self.root.is_dir() and any(
                path.name != LOCK_FILE for path in self.root.iterdir()):
            raise OtherDistillation(f"{self.root} is not empty and holds no {RECIPE_FILE}; "
                                    "choose a new or empty --out.")

    def claim(self) -> None:
        """Make OUT this recipe's, or check that it is: `OtherDistillation` if it holds
        another recipe's output (or files of anything else), naming what differs. Another
        recipe with nothing translated yet (a command refused after claiming OUT) is
        replaced; a finished output is reused whatever --chunk-lines says."""
        recipe_file = self.root / RECIPE_FILE
        if recipe_file.is_file() and not self._holds_work():
            recipe_file.unlink()
            if self.parts.is_dir():
                self.parts.rmdir()
        if recipe_file.is_file():
            try:
                stored = json.loads(recipe_file.read_text(encoding="utf-8"))
            except ValueError:
                raise OtherDistillation(f"{recipe_file} is damaged; delete {self.root} or "
                                        "choose another --out.") from None
            differs = self.recipe.differences(stored, finished=self.finished())
            if differs:
                raise OtherDistillation(self._refusal(differs, stored))
            return
        self._refuse_foreign()
        self.root.mkdir(parents=True, exist_ok=True)
        write_atomically(recipe_file, json.dumps(self.recipe.to_json(), indent=2) + "\n")

    def _refusal(self, differs: list[str], stored: dict[str, Any]) -> str:
        """The line refusing OUT's stored recipe, naming the fields in `differs` by their
        flags."""
        if differs == ["chunk_lines"]:  # an unfinished output: its parts are numbered by it
            return (f"{self.root} holds an unfinished distillation saved in chunks of "
                    f"{stored['chunk_lines']} lines; continue it with --chunk-lines "
                    f"{stored['chunk_lines']}, or choose another --out.")
        flags = [FIELD_FLAGS.get(name, name) for name in differs]
        names = " and ".join(filter(None, (", ".join(flags[:-1]), flags[-1])))
        # "teachers" is plural: "its teachers differ", "its corpus differs".
        verb = "differ" if len(differs) > 1 or differs == ["teachers"] else "differs"
        return (f"{self.root} holds another distillation (its {names} {verb} from this "
                "command's); choose another --out, or delete it to distil again.")

    def _holds_work(self) -> bool:
        """Whether OUT holds anything but its recipe (and lock): a part, or a result file."""
        empty_parts = self.parts.is_dir() and not any(self.parts.iterdir())
        return any(path.name not in (RECIPE_FILE, LOCK_FILE)
                   and not (path == self.parts and empty_parts)
                   for path in self.root.iterdir())

    def finished(self) -> bool:
        return self.source_file.is_file() and self.target_file.is_file() \
            and not self.parts.exists()

    def part_path(self, chunk: int) -> Path:
        return self.parts / f"{chunk:06d}.{self.recipe.tgt}"

    def dropped_path(self, chunk: int) -> Path:
        return self.parts / f"{chunk:06d}.dropped"

    def done_part(self, chunk: int, lines: int) -> bool:
        """Whether chunk's part is written whole with its `lines` translations, and the lines
        it leaves out (a part of another length, from an older run's chunking, or without
        them, from a version that kept every line, is translated again)."""
        path = self.part_path(chunk)
        return path.is_file() and count_lines(path) == lines \
            and self.dropped_path(chunk).is_file()

    def write_part(self, chunk: int, translations: Sequence[str],
                   dropped: Sequence[int] = ()) -> None:
        """Save chunk's translations, one per corpus line (a line left out has one too, never
        written to the result files), and `dropped`, the corpus line numbers left out."""
        self.parts.mkdir(exist_ok=True)
        write_atomically(self.dropped_path(chunk), "".join(f"{n}\n" for n in dropped))
        write_atomically(self.part_path(chunk), "".join(f"{one_line(t)}\n" for t in translations))

    def finish(self, chunks: int, sources: Callable[[], Iterable[str]],
               originals: Callable[[], Iterable[str]] | None) -> list[int]:
        """Write the result files from the source lines, the kept original targets (or None)
        and every part, the lines the parts left out left out of the distilled pairs, then
        remove the parts; return those corpus line numbers. Each file is written whole; the
        corpus is streamed, never held."""
        dropped = {int(n) for chunk in range(chunks) if self.dropped_path(chunk).is_file()
                   for n in self.dropped_path(chunk).read_text(encoding="utf-8").split()}
        with atomic_file(self.source_file, "w") as out:
            if originals is not None:
                out.writelines(f"{line}\n" for line in sources())
            out.writelines(f"{line}\n" for n, line in enumerate(sources(), 1) if n not in dropped)
        with atomic_file(self.target_file, "w") as out:
            if originals is not None:
                out.writelines(f"{line}\n" for line in originals())
            number = 0
            for chunk in range(chunks):
                with self.part_path(chunk).open(encoding="utf-8") as part:
                    for number, line in enumerate(part, number + 1):
                        if number not in dropped:
                            out.write(line)
        if self.parts.exists():  # none where no chunk was translated
            shutil.rmtree(self.parts)
        return sorted(dropped)
