"""Files translated whole, their layout and formatting kept: plain text, HTML and Word
(.docx), for the server's /translate_file.

    prepared = prepare(data, "report.docx", "en")   # ValueError for a file it cannot read
    texts = [document.join(translations_of(document), target="de")
             for document in prepared.documents]
    translated_bytes = prepared.rebuild(texts)

Two phases, so that a server can refuse a file by its `characters` before translating any of
it, and translate the sentences of all its documents in one batched search in between.

A text file is one `split_text` document (a UTF-8 BOM kept aside, line endings as they were),
an HTML page one `split_html` document (a charset its meta elements name set to utf-8, as
the translation is UTF-8). In a .docx each paragraph (of the body, of tables at
any depth, of headers and footers) is one HTML fragment whose runs are inline elements: a run
of text `<span data-r="N">`, a tab `<span data-r="N"> </span>` (a space to the model), a
picture, a symbol, a whole field or text in any other wrapper (a tracked insertion, a smart
tag, a content control...) `<img data-r="N">`, a hyperlink `<a data-h="N">` around
its runs, and a line break `<br data-r="N">`, which ends a sentence as a line does.
`split_html` translates each sentence whole and puts the tags back around the words they
enclosed (`nmt.translation.inline_markup`), so on rebuild each run gets the text now inside
its span and the runs are put in the order their tags now have: bold, italic, fonts and links
stay on their words when a translation reorders them. Text left outside every span (the
spaces between words, mostly) goes to the run next to it (spaces between two runs split by
how many each had at that edge), a picture or field gets the spaces
it had around it, and a translation under the identity gives every run its text back.

Not translated, kept as they are: text boxes, footnotes and endnotes, comments, content
controls (w:sdt), tracked changes, smart tags, custom XML, simple fields and their results,
text in a direction override (w:dir, w:bdo), alt text, hidden text (w:vanish).
A .docx is refused (ValueError) when it is not a readable Word file or unpacks to more than
MAX_UNPACKED_BYTES, counted as it unpacks (the sizes a zip states are the sender's to write).
Given a limit of characters to translate, its markup is held to that limit too
(TooMuchMarkup), since a few kilobytes of zip can hold millions of empty paragraphs that cost
work and hold no character: its parts may hold XML_TAGS_PER_CHARACTER tags per character
allowed (and XML_TAGS_BESIDES more, for styles and settings), counted as they unpack, before
they are parsed; and as many paragraphs, tables, table cells, runs, tabs, line breaks and
hyperlinks are read as `paragraphs.markup_allowed` allows, each counted before the work of
reading it.
"""

from __future__ import annotations

import copy
import dataclasses
import html
import io
import re
import zipfile
import zlib
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import PurePath

import docx  # python-docx (the serve extra)
from docx.opc.exceptions import OpcError
from docx.oxml import OxmlElement
from docx.table import Table, _Cell
from docx.text.paragraph import Paragraph
from docx.text.run import Run
from lxml import etree

from nmt.translation.paragraphs import (
    Document,
    TooManyCharacters,
    TooMuchMarkup,
    check_markup,
    split_html,
    split_text,
)

MEDIA_TYPES = {
    ".txt": "text/plain; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".htm": "text/html; charset=utf-8",
    ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
}
FILE_SUFFIXES = tuple(MEDIA_TYPES)
# A .docx is a zip: what it unpacks to is bounded, or a few compressed megabytes of repeated
# XML could take gigabytes to read.
MAX_UNPACKED_BYTES = 256 << 20
# Under a limit of characters, the XML tags a .docx's parts may hold: per character allowed,
# and besides (python-docx's own template holds 24,000 tags of styles and settings). A Word
# document holds about one tag per character; an empty paragraph, "<w:p/>", is one.
XML_TAGS_PER_CHARACTER = 8
XML_TAGS_BESIDES = 1 << 18
_BOM = "\ufeff"


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A file cut into documents to translate; `rebuild(texts)` (once) gives the translated
    file from each document's joined translation, in order."""

    documents: list[Document]
    rebuild: Callable[[list[str]], bytes]

    @property
    def characters(self) -> int:
        """The characters of all the sentences to translate."""
        return sum(len(sentence) for document in self.documents
                   for sentence in document.sentences)


def kind_of(filename: str) -> str:
    """The file's suffix, lower case; ValueError for a kind not translated here."""
    suffix = PurePath(filename).suffix.lower()
    if suffix not in MEDIA_TYPES:
        raise ValueError(f"files of kind {suffix or '(no suffix)'} are not translated; send "
                         f"one of {', '.join(FILE_SUFFIXES)}")
    return suffix


def media_type(filename: str) -> str:
    return MEDIA_TYPES[kind_of(filename)]


def prepare(data: bytes, filename: str, language: str,
            max_characters: int | None = None) -> Prepared:
    """`data`, a file named `filename`, cut into documents for sentences in `language`;
    ValueError saying what is wrong with a file that cannot be read, TooManyCharacters as
    soon as what is read holds more than `max_characters` to translate (a .docx's paragraphs
    as they are read: a few kilobytes of zip can hold a million; a text's or a page's
    sentences as they are cut), and TooMuchMarkup (a TooManyCharacters) for a .docx holding
    more markup than the module's docstring says that limit allows, so that an oversized
    file costs no more than the limit."""
    kind = kind_of(filename)
    if kind == ".docx":
        return _prepare_docx(data, language, max_characters)
    text = _decode(data)
    bom = _BOM if text.startswith(_BOM) else ""
    if kind == ".txt":
        return Prepared([split_text(text[len(bom):], language, max_characters)],
                        lambda texts: (bom + _one(texts)).encode("utf-8"))
    return Prepared([split_html(text[len(bom):], language, max_characters)],
                    lambda texts: (bom + _declared_utf8(_one(texts))).encode("utf-8"))


def _one(texts: list[str]) -> str:
    if len(texts) != 1:
        raise ValueError(f"{len(texts)} texts for a file of one document")
    return texts[0]


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"not UTF-8 text: byte 0x{data[err.start]:02x} at offset "
                         f"{err.start}; save it as UTF-8") from None


# The charset a meta element names: its charset attribute, or the parameter in the content of
# one with http-equiv="Content-Type".
_CHARSET = re.compile(r"""(charset\s*=\s*["']?)([^"'\s;>/]+)""", re.IGNORECASE)
# The encoding an XHTML page's XML declaration names, which an XML reader of the saved page
# follows before any meta element.
_XML_ENCODING = re.compile(r"""\A(\s*<\?xml\s[^>]*?\bencoding\s*=\s*["'])([^"']+)""")


def _declared_utf8(page: str) -> str:
    """`page` with its XML declaration and each meta element naming a charset other than
    UTF-8 naming UTF-8 instead, all else as it was: the page goes out (and is saved) as UTF-8
    bytes, which a browser would read as the charset the page declared."""
    page = _XML_ENCODING.sub(_utf8, page, count=1)
    parser = _CharsetMetas()
    parser.feed(page)
    parser.close()
    line_starts = [0] + [match.end() for match in re.finditer("\n", page)]
    out, done = [], 0
    for (line, column), tag in parser.found:
        start = line_starts[line - 1] + column
        if page.startswith(tag, start):
            out += [page[done:start], _CHARSET.sub(_utf8, tag, count=1)]
            done = start + len(tag)
    return "".join(out) + page[done:]


def _utf8(match: re.Match) -> str:
    name = match[2] if match[2].lower() in ("utf-8", "utf8") else "utf-8"
    return match[1] + name


class _CharsetMetas(HTMLParser):
    """Where the meta elements that declare a charset start in a page (line from 1, column)
    and their start tags as written; tags in comments and scripts are none."""

    def __init__(self):
        super().__init__(convert_charrefs=False)
        self.found: list[tuple[tuple[int, int], str]] = []

    def handle_starttag(self, tag, attrs):
        values = {name: value or "" for name, value in attrs}
        if tag == "meta" and ("charset" in values
                              or values.get("http-equiv", "").lower() == "content-type"):
            self.found.append((self.getpos(), self.get_starttag_text()))


# ----------------------------------------------------------------------------- .docx

_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
# Run content that is text (python-docx's run.text reads it, its setter writes it back);
# lastRenderedPageBreak is Word's note of where it last broke a page, dropped with no loss.
_TEXT = frozenset(("t", "noBreakHyphen", "softHyphen", "lastRenderedPageBreak"))
_BREAKS = frozenset(("br", "cr"))
_TAB = "tab"
# What reading a broken .docx raises: the zip, its XML, or python-docx's view of the package
# (an element it expects missing: AttributeError, TypeError, IndexError).
_UNREADABLE = (zipfile.BadZipFile, KeyError, ValueError, EOFError, NotImplementedError,
               RuntimeError, zlib.error, etree.LxmlError, OpcError, AttributeError, TypeError,
               IndexError)
_UNPACK_CHUNK = 1 << 20  # bytes unpacked at a time while counting (`_check_unpacked_size`)
# Characters XML 1.0 cannot hold, which a translation must not bring in.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _prepare_docx(data: bytes, language: str, max_characters: int | None) -> Prepared:
    document = _open_docx(data, max_characters)
    try:
        fragments = _fragments(document, _Allowance(max_characters))
    except _UNREADABLE as err:  # a part python-docx cannot read as Word's
        if isinstance(err, TooManyCharacters):
            raise
        raise ValueError(f"not a valid .docx file ({type(err).__name__}: {err})") from None
    documents = [split_html(fragment.markup, language) for fragment in fragments]

    def rebuild(texts: list[str]) -> bytes:
        if len(texts) != len(fragments):
            raise ValueError(f"{len(texts)} texts for {len(fragments)} paragraphs")
        for fragment, text in zip(fragments, texts):
            fragment.write_back(text)
        out = io.BytesIO()
        document.save(out)
        return out.getvalue()

    return Prepared(documents, rebuild)


class _Allowance:
    """What reading a .docx may still cost under a limit of characters to translate (None:
    none): as many characters, and pieces of markup (paragraphs, tables, cells, runs...) in
    proportion, each counted before the work of reading it."""

    def __init__(self, limit: int | None):
        self.limit = limit
        self.characters = 0
        self.pieces = 0

    def spend_characters(self, count: int) -> None:
        self.characters += count
        if self.limit is not None and self.characters > self.limit:
            raise TooManyCharacters(f"the file has more than {self.limit} characters to "
                                    "translate")

    def spend_pieces(self, count: int) -> None:
        self.pieces += count
        check_markup(self.pieces, self.limit, "paragraphs, tables, table cells, runs, tabs, "
                     "line breaks and hyperlinks", "the .docx file")


# What a paragraph's text may hold besides whitespace (python-docx's run.text reads tabs and
# breaks as whitespace): a paragraph without one is not read further.
_VISIBLE = (_W + "t", _W + "noBreakHyphen")
# A paragraph's pieces that its reading works on, one by one.
_PIECES = tuple(_W + name for name in ("r", "tab", "br", "cr", "hyperlink"))


def _fragments(document, allowance: _Allowance) -> list[_Fragment]:
    """The paragraphs with text to translate; TooManyCharacters once they pass the limit."""
    fragments = []
    for p, container, depth in _in_fields(_paragraphs(document, allowance)):
        allowance.spend_pieces(sum(1 for _ in p.iter(*_PIECES)))
        if next(p.iter(*_VISIBLE), None) is None:
            continue  # an empty paragraph costs no more than this
        paragraph = Paragraph(p, container)
        text = paragraph.text.strip()
        if not text:
            continue
        allowance.spend_characters(len(text))
        fragment = _Fragment(paragraph, depth)
        if fragment.has_text:
            fragments.append(fragment)
    return fragments


def _in_fields(paragraphs: Iterator[tuple]) -> Iterator[tuple]:
    """Each (w:p element, its container) with the number of fields open where it begins: a
    field (a table of contents) may span the paragraphs of a container (the body, a cell, a
    header)."""
    parent, depth = None, 0
    for p, container in paragraphs:
        if p.getparent() is not parent:
            parent, depth = p.getparent(), 0
        yield p, container, depth
        depth = max(0, depth + _field_depth(p))


def _open_docx(data: bytes, max_characters: int | None):
    """The python-docx Document of `data`; ValueError for what is not a .docx or unpacks to
    more than MAX_UNPACKED_BYTES, TooMuchMarkup for one whose XML holds more tags than
    `max_characters` allows (see the module's docstring)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            _check_unpacked_size(archive, max_characters)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError) as err:
        raise ValueError(f"not a valid .docx file ({type(err).__name__}: {err})") from None
    try:
        return docx.Document(io.BytesIO(data))
    except _UNREADABLE as err:
        raise ValueError(f"not a valid .docx file ({type(err).__name__}: {err})") from None


def _check_unpacked_size(archive: zipfile.ZipFile, max_characters: int | None) -> None:
    """ValueError once the entries, unpacked a chunk at a time, pass MAX_UNPACKED_BYTES: the
    sizes the zip states may lie (a small file claiming small entries that unpack to
    gigabytes), and unpacking an entry whole would hold it all at once. An entry that unpacks
    to other than its stated size fails its CRC check (BadZipFile). TooMuchMarkup once they
    hold more "<" (an upper bound of their tags, counted in every entry, as any may be XML)
    than `max_characters` allows, before python-docx parses one."""
    unpacked = tags = 0
    max_tags = (None if max_characters is None
                else XML_TAGS_PER_CHARACTER * max_characters + XML_TAGS_BESIDES)
    for info in archive.infolist():
        with archive.open(info) as entry:
            while chunk := entry.read(_UNPACK_CHUNK):
                unpacked += len(chunk)
                tags += chunk.count(b"<")
                if unpacked > MAX_UNPACKED_BYTES:
                    raise ValueError(f"the .docx file unpacks to more than the "
                                     f"{MAX_UNPACKED_BYTES} bytes read here; split it into "
                                     "smaller files")
                if max_tags is not None and tags > max_tags:
                    raise TooMuchMarkup(
                        f"the .docx file's XML holds more than {max_tags} tags, the most read "
                        f"for {max_characters} characters to translate "
                        f"({XML_TAGS_PER_CHARACTER} per character and {XML_TAGS_BESIDES} more); "
                        "split it into smaller files")


def _paragraphs(document, allowance: _Allowance) -> Iterator[tuple]:
    """(w:p element, its container) for every paragraph of the body, its tables (nested ones
    too), headers and footers, each once (a merged cell is one cell; a header linked to the
    previous section is that one); each paragraph, table and cell is spent from
    `allowance` before it is read."""
    seen: set = set()  # XML elements, held so that no other element can take their identity
    for part in _parts(document):
        yield from _in_container(part, seen, allowance)


def _parts(document) -> Iterator:
    yield document._body
    for section in document.sections:
        for part in (section.header, section.footer, section.first_page_header,
                     section.first_page_footer, section.even_page_header,
                     section.even_page_footer):
            if not part.is_linked_to_previous:
                yield part


def _in_container(container, seen: set, allowance: _Allowance) -> Iterator[tuple]:
    """The paragraphs of a container (the body, a header, a cell), then its tables'. The
    XML is walked here, not through python-docx's lists: those are built whole before the
    first item is counted, and its row.cells repeats a cell for each grid column it spans
    (a span the file states: a billion for one cell) and walks up a vertical merge from
    each of its cells (quadratic in its rows). A cell that continues a vertical merge is
    the cell above it, read there."""
    element = container._element
    for p in element.iterchildren(_W + "p"):
        allowance.spend_pieces(1)
        if p not in seen:
            seen.add(p)
            yield p, container
    for tbl in element.iterchildren(_W + "tbl"):
        allowance.spend_pieces(1)
        table = Table(tbl, container)
        for tr in tbl.iterchildren(_W + "tr"):
            for tc in tr.iterchildren(_W + "tc"):
                allowance.spend_pieces(1)
                if tc not in seen and tc.vMerge != "continue":
                    seen.add(tc)
                    yield from _in_container(_Cell(tc, table), seen, allowance)


@dataclasses.dataclass(eq=False)
class _Unit:
    """Consecutive children of a paragraph (or of a hyperlink in it) that move together: a
    run ("text", "tab", "break" or "other": a picture, a symbol...), a whole field, or a
    hyperlink ("link") with the units of its runs."""

    number: int
    kind: str
    elements: list
    run: Run | None = None  # a text run, whose text is set
    source: str = ""  # its text before translation
    inner: list[_Unit] = dataclasses.field(default_factory=list)
    # "other": whether the source had a space right before it, and right after it.
    spaced: tuple[bool, bool] = (False, False)


class _Fragment:
    """A paragraph as HTML (the module's docstring shows how), and written back from its
    translation."""

    def __init__(self, paragraph, depth: int = 0):
        """`depth`: the fields open where the paragraph begins (begun in one before it)."""
        self.paragraph = paragraph
        self.units: list[_Unit] = []  # all of them, by number
        self.top = self._units(paragraph._p, depth)
        self.markup = "".join(map(self._markup, self.top))
        self.has_text = any(unit.source.strip() for unit in self.units)
        _note_spacing(list(_flat(self.top)))

    def _units(self, parent, depth: int = 0) -> list[_Unit]:
        """The units among `parent`'s children: a child holding text in a wrapper (a
        tracked insertion, smart tag, content control, simple field...) is an "other" unit,
        kept with the spaces around it; the rest (paragraph properties, bookmarks...) are
        none and stay where they are. A field, from the child that begins it (or from the
        first, while `depth` fields begun before `parent` are open) to the one that ends it,
        is one "other" unit."""
        _split_runs(parent)
        units: list[_Unit] = []
        field: _Unit | None = None
        for child in list(parent):
            name = _local(child)
            if depth > 0 or _field_depth(child) > 0:  # inside a field: up to its end
                if field is None:
                    field = self._add(units, "other", [])
                field.elements.append(child)
                depth = max(0, depth + _field_depth(child))
                field = field if depth > 0 else None
            elif name == "r":
                kind = _run_kind(child)
                unit = self._add(units, kind, [child])
                if kind == "text":
                    unit.run = Run(child, self.paragraph)
                    unit.source = unit.run.text
            elif name == "hyperlink":
                self._add(units, "link", [child]).inner = self._units(child)
            elif next(child.iter(_W + "t"), None) is not None:
                self._add(units, "other", [child])  # a tracked insertion, smart tag...
        return units

    def _add(self, units: list[_Unit], kind: str, elements: list) -> _Unit:
        unit = _Unit(len(self.units), kind, elements)
        self.units.append(unit)
        units.append(unit)
        return unit

    def _markup(self, unit: _Unit) -> str:
        number = unit.number
        if unit.kind == "text":
            return f'<span data-r="{number}">{html.escape(unit.source, quote=False)}</span>'
        if unit.kind == "tab":
            return f'<span data-r="{number}"> </span>'
        if unit.kind == "break":
            return f'<br data-r="{number}">'
        if unit.kind == "link":
            return f'<a data-h="{number}">{"".join(map(self._markup, unit.inner))}</a>'
        return f'<img data-r="{number}">'

    def write_back(self, translated: str) -> None:
        """Each text run's text set to what its span holds in `translated` (text outside
        spans to a neighbour), and the units put in the order of their tags there."""
        reading = _Reading.of(translated)
        texts = _Texts(self.units, reading.pieces).texts()
        for unit in self.units:
            if unit.run is not None:
                text = _NOT_XML.sub("", texts.get(unit.number, ""))
                if text != unit.source:
                    unit.run.text = text
        for units in self._containers(self.top):
            _rearrange(units, _new_order(units, reading.order))

    def _containers(self, units: list[_Unit]) -> Iterator[list[_Unit]]:
        yield units
        for unit in units:
            if unit.kind == "link":
                yield from self._containers(unit.inner)


def _flat(units: list[_Unit]) -> Iterator[_Unit]:
    """The units in the order of the paragraph, a hyperlink's after it."""
    for unit in units:
        yield unit
        yield from _flat(unit.inner)


def _note_spacing(units: list[_Unit]) -> None:
    """Set `spaced` of each "other" unit from the text around it in the source."""
    texts = [{"tab": "\t", "break": "\n"}.get(unit.kind, unit.source) for unit in units]
    before, last = [], ""  # the character right before each unit
    for text in texts:
        before.append(last)
        last = text[-1:] or last
    after, first = [""] * len(units), ""  # right after each
    for i in reversed(range(len(units))):
        after[i] = first
        first = texts[i][:1] or first
    for unit, b, a in zip(units, before, after):
        if unit.kind == "other":
            unit.spaced = (b.isspace(), a.isspace())


class _Texts:
    """The text of each text run from a translated fragment's pieces (`_Reading`)."""

    def __init__(self, units: list[_Unit], pieces: list[tuple[int | None, str]]):
        self.units = units
        self.numbers = [number for number, _ in pieces]
        self.pieces = [text for _, text in pieces]
        self.kinds = [units[n].kind if n is not None else None for n in self.numbers]

    def texts(self) -> dict[int, str]:
        """What each text run's span holds, and each piece outside text spans given to the
        text run before it or after it: spaces to the one whose tag they touch where only
        one does, split between the two where both do (`_split_spaces`), else as
        `_neighbour` says."""
        self._drop_tab_spaces()
        self._space_others()
        owners = [n if kind == "text" else None for n, kind in zip(self.numbers, self.kinds)]
        texts: dict[int, list[str]] = {}
        for i in range(len(self.pieces)):
            for owner, part in self._owned(owners, i, texts):
                texts.setdefault(owner, []).append(part)
        return {number: "".join(parts) for number, parts in texts.items()}

    def _owned(self, owners: list[int | None], i: int,
               texts: dict[int, list[str]]) -> list[tuple[int, str]]:
        """Piece `i` as (text run, part of it) pairs: the run whose span holds it, else the
        neighbour or neighbours it goes to (`texts`: what the runs hold so far)."""
        text = self.pieces[i]
        if owners[i] is not None or not text:
            return [(owners[i], text)] if owners[i] is not None else []
        before, after = owners[i - 1] if i else None, _at(owners, i + 1)
        if not text.strip() and None not in (before, after) and before != after:
            return self._split_spaces(text, before, after, "".join(texts.get(before, [])))
        if not text.strip() and (before, after) != (None, None):
            return [(before if after is None else after, text)]
        owner = self._neighbour(text, _last(owners[:i]), _first(owners[i + 1:]))
        return [(owner, text)] if owner is not None else []

    def _split_spaces(self, text: str, before: int, after: int,
                      held: str) -> list[tuple[int, str]]:
        """Spaces between the spans of two text runs, the run before holding `held` so far:
        to the run before as many as its source ended with and it lacks, to the run after as
        many as its source began with, what is left over to the run before (to the run after
        where the run before did not end with a space); so each gets back the spaces it had
        at that edge."""
        ending, beginning = self.units[before].source, self.units[after].source
        lacking = _edge_spaces(ending[::-1]) - _edge_spaces(held[::-1])
        to_before = max(0, min(lacking, len(text)))
        to_after = min(_edge_spaces(beginning), len(text) - to_before)
        if _edge_spaces(ending[::-1]) == 0:
            to_after = len(text) if to_after else 0
        cut = len(text) - to_after
        return [(owner, part) for owner, part in ((before, text[:cut]), (after, text[cut:]))
                if part]

    def _pieces_of(self, kind: str) -> dict[int, list[int]]:
        """The units of `kind` in the translation: number -> the indices of their pieces."""
        found: dict[int, list[int]] = {}
        for i, (number, k) in enumerate(zip(self.numbers, self.kinds)):
            if k == kind:
                found.setdefault(number, []).append(i)
        return found

    def _drop_tab_spaces(self) -> None:
        """For each tab whose span holds no words, drop the space that stood for it: one
        inside its span, else the last before it, else the first after it."""
        for inside in self._pieces_of("tab").values():
            if any(self.pieces[i].strip() for i in inside):
                continue
            for i in inside + [inside[0] - 1]:
                if self._ends_with_space(i):
                    self.pieces[i] = self.pieces[i][:-1]
                    break
            else:
                if self._starts_with_space(inside[-1] + 1):
                    self.pieces[inside[-1] + 1] = self.pieces[inside[-1] + 1][1:]

    def _space_others(self) -> None:
        """Give each picture or field the spaces it had around it in the source where the
        translation has one on its other side, or none (inline markup sets a void element
        right before the word after it)."""
        for number, inside in self._pieces_of("other").items():
            want_before, want_after = self.units[number].spaced
            before, after = self._text_piece(inside[0], -1), self._text_piece(inside[-1], 1)
            has_before, has_after = self._ends_with_space(before), self._starts_with_space(after)
            if want_after and not has_after and after is not None:
                if has_before and (not want_before or self._ends_with_space(before, 2)):
                    self.pieces[before] = self.pieces[before][:-1]
                self.pieces[after] = " " + self.pieces[after]
            elif want_before and not has_before and before is not None:
                if has_after and (not want_after or self._starts_with_space(after, 2)):
                    self.pieces[after] = self.pieces[after][1:]
                self.pieces[before] += " "

    def _text_piece(self, index: int, step: int) -> int | None:
        """The nearest piece holding text from `index` on (not `index`) in direction `step`."""
        index += step
        while 0 <= index < len(self.pieces) and not self.pieces[index]:
            index += step
        return index if 0 <= index < len(self.pieces) else None

    def _ends_with_space(self, index: int | None, count: int = 1) -> bool:
        return (index is not None and 0 <= index < len(self.pieces)
                and len(self.pieces[index]) >= count
                and self.pieces[index][-count:].isspace())

    def _starts_with_space(self, index: int | None, count: int = 1) -> bool:
        return (index is not None and 0 <= index < len(self.pieces)
                and len(self.pieces[index]) >= count
                and self.pieces[index][:count].isspace())

    def _neighbour(self, text: str, before: int | None, after: int | None) -> int | None:
        """Whose is text outside the spans: spaces go to the run after them where that run's
        source began with a space and the run before did not end with one; else the run
        before has it (the one after where none is before)."""
        if before is None or after is None:
            return after if before is None else before
        if (not text.strip() and self.units[after].source[:1].isspace()
                and not self.units[before].source[-1:].isspace()):
            return after
        return before


def _local(element) -> str:
    tag = element.tag
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def _field_depth(element) -> int:
    """How many fields the element (a run, a paragraph...) begins (its w:fldChar begin) less
    how many it ends."""
    depth = 0
    for char in element.iter(_W + "fldChar"):
        kind = char.get(_W + "fldCharType")
        depth += 1 if kind == "begin" else -1 if kind == "end" else 0
    return depth


def _content(run) -> list:
    return [child for child in run if _local(child) != "rPr"]


def _hidden(run) -> bool:
    """Whether the run's own properties hide it (w:vanish, w:specVanish), unless set off."""
    for properties in (child for child in run if _local(child) == "rPr"):
        for flag in properties:
            if _local(flag) in ("vanish", "specVanish"):
                value = next((v for k, v in flag.attrib.items()
                              if k.rsplit("}", 1)[-1] == "val"), "true")
                return value.lower() not in ("0", "false", "off")
    return False


def _run_kind(run) -> str:
    if _hidden(run):
        return "other"  # not shown: neither translated nor given words
    names = [_local(child) for child in _content(run)]
    if all(name in _TEXT for name in names):
        return "text"
    if len(names) == 1 and names[0] in _BREAKS:
        return "break"
    if len(names) == 1 and names[0] == _TAB:
        return "tab"
    return "other"


def _split_runs(parent) -> None:
    """Cut each run of text holding tabs or line breaks into runs of text and runs of one tab
    or break each, all formatted alike, so that these stay where they are."""
    for run in [child for child in parent if _local(child) == "r"]:
        content = _content(run)
        names = [_local(child) for child in content]
        if (len(content) < 2 or not all(n in _TEXT or n in _BREAKS or n == _TAB for n in names)
                or all(n in _TEXT for n in names)):
            continue
        groups: list[list] = []
        for child, name in zip(content, names):
            if name in _TEXT and groups and _local(groups[-1][-1]) in _TEXT:
                groups[-1].append(child)
            else:
                groups.append([child])
        properties = run.find(_W + "rPr")
        previous = run
        for group in groups[1:]:
            new = OxmlElement("w:r")
            for key, value in run.attrib.items():
                new.set(key, value)
            if properties is not None:
                new.append(copy.deepcopy(properties))
            new.extend(group)  # moved out of `run`
            previous.addnext(new)
            previous = new


def _edge_spaces(text: str) -> int:
    """How many white-space characters `text` begins with."""
    return len(text) - len(text.lstrip())


def _at(items: list, index: int):
    return items[index] if index < len(items) else None


def _last(numbers: list[int | None]) -> int | None:
    return next((n for n in reversed(numbers) if n is not None), None)


def _first(numbers: list[int | None]) -> int | None:
    return next((n for n in numbers if n is not None), None)


def _new_order(units: list[_Unit], order: dict[int, int]) -> list[_Unit]:
    """`units` in the order of their tags in the translation (`order`: number -> rank); a
    unit whose tag is not there stays after the unit it followed."""
    ranked = sorted((u for u in units if u.number in order), key=lambda u: order[u.number])
    for i, unit in enumerate(units):
        if unit.number not in order:
            ranked.insert(ranked.index(units[i - 1]) + 1 if i else 0, unit)
    return ranked


def _rearrange(old: list[_Unit], new: list[_Unit]) -> None:
    """The units' elements moved so that the places `old` took hold `new`, in order; other
    children stay where they are."""
    if old == new:
        return
    places = []
    for unit in old:
        place = etree.Element("place")
        unit.elements[0].addprevious(place)
        places.append(place)
        for element in unit.elements:
            element.getparent().remove(element)
    for place, unit in zip(places, new):
        for element in unit.elements:
            place.addprevious(element)
        place.getparent().remove(place)


class _Reading(HTMLParser):
    """A translated fragment read back: its text in pieces, each with the number of the run
    whose span holds it (None outside spans), an empty piece with the unit's number where
    each tag of a unit is, and the rank of each unit's first tag."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.pieces: list[tuple[int | None, str]] = []
        self.order: dict[int, int] = {}
        self.open: list[int | None] = []  # the spans open, innermost last
        self.links: list[int | None] = []  # the hyperlinks open

    @classmethod
    def of(cls, markup: str) -> _Reading:
        reading = cls()
        reading.feed(markup)
        reading.close()
        return reading

    def handle_starttag(self, tag, attrs):
        values = dict(attrs)
        number = _number(values.get("data-r") or values.get("data-h"))
        if number is not None:
            self.order.setdefault(number, len(self.order))
            self.pieces.append((number, ""))
        if tag == "span":
            self.open.append(number)
        elif tag == "a":
            self.links.append(number)

    def handle_endtag(self, tag):
        if tag == "span" and self.open:
            self.open.pop()
        elif tag == "a" and self.links:
            number = self.links.pop()
            if number is not None:
                self.pieces.append((number, ""))

    def handle_data(self, data):
        self.pieces.append((_last(self.open), data))


def _number(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None
