"""Files written whole or not at all: a reader never sees half of one, and a failure leaves
the earlier file as it was."""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

PARTIAL_SUFFIX = ".partial"


class AtomicOutput:
    """A text file written as it goes into PATH.partial and moved onto PATH on success only."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.partial = self.path.with_name(self.path.name + PARTIAL_SUFFIX)
        self.handle: IO[str] | None = None

    def __enter__(self) -> IO[str]:
        self.handle = open(self.partial, "w", encoding="utf-8", newline="\n")
        return self.handle

    def __exit__(self, exc_type, exc, tb) -> None:
        assert self.handle is not None
        try:
            self.handle.close()
        except OSError:
            if exc_type is None:
                self.partial.unlink(missing_ok=True)
                raise
        if exc_type is None:
            os.replace(self.partial, self.path)
        else:
            self.partial.unlink(missing_ok=True)


def write_text_atomically(path: str | Path, text: str) -> None:
    with AtomicOutput(path) as out:
        out.write(text)

