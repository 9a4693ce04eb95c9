"""Inline HTML markup inside a sentence, put back into its translation around the words it
enclosed, as Firefox's translations (Bergamot) do: the sentence is translated whole with its
tags removed, and each tag goes where a word alignment of the sentence and its translation
(`nmt.models.alignment`) sends the words next to it.

A sentence's markup is a list of `Point`s, each a tag as written at a character offset of the
tag-free sentence: an element's start and end tags (a pair, enclosing the characters between
them), a start or end tag whose partner is in another sentence (lone), or a void element such
as <img>. `place` gives the translation with every point's markup in it, once each, balanced
and nested as in the source (an element inside another stays inside it):

- a pair encloses the target words aligned to the source words it enclosed (extended to whole
  words where the target writes spaces between words, not in Chinese, Japanese, Thai, Lao,
  Khmer or Myanmar script, and except on a side where the tag cut a source word:
  H<sub>2</sub>O marks a piece of a word, and keeps to the aligned tokens; never between a
  character and its combining marks);
- a lone start tag goes before the target words aligned to the rest of its sentence, a lone
  end tag after those aligned to the sentence up to it;
- a void element (or a pair enclosing nothing, or only spaces where the text changed) goes
  after the target of the word it follows without a space, else before the target of the
  word after it.

Elements side by side take the order of their words in the target, as the words did; where
two would overlap, the later one starts where the earlier ends (and may enclose nothing). A
lone end tag stays before its siblings and a lone start tag after them, so that no element
moves into or out of one that spans two sentences. Spaces at the edges of what a tag encloses
are left outside it ("<a>here </a>now" -> "<a>hier</a> jetzt").
Without an alignment (an engine that gives none), source positions map to target positions
by their share of the sentence's length.
"""

from __future__ import annotations

import dataclasses
import html
import unicodedata
from collections.abc import Iterator, Sequence
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


@dataclasses.dataclass
class _Node:
    """An element of the sentence's markup: its tags (a start tag, an end tag, or both; a
    void element has its one tag as `start`), where it wants to be in the target, and the
    elements inside it."""

    start: Point | None
    end: Point | None
    want: tuple[int, int] = (0, 0)
    children: list[_Node] = dataclasses.field(default_factory=list)
    at: tuple[int, int] = (0, 0)  # where it goes


def place(points: Sequence[Point], source: str, target: str,
          alignment: Alignment | None) -> str:
    """`target` (plain text) as HTML, escaped, with every point's markup in it."""
    mapper = _Mapper(source, target, alignment)
    root = _tree(points)
    root.want = root.at = (0, len(target))
    # Parents before children, each placing its children (no recursion: markup may nest
    # thousands of elements deep).
    for node in _parents_first(root):
        _want(node, source, mapper)
        _lay_out(node, target)
    parts: list[str] = []
    end = _render(root, target, parts)
    parts.append(html.escape(target[end:], quote=False))
    return "".join(parts)


def _parents_first(root: _Node) -> Iterator[_Node]:
    """Every element under `root` (and `root`), each before the elements inside it; the
    elements inside are read after their parent is handled, so it may reorder them."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children)


def _tree(points: Sequence[Point]) -> _Node:
    """The points as a tree of elements under a root spanning the sentence: pairs hold what
    was between their tags; a lone start tag holds the rest of its element's content, a lone
    end tag what came before it at the top."""
    root = _Node(None, None)
    stack = [root]
    for point in points:
        if point.kind == "void":
            stack[-1].children.append(_Node(point, None))
        elif point.kind == "open":
            node = _Node(point, None)
            stack[-1].children.append(node)
            stack.append(node)
        elif point.partner is not None:  # the end of a pair: close it, and lone ones in it
            while len(stack) > 1 and stack[-1].start is not points[point.partner]:
                stack.pop()
            if len(stack) > 1:
                stack.pop().end = point
            else:
                root.children.append(_Node(None, point))
        elif len(stack) == 1:  # a lone end tag at the top holds all before it
            root.children = [_Node(None, point, children=root.children)]
        else:  # a lone end tag inside a pair: malformed markup, kept as a point
            stack[-1].children.append(_Node(point, None))
    return root


def _want(node: _Node, source: str, mapper: _Mapper) -> None:
    """Where each element inside `node` wants to be in the target, by the alignment of the
    source characters it held (a lone tag's other side: `node`'s own). A void tag, a stray
    end tag inside a pair, and an element of spaces only (a .docx tab) in a changed text
    hold no word: each goes beside the word it touched, rather than take a word of the
    target (in the same text, positions are exact and keep each space in its element)."""
    for child in node.children:
        start = child.start.offset if child.start else 0
        end = child.end.offset if child.end else len(source)
        if (child.start is not None and child.start.kind != "open" or start >= end
                or not source[start:end].strip() and source != mapper.target):
            at = _beside_a_word(source, start, mapper)
            child.want = (at, at)
        else:
            found = mapper.target_range(start, end)
            child.want = (found[0] if child.start else node.want[0],
                          found[1] if child.end else node.want[1])
    # One before another element with only spaces between them stays in front of it (the
    # word after it may be past an element of spaces only, as in <img> <a> </a> word).
    for child, after in reversed(list(zip(node.children, node.children[1:]))):
        if (child.want[0] == child.want[1] and _before_the_next(source, child)
                and after.start is not None
                and not source[child.start.offset:after.start.offset].strip()):
            child.want = (after.want[0], after.want[0])


def _lay_out(node: _Node, target: str) -> None:
    """Place the elements inside `node` within its place in `target`, in the order of where
    they want to be (so elements may swap as words do), none overlapping another: a later
    one starts where the one before it ends (past the spaces there), and may be left
    enclosing nothing. A lone end tag stays first and a lone start tag last: the element it
    ends or starts holds what came before or after it in the other sentence too, so nothing
    may move out of or into it."""
    low, high = node.at
    node.children.sort(key=lambda c: (_lone_rank(c), c.want[0]))
    cursor = low
    for child in node.children:
        start = min(max(child.want[0], cursor), high)
        while child.want[0] < start < high and target[start].isspace():
            start += 1
        end = min(max(child.want[1], start), high)
        child.at = (start, end)
        cursor = end


def _lone_rank(node: _Node) -> int:
    """0 for a lone end tag, 2 for a lone start tag, 1 for the rest (void ones too)."""
    if node.start is None:
        return 0
    lone_start = node.end is None and node.start.kind == "open"
    return 2 if lone_start else 1


def _render(root: _Node, target: str, parts: list[str]) -> int:
    """Append the markup of `root`'s elements and the target text they hold, in the order
    laid out; returns where in the target the output has reached."""
    position = 0
    stack: list[tuple[_Node, bool]] = [(root, False)]
    while stack:
        node, inside_done = stack.pop()
        tag, at = (node.end, node.at[1]) if inside_done else (node.start, node.at[0])
        if tag is not None:
            parts += [html.escape(target[position:at], quote=False), tag.markup]
            position = at
        if not inside_done:
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(node.children))
    return position


def _before_the_next(source: str, child: _Node) -> bool:
    """Whether `child` holds nothing and goes before the word after it (`_beside_a_word`)."""
    if child.start is None:
        return False
    offset = child.start.offset
    empty = child.start.kind != "open" or (child.end is not None
                                           and child.end.offset <= offset)
    return empty and (offset == 0 or source[offset - 1].isspace())


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
        # A side that cuts a source word (H<sub>2</sub>O) is not widened in the target.
        return _whole_words(self.target, *found, not _inside_word(self.source, start),
                            not _inside_word(self.source, end))

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


# Scripts written without spaces between words, where a token is the unit a tag keeps to:
# CJK ideographs (extensions B and later too), kana, and Thai, Lao, Myanmar and Khmer.
_UNSPACED = ((0x0E00, 0x0EFF), (0x1000, 0x109F), (0x1780, 0x17FF), (0x19E0, 0x19FF),
             (0x2E80, 0x9FFF), (0xA9E0, 0xA9FF), (0xAA60, 0xAA7F), (0xF900, 0xFAFF),
             (0xFF66, 0xFF9F), (0x20000, 0x3FFFF))


def _joins(char: str) -> bool:
    """Whether `char` is part of a word in a script that writes spaces between words: a
    letter, a digit or a combining mark (the vowel signs of Devanagari, an accent written
    apart), not of the scripts in `_UNSPACED`."""
    code = ord(char)
    return ((char.isalnum() or _is_mark(char))
            and not any(low <= code <= high for low, high in _UNSPACED))


def _is_mark(char: str) -> bool:
    return unicodedata.category(char).startswith("M")


def _inside_word(text: str, offset: int) -> bool:
    """Whether `offset` falls between two characters of one word of `text`."""
    return 0 < offset < len(text) and _joins(text[offset - 1]) and _joins(text[offset])


def _whole_words(text: str, start: int, end: int, widen_start: bool = True,
                 widen_end: bool = True) -> tuple[int, int]:
    """[start, end) with the spaces at its edges left out, and its sides widened to whole
    words where asked: a tag's target tokens may be pieces of a word (Fahr|rad), but a tag
    that cut a source word marks a piece of it, so that side stays at a token edge."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    while widen_start and _inside_word(text, start):
        start -= 1
    while widen_end and _inside_word(text, end):
        end += 1
    # Never between a character and its combining marks, in any script.
    while 0 < start < len(text) and _is_mark(text[start]):
        start -= 1
    while end < len(text) and _is_mark(text[end]):
        end += 1
    return start, end
