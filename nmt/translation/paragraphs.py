"""Paragraphs in, sentences out, and back: text and HTML cut into the sentences a model
translates, then rebuilt around their translations with everything else as it was.

    document = split_text("  Dr. Smith came.  He left.\r\n\r\nBye!\n", "en")
    document.sentences                 # ["Dr. Smith came.", "He left.", "Bye!"]
    document.join(translations)        # one translation per sentence, in order

A `Document` is the sentences and the exact text between them (`between`: before the first,
between each two, after the last), so `join` puts each translation where its sentence was and
keeps all the rest byte for byte: leading and trailing whitespace, the spaces after each
sentence, tabs, single and double line breaks, "\\r\\n"; `join(document.sentences)` gives the
input back. A translation is written as one stretch of a line: its own line breaks become
spaces and its edges are stripped, so it cannot change the layout around it. Given the
target language, `join` changes one thing: the space between two sentences of one run of
text, which Japanese and Chinese leave out and most other languages write (`respaced`).

Plain text is cut at line breaks first ("\\n", "\\r\\n", a lone "\\r"; U+2028 and the like
stay inside lines, as in `data.lines`): a line is a paragraph and no sentence spans two.
Each line is then split by sentencex (Wikimedia's segmenter, rules for about 300 languages).
Its language codes are lower-case MediaWiki codes, and a code it does not know (`xx`, but
also `de-DE` or `DE`) silently gets English rules, so a code is reduced to its lower-case
base first (`pt-BR` -> `pt`, `zh_Hant` -> `zh`), and a three-letter code to the two-letter
one (`jpn` or `jpn_Jpan` -> `ja`, for the languages `language_codes` knows); an unknown base still
gets English rules, which suit most languages written with spaces and ".!?". Where
sentencex cuts after a quotation that a Japanese, Chinese or Korean sentence goes on after
(「本当？」と聞いた), the two pieces are one sentence again (`_quotes_rejoined`); so are a
list item's number at the start of a line and what follows it ("1. Einleitung"), an ordinal
written with a full stop and the word after it in languages that write them so ("Der 2.
Weltkrieg", `ORDINAL_DOT`), a title that sentencex does not know and the name after it
("M. Dupont", "Mevr. Jansen", "Dña. García"), and a word cut at a hyphen ("Dipl.-Ing.");
a quotation mark after a space, which sentencex leaves at the end of a sentence though it
opens the next ('Er sagte es. "Und ...'), starts the next (`_opening_quotes_moved`).
Khmer's "។" and "៕" end a sentence (`_STOPS`). Thai, Lao, Khmer and Myanmar end a sentence
with a space, which sentencex does not see: their text is cut at spaces where
it would otherwise make a sentence of more than 200 characters (`_cut_at_spaces`).

HTML (`split_html`) keeps every tag, attribute, comment, doctype, CDATA section and
processing instruction as it was (attribute values such as alt or title are not translated)
and translates the text between them: each run of text is unescaped (`html.unescape`), split
into sentences, and each translation escaped again (`html.escape`, quote=False) when joined;
the whitespace around sentences is copied from the markup as written (`&nbsp;` stays
`&nbsp;`). Kept verbatim, untranslated:
- the contents of <script> and <style>: code, not text, and not markup either (`a<b` is no
  tag there), so they are skipped up to their end tag without being scanned;
- <template> elements and every element marked translate="no" (HTML's own way of saying "do
  not translate": mark <code> or <pre> that holds code so) or class="notranslate" (a class
  list holding that token, which Google Translate and Firefox honour too),
  with everything inside them, up to where a browser ends them: their end tag, an end tag of
  an element around them, or a start tag that implies an end tag left out (<p
  translate="no">A<p>B: "B" is translated). Such an element is skipped whole, as Firefox's
  translator skips it: an element marked translate="yes" inside it is not translated either.
Elsewhere line breaks in HTML text are spaces, so a sentence wrapped over two source lines
stays one sentence (and comes back on one line); only inside <pre>, <textarea> and <listing>,
where they show, is text cut into lines as plain text is. Markup that is not well formed
loses nothing: a "<" that does not open a tag ("a < b", "x <3", a tag never closed) is text,
a quote that never closes is a character of its tag, and an unclosed comment runs to the end,
as browsers read it. As browsers do too, a start tag ending in "/>" opens an element like any
other (<span/> and <div translate="no"/> hold what follows, up to their end): only void
elements (<br>, <img>, ...) and, inside <svg> and <math>, tags ending in "/>" hold nothing; and
the "/" that ends an unquoted value is the value's (<a href=/docs/> opens a link).

Inline markup stays inside sentences: the start and end tags of phrasing elements (a, abbr,
b, bdi, bdo, big, cite, code, data, del, dfn, em, font, i, ins, kbd, label, mark, nobr, q, s,
samp, small, span, strike, strong, sub, sup, time, tt, u, var: `INLINE`) and the void <img>
and <wbr> do not cut text; every other tag (blocks, <br>, unknown names), comments, the
verbatim elements above (an inline one marked translate="no" too) and every tag inside
<pre>, <textarea> and <listing> do. The text between two cutting tags, inline tags removed,
is split into sentences, so "Hello <b>world</b>." is the one sentence "Hello world.". A
sentence's inline tags are kept as points at offsets of its text (`Document.points`), and
`join` puts them into its translation around the words that a word alignment of the two
(`alignments`, for the sentences in `Document.needs_alignment`) ties to the words they
enclosed, or by relative position where none is given (`nmt.translation.inline_markup`).
Tags between sentences (a pair around a whole sentence) stay in `between`.
"""

from __future__ import annotations

import bisect
import dataclasses
import html
import re
import unicodedata
from collections.abc import Callable, Iterator, Mapping, Sequence

from sentencex import segment

from nmt.models.alignment import Alignment
from nmt.translation.inline_markup import Kind, Point, pair_points, place
from nmt.translation.language_codes import base_language

# Line breaks: "\n", "\r\n" and a lone "\r"; not U+2028 and the like (data.lines says why).
_LETTER = re.compile(r"[^\W\d_]")
_LINE = re.compile(r"[^\r\n]+")
_LINE_BREAK = re.compile(r"\r\n?|\n")
_LINE_BREAK_CHARACTER = re.compile(r"[\r\n]")  # one of a line break's characters
# sentencex 1.0.32 panics on a capital letter, a non-ASCII space and "." ("D\xa0.") and on
# a few more such cases (it slices bytes as if every space were one byte): it is shown a
# copy with these spaces made " ", which has the same characters and so the same offsets.
_NON_ASCII_SPACE = re.compile(r"[^\S\x00-\x7f]")

# A tag: "<" or "</" and a letter; it ends at the first ">" outside quoted attribute values,
# and a quote opens a value only after "=", as browsers read tags.
_TAG_NAME = re.compile(r"</?([A-Za-z][^\s/>]*)")
_TAG_STOP = re.compile(r""">|=(?=\s*["'])""")
_QUOTED_VALUE = re.compile(r"""=\s*(?:"[^"]*"|'[^']*')""")
_ATTRIBUTE = re.compile(r"""([^\s"'>/=]+)(?:\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+)))?""")
# html.unescape's own pattern (html._charref): every match is replaced on its own.
_CHARREF = re.compile(r"&(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\f <&#;]{1,32};?)")

# Languages written with no space between sentences (their codes as `segmenter_language`
# gives them): a space between two sentences of another language is dropped (`respaced`).
UNSPACED = frozenset(("ja", "zh", "yue", "wuu", "lzh"))
# The end of a sentence, closing quotes and brackets after it included.
_SENTENCE_END = re.compile(r"[.!?。！？．｡…][\"'”’」』）)\]】〉》]*$")

RAW_TEXT = ("script", "style")  # contents skipped unscanned up to the end tag
VERBATIM = ("template",)  # elements kept whole, as if marked translate="no"
LINED = ("pre", "textarea", "listing")  # elements whose line breaks show
# Phrasing elements, which mark words inside a sentence rather than cut text into blocks:
# their tags go into the sentence's translation (`inline_markup`) instead of cutting it.
INLINE = frozenset(("a", "abbr", "b", "bdi", "bdo", "big", "cite", "code", "data", "del", "dfn",
                    "em", "font", "i", "ins", "kbd", "label", "mark", "nobr", "q", "s", "samp",
                    "small", "span", "strike", "strong", "sub", "sup", "time", "tt", "u",
                    "var"))
INLINE_VOID = frozenset(("img", "wbr"))
_VOID = frozenset(("area", "base", "br", "col", "embed", "hr", "img", "input", "link",
                   "meta", "param", "source", "track", "wbr"))
# Elements whose contents are SVG or MathML, where "/>" ends an element (`_empty`).
_FOREIGN = ("svg", "math")


@dataclasses.dataclass(frozen=True)
class Document:
    """Sentences to translate and the text around them; `join` puts translations in their
    place.

    sentences: the pieces to translate, in order: stripped and non-empty; in plain text (and
        HTML's <pre>) none spans two lines.
    between: len(sentences) + 1 strings kept as they are: before the first sentence, between
        each two, after the last.
    markup: the text is HTML; translations are escaped when joined.
    """

    sentences: list[str]
    between: list[str]
    markup: bool = False
    # HTML: the inline tags inside each sentence (`nmt.translation.inline_markup`), or none.
    points: list[tuple[Point, ...]] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        if len(self.between) != len(self.sentences) + 1:
            raise ValueError(f"{len(self.sentences)} sentences need {len(self.sentences) + 1} "
                             f"stretches between them, got {len(self.between)}.")

    @property
    def needs_alignment(self) -> list[int]:
        """The sentences holding inline markup: `join` places it by their alignments."""
        return [i for i, points in enumerate(self.points) if points]

    def join(self, translations: Sequence[str],
             alignments: Mapping[int, Alignment | None] | None = None,
             target: str | None = None) -> str:
        """The text with translations[i] in place of sentences[i]; ValueError unless there
        is one translation per sentence. A sentence's inline markup goes where
        alignments[i] (its word alignment with its translation) sends it, or by position
        without one or where the translation is the sentence itself. With `target`, the
        translations' language, the space after a translated sentence follows its custom
        (`respaced`); without, and after a sentence kept as it is, it is the source's."""
        if isinstance(translations, str) or len(translations) != len(self.sentences):
            count = "a string" if isinstance(translations, str) else len(translations)
            raise ValueError(f"{count} translations for {len(self.sentences)} sentences; give "
                             "a list with one translation per sentence, in order.")
        parts = [self.between[0]]
        for i, (translation, after) in enumerate(zip(translations, self.between[1:])):
            # The space after a sentence kept as it is (one without letters) stays the
            # source's: "1. 2. 3." into Japanese is not "1. 2.3.".
            if i > 0 and translations[i - 1] != self.sentences[i - 1]:
                parts[-1] = respaced(parts[-1], self.markup, translations[i - 1], target)
            parts += [self._in_place(i, translation, alignments), after]
        return "".join(parts)

    def _in_place(self, i: int, translation: str,
                  alignments: Mapping[int, Alignment | None] | None) -> str:
        """A translation as a stretch of one line, escaped in markup, with its inline tags."""
        text = _LINE_BREAK.sub(" ", translation).strip()
        points = self.points[i] if self.points else ()
        if points:
            stripped = _LINE_BREAK.sub(" ", translation)
            # A sentence translated as itself (one without letters) keeps its tags where
            # they were: placing by position is exact for the same text, an alignment not.
            alignment = None if translation == self.sentences[i] else (alignments or {}).get(i)
            if alignment is not None and stripped != text:  # offsets of the text as aligned
                alignment = _shifted(alignment, len(stripped) - len(stripped.lstrip()))
            return place(points, self.sentences[i], text, alignment)
        return html.escape(text, quote=False) if self.markup else text


def respaced(gap: str, markup: bool, before: str, target: str | None) -> str:
    """`gap`, the source's text between two sentences (HTML with `markup`), as it goes
    between their translations into `target` (None: as it is), the first being `before`.
    Japanese and Chinese write no space after a sentence and most other languages one:
    "晴れ。雨。" in English is "Sunny. Rain." and "Sunny. Rain." in Japanese "晴れ。雨。".
    Only a gap within one run of text changes (no line break, no tag but inline ones): one
    with no text gets a space (after its end tags, before the rest), one of ASCII spaces
    after a sentence's end loses them."""
    if target is None or not before.strip():
        return gap
    pieces = list(_pieces(gap)) if markup else [(gap, True, None)]
    if any(not is_text and _inline(tag) is None for _, is_text, tag in pieces):
        return gap
    text = "".join(piece for piece, is_text, _ in pieces if is_text)
    if segmenter_language(target) in UNSPACED:
        if text and not text.strip(" ") and _SENTENCE_END.search(before.strip()):
            return "".join(piece for piece, is_text, _ in pieces if not is_text)
        return gap
    if text:
        return gap
    ends = next((k for k, (_, is_text, tag) in enumerate(pieces) if is_text or not tag[0]),
                len(pieces))
    return "".join(piece for piece, _, _ in pieces[:ends]) + " " + "".join(
        piece for piece, _, _ in pieces[ends:])


def has_letters(text: str) -> bool:
    """Whether `text` has a letter of any script (what a language is told by, and what a
    model translates: digits, punctuation and emoji are none)."""
    return bool(_LETTER.search(unicodedata.normalize("NFKC", text)))


def readable(sentences: Sequence[str]) -> list[int]:
    """The positions of the sentences a model translates: those with a letter. Any other (a
    number, a bullet, an emoji) is its own translation, since a model would make words of it."""
    return [n for n, sentence in enumerate(sentences) if has_letters(sentence)]


def markup_pairs(documents: Sequence[Document], translations: Sequence[str]
                 ) -> tuple[list[str], list[str]]:
    """(sources, translations) of the sentences to align, in document order: those holding
    inline markup, less those translated as themselves (one without letters), whose tags
    `join` keeps where they were; `translations` has one per sentence of all the documents."""
    pairs = [(source, target) for _, _, source, target in _to_align(documents, translations)]
    return [source for source, _ in pairs], [target for _, target in pairs]


def alignments_by_document(documents: Sequence[Document], translations: Sequence[str],
                           found: Sequence[Alignment | None] | None
                           ) -> list[dict[int, Alignment | None]]:
    """`found` (the alignments of `markup_pairs`, in its order; None: none, or none for
    that pair) as each document's sentence -> alignment, for `Document.join`."""
    remaining = iter(found or ())
    by_document: list[dict[int, Alignment | None]] = [{} for _ in documents]
    for d, i, _, _ in _to_align(documents, translations):
        by_document[d][i] = next(remaining, None)
    return by_document


def _to_align(documents: Sequence[Document], translations: Sequence[str]
              ) -> Iterator[tuple[int, int, str, str]]:
    """(document, sentence index, sentence, translation) of each sentence `markup_pairs`
    aligns."""
    offset = 0
    for d, document in enumerate(documents):
        for i in document.needs_alignment:
            if translations[offset + i] != document.sentences[i]:
                yield d, i, document.sentences[i], translations[offset + i]
        offset += len(document.sentences)


def _shifted(alignment: Alignment, by: int) -> Alignment:
    """`alignment` with its target offsets moved `by` characters to the left."""
    return dataclasses.replace(alignment, target_spans=[
        (max(a - by, 0), max(b - by, 0)) for a, b in alignment.target_spans])


class TooManyCharacters(ValueError):
    """A text holds more to translate than the caller's limit: found while it is cut, before
    the work of cutting all of it."""


class TooMuchMarkup(TooManyCharacters):
    """A file holds more markup than its reader's limit of characters allows (markup holds
    no characters, yet costs work to read): found as it is read, before the work of reading
    all of it."""


# Under a limit of characters to translate, the pieces of markup read (a page's tags; a
# .docx's paragraphs, tables, cells, runs, tabs, breaks and hyperlinks): per character
# allowed, and besides, since a page's navigation or an empty form's grid holds markup and no
# character. Each piece costs about a character's work to read.
MARKUP_PER_CHARACTER = 2
MARKUP_BESIDES = 1 << 16


def markup_allowed(max_characters: int) -> int:
    """The pieces of markup read under a limit of `max_characters` characters."""
    return MARKUP_PER_CHARACTER * max_characters + MARKUP_BESIDES


def check_markup(count: int, max_characters: int | None, pieces: str, where: str) -> None:
    """TooMuchMarkup once `count` `pieces` ("tags") read of `where` ("the page") pass what
    `markup_allowed` gives a limit of `max_characters` (None: no limit)."""
    if max_characters is not None and count > (most := markup_allowed(max_characters)):
        raise TooMuchMarkup(f"{where} has more than {most} {pieces}, the most read for "
                            f"{max_characters} characters to translate ({MARKUP_PER_CHARACTER} "
                            f"per character and {MARKUP_BESIDES} more); split it into smaller "
                            "files")


class _Builder:
    """A Document under construction: text to keep and sentences to translate, in order;
    TooManyCharacters once the sentences pass `max_characters` (None: no limit)."""

    def __init__(self, max_characters: int | None = None):
        self.sentences: list[str] = []
        self.points: list[tuple[Point, ...]] = []
        self.between: list[list[str]] = [[]]
        self.max_characters = max_characters
        self.characters = 0
        self.tags = 0

    def keep(self, text: str) -> None:
        self.between[-1].append(text)

    def check_room(self, text: str) -> None:
        """TooManyCharacters if the sentences of `text`, about to be cut, cannot fit: they
        hold all of it but its whitespace, so a long line is refused before it is cut."""
        self.check_more(_visible_length(text))

    def check_more(self, characters: int) -> None:
        """TooManyCharacters if `characters` more, about to be cut, cannot fit."""
        self._refuse_past(self.characters + characters)

    def count_tag(self) -> None:
        """TooMuchMarkup once a page holds more tags than `markup_allowed` for its limit."""
        self.tags += 1
        check_markup(self.tags, self.max_characters, "tags", "the page")

    def translate(self, sentence: str, points: tuple[Point, ...] = ()) -> None:
        self.characters += len(sentence)
        self._refuse_past(self.characters)
        self.sentences.append(sentence)
        self.points.append(points)
        self.between.append([])

    def add(self, spans: Iterator[tuple[int, int]], end: int,
            sentence: Callable[[int, int], str], kept: Callable[[int, int], str]) -> None:
        """Text [0, end) with its sentence `spans`: sentence(a, b) and kept(a, b) give the
        text of [a, b) to translate and to keep."""
        position = 0
        for start, stop in spans:
            self.keep(kept(position, start))
            self.translate(sentence(start, stop))
            position = stop
        self.keep(kept(position, end))

    def _refuse_past(self, characters: int) -> None:
        if self.max_characters is not None and characters > self.max_characters:
            raise TooManyCharacters(f"the text has more than {self.max_characters} characters "
                                    "to translate")

    def document(self, markup: bool = False) -> Document:
        points = self.points if any(self.points) else []
        return Document(self.sentences, ["".join(parts) for parts in self.between], markup,
                        points)


def segmenter_language(language: str) -> str:
    """The code sentencex is given for `language`: its base language (`base_language`), since
    sentencex gives English rules to any code it does not know, region forms included."""
    return base_language(language)


def split_text(text: str, language: str, max_characters: int | None = None) -> Document:
    """`text` cut into lines, and each line into sentences with sentencex's rules for
    `language` (a code such as "de" or "pt-BR"; unknown ones get English rules);
    TooManyCharacters as soon as the sentences hold more than `max_characters`."""
    builder = _Builder(max_characters)
    builder.check_room(text)
    builder.add(sentence_spans(text, segmenter_language(language), line_spans(text)), len(text),
                lambda a, b: text[a:b], lambda a, b: text[a:b])
    return builder.document()


def line_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each line of `text` that holds anything, its line break left out."""
    return [match.span() for match in _LINE.finditer(text)]


def sentence_spans(text: str, language: str, lines: Sequence[tuple[int, int]] | None = None
                   ) -> Iterator[tuple[int, int]]:
    """(start, end) of each sentence of `text`, stripped and in order; `language` is a
    sentencex code. Given `lines` ((start, end) of each, as `line_spans`), no sentence spans
    two; else sentencex reads line breaks as spaces (a blank line still ends a sentence)."""
    for offset, end in lines if lines is not None else [(0, len(text))]:
        for length in _segment_lengths(text[offset:end], language):
            piece = text[offset:offset + length]
            core = piece.strip()
            if core:
                start = offset + len(piece) - len(piece.lstrip())
                yield start, start + len(core)
            offset += length


def _segment_lengths(line: str, language: str) -> list[int]:
    """The lengths of sentencex's segments of `line` (each with its trailing whitespace); the
    whole line as one segment where sentencex fails, so that no text is ever lost."""
    shown = _NON_ASCII_SPACE.sub(" ", line)
    try:
        segments = list(segment(language, shown))
    except BaseException as err:  # a Rust panic is a BaseException; nothing else is caught
        if type(err).__name__ != "PanicException":
            raise
        return [len(line)]
    if "".join(segments) != shown:
        return [len(line)]
    segments = _numbers_and_titles_rejoined(_quotes_rejoined(segments, language), language)
    segments = _opening_quotes_moved(segments)
    stops = _STOPS.get(language)
    if stops is not None:
        segments = [cut for piece in segments for cut in stops.findall(piece)]
    if language in SPACE_ENDS_SENTENCES:
        segments = [cut for piece in segments for cut in _cut_at_spaces(piece, LONG_SEGMENT)]
    return [len(piece) for piece in segments if piece]


# Thai, Lao, Khmer and Myanmar end a sentence with a space (Khmer and Myanmar also with
# "។" and "။"), which sentencex has no rule for: a paragraph with no stop would be one
# sentence, cut at the model's length. A segment of them longer than LONG_SEGMENT
# characters is cut at spaces.
SPACE_ENDS_SENTENCES = frozenset(("th", "lo", "km", "my"))
# Sentence ends that sentencex has no rule for (it knows Myanmar's "။"): Khmer's khan "។" and
# bariyosan "៕", cut after where a space or the end follows (closing quotes kept with them),
# so that "។ល។" ("etc.") stays whole; the pieces are cut at spaces only if still too long.
_STOPS = {"km": re.compile(r".*?[។៕]+[\"'”’»)\]]*(?:\s+|\Z)|.+", re.DOTALL)}
LONG_SEGMENT = 200
_WORD_AND_SPACE = re.compile(r"\s*\S+\s*")


def _cut_at_spaces(piece: str, bound: int) -> list[str]:
    """`piece` cut at spaces into pieces of at most `bound` characters (but for their
    trailing spaces), each as long as it can be; a run without spaces longer than `bound`
    stays whole."""
    if len(piece) <= bound:
        return [piece]
    cuts = [""]
    for word in _WORD_AND_SPACE.findall(piece):
        if cuts[-1] and len(cuts[-1]) + len(word.rstrip()) > bound:
            cuts.append("")
        cuts[-1] += word
    return cuts


# A quotation that ends in a sentence's punctuation, and what sentencex cuts after it though
# the sentence goes on: a quotative particle in Japanese (「本当？」と聞いた), a question or an
# exclamation in Chinese (“真的吗？”然后走了; after "。”" a new sentence starts), a
# particle in Korean, joined to the quote or after a space ("좋아."라고 말했다, "좋아." 라고
# 말했다; any other word after a space starts a new sentence). Elsewhere sentencex keeps
# such a quote in its sentence. A Japanese sentence may itself begin with と: ところで,
# とても, とにかく, ... start one.
_QUOTE_END = re.compile(r"[.!?。！？．][\"'”’」』）)]+(?=\s*$)")
_GOES_ON = {"ja": re.compile(r"と(?!ころ|ても|にかく|りあえず|もかく|はいえ|きどき|うとう|"
                             r"たん|なり|つぜん)|って|など|なんて"),
            "zh": re.compile(r"(?<=[!?！？][\"'”’」』）)])[^\s\"'“‘「『（(]"),
            "ko": re.compile(r"[\uac00-\ud7a3]|\s+(?:이?라고|이?라며|고)(?![\uac00-\ud7a3])")}


def _quotes_rejoined(segments: list[str], language: str) -> list[str]:
    """sentencex's `segments` with each that ends in a quotation joined to the next where the
    sentence goes on after the quote (`_GOES_ON`)."""
    goes_on = _GOES_ON.get(language)
    if goes_on is None:
        return segments
    joined = segments[:1]
    for piece in segments[1:]:
        quote = _QUOTE_END.search(joined[-1])
        if quote and goes_on.match(joined[-1][quote.start():] + piece, len(quote.group())):
            joined[-1] += piece
        else:
            joined.append(piece)
    return joined


# Quotation marks that open a quote after a space ("..., „...", «...», ‚...'), which
# sentencex leaves at the end of the sentence before: 'Er sagte es. "' + 'Und wir ...'.
_OPENING_QUOTES = re.compile(r"""(?<=\s)["'“„«‘‚‹]+$""")


def _opening_quotes_moved(segments: list[str]) -> list[str]:
    """`segments` with quotation marks that end one after a space, and so open a quote that
    the next segment (starting without a space) holds, moved to the start of that one."""
    moved = segments[:1]
    for piece in segments[1:]:
        quotes = _OPENING_QUOTES.search(moved[-1])
        if quotes and piece[:1] and not piece[:1].isspace():
            moved[-1] = moved[-1][:quotes.start()]
            piece = quotes.group() + piece
        moved.append(piece)
    return moved


# Languages that write an ordinal as its number and a full stop ("der 2. Weltkrieg", "den 2.
# verdenskrig", "2. sijalle"), which sentencex takes for a sentence's end before a capital.
ORDINAL_DOT = frozenset(("bs", "cs", "da", "de", "et", "eu", "fi", "fo", "hr", "hu", "is", "lv",
                         "nb", "nn", "no", "pl", "sk", "sl", "sr", "tr"))
# A segment ending in a number of one to three digits and "." ("2.", "20.", "2.1."): an
# ordinal there. A year is no ordinal, so "Er kam 1939. Dann ging er." is still cut; a
# sentence that ends in a small number before a word ("Er wurde 2. Dann ...") is not.
_ORDINAL_END = re.compile(r"(?:^|(?<=[\s(\[]))(?:\d{1,3}\.)+\s+$")
# A line that starts with a list item's or a heading's number ("1. Einleitung", "2.1. Methods").
_LIST_NUMBER = re.compile(r"\s*(?:\d{1,3}\.)+\s+")
# Titles written before a name with a full stop that sentencex does not know, per language.
_TITLES = {"fr": ("M", "MM", "Mme", "Mmes", "Mlle", "Mlles", "Mgr", "Dr", "Pr", "Me"),
           "nl": ("Mevr", "Mw", "Mej", "Dhr", "Ir", "Drs", "Mr"),
           "es": ("D", "Dña", "Sr", "Sra", "Srta", "Dr", "Dra", "Lic", "Ing"),
           "de": ("Ing",)}
_TITLE_END = {language: re.compile(rf"(?:^|(?<=[\s(-]))(?:{'|'.join(titles)})\.\s+$")
              for language, titles in _TITLES.items()}
# A segment that starts with a hyphen straight after the last one's full stop is one word
# cut in two ("Dipl.-Ing.", "z.B.-Wert").
_HYPHENS = frozenset("-\u2010\u2011")


def _numbers_and_titles_rejoined(segments: list[str], language: str) -> list[str]:
    """sentencex's `segments` with each that cannot end a sentence joined to the next: a
    list item's number at the start of the line, and a cut inside a hyphenated word
    ("Dipl.-Ing."), in every language; before a word, an ordinal (in `ORDINAL_DOT`
    languages) and a title (`_TITLES`)."""
    ordinal = language in ORDINAL_DOT
    title = _TITLE_END.get(language)
    joined = segments[:1]
    for piece in segments[1:]:
        last = joined[-1]
        before_word = piece[:1].isalpha() and (
            (ordinal and _ORDINAL_END.search(last)) or (title and title.search(last)))
        inside_word = piece[:1] in _HYPHENS and last.endswith(".")
        if before_word or inside_word or (len(joined) == 1 and _LIST_NUMBER.fullmatch(last)):
            joined[-1] += piece
        else:
            joined.append(piece)
    return joined


def split_html(markup: str, language: str, max_characters: int | None = None,
               by_line: bool = False) -> Document:
    """The text of HTML `markup` cut into sentences (see the module's docstring for what is
    kept verbatim); join gives the markup with tags and attributes as they were.
    TooManyCharacters as soon as the text read (a sentence not yet ended too) holds more than
    `max_characters`, and TooMuchMarkup (a TooManyCharacters) as soon as its tags are more than
    `max_characters`, so that a page of tags alone costs no more than the limit. `by_line`:
    no sentence spans a line break of the markup anywhere (not only in <pre>), so that the
    joined translation has the markup's lines, one for one (translate.py --html); outside
    <pre>, an encoded one ("&#10;") is a space still, as without `by_line`."""
    code = segmenter_language(language)
    builder = _Builder(max_characters)
    flow = _Flow()
    for piece, translate, lined, inline in _runs(markup):
        if not translate:  # a tag (or what a verbatim element holds)
            builder.count_tag()
        if (translate and not lined) or inline is not None:
            flow.add(piece, inline)
            builder.check_more(flow.characters)  # before a sentence that runs on ends
            continue
        flow.flush(builder, code, by_line)
        if translate:
            _add_html_text(builder, piece, code, lined)
        else:
            builder.keep(piece)
    flow.flush(builder, code, by_line)
    return builder.document(markup=True)


def _add_html_text(builder: _Builder, raw: str, language: str, by_line: bool) -> None:
    """A run of HTML text: sentences unescaped, the text around them as written."""
    plain, where = unescape_with_offsets(raw)
    builder.check_room(plain)
    lines = line_spans(plain) if by_line else None
    builder.add(sentence_spans(plain, language, lines), len(plain),
                lambda a, b: plain[a:b], lambda a, b: raw[where[a]:where[b]])


class _Flow:
    """Text and inline tags between two tags that cut text (a block's text, say), gathered to
    be cut into sentences as one text: the sentences hold the tags inside them as points,
    and those between sentences are kept where they are."""

    def __init__(self):
        self.raw: list[str] = []    # the pieces as written
        self.plain: list[str] = []  # their text, unescaped, without tags
        # Per plain character: where its markup starts in the flow (and after the last, the
        # flow's end), and where it ends.
        self.starts: list[int] = []
        self.ends: list[int] = []
        # Tags: (plain offset, raw start, raw end, kind, name).
        self.tags: list[tuple[int, int, int, Kind, str]] = []
        self.length = 0  # of the raw flow
        self.plain_length = 0
        self.characters = 0  # of the plain text, but whitespace

    def add(self, piece: str, inline: tuple[Kind, str] | None) -> None:
        if inline is not None:
            self.tags.append((self.plain_length, self.length, self.length + len(piece),
                              *inline))
        else:
            plain, where = unescape_with_offsets(piece)
            self.plain.append(plain)
            self.plain_length += len(plain)
            self.characters += _visible_length(plain)
            self.starts += [self.length + w for w in where[:-1]]
            self.ends += [self.length + w for w in where[1:]]
        self.raw.append(piece)
        self.length += len(piece)

    def flush(self, builder: _Builder, language: str, by_line: bool = False) -> None:
        """Add the flow to `builder` and start a new one; `by_line`: its sentences end at
        the line breaks of the markup as written (`_written_lines`)."""
        raw, plain = "".join(self.raw), "".join(self.plain)
        builder.check_room(plain)
        partners = [point.partner for point in pair_points(
            [(offset, "", kind, name) for offset, _, _, kind, name in self.tags])]
        # The tags are in order of both offsets: each sentence finds its own by bisection,
        # so that a flow of many sentences and tags takes linear time.
        offsets = [offset for offset, *_ in self.tags]
        raw_starts = [a for _, a, *_ in self.tags]
        kept = 0  # the flow's markup up to here is in `builder`
        lines = self._written_lines(raw, plain) if by_line else None
        for start, end in sentence_spans(plain, language, lines):
            first, last = self._sentence_markup(start, end, partners, offsets)
            builder.keep(raw[kept:first])
            inside = self.tags[bisect.bisect_left(raw_starts, first):
                               bisect.bisect_left(raw_starts, last)]
            points = [(offset - start, raw[a:b], kind, name)
                      for offset, a, b, kind, name in inside]
            builder.translate(plain[start:end], tuple(pair_points(points)))
            kept = last
        builder.keep(raw[kept:])
        self.__init__()

    def _written_lines(self, raw: str, plain: str) -> list[tuple[int, int]]:
        """The lines of the flow's `plain` text where the markup `raw` breaks its lines: an
        encoded line break ("&#10;") is a space to the browser and to the server, and stays
        inside its line, so that a sentence is cut as the server cuts it."""
        written = _LINE_BREAK_CHARACTER.sub(
            lambda match: match.group() if raw[self.starts[match.start()]] == match.group()
            else " ", plain)
        return line_spans(written)

    def _sentence_markup(self, start: int, end: int, partners: list[int | None],
                         offsets: list[int]) -> tuple[int, int]:
        """[first, last) of the flow's markup that sentence [start, end) of the plain text
        takes: its characters, with the tags inside it and those at its edges whose partner
        is inside (a tag pair around the whole sentence stays outside it). `offsets`: each
        tag's plain offset, in order."""
        first, last = self.starts[start], self.ends[end - 1]
        for index in [*_indices_of(offsets, start), *_indices_of(offsets, end)]:
            (offset, a, b, kind, _), partner = self.tags[index], partners[index]
            if partner is None or not start < self.tags[partner][0] < end:
                continue
            if offset == start and kind == "open":
                first = min(first, a)
            elif offset == end and kind == "close":
                last = max(last, b)
        return first, last


def _indices_of(values: list[int], value: int) -> range:
    """Where `value` is in the sorted `values`."""
    return range(bisect.bisect_left(values, value), bisect.bisect_right(values, value))


def _visible_length(text: str) -> int:
    """The characters of `text` but its whitespace."""
    return sum(map(len, text.split()))


def unescape_with_offsets(raw: str) -> tuple[str, list[int]]:
    """(html.unescape(raw), where): where[i] is the offset in `raw` of the text that gave
    character i of the result (len(result) + 1 entries, the last len(raw)).

    A character reference maps its characters to where it starts; what html.unescape copies
    as it was (an unknown name, the letters after a legacy one as in "&ampx") maps one to
    one, so whitespace next to a reference is copied as written.
    """
    plain, where, position = [], [], 0
    for match in _CHARREF.finditer(raw):
        _copy(raw, position, match.start(), plain, where)
        token, text = match.group(), html.unescape(match.group())
        # "&#59;" -> ";": a reference gives at least one character of its own.
        same = len(text) if text == token else min(_common_suffix(token, text), len(text) - 1)
        plain.append(text[:len(text) - same])
        where += [match.start()] * (len(text) - same)
        _copy(raw, match.end() - same, match.end(), plain, where)
        position = match.end()
    _copy(raw, position, len(raw), plain, where)
    return "".join(plain), where + [len(raw)]


def _copy(raw: str, start: int, end: int, plain: list[str], where: list[int]) -> None:
    plain.append(raw[start:end])
    where += range(start, end)


def _common_suffix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


def _runs(markup: str) -> Iterator[tuple[str, bool, bool, tuple[Kind, str] | None]]:
    """(piece, translate it, cut it into lines, (kind, name) of an inline tag that may sit
    inside a sentence, or None) for consecutive pieces of `markup`."""
    around = _OpenElements()  # outside the verbatim element
    hidden: _KeptWhole | None = None  # the verbatim element open
    lined = 0  # <pre> depth
    for piece, is_text, tag in _pieces(markup):
        foreign = tag is not None and _foreign(tag[1], around)
        inline = _inline(tag, foreign) if hidden is None and lined == 0 else None
        yield piece, is_text and hidden is None, lined > 0, inline
        if tag is None:
            continue
        closing, name, attributes = tag
        if name in _VOID or not closing and _empty(name, attributes, foreign):
            continue
        if name in LINED:
            lined = max(lined - 1, 0) if closing else lined + 1
        if hidden is not None:
            ended, hidden = hidden, None
            if not ended.ends_at(closing, name, around):
                hidden = ended
                continue
            if closing and name == ended.name:
                continue  # its own end tag: it was never among `around`
        if closing:
            around.close(name)
        elif _kept_whole(name, attributes):
            hidden = _KeptWhole(name)
        else:
            around.open(name)


# Elements whose end tag HTML lets one leave out, each ended by the start tags listed (unless
# an element of the second list opened inside it holds them: a nested list's <li>).
_IMPLIED_END: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "p": (frozenset(("address", "article", "aside", "blockquote", "details", "dialog", "div",
                     "dl", "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2",
                     "h3", "h4", "h5", "h6", "header", "hgroup", "hr", "main", "menu", "nav",
                     "ol", "p", "pre", "search", "section", "table", "ul")), frozenset()),
    "li": (frozenset(("li",)), frozenset(("ul", "ol", "menu"))),
    **dict.fromkeys(("dt", "dd"), (frozenset(("dt", "dd")), frozenset(("dl",)))),
    **dict.fromkeys(("td", "th"), (frozenset(("td", "th", "tr", "tbody", "thead", "tfoot")),
                                   frozenset(("table",)))),
    "tr": (frozenset(("tr", "tbody", "thead", "tfoot")), frozenset(("table",))),
    **dict.fromkeys(("thead", "tbody", "tfoot"), (frozenset(("tbody", "tfoot")),
                                                  frozenset(("table",)))),
    "option": (frozenset(("option", "optgroup")), frozenset()),
    "optgroup": (frozenset(("optgroup",)), frozenset()),
    **dict.fromkeys(("rb", "rt", "rtc", "rp"), (frozenset(("rb", "rt", "rtc", "rp")),
                                                frozenset(("ruby",)))),
}


class _OpenElements:
    """The names of the elements open, as a stack whose end tags close everything opened
    after the element they end (a stray end tag closes nothing); each element is pushed and
    popped once, however malformed the markup."""

    def __init__(self):
        self.names: list[str] = []
        self.at: dict[str, list[int]] = {}  # name -> its places in `names`

    def open(self, name: str) -> None:
        self.at.setdefault(name, []).append(len(self.names))
        self.names.append(name)

    def close(self, name: str) -> None:
        if self.at.get(name):
            last = self.at[name][-1]
            while len(self.names) > last:
                self.at[self.names.pop()].pop()

    def __contains__(self, name: str) -> bool:
        return bool(self.at.get(name))


class _KeptWhole:
    """An element kept verbatim and where it ends: at its own end tag, at the end tag of an
    element around it, or where HTML implies its end (`_IMPLIED_END`: a <p translate="no">
    whose </p> was left out ends at the next <p>)."""

    def __init__(self, name: str):
        self.name = name
        self.inside: dict[str, int] = {}  # elements opened inside it and not closed

    def ends_at(self, closing: bool, name: str, around: _OpenElements) -> bool:
        """Whether the tag (not void) ends the element, else counted as inside it."""
        if closing:
            if self.inside.get(name):
                self.inside[name] -= 1
                return False
            return name == self.name or name in around
        implied, held_by = _IMPLIED_END.get(self.name, (frozenset(), frozenset()))
        if name in implied and not any(self.inside.get(n) for n in held_by):
            return True
        self.inside[name] = self.inside.get(name, 0) + 1
        return False


def _inline(tag: tuple[bool, str, str] | None, foreign: bool = False
            ) -> tuple[Kind, str] | None:
    """(kind, name) of a tag that may sit inside a sentence: a phrasing element's start or
    end tag (not one kept whole with what it holds), or an inline void element; `foreign`:
    the tag is in SVG or MathML (`_empty`)."""
    if tag is None:
        return None
    closing, name, attributes = tag
    if name in INLINE_VOID and not closing:
        return "void", name
    if name not in INLINE or (not closing and _kept_whole(name, attributes)):
        return None
    if not closing and _empty(name, attributes, foreign):
        return "void", name
    return ("close" if closing else "open"), name


def _foreign(name: str, around: _OpenElements) -> bool:
    """Whether a tag named `name` is SVG's or MathML's: <svg> and <math> themselves, and
    every tag inside them."""
    return name in _FOREIGN or any(element in around for element in _FOREIGN)


def _empty(name: str, attributes: str, foreign: bool) -> bool:
    """Whether a start tag opens an element with nothing inside it: a void element (<br>,
    <img>), or in SVG and MathML (`foreign`) a tag ending in "/>". As browsers read HTML,
    "/>" does not end any other element (<span/> opens a span), and a "/" that ends an
    unquoted value belongs to the value (<a href=/docs/> opens a link)."""
    if name in _VOID:
        return True
    if not foreign:
        return False
    written = attributes.rstrip()
    return written.endswith("/") and not any(
        match.end() == len(written) for match in _ATTRIBUTE.finditer(written))


def _kept_whole(name: str, attributes: str) -> bool:
    """Whether the element a start tag opens is kept verbatim with all it holds."""
    if name in _VOID:
        return False
    found = _attributes(attributes)
    return (name in VERBATIM or found.get("translate", "").lower() == "no"
            or "notranslate" in found.get("class", "").split())


def _attributes(text: str) -> dict[str, str]:
    """A start tag's attributes (the text after its name): name (lower case) -> value."""
    found: dict[str, str] = {}
    for match in _ATTRIBUTE.finditer(text):
        value = next((v for v in match.group(2, 3, 4) if v is not None), "")
        found.setdefault(match.group(1).lower(), value.strip())
    return found


def _pieces(markup: str) -> Iterator[tuple[str, bool, tuple[bool, str, str] | None]]:
    """(piece, is text, (closing, lower-case name, attributes) of a tag or None) for the
    consecutive pieces of `markup`: text, tags, other markup, raw text elements' contents."""
    ends = _TagEnds(markup)
    text_start = position = 0
    while (start := markup.find("<", position)) != -1:
        found = _markup_at(markup, start, ends)
        if found is None:  # a "<" that opens nothing is text
            position = start + 1
            continue
        end, tag = found
        if start > text_start:
            yield markup[text_start:start], True, None
        yield markup[start:end], False, tag
        if tag and not tag[0] and tag[1] in RAW_TEXT:
            close = _raw_text_end(tag[1]).search(markup, end)
            stop = close.start() if close else len(markup)
            if stop > end:
                yield markup[end:stop], False, None
            end = stop
        position = text_start = end
    if text_start < len(markup):
        yield markup[text_start:], True, None


def _markup_at(markup: str, start: int, ends: _TagEnds
               ) -> tuple[int, tuple[bool, str, str] | None] | None:
    """(end, the tag's closing, name and attributes or None) of the markup starting at the
    "<" at `start`, or None where that "<" opens nothing (it is text)."""
    # A comment's "-->" may overlap its "<!--": "<!-->" and "<!--->" are empty comments.
    for opening, closing, skip in (("<!--", "-->", 2), ("<![CDATA[", "]]>", 9)):
        if markup.startswith(opening, start):  # unclosed, it runs to the end
            end = markup.find(closing, start + skip)
            return (end + len(closing) if end != -1 else len(markup)), None
    if markup.startswith(("<!", "<?"), start):  # <!DOCTYPE html>, <?xml ... ?>
        end = ends.next_gt(start)
        return (end + 1, None) if end is not None else None
    name = _TAG_NAME.match(markup, start)
    end = ends.after(name.end()) if name else None
    if end is None:
        return None
    return end + 1, (markup[start + 1] == "/", name.group(1).lower(), markup[name.end():end])


class _TagEnds:
    """Where tags end, found for the whole markup in one pass from its end: a scan from each
    "<" would make many that open nothing ("a <b" repeated, no ">") cost quadratic time."""

    def __init__(self, markup: str):
        self.markup = markup
        self.stops = [match.start() for match in _TAG_STOP.finditer(markup)]
        self.ends: list[int | None] = [None] * len(self.stops)
        for k in reversed(range(len(self.stops))):
            stop = self.stops[k]
            if markup[stop] == ">":
                self.ends[k] = stop
            else:  # a quoted value is skipped whole; an unclosed quote is a character
                value = _QUOTED_VALUE.match(markup, stop)
                self.ends[k] = self.after(value.end() if value else stop + 1)
        self.last_gt = markup.rfind(">")

    def after(self, position: int) -> int | None:
        """The ">" ending a tag whose attributes start at `position`, or None."""
        k = bisect.bisect_left(self.stops, position)
        return self.ends[k] if k < len(self.stops) else None

    def next_gt(self, position: int) -> int | None:
        """The first ">" from `position` on, or None."""
        return self.markup.find(">", position) if position < self.last_gt else None


def _raw_text_end(name: str) -> re.Pattern:
    """Where a raw text element's contents end: its end tag, in any case."""
    return re.compile(rf"</{name}(?=[\s/>]|\Z)", re.IGNORECASE)
