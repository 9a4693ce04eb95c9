"""What a translation call returns, whichever engine searched (n-best lists and records), and
the checks of its sources that every engine makes alike."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence

log = logging.getLogger("translate")


@dataclasses.dataclass(frozen=True)
class BatchStats:
    """What one searched batch cost: for profiles (bench.search_rules) and padding checks."""

    width: int      # padded source length (a bucket)
    rows: int       # rows of the compiled shape
    sentences: int  # rows holding a sentence; the rest are PAD
    source_tokens: int  # real source tokens, EOS included
    steps: int      # decoder steps the search ran
    row_steps: int  # rows decoded, summed over those steps (finished sentences leave)
    stage_rows: tuple[int, ...]  # rows of each stage of the search: `rows`, then fewer
    seconds: float  # search, from the call until the results are on the host


@dataclasses.dataclass(frozen=True)
class Hypothesis:
    text: str
    score: float
    tokens: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Translations:
    """What one call did: its n-best lists in input order, and its records. Lines are
    numbered as the call was told (`line_numbers`, or from `first_line`). A list holds up to
    nbest hypotheses, best first: only those the search found, so it may be shorter."""

    nbest: list[list[Hypothesis]]
    truncated: list[int]      # lines cut to the model's positions (each warned about)
    reached_limit: list[int]  # lines whose best translation ends where EOS was forced, in order
    batches: list[BatchStats]


def truncate_sources(ids: list[list[int]], limit: int, line_numbers: Sequence[int],
                     source: str, each_line: bool = True) -> tuple[list[list[int]], list[int]]:
    """`ids` with every row over `limit` tokens (the model's positions less EOS) cut to fit,
    each with a warning naming its line, and the indices of those rows (the caller's rows
    are not changed). `each_line=False` warns once, counting them (`summarise_truncated`)."""
    truncated = [i for i, row in enumerate(ids) if len(row) > limit]
    if truncated and not each_line:
        summarise_truncated([len(ids[i]) for i in truncated], limit, source)
    for i in truncated:
        if each_line:
            log.warning("%s line %d: a sentence of %d tokens, more than the model's %d (+ EOS); "
                        "truncated to %d tokens", source, line_numbers[i], len(ids[i]), limit,
                        limit)
        ids[i] = ids[i][:limit]
    return ids, truncated


def summarise_truncated(lengths: Sequence[int], limit: int, source: str) -> None:
    """One warning for the sentences of `lengths` cut to `limit` tokens: the server's, whose
    "lines" would be places in a batch of several clients' requests, one warning each a
    flood that any client could cause."""
    one = len(lengths) == 1
    log.warning("%s: %d %s longer than the model's %d positions %s cut to %d tokens "
                "(longest %d)", source, len(lengths), "sentence" if one else "sentences",
                limit + 1, "was" if one else "were", limit, max(lengths))


def refuse_long_sources(ids: list[list[int]], limit: int, first_line: int, source: str
                        ) -> list[list[int]]:
    """`ids`, or a ValueError naming the first row over `limit` tokens: its log-probability
    cannot be computed without scoring another text."""
    for i, row in enumerate(ids):
        if len(row) > limit:
            raise ValueError(
                f"{source} line {first_line + i}: {len(row)} tokens, more than the model's "
                f"{limit} (+ EOS); its log-probability cannot be computed without truncating "
                f"it, which would score another text: leave the pair out of the test set")
    return ids


@dataclasses.dataclass
class CallSources:
    """What every engine's `translate_all` does before searching: the sentences' ids (encoded
    unless given), cut to the model's positions with a warning naming each line (or one for
    them all: `each_line`), and the empty sentences (blank, or of no tokens: a zero-width
    space alone) answered with empty hypotheses. `todo`: the indices left to search."""

    ids: list[list[int]]
    results: list[list[Hypothesis] | None]
    todo: list[int]
    line_numbers: Sequence[int]
    truncated_lines: list[int]

    @classmethod
    def of(cls, sentences: Sequence[str], tokenizer, limit: int, nbest: int,
           ids: Sequence[Sequence[int]] | None, line_numbers: Sequence[int] | None,
           first_line: int, source: str, progress: Callable[[int], None] | None,
           each_line: bool = True) -> "CallSources":
        if isinstance(sentences, (str, bytes)):
            raise TypeError("sentences must be a list of strings, got one "
                            f"{type(sentences).__name__}: pass [text] to translate one")
        if line_numbers is None:
            line_numbers = range(first_line, first_line + len(sentences))
        elif len(line_numbers) != len(sentences):
            raise ValueError(f"{len(line_numbers)} line numbers for {len(sentences)} sentences")
        if ids is None:
            ids = tokenizer.encode(list(sentences), "source")
        elif len(ids) != len(sentences):
            raise ValueError(f"{len(ids)} rows of token ids for {len(sentences)} sentences")
        rows, truncated = truncate_sources(list(ids), limit, line_numbers, source, each_line)
        results: list[list[Hypothesis] | None] = [None] * len(sentences)
        empty = [i for i, sentence in enumerate(sentences) if not sentence.strip() or not rows[i]]
        for i in empty:
            results[i] = [Hypothesis("", 0.0, ())] * nbest
        if progress is not None and empty:
            progress(len(empty))
        return cls(rows, results, [i for i, r in enumerate(results) if r is None],
                   line_numbers, [line_numbers[i] for i in truncated])
