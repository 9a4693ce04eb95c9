"""Inline HTML markup inside a sentence, put back into its translation around the words it
enclosed, as Firefox's translations (Bergamot) do: the sentence is translated whole with its
tags removed, and each tag goes where a word alignment of the sentence and its translation
(`nmt.models.alignment`) sends the words next to it.

A sentence's markup is a list of `Point`s, each a tag as written at a character offset of the
tag-free sentence: an element's start and end tags (a pair, enclosing the characters between
them), a start or end tag whose partner is in another sentence (lone), or a void element such
as <img> (a point). `place` gives the translation with every point's markup in it, once each,
in the order the source had them, so pairs stay balanced and nested:

- a pair encloses the target words aligned to the source words it enclosed (extended to whole
  words where the target writes spaces between words);
- a lone start tag goes before the target words aligned to the rest of its sentence, a lone
  end tag after those aligned to the sentence up to it;
- a void element (or a pair enclosing nothing) goes after the target of the word it follows
  without a space, else before the target of the word after it.

Where these would put a tag before one that came earlier in the source (word order differs),
it moves up to that one: a pair may then enclose fewer words, or none. Without an alignment
(an engine that gives none), source positions map to target positions by their share of the
sentence's length.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Sequence
from typing import Literal

from nmt.models.alignment import Alignment, aligned_targets

Kind = Literal["open", "close", "void"]


@dataclasses.dataclass(frozen=True)
class Point:
    """A tag of a sentence: `markup` as written, at `offset` of the tag-free sentence;
    `partner`: the index of the other tag of its pair among the sentence's points, or None."""

    offset: int
    markup: str
    kind: Kind
    partner: int | None = None


def pair_points(points: list[tuple[int, str, Kind, str]]) -> list[Point]:
    """`Point`s of (offset, markup, kind, tag name) in source order, each end tag paired with
    the nearest open start tag of its name that is not yet closed."""
    partners: dict[int, int] = {}
    stack: list[tuple[str, int]] = []
    for index, (_, _, kind, name) in enumerate(points):
        if kind == "open":
            stack.append((name, index))
        elif kind == "close":
            for depth in range(len(stack) - 1, -1, -1):
                if stack[depth][0] == name:
                    opened = stack[depth][1]
                    partners[opened], partners[index] = index, opened
                    del stack[depth:]  # elements left open inside are closed by it
                    break
    return [Point(offset, markup, kind, partners.get(index))
            for index, (offset, markup, kind, _) in enumerate(points)]


def place(points: Sequence[Point], source: str, target: str,
          alignment: Alignment | None) -> str:
    """`target` (plain text) as HTML, escaped, with every point's markup in it."""
    mapper = _Mapper(source, target, alignment)
    wanted = [_wanted_position(point, points, source, mapper) for point in points]
    positions, floor = [], 0
    for position in wanted:  # never before a tag that came earlier in the source
        floor = max(floor, position)
        positions.append(floor)
    parts, last = [], 0
    for point, position in zip(points, positions):
        parts += [html.escape(target[last:position], quote=False), point.markup]
        last = position
    parts.append(html.escape(target[last:], quote=False))
    return "".join(parts)


def _wanted_position(point: Point, points: Sequence[Point], source: str,
                     mapper: _Mapper) -> int:
    """Where `point` would go in the target, before the source order is enforced."""
    if point.partner is not None:
        start, end = sorted((point.offset, points[point.partner].offset))
        if start < end:
            found = mapper.target_range(start, end)
            return found[0] if point.kind == "open" else found[1]
        return _beside_a_word(source, start, mapper)
    if point.kind == "open":  # closed in a later sentence: encloses the rest of this one
        return mapper.target_range(point.offset, len(source))[0]
    if point.kind == "close":  # opened in an earlier sentence
        return mapper.target_range(0, point.offset)[1]
    return _beside_a_word(source, point.offset, mapper)


def _beside_a_word(source: str, offset: int, mapper: _Mapper) -> int:
    """Where a tag enclosing nothing goes: after the target of the word it follows without
    a space, else before the target of the word after it (at the end if none)."""
    if 0 < offset and not source[offset - 1].isspace():
        start = offset
        while start > 0 and not source[start - 1].isspace():
            start -= 1
        return mapper.target_range(start, offset)[1]
    start = offset
    while start < len(source) and source[start].isspace():
        start += 1
    end = start
    while end < len(source) and not source[end].isspace():
        end += 1
    return mapper.target_range(start, end)[0] if start < end else len(mapper.target)


class _Mapper:
    """Source character ranges -> target character ranges, by the alignment."""

    def __init__(self, source: str, target: str, alignment: Alignment | None):
        self.source, self.target = source, target
        usable = (alignment is not None and alignment.weights.ndim == 2
                  and alignment.weights.shape == (len(alignment.target_spans),
                                                  len(alignment.source_spans))
                  and alignment.weights.size > 0)
        self.alignment = alignment if usable else None

    def target_range(self, start: int, end: int) -> tuple[int, int]:
        """The target words aligned to source characters [start, end)."""
        if not self.target:
            return 0, 0
        found = self._aligned(start, end) if self.alignment is not None else None
        if found is None:
            found = self._by_share(start, end)
        return _whole_words(self.target, *found)

    def _aligned(self, start: int, end: int) -> tuple[int, int] | None:
        alignment = self.alignment
        assert alignment is not None
        inside = [i for i, (a, b) in enumerate(alignment.source_spans)
                  if a < end and b > start and b > a]
        if not inside:
            return None
        chosen = [j for j in aligned_targets(alignment.weights, inside)
                  if alignment.target_spans[j][1] > alignment.target_spans[j][0]]
        if not chosen:  # what draws most on these source tokens
            mass = alignment.weights[:, inside].sum(axis=1)
            chosen = [j for j in mass.argsort()[::-1]
                      if alignment.target_spans[j][1] > alignment.target_spans[j][0]][:1]
        if not chosen:
            return None
        spans = [alignment.target_spans[j] for j in chosen]
        return min(a for a, _ in spans), max(b for _, b in spans)

    def _by_share(self, start: int, end: int) -> tuple[int, int]:
        share = len(self.target) / max(len(self.source), 1)
        return round(start * share), max(round(end * share), round(start * share))


def _joins(char: str) -> bool:
    """Whether `char` is part of a word in a script that writes spaces between words (not
    the ideographs and kana of Chinese and Japanese, where a token is the unit)."""
    return char.isalnum() and not ("\u3040" <= char <= "\u30ff" or "\u3400" <= char <= "\u9fff"
                                   or "\uf900" <= char <= "\ufaff")


def _whole_words(text: str, start: int, end: int) -> tuple[int, int]:
    """[start, end) widened to whole words, with the spaces at its edges left out."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    while 0 < start < len(text) and _joins(text[start - 1]) and _joins(text[start]):
        start -= 1
    while 0 < end < len(text) and _joins(text[end - 1]) and _joins(text[end]):
        end += 1
    return start, end
