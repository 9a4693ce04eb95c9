"""Files translated whole, their layout and formatting kept: plain text, HTML and Word
(.docx), for the server's /translate_file.

    prepared = prepare(data, "report.docx", "en")   # ValueError for a file it cannot read
    texts = [document.join(translations_of(document)) for document in prepared.documents]
    translated_bytes = prepared.rebuild(texts)

A file is cut into `Document`s (`nmt.translation.paragraphs`): a text file is one text, an
HTML file one page. In a .docx each paragraph (of the body, of tables at any depth, of headers
and footers) is one HTML fragment whose runs are inline elements, `<span data-r="N">`, and
hyperlinks `<a data-h="N">` around theirs: the paragraph is translated sentence by sentence,
each sentence whole, and its runs' tags go back around the words they held
(`nmt.translation.inline_markup`), so bold, italic, fonts and links stay on the words they
marked. Runs holding more than text (pictures, fields) are left as they are. Not translated:
text boxes, footnotes, comments.
"""

from __future__ import annotations

import dataclasses
import html
import io
import zipfile
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import PurePath

import docx  # python-docx (the serve extra)

from nmt.translation.paragraphs import Document, split_html, split_text

MEDIA_TYPES = {
    ".txt": "text/plain; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".htm": "text/html; charset=utf-8",
    ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
}
FILE_SUFFIXES = tuple(MEDIA_TYPES)
_BOM = "\ufeff"


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A file cut into documents to translate; `rebuild(texts)` gives the translated file
    from each document's joined translation, in order."""

    documents: list[Document]
    rebuild: Callable[[list[str]], bytes]

    @property
    def characters(self) -> int:
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


def prepare(data: bytes, filename: str, language: str) -> Prepared:
    """`data`, a file named `filename`, cut into documents for sentences in `language`;
    ValueError saying what is wrong with a file that cannot be read."""
    kind = kind_of(filename)
    if kind == ".docx":
        return _prepare_docx(data, language)
    text = _decode(data)
    bom = _BOM if text.startswith(_BOM) else ""
    document = (split_text if kind == ".txt" else split_html)(text[len(bom):], language)
    return Prepared([document], lambda texts: (bom + texts[0]).encode("utf-8"))


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"not UTF-8 text: byte 0x{data[err.start]:02x} at offset "
                         f"{err.start}; save it as UTF-8") from None


# ----------------------------------------------------------------------------- .docx


def _prepare_docx(data: bytes, language: str) -> Prepared:
    try:
        document = docx.Document(io.BytesIO(data))
    except (zipfile.BadZipFile, KeyError, ValueError) as err:
        raise ValueError(f"not a valid .docx file ({type(err).__name__}: {err})") from None
    paragraphs = [p for p in _paragraphs(document) if p.text.strip()]
    fragments = [_Fragment(paragraph) for paragraph in paragraphs]
    documents = [split_html(fragment.markup, language) for fragment in fragments]

    def rebuild(texts: list[str]) -> bytes:
        for fragment, text in zip(fragments, texts):
            fragment.write_back(text)
        out = io.BytesIO()
        document.save(out)
        return out.getvalue()

    return Prepared(documents, rebuild)


def _paragraphs(document) -> Iterator:
    """Every paragraph of the body, its tables (nested ones too), headers and footers, each
    once (a merged cell is one cell; a header linked to the previous section is that one)."""
    seen: set[int] = set()
    parts = [document]
    for section in document.sections:
        for part in (section.header, section.footer, section.first_page_header,
                     section.first_page_footer, section.even_page_header,
                     section.even_page_footer):
            if not part.is_linked_to_previous:
                parts.append(part)
    for part in parts:
        for paragraph in _in_container(part, seen):
            if id(paragraph._p) not in seen:
                seen.add(id(paragraph._p))
                yield paragraph


def _in_container(container, seen: set[int]) -> Iterator:
    yield from container.paragraphs
    for table in container.tables:
        for row in table.rows:
            for cell in row.cells:
                if id(cell._tc) not in seen:
                    seen.add(id(cell._tc))
                    yield from _in_container(cell, seen)


class _Fragment:
    """A paragraph as HTML: each text run a `<span data-r>`, each hyperlink an `<a data-h>`
    around its runs, other runs (pictures, fields) `<img data-r>` points kept as they are."""

    def __init__(self, paragraph):
        self.runs = []  # the paragraph's runs, by the number in their tag
        parts = []
        for item in paragraph.iter_inner_content():
            if hasattr(item, "runs") and hasattr(item, "address"):  # a hyperlink
                parts.append(f'<a data-h="{len(self.runs)}">')
                parts += [self._run(run) for run in item.runs]
                parts.append("</a>")
            else:
                parts.append(self._run(item))
        self.markup = "".join(parts)

    def _run(self, run) -> str:
        number = len(self.runs)
        self.runs.append(run)
        if not _text_only(run):
            return f'<img data-r="{number}">'
        return f'<span data-r="{number}">{html.escape(run.text, quote=False)}</span>'

    def write_back(self, translated: str) -> None:
        """Each text run's text set to what its span holds in `translated`."""
        texts = _RunTexts.of(translated)
        for number, run in enumerate(self.runs):
            if _text_only(run):
                new = texts.get(number, "")
                if new != run.text:
                    run.text = new


def _text_only(run) -> bool:
    """Whether a run holds text alone (with tabs and breaks), so that its text can be set
    without losing anything: python-docx's setter clears all else."""
    kept = {"rPr", "t", "tab", "br", "cr", "noBreakHyphen", "softHyphen"}
    return all(child.tag.rsplit("}", 1)[-1] in kept for child in run._r)


class _RunTexts(HTMLParser):
    """The text inside each `<span data-r=N>` of a translated fragment; text outside every
    span goes to the run before it (the first run if none)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.texts: dict[int, str] = {}
        self.open: list[int | None] = []
        self.last: int | None = None
        self.orphan = ""  # text before any run

    @classmethod
    def of(cls, markup: str) -> dict[int, str]:
        parser = cls()
        parser.feed(markup)
        parser.close()
        if parser.orphan:
            first = min(parser.texts, default=0)
            parser.texts[first] = parser.orphan + parser.texts.get(first, "")
        return parser.texts

    def handle_starttag(self, tag, attrs):
        if tag == "span":
            number = dict(attrs).get("data-r")
            self.open.append(int(number) if number is not None else None)
            if number is not None:
                self.last = int(number)
                self.texts.setdefault(self.last, "")

    def handle_endtag(self, tag):
        if tag == "span" and self.open:
            self.open.pop()

    def handle_data(self, data):
        current = next((n for n in reversed(self.open) if n is not None), self.last)
        if current is None:
            self.orphan += data
        else:
            self.texts[current] = self.texts.get(current, "") + data
