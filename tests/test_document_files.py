"""Files translated whole (`nmt.translation.document_files`): text and HTML come back byte for
byte under an identity translation, and a .docx built here with python-docx comes back with
its paragraphs, tables (nested ones too), headers and footers translated, each run's
formatting on the words it marked, and its line breaks, tabs, pictures and links where they
were; files that cannot be read are refused with a ValueError saying why.

The translations are deterministic fakes: upper case (same length, so inline tags stay at the
same offsets), and each sentence's words in reverse order with an exact word alignment, so
that a paragraph's runs follow their words as they would with a model's alignment.
"""

from __future__ import annotations

import io
import random
import re
import struct
import zipfile
import zlib
from collections.abc import Callable

import docx
import numpy as np
import pytest
from docx.opc.constants import RELATIONSHIP_TYPE
from docx.oxml import OxmlElement
from docx.oxml.ns import qn

from nmt.models.alignment import Alignment
from nmt.translation import document_files, paragraphs
from nmt.translation.document_files import MEDIA_TYPES, Prepared, kind_of, prepare

Fake = Callable[[str], tuple[str, Alignment | None]]


def _upper(sentence: str) -> tuple[str, Alignment | None]:
    return sentence.upper(), None


def _reversed(sentence: str) -> tuple[str, Alignment]:
    """The sentence's words in reverse order, each target word aligned to its source word."""
    source = [m.span() for m in re.finditer(r"\S+", sentence)]
    text = " ".join(sentence[a:b] for a, b in reversed(source))
    target = [m.span() for m in re.finditer(r"\S+", text)]
    weights = np.zeros((len(target), len(source)), np.float32)
    for j in range(len(target)):
        weights[j, len(source) - 1 - j] = 1.0
    return text, Alignment(source, target, weights)


def _identity(sentence: str) -> tuple[str, Alignment | None]:
    return sentence, None


def _translate(prepared: Prepared, fake: Fake) -> bytes:
    """The file rebuilt from each document joined with the fake's translations."""
    texts = []
    for document in prepared.documents:
        pairs = [fake(sentence) for sentence in document.sentences]
        alignments = {i: a for i, (_, a) in enumerate(pairs) if a is not None}
        texts.append(document.join([t for t, _ in pairs], alignments))
    return prepared.rebuild(texts)


def _saved(document) -> bytes:
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def _open(data: bytes):
    return docx.Document(io.BytesIO(data))


def _add_link(paragraph, text: str, url: str) -> None:
    """A hyperlink run at the end of `paragraph` (python-docx reads links but adds none)."""
    rid = paragraph.part.relate_to(url, RELATIONSHIP_TYPE.HYPERLINK, is_external=True)
    link, run, t = OxmlElement("w:hyperlink"), OxmlElement("w:r"), OxmlElement("w:t")
    link.set(qn("r:id"), rid)
    t.text = text
    t.set(qn("xml:space"), "preserve")
    run.append(t)
    link.append(run)
    paragraph._p.append(link)


def _png() -> bytes:
    """A 1x1 grey PNG."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00\x00")) + chunk(b"IEND", b""))


def _report() -> bytes:
    """A .docx with a heading, formatted runs, an empty paragraph, a table holding a nested
    table, a header and a footer."""
    document = docx.Document()
    document.add_heading("Quarterly report", level=1)
    paragraph = document.add_paragraph()
    paragraph.add_run("The ")
    paragraph.add_run("quick brown").bold = True
    paragraph.add_run(" fox ")
    paragraph.add_run("jumps").italic = True
    paragraph.add_run(" over the dog.")
    document.add_paragraph("")
    table = document.add_table(rows=2, cols=2)
    table.cell(0, 0).text, table.cell(0, 1).text = "Name", "Value"
    table.cell(1, 0).text, table.cell(1, 1).text = "Speed is high.", "Outer cell."
    inner = table.cell(1, 1).add_table(rows=1, cols=2)
    inner.cell(0, 0).text, inner.cell(0, 1).text = "Inner left.", "Inner right."
    document.add_paragraph("Thanks for reading.")
    section = document.sections[0]
    section.header.paragraphs[0].text = "Confidential draft."
    section.footer.paragraphs[0].text = "Page footer."
    return _saved(document)


def _runs(paragraph) -> list[tuple[str, bool | None, bool | None]]:
    return [(run.text, run.bold, run.italic) for run in paragraph.runs]


# ------------------------------------------------------------------------------- kinds


def test_kind_of_reads_the_four_suffixes_in_any_case_and_names_them_otherwise():
    assert [kind_of(name) for name in ("a.txt", "b.HTML", "c.Htm", "d.e.docx")] == [
        ".txt", ".html", ".htm", ".docx"]
    assert set(MEDIA_TYPES) == {".txt", ".html", ".htm", ".docx"}
    assert MEDIA_TYPES[".docx"] == ("application/vnd.openxmlformats-officedocument."
                                    "wordprocessingml.document")
    assert MEDIA_TYPES[".htm"].startswith("text/html")
    for name in ("report.pdf", "README", "notes.txt.bak", "old.doc"):
        with pytest.raises(ValueError, match=r"\.txt.*\.docx|\.docx.*\.txt"):
            kind_of(name)
    with pytest.raises(ValueError, match="docx"):
        prepare(b"%PDF-1.4", "report.pdf", "en")


# ------------------------------------------------------------------------------- text


@pytest.mark.parametrize("data", [
    "\ufeffTitle\r\n\r\nFirst sentence.  Second one!\rLone CR line\n\tIndented, trailing  \n"
    "Ümlaut naïve café. 日本語です。\n\n".encode(),
    b"No line break at the end.  Two sentences here",
    b"", b"\n\r\n  \n",
])
def test_text_comes_back_byte_for_byte_under_an_identity_translation(data):
    assert _translate(prepare(data, "notes.txt", "en"), _identity) == data


def test_text_translation_keeps_the_bom_and_line_endings():
    prepared = prepare("\ufeffHello world. Bye.\r\n\r\nNext\rline.\n".encode(), "a.TXT", "en")
    assert [d.sentences for d in prepared.documents] == [
        ["Hello world.", "Bye.", "Next", "line."]]
    assert prepared.characters == 12 + 4 + 4 + 5
    assert _translate(prepared, _upper) == "\ufeffHELLO WORLD. BYE.\r\n\r\nNEXT\rLINE.\n".encode()


def test_text_that_is_not_utf8_is_refused_with_the_byte_offset():
    with pytest.raises(ValueError, match=r"UTF-8.*offset 10|offset 10.*UTF-8"):
        prepare(b"Good text \xff more", "a.txt", "en")


# ------------------------------------------------------------------------------- HTML

PAGE = ('<!DOCTYPE html>\r\n<html lang="en"><head><title>A &amp; B</title>\r\n'
        '<style>p { color: red }</style></head>\n<body><!-- a comment -->\n'
        '<p title="Not translated.">&nbsp;Hello <b>bold</b> world.  Fish &amp; chips &lt;3!</p>\n'
        '<script>var s = "<p>no</p>";</script><pre>line one\nline two</pre></body></html>\n')


@pytest.mark.parametrize("name", ["page.html", "page.htm"])
def test_html_comes_back_byte_for_byte_under_an_identity_translation(name):
    data = ("\ufeff" + PAGE).encode()
    assert _translate(prepare(data, name, "en"), _identity) == data
    assert _translate(prepare(PAGE.encode(), name, "en"), _identity) == PAGE.encode()


def test_html_translation_changes_text_only():
    data = ('<p title="keep me">Hello <b>bold</b> world.</p>'
            '<script>var x = "no";</script>').encode()
    out = _translate(prepare(data, "page.html", "en"), _upper)
    assert out == ('<p title="keep me">HELLO <b>BOLD</b> WORLD.</p>'
                   '<script>var x = "no";</script>').encode()


def test_html_declaring_another_charset_is_declared_utf8_as_it_is_sent():
    head = ('<html><head>\n<META CharSet=\'ISO-8859-1\' >\n<!-- <meta charset="latin1"> -->\n'
            '<meta http-equiv="Content-Type" content="text/html; charset=windows-1252"/>\n'
            '<meta name="description" content="charset=latin1">')
    page = head + '</head><body><p>Caf&eacute; &#233;t&eacute;.</p></body></html>'
    out = _translate(prepare(page.encode(), "page.html", "fr"), _identity).decode()
    assert out == (head.replace("ISO-8859-1", "utf-8").replace("windows-1252", "utf-8")
                   + "</head><body><p>Café été.</p></body></html>")
    declared = '<meta charset="UTF-8"><meta http-equiv="content-type" content="text/html">'
    data = (declared + "<p>Déjà vu.</p>").encode()
    assert _translate(prepare(data, "page.html", "fr"), _identity) == data


def test_xhtml_declaring_another_encoding_is_declared_utf8_as_it_is_sent():
    page = ("<?xml version='1.0' encoding='ISO-8859-1'?>\n"
            '<html xmlns="http://www.w3.org/1999/xhtml"><body><p>Caf&#233;.</p>'
            "<pre>&lt;?xml encoding='latin1'?&gt;</pre></body></html>")
    out = _translate(prepare(page.encode(), "page.html", "fr"), _identity).decode()
    assert out == page.replace("ISO-8859-1", "utf-8").replace("&#233;", "é")
    declared = '<?xml version="1.0" encoding="UTF-8"?><p>Déjà vu.</p>'
    assert _translate(prepare(declared.encode(), "page.html", "fr"), _identity) == (
        declared.encode())


# ------------------------------------------------------------------------------- .docx


def test_docx_upper_case_reaches_body_tables_nested_tables_header_and_footer():
    original = _open(_report())
    translated = _open(_translate(prepare(_report(), "report.docx", "en"), _upper))
    assert [p.text for p in translated.paragraphs] == [
        p.text.upper() for p in original.paragraphs]
    assert [p.style.name for p in translated.paragraphs] == [
        p.style.name for p in original.paragraphs]
    assert len(translated.tables) == len(original.tables) == 1
    table = translated.tables[0]
    assert [[c.text for c in row.cells] for row in table.rows] == [
        [c.text.upper() for c in row.cells] for row in original.tables[0].rows]
    assert table.cell(1, 0).text == "SPEED IS HIGH."
    assert len(table.cell(1, 1).tables) == 1
    inner = table.cell(1, 1).tables[0]
    assert [c.text for c in inner.rows[0].cells] == ["INNER LEFT.", "INNER RIGHT."]
    section = translated.sections[0]
    assert section.header.paragraphs[0].text == "CONFIDENTIAL DRAFT."
    assert section.footer.paragraphs[0].text == "PAGE FOOTER."


def test_docx_runs_keep_their_formatting_on_the_same_words():
    translated = _open(_translate(prepare(_report(), "report.docx", "en"), _upper))
    assert _runs(translated.paragraphs[1]) == [
        ("THE ", None, None), ("QUICK BROWN", True, None), (" FOX ", None, None),
        ("JUMPS", None, True), (" OVER THE DOG.", None, None)]


def test_docx_runs_follow_their_words_when_the_translation_reorders_them():
    prepared = prepare(_report(), "report.docx", "en")
    translated = _open(_translate(prepared, _reversed))
    paragraph = translated.paragraphs[1]
    assert paragraph.text == "dog. the over jumps fox brown quick The"
    bold = [run.text.strip() for run in paragraph.runs if run.bold]
    italic = [run.text.strip() for run in paragraph.runs if run.italic]
    assert bold == ["brown quick"] and italic == ["jumps"]
    assert translated.paragraphs[0].text == "report Quarterly"
    assert translated.sections[0].header.paragraphs[0].text == "draft. Confidential"
    assert translated.tables[0].cell(1, 0).text == "high. is Speed"


def test_docx_identity_translation_leaves_every_run_as_it_was():
    original = _open(_report())
    translated = _open(_translate(prepare(_report(), "report.docx", "en"), _identity))
    assert [_runs(p) for p in translated.paragraphs] == [_runs(p) for p in original.paragraphs]
    assert translated.tables[0].cell(1, 1).tables[0].cell(0, 1).text == "Inner right."


def test_docx_counts_only_its_sentences_characters_once_each():
    document = docx.Document()
    document.add_paragraph("One two.")
    table = document.add_table(rows=2, cols=3)
    merged = table.cell(0, 0).merge(table.cell(1, 1))  # one cell over four grid cells
    merged.text = "Merged cell."
    table.cell(0, 2).text = "Side."
    prepared = prepare(_saved(document), "merged.docx", "en")
    assert sorted(s for d in prepared.documents for s in d.sentences) == [
        "Merged cell.", "One two.", "Side."]
    assert prepared.characters == len("One two.") + len("Merged cell.") + len("Side.")
    translated = _open(_translate(prepared, _upper))
    assert translated.tables[0].cell(1, 1).text == "MERGED CELL."


def test_docx_every_paragraph_and_cell_is_translated_however_many_there_are():
    document = docx.Document()
    for i in range(40):
        document.add_paragraph("")
        document.add_paragraph(f"Body line {i}.")
    table = document.add_table(rows=20, cols=4)
    for r, row in enumerate(table.rows):
        for c, cell in enumerate(row.cells):
            cell.text = f"Cell {r} {c}."
            cell.add_paragraph("")
    header = document.sections[0].header
    for i in range(10):
        header.add_paragraph("")
        header.add_paragraph(f"Header line {i}.")
    prepared = prepare(_saved(document), "many.docx", "en")
    assert len(prepared.documents) == 40 + 80 + 10
    translated = _open(_translate(prepared, _upper))
    texts = [p.text for p in translated.paragraphs]
    texts += [cell.text.strip() for row in translated.tables[0].rows for cell in row.cells]
    texts += [p.text for p in translated.sections[0].header.paragraphs]
    assert [t for t in texts if t != t.upper()] == []
    assert "CELL 19 3." in texts and "HEADER LINE 9." in texts


def test_docx_line_breaks_and_tabs_inside_a_sentence_stay_where_they_were():
    document = docx.Document()
    document.add_paragraph().add_run("Dear Sir,\nthank you for\tthe letter.")
    data = _saved(document)
    for fake, text in ((_identity, "Dear Sir,\nthank you for\tthe letter."),
                       (_upper, "DEAR SIR,\nTHANK YOU FOR\tTHE LETTER.")):
        paragraph = _open(_translate(prepare(data, "letter.docx", "en"), fake)).paragraphs[0]
        assert paragraph.text == text
        assert len(paragraph._p.xpath(".//w:br")) == len(paragraph._p.xpath(".//w:tab")) == 1


def test_docx_a_tab_run_takes_no_word_from_the_runs_beside_it():
    """A tab (a run of its own, sent as an element of one space) stays between the words it
    was between, and the bold run before it gets no word more."""
    document = docx.Document()
    paragraph = document.add_paragraph()
    paragraph.add_run("Name").bold = True
    paragraph.add_run("\tder Besitzer des Hauses")
    prepared = prepare(_saved(document), "owners.docx", "de")
    target = "Name of the owners of the house"

    def fake(sentence: str) -> tuple[str, Alignment]:
        # Name->Name, of->des, the->der, owners->Besitzer, of->des, the->der, house->Hauses
        source = [m.span() for m in re.finditer(r"\S+", sentence)]
        spans = [m.span() for m in re.finditer(r"\S+", target)]
        weights = np.full((len(spans), len(source)), 0.01, np.float32)
        for j, i in enumerate((0, 3, 1, 2, 3, 1, 4)):
            weights[j, i] = 1.0
        return target, Alignment(source, spans, weights)

    paragraph = _open(_translate(prepared, fake)).paragraphs[0]
    assert paragraph.runs[0].text == "Name" and paragraph.runs[0].bold
    assert paragraph.text.replace(" ", "") == "Name\toftheownersofthehouse"
    assert len(paragraph._p.xpath(".//w:tab")) == 1


def test_docx_pictures_and_empty_runs_are_kept_in_place():
    document = docx.Document()
    paragraph = document.add_paragraph()
    paragraph.add_run("Before the picture ")
    paragraph.add_run().add_picture(io.BytesIO(_png()))
    paragraph.add_run(" after it.")
    paragraph.add_run().bold = True  # a run with formatting and no text
    translated = _open(_translate(prepare(_saved(document), "pic.docx", "en"), _upper))
    runs = translated.paragraphs[0].runs
    assert [bool(run._r.xpath("./w:drawing")) for run in runs] == [False, True, False, False]
    assert translated.paragraphs[0].text == "BEFORE THE PICTURE  AFTER IT."
    assert runs[3].bold and runs[3].text == ""
    assert len(translated.inline_shapes) == 1


def test_docx_runs_word_marked_with_a_rendered_page_break_are_translated():
    document = docx.Document()
    run = document.add_paragraph().add_run("Text on a new page.")
    run._r.insert(0, OxmlElement("w:lastRenderedPageBreak"))  # as Word saves page starts
    translated = _open(_translate(prepare(_saved(document), "word.docx", "en"), _upper))
    assert translated.paragraphs[0].text == "TEXT ON A NEW PAGE."


def test_docx_hyperlinks_keep_their_address_around_their_translated_words():
    document = docx.Document()
    paragraph = document.add_paragraph("Read ")
    _add_link(paragraph, "the full report", "https://example.org/report")
    paragraph.add_run(" online.")
    for fake, whole, linked in ((_upper, "READ THE FULL REPORT ONLINE.", "THE FULL REPORT"),
                                (_reversed, "online. report full the Read",
                                 "report full the")):
        translated = _open(_translate(prepare(_saved(document), "l.docx", "en"), fake))
        paragraph = translated.paragraphs[0]
        links = paragraph.hyperlinks
        assert paragraph.text == whole
        assert [(link.text.strip(), link.address) for link in links] == [
            (linked, "https://example.org/report")]


def test_docx_markup_characters_in_runs_survive():
    document = docx.Document()
    document.add_paragraph().add_run("Fish & chips <cheap> for 5 € > 3 \"quoted\".")
    data = _saved(document)
    for fake, text in ((_identity, "Fish & chips <cheap> for 5 € > 3 \"quoted\"."),
                       (_upper, "FISH & CHIPS <CHEAP> FOR 5 € > 3 \"QUOTED\".")):
        assert _open(_translate(prepare(data, "m.docx", "en"), fake)).paragraphs[0].text == text


def test_docx_rebuild_gives_each_run_the_text_inside_its_span():
    document = docx.Document()
    paragraph = document.add_paragraph("One ")
    paragraph.add_run("two").bold = True
    paragraph.add_run(" three.")
    prepared = prepare(_saved(document), "spans.docx", "en")
    assert [d.sentences for d in prepared.documents] == [["One two three."]]
    # Spans of runs 0 and 2 lost: those runs are emptied, the text outside spans kept.
    out = _open(prepared.rebuild(['Uno <span data-r="1">dos</span>'])).paragraphs[0]
    assert out.text == "Uno dos" and [r.text for r in out.runs if not r.bold] == ["", ""]
    # Text after a span goes into the run before it.
    out = _open(prepared.rebuild(
        ['<span data-r="0">Uno</span> <span data-r="2">tres</span> fin.'])).paragraphs[0]
    assert _runs(out) == [("Uno ", None, None), ("", True, None), ("tres fin.", None, None)]


def _random_runs(rng: random.Random) -> list[str]:
    """A sentence with one to three spaces between words and some at its ends, cut at random
    places (runs of spaces alone among them)."""
    words = "The quick brown fox jumps over the lazy dog. It was not amused!".split()
    words = words[:rng.randint(2, len(words))]
    text = "".join(word + " " * rng.choice([1, 1, 2, 3]) for word in words).rstrip()
    text = " " * rng.choice([0, 1, 2]) + text + " " * rng.choice([0, 1, 2])
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 9))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


@pytest.mark.parametrize("seed", range(4))
def test_docx_identity_gives_runs_cut_anywhere_their_spaces_back(seed):
    rng = random.Random(seed)
    for _ in range(25):
        runs = _random_runs(rng)
        document = docx.Document()
        paragraph = document.add_paragraph()
        for i, text in enumerate(runs):
            paragraph.add_run(text).bold = i % 2 == 1
        translated = _translate(prepare(_saved(document), "r.docx", "en"), _identity)
        assert [run.text for run in _open(translated).paragraphs[0].runs] == runs


def _add_field(paragraph, instruction: str, result: str) -> None:
    """A field (begin, instruction, separate, result, end: five runs) at the end."""
    def char(kind: str):
        element = OxmlElement("w:fldChar")
        element.set(qn("w:fldCharType"), kind)
        return element

    code, shown = OxmlElement("w:instrText"), OxmlElement("w:t")
    code.text, shown.text = instruction, result
    for content in (char("begin"), code, char("separate"), shown, char("end")):
        run = OxmlElement("w:r")
        run.append(content)
        paragraph._p.append(run)


def _run_contents(paragraph) -> list[str]:
    """Each run of the paragraph as its field character type, "code" or its text."""
    out = []
    for run in paragraph._p.xpath("./w:r"):
        char, code = run.xpath("./w:fldChar"), run.xpath("./w:instrText")
        out.append(char[0].get(qn("w:fldCharType")) if char else "code" if code else run.text)
    return out


def test_docx_fields_stay_whole_and_untranslated_when_words_move():
    document = docx.Document()
    paragraph = document.add_paragraph("This is page ")
    _add_field(paragraph, " PAGE ", "7")
    paragraph.add_run(" of the report.")
    translated = _open(_translate(prepare(_saved(document), "f.docx", "en"), _reversed))
    contents = _run_contents(translated.paragraphs[0])
    start = contents.index("begin")
    assert contents[start:start + 5] == ["begin", "code", "separate", "7", "end"]
    words = contents[:start] + contents[start + 5:]
    assert " ".join("".join(words).split()) == "report. the of page is This"


def test_docx_a_field_across_paragraphs_is_left_whole_and_what_follows_translated():
    document = docx.Document()
    document.add_paragraph("Contents.")
    first = document.add_paragraph()
    _add_field(first, ' TOC \\o "1-3" ', "Introduction chapter")
    document.add_paragraph("Methods chapter")
    last = document.add_paragraph("Results chapter")
    last._p.append(first._p.r_lst[-1])  # the field's end moved to the third paragraph
    last.add_run(" closes it.")
    document.add_paragraph("After the field.")
    translated = _open(_translate(prepare(_saved(document), "toc.docx", "en"), _upper))
    assert [p.text for p in translated.paragraphs] == [
        "CONTENTS.", "Introduction chapter", "Methods chapter", "Results chapter CLOSES IT.",
        "AFTER THE FIELD."]


def test_docx_page_number_fields_in_a_footer_keep_their_spaces():
    document = docx.Document()
    footer = document.sections[0].footer.paragraphs[0]
    footer.add_run("Page ")
    _add_field(footer, " PAGE ", "9")
    footer.add_run(" of ")
    _add_field(footer, " NUMPAGES ", "12")
    data = _saved(document)
    for fake, text in ((_identity, "Page 9 of 12"), (_upper, "PAGE 9 OF 12"),
                       (_reversed, "9 of Page 12")):
        translated = _open(_translate(prepare(data, "footer.docx", "en"), fake))
        assert translated.sections[0].footer.paragraphs[0].text.strip() == text


def test_docx_rebuild_drops_what_xml_cannot_hold_and_counts_its_texts():
    document = docx.Document()
    document.add_paragraph("Hello there.")
    prepared = prepare(_saved(document), "x.docx", "en")
    out = prepared.rebuild(['<span data-r="0">Hel\x01lo\x0b there.\ufffe</span>'])
    assert _open(out).paragraphs[0].text == "Hello there."
    for prepared in (prepare(_saved(document), "x.docx", "en"), prepare(b"A.", "a.txt", "en")):
        with pytest.raises(ValueError, match="texts"):
            prepared.rebuild([])


def test_a_docx_that_unpacks_to_too_much_is_refused_before_it_is_read(monkeypatch):
    data = _report()
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        unpacked = sum(info.file_size for info in archive.infolist())
    monkeypatch.setattr(document_files, "MAX_UNPACKED_BYTES", unpacked - 1)
    with pytest.raises(ValueError, match=f"unpacks to more than the {unpacked - 1} bytes"):
        prepare(data, "bomb.docx", "en")
    monkeypatch.setattr(document_files, "MAX_UNPACKED_BYTES", unpacked)
    assert prepare(data, "fits.docx", "en").characters > 0


def _understated(data: bytes, name: str, stated: int) -> bytes:
    """`data` with the unpacked size of entry `name` written as `stated` in the zip's local
    header and central directory, as a sender who wants past a size check would."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        info = archive.getinfo(name)
        real, offset = info.file_size, info.header_offset
    out = bytearray(data)
    # The local header's uncompressed size sits at offset 22; the central directory's at 24.
    assert struct.unpack_from("<I", out, offset + 22)[0] == real
    struct.pack_into("<I", out, offset + 22, stated)
    central = out.rfind(b"PK\x01\x02" + out[offset + 4:offset + 8], 0)
    while struct.unpack_from("<I", out, central + 42)[0] != offset:
        central = out.rfind(b"PK\x01\x02", 0, central)
    struct.pack_into("<I", out, central + 24, stated)
    return bytes(out)


def test_a_docx_whose_zip_understates_its_sizes_is_refused_while_it_unpacks(monkeypatch):
    """The sizes a zip states are the sender's to write: a few kilobytes claiming small
    entries can unpack to gigabytes, which python-docx would unpack whole (up to 2 GiB at a
    time) before finding out. It is refused as it unpacks, a chunk at a time: the entry
    that unpacks past its stated size fails its CRC check."""
    document = docx.Document()
    document.add_paragraph("x " * 200_000)  # 400 kB of text, deflated to a few kB
    data = _understated(_saved(document), "word/document.xml", 1000)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        stated = sum(info.file_size for info in archive.infolist())
    monkeypatch.setattr(document_files, "MAX_UNPACKED_BYTES", stated + 1000)  # it passes

    def unpacked_whole(*args):
        raise AssertionError("python-docx was given the file")

    monkeypatch.setattr(document_files.docx, "Document", unpacked_whole)
    with pytest.raises(ValueError, match=r"not a valid \.docx file \(BadZipFile: Bad CRC-32 "
                                         r"for file 'word/document\.xml'\)"):
        prepare(data, "bomb.docx", "en")


def test_a_docx_that_python_docx_cannot_read_as_word_is_refused_as_such():
    """A body missing, a header reference to no part: errors python-docx raises only once
    the paragraphs are read."""
    good = _report()
    with zipfile.ZipFile(io.BytesIO(good)) as archive:
        parts = {name: archive.read(name) for name in archive.namelist()}
    namespace = b'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
    no_body = _zip({**parts, "word/document.xml": b"<w:document " + namespace + b"/>"})
    body = parts["word/document.xml"]
    dangling = _zip({**parts, "word/document.xml": re.sub(
        rb'(headerReference [^>]*r:id=")[^"]+', rb"\1rId99", body, count=1)})
    for data in (no_body, dangling):
        with pytest.raises(ValueError, match=r"not a valid \.docx"):
            prepare(data, "broken.docx", "en")


def test_docx_hidden_text_is_neither_translated_nor_given_words():
    document = docx.Document()
    paragraph = document.add_paragraph()
    paragraph.add_run("The price ")
    paragraph.add_run("(internal note)").font.hidden = True
    paragraph.add_run(" is ten euros.")
    prepared = prepare(_saved(document), "x.docx", "en")
    assert [s.split() for s in prepared.documents[0].sentences] == [
        ["The", "price", "is", "ten", "euros."]]
    runs = _open(_translate(prepared, _upper)).paragraphs[0].runs
    assert [(run.text, run.font.hidden) for run in runs if run.font.hidden] == [
        ("(internal note)", True)]
    assert "".join(run.text for run in runs if not run.font.hidden).split() == [
        "THE", "PRICE", "IS", "TEN", "EUROS."]


def test_a_docx_of_more_characters_than_asked_stops_being_read_there():
    document = docx.Document()
    for _ in range(50):
        document.add_paragraph("Twenty characters...")
    data = _saved(document)
    assert prepare(data, "x.docx", "en", max_characters=1000).characters == 50 * 20
    with pytest.raises(document_files.TooManyCharacters, match="more than 999 characters"):
        prepare(data, "x.docx", "en", max_characters=999)


def _with_body(markup: bytes, text: str = "Hello there.") -> bytes:
    """A .docx whose body holds `markup` and then a paragraph of `text`, zipped anew (python-docx
    would take minutes to add a million paragraphs)."""
    document = docx.Document()
    document.add_paragraph(text)
    with zipfile.ZipFile(io.BytesIO(_saved(document))) as archive:
        parts = {name: archive.read(name) for name in archive.namelist()}
    body = parts["word/document.xml"]
    return _zip({**parts, "word/document.xml": body.replace(b"<w:body>", b"<w:body>" + markup)})


def test_a_docx_of_empty_paragraphs_is_refused_at_the_limit_before_their_text_is_read(
        monkeypatch):
    """Empty paragraphs hold no character, yet each costs work to read (a few kilobytes of
    zip can hold millions): each paragraph, table, cell and run counts one against the limit,
    before the paragraph's text is read, and an empty one's never is."""
    read = []
    text = docx.text.paragraph.Paragraph.text
    monkeypatch.setattr(docx.text.paragraph.Paragraph, "text", property(
        lambda paragraph: read.append(1) or text.fget(paragraph), text.fset))
    monkeypatch.setattr(paragraphs, "MARKUP_BESIDES", 2)  # 2 a character, 2 more
    data = _with_body(b"<w:p/>" * 3000)  # and one paragraph of one run: 3002 pieces
    with pytest.raises(document_files.TooMuchMarkup, match=r"more than 3000 paragraphs.* the "
                                                           r"most read for 1499 characters"):
        prepare(data, "empty.docx", "en", max_characters=1499)
    assert read == []
    assert prepare(data, "empty.docx", "en", max_characters=1500).characters == 12
    read.clear()
    assert prepare(data, "empty.docx", "en").documents[0].sentences == ["Hello there."]
    assert len(read) == 1  # without a limit (translate.py), the text paragraph's alone
    cells = b"<w:tbl>" + (b"<w:tr>" + b"<w:tc/>" * 40 + b"</w:tr>") * 50 + b"</w:tbl>"
    with pytest.raises(document_files.TooMuchMarkup, match="table cells"):
        prepare(_with_body(cells), "cells.docx", "en", max_characters=400)


def test_a_docx_form_of_empty_cells_under_a_small_limit_is_read():
    """An empty form's grid holds markup and no character: under the allowance besides the
    limit's share it is read, as it was before markup counted."""
    document = docx.Document()
    document.add_paragraph("Name, date and hours worked, one row a day. " * 6)
    document.add_table(rows=60, cols=20)
    data = io.BytesIO()
    document.save(data)
    prepared = prepare(data.getvalue(), "timesheet.docx", "en", max_characters=2000)
    assert prepared.documents[0].sentences == ["Name, date and hours worked, one row a day."] * 6


def test_a_docx_whose_xml_holds_more_tags_than_the_limit_allows_is_refused_unparsed(
        monkeypatch):
    """Tags are counted as the parts unpack, 8 per character allowed and XML_TAGS_BESIDES
    more, so that python-docx never parses a bomb of empty elements."""
    data = _with_body(b"<w:p/>" * 5000)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        tags = sum(archive.read(name).count(b"<") for name in archive.namelist())
    assert document_files.XML_TAGS_PER_CHARACTER == 8
    monkeypatch.setattr(document_files, "XML_TAGS_BESIDES", tags - 8 * 10_000)
    assert prepare(data, "fits.docx", "en", max_characters=10_000).characters == 12
    monkeypatch.setattr(document_files, "XML_TAGS_BESIDES", tags - 8 * 10_000 - 1)

    def parsed(*args):
        raise AssertionError("python-docx was given the file")

    monkeypatch.setattr(document_files.docx, "Document", parsed)
    with pytest.raises(document_files.TooMuchMarkup, match=f"more than {tags - 1} tags"):
        prepare(data, "bomb.docx", "en", max_characters=10_000)


def test_a_docx_cell_spanning_many_columns_or_rows_is_read_once():
    """A cell's span is the file's to state: one over many grid columns and rows (the cells
    below it continuing its vertical merge) is one cell, read once; not once per grid column,
    nor by walking up the merge from each cell below it (quadratic in its rows)."""
    span = (b'<w:tr><w:tc><w:tcPr><w:gridSpan w:val="1000"/><w:vMerge w:val="restart"/>'
            b'</w:tcPr><w:p><w:r><w:t>Wide cell.</w:t></w:r></w:p></w:tc></w:tr>')
    below = (b'<w:tr><w:tc><w:tcPr><w:gridSpan w:val="1000"/><w:vMerge/></w:tcPr>'
             b'<w:p><w:r><w:t>Hidden.</w:t></w:r></w:p></w:tc></w:tr>')
    data = _with_body(b"<w:tbl>" + span + below * 600 + b"</w:tbl>")
    prepared = prepare(data, "wide.docx", "en", max_characters=10_000)
    assert [d.sentences for d in prepared.documents] == [["Hello there."], ["Wide cell."]]


@pytest.mark.parametrize("name, unit", [("x.txt", "Twenty characters...\n"),
                                        ("x.htm", "<p>Twenty characters...</p>")])
def test_a_text_or_page_of_more_characters_than_asked_stops_being_cut_there(
        monkeypatch, name, unit):
    """The segmenter is asked for no more text than the limit and the paragraph that passes
    it (a page's paragraphs; a text file's none: its characters but spaces are already too
    many), so that a large file past the limit costs no more than the limit."""
    from nmt.translation import paragraphs

    segmented = []
    segment_lengths = paragraphs._segment_lengths

    def recorded(line: str, language: str) -> list[int]:
        segmented.append(line)
        return segment_lengths(line, language)

    monkeypatch.setattr(paragraphs, "_segment_lengths", recorded)
    data = (unit * 10_000).encode()
    assert prepare(data, name, "en", max_characters=200_000).characters == 10_000 * 20
    segmented.clear()
    with pytest.raises(document_files.TooManyCharacters, match="more than 999 characters"):
        prepare(data, name, "en", max_characters=999)
    assert len("".join(segmented)) <= 999 + len("Twenty characters...")


def _zip(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return out.getvalue()


def _broken_docx() -> list[bytes]:
    good = _report()
    with zipfile.ZipFile(io.BytesIO(good)) as archive:
        parts = {name: archive.read(name) for name in archive.namelist()}
    without = {k: v for k, v in parts.items() if k != "word/document.xml"}
    return [b"", b"not a zip at all", good[:len(good) // 2], _zip({"a.txt": b"x"}), _zip(without),
            _zip({**parts, "word/document.xml": b"<w:document><w:body>"})]


@pytest.mark.parametrize("data", _broken_docx())
def test_a_file_that_is_not_a_docx_is_refused_as_such(data):
    with pytest.raises(ValueError, match=r"not a valid \.docx"):
        prepare(data, "broken.docx", "en")


def _texts_of(data: bytes) -> list[str]:
    """The text of every w:t of the document's body, in order."""
    return [t.text or "" for t in _open(data).element.body.iter(qn("w:t"))]


def _wrapped(wrapper: str, text: str):
    """`text` in a run inside `wrapper` (a content control's runs inside its w:sdtContent)."""
    outer = OxmlElement(wrapper)
    for name, value in {"w:ins": {"w:id": "1", "w:author": "A"}, "w:dir": {"w:val": "rtl"},
                        "w:fldSimple": {"w:instr": " PAGE "}}.get(wrapper, {}).items():
        outer.set(qn(name), value)
    inner = outer
    if wrapper == "w:sdt":
        inner = OxmlElement("w:sdtContent")
        outer.append(inner)
    run, t = OxmlElement("w:r"), OxmlElement("w:t")
    t.text = text
    run.append(t)
    inner.append(run)
    return outer


@pytest.mark.parametrize("wrapper", ["w:ins", "w:smartTag", "w:customXml", "w:dir",
                                     "w:fldSimple", "w:sdt"])
def test_docx_text_in_other_wrappers_keeps_the_spaces_around_it(wrapper):
    document = docx.Document()
    paragraph = document.add_paragraph("The quick ")
    paragraph._p.append(_wrapped(wrapper, "brown"))
    paragraph.add_run(" fox jumps.")
    data = _saved(document)
    assert _texts_of(_translate(prepare(data, "w.docx", "en"), _identity)) == [
        "The quick ", "brown", " fox jumps."]
    assert _texts_of(_translate(prepare(data, "w.docx", "en"), _upper)) == [
        "THE QUICK ", "brown", " FOX JUMPS."]
