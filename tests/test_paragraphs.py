"""Sentences out of text and HTML, and translations back in their place
(`nmt.translation.paragraphs`): nothing but the sentences may change.

Round trips with the identity translation must give the input back exactly; a marker per
sentence shows where each translation lands; HTML keeps every tag and attribute as written.
Random texts come from a seeded generator of tricky pieces (hypothesis is not a dependency).
"""

from __future__ import annotations

import html
import random
import re
import time

import numpy as np
import pytest

from nmt.models.alignment import Alignment
from nmt.translation import paragraphs
from nmt.translation.paragraphs import (
    Document,
    _pieces,
    segmenter_language,
    split_html,
    split_text,
    unescape_with_offsets,
)

TRICKY_TEXTS = [
    "",
    " ",
    "\n",
    "\r\n\r\n",
    " \t \n  \r\n ",
    "One sentence.",
    "  Leading and trailing.  ",
    "Two spaces.  Between sentences!  And three?   Yes.",
    "Tab\tinside. And\tafter.\tEnd.",
    "Windows lines.\r\nSecond line.\r\n",
    "Old Mac lines.\rSecond.\rThird",
    "Paragraph one. Still one.\n\nParagraph two.\n\n\nThree, after two blank lines.\n",
    "A line without a stop\nand its continuation.",
    "Dr. Smith met Mr. Jones at 5 p.m. today. They talked.",
    "e.g. this, i.e. that. Fine.",
    "Am 3. Oktober feiern wir. Das ist z. B. gut. Hr. Meier kommt.",
    "こんにちは。元気ですか？はい、元気です！\n日本語。",
    "Non-breaking\xa0space. Ideographic\u3000space。Thin\u2009space.",
    "D\xa0. A\u3000. Z\u2028.",  # sentencex panics on these unless given plain spaces
    "Line\u2028separator stays inside. \x0bVertical tab.\x0cForm feed.",
    "...",
    " . ! ? ",
    "Ellipsis… and «quotes». (Parenthesis.) \"Quoted.\" Done",
    "Emoji 😀. Next 🚀!",
    "\ufeffByte order mark. Then text.",
]


def _round_trip(document: Document) -> str:
    return document.join(document.sentences)


def _marked(document: Document) -> str:
    """The document with sentence i replaced by a marker naming i."""
    return document.join([f"\x00{i}\x00" for i in range(len(document.sentences))])


def _unmarked(document: Document, marked: str, escape=lambda sentence: sentence) -> str:
    """`marked` with each marker replaced by its sentence (escaped) again."""
    return re.sub("\x00(\\d+)\x00", lambda m: escape(document.sentences[int(m.group(1))]),
                  marked)


def assert_cut_as_marked(cases: list[tuple[str, str]]) -> None:
    """Each (language, text with "|" where it is cut): split_text gives those sentences, and
    its join gives the text back."""
    for language, cut in cases:
        text = cut.replace("|", "")
        document = split_text(text, language)
        assert document.sentences == [s.strip() for s in cut.split("|")], (language, text)
        assert document.join(document.sentences) == text


@pytest.mark.parametrize("text", TRICKY_TEXTS)
def test_identity_translation_gives_the_text_back(text):
    for language in ("en", "de", "ja", "xx"):
        document = split_text(text, language)
        assert _round_trip(document) == text
        for sentence in document.sentences:
            assert sentence and sentence == sentence.strip()
            assert "\n" not in sentence and "\r" not in sentence


def _random_text(rng: random.Random) -> str:
    pieces = ["Dr. Smith", "went home", ".", "!", "?", "。", "！", " ", "  ", "\t", "\n",
              "\r\n", "\r", "\n\n", "\xa0", "\u3000", "z. B.", "Äpfel", "é", "😀", "a", "B",
              "i.e.", "...", "«", "»", '"', "(", ")", "3.", "\x0b", "\u2028", "\x85"]
    return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))


def test_random_texts_round_trip_and_translations_land_in_place():
    rng = random.Random(1234)
    for _ in range(2000):
        text = _random_text(rng)
        language = rng.choice(["en", "de", "ja", "fr", "zh", "xx", "pt-BR"])
        document = split_text(text, language)
        assert _round_trip(document) == text, (text, language)
        # Each marker, replaced by its sentence again, gives the text: every translation
        # lands exactly where its own sentence was.
        marked = _marked(document)
        assert _unmarked(document, marked) == text
        assert marked.count("\x00") == 2 * len(document.sentences)
        for sentence in document.sentences:
            assert sentence == sentence.strip() and not re.search(r"[\r\n]", sentence)


def test_sentences_in_order_and_whitespace_in_between():
    text = "  Dr. Smith went home.  He was tired!\tThen?\r\n\r\nNew paragraph. \n"
    document = split_text(text, "en")
    assert document.sentences == ["Dr. Smith went home.", "He was tired!", "Then?",
                                  "New paragraph."]
    assert document.between == ["  ", "  ", "\t", "\r\n\r\n", " \n"]
    assert document.join(["A", "B", "C", "D"]) == "  A  B\tC\r\n\r\nD \n"
    upper = document.join([s.upper() for s in document.sentences])
    assert upper == "  DR. SMITH WENT HOME.  HE WAS TIRED!\tTHEN?\r\n\r\nNEW PARAGRAPH. \n"


def test_a_sentence_never_spans_a_line():
    document = split_text("This line has no stop\nand this one ends. Here", "en")
    assert document.sentences == ["This line has no stop", "and this one ends.", "Here"]


def test_languages_use_their_rules():
    german = "Am 3. Oktober feiern wir. Das ist z. B. gut."
    assert split_text(german, "de").sentences == ["Am 3. Oktober feiern wir.",
                                                  "Das ist z. B. gut."]
    for code in ("de-DE", "DE", "de_AT", " de "):  # sentencex alone gives these English rules
        assert split_text(german, code).sentences == split_text(german, "de").sentences, code
    assert split_text("こんにちは。元気ですか？はい。", "ja").sentences == [
        "こんにちは。", "元気ですか？", "はい。"]
    assert split_text("你好。再見！", "zh-Hant").sentences == ["你好。", "再見！"]
    # An unknown code gets English rules rather than an error.
    assert split_text("Dr. Smith came. He left.", "xx").sentences == ["Dr. Smith came.",
                                                                      "He left."]
    assert [segmenter_language(c) for c in ("pt-BR", "zh_Hant", "EN", "xx", "")] == [
        "pt", "zh", "en", "xx", ""]


def test_three_letter_codes_are_the_languages_two_letter_ones():
    """ISO 639-2 and 639-3 codes (and NLLB's jpn_Jpan) get the rules of their language, not
    English ones: Japanese and Chinese spacing, German ordinals, Khmer stops."""
    assert [segmenter_language(c) for c in ("jpn", "jpn_Jpan", "zho_Hant", "cmn", "chi", "kor",
                                            "tha", "lao", "khm", "mya", "deu", "ger", "fra",
                                            "yue", "xyz")] == [
        "ja", "ja", "zh", "zh", "zh", "ko", "th", "lo", "km", "my", "de", "de", "fr", "yue",
        "xyz"]
    assert paragraphs.respaced(" ", False, "晴れです。", "jpn") == ""
    assert paragraphs.respaced(" ", False, "晴れです。", "zho_Hans") == ""
    assert split_text("今日は晴れです。明日は雨です。", "jpn").join(
        ["It is sunny today.", "It will rain tomorrow."], target="eng") == (
        "It is sunny today. It will rain tomorrow.")
    assert split_text("Der 2. Weltkrieg begann 1939. Dann.", "deu").sentences == [
        "Der 2. Weltkrieg begann 1939.", "Dann."]
    assert split_text("ខ្ញុំ។ តើ។", "khm").sentences == ["ខ្ញុំ។", "តើ។"]


def test_a_quote_the_sentence_goes_on_after_stays_in_it():
    """sentencex cuts after a quote that ends in "?" or "。" where Japanese, Chinese and
    Korean go on without a space ("と聞いた", "라고 말했다"): the sentence stays whole, as
    English and German ones do, while a new sentence after a quote is still cut."""
    # Each text's sentences, "|" where it is cut.
    cases = [
        ("ja", "彼は「本当？」と聞いた。|次の文です。"),
        ("ja", "「行くよ。」と彼は言った。|そうですか。"),
        ("ja", "「本当？」って聞いた。"),
        ("zh", "他问：“真的吗？”然后走了。|下一句。"),
        ("ko", '그는 "좋아."라고 말했다. |다음 문장.'),
        ("ko", '그녀는 "가고 싶지 않았습니다." 라고 말했다. |다음 문장.'),
        ("ko", '"좋아요." 이라고 했다.'),
        ("ko", '그는 "좋아." 고 말했다.'),
        ("en", 'He said "Really?" and left. |Next.'),
        # New sentences: after "。”" in Chinese, after a space in Korean, before a quote.
        ("zh", "他说：“好。”|我走了。"),
        ("ko", "그는 “좋아.” |다음."),
        ("ko", '그는 "좋아." |고양이가 왔다.'),  # a word that begins with 고
        ("ja", "今日は晴れです。|「明日は？」と聞いた。"),
        ("ja", "彼は「本当？」|「うん。」と言った。"),
        ("ja", "「ありがとう。」|ところで、明日は来ますか。"),  # と begins the next sentence
        ("ja", "「はい。」|とても良い天気です。"),
    ]
    assert_cut_as_marked(cases)


def test_a_quote_that_opens_a_sentence_starts_it():
    """sentencex leaves a quotation mark that opens the next sentence at the end of the one
    before ('Er sagte es. "' + 'Und ...'): it goes with the sentence it opens, while one
    that closes a quote stays with its sentence."""
    cases = [
        ("de", 'Er sagte es. |"Und wir teilen es.'),
        ("en", "He said it. |'And we share it."),
        ("en", "He left. |“Yes,” she said."),
        ("de", "Er ging. |„Ja“, sagte sie."),
        ("en", 'He said "Go." |Then he left.'),
        ("en", '"Go." |"Now!" she said.'),
    ]
    assert_cut_as_marked(cases)


def test_ordinals_list_numbers_and_titles_stay_in_their_sentence():
    """sentencex cuts after "2." before a German noun, after a line's "1.", after "M." in
    French, "Mevr." in Dutch, "Dña." in Spanish and inside "Dipl.-Ing.": each is one sentence
    again, while a year or a sentence's end before a new
    sentence is still cut."""
    # Each text's sentences, "|" where it is cut.
    cases = [
        ("de", "Der 2. Weltkrieg begann 1939."),
        ("de", "Das 20. Jahrhundert war lang."),
        ("de", "Sie belegte den 2. Platz."),
        ("de", "1. FC Köln gewann."),
        ("de", "1. Einleitung"),
        ("de", "Kapitel 2. Methoden werden beschrieben."),
        ("de-AT", "Das 2. Kapitel. |Der 3. Abschnitt."),
        ("nb", "Den 2. Verdenskrig."),
        ("en", "  1. Introduction. |Then more."),
        ("en", "2.1. Methods"),
        ("fr", "M. Dupont est arrivé."),
        ("fr", "Mme. Durand"),
        ("fr", "Mme Durand est là. |Mlle. Roux aussi."),
        ("fr", "J’ai vu M. Dupont. |Il va bien."),
        ("nl", "Mevr. Jansen kwam. |Mw. de Vries ook."),
        ("es", "Dña. García llegó. |D. Pérez también."),
        ("de", "Dipl.-Ing. Müller kam. |Dr.-Ing. Roth auch."),
        ("en", "It ended. |- Then more."),
        # Still cut: a year, a number in a language without dotted ordinals, a number that is
        # not at the start of its line.
        ("de", "Er kam 1939. |Dann ging er."),
        ("fr", "Il est arrivé 2. |Puis il est parti."),
        ("en", "Chapter 2. |Methods."),
        ("en", "It was 1. |Then 2. |Then 3."),
    ]
    assert_cut_as_marked(cases)


def test_a_long_thai_paragraph_is_cut_at_spaces():
    """Thai (and Lao, Khmer, Myanmar) ends a sentence with a space, which sentencex does not
    see: a paragraph longer than LONG_SEGMENT characters is cut at spaces into pieces of at
    most that (it would be one sentence, cut at the model's length), a shorter one is not;
    a language with its own stops is not cut at spaces at all."""
    sentence = "วันนี้อากาศดีมากและฉันอยากไปเที่ยวทะเลกับครอบครัว"  # 49 characters
    text = "  " + " ".join([sentence] * 12) + "\n" + " ".join([sentence] * 3)
    document = split_text(text, "th")
    assert len(document.sentences) == 5 and document.join(document.sentences) == text
    assert all(len(s) <= paragraphs.LONG_SEGMENT for s in document.sentences)
    assert document.sentences[-1] == " ".join([sentence] * 3)  # short enough: whole
    assert split_text(text, "lo").sentences == document.sentences
    html_document = split_html(f"<p>{html.escape(text)}</p>", "th-TH")
    assert len(html_document.sentences) > 1
    english = " ".join(["a clause without a stop"] * 30)
    assert split_text(english, "en").sentences == [english]


def test_khmer_sentences_end_at_their_stops():
    """sentencex has no rule for Khmer's "។" and "៕": a sentence ends after them where a
    space or the text's end follows, before a long paragraph is cut at spaces, so such a
    paragraph is cut between its sentences rather than inside one."""
    text = "ខ្ញុំស្រឡាញ់អ្នក។ តើអ្នកសុខសប្បាយទេ។  «បាទ។» ផ្លែឈើ ស្វាយ ចេក ។ល។ ចប់៕"
    document = split_text(text, "km")
    assert document.sentences == ["ខ្ញុំស្រឡាញ់អ្នក។", "តើអ្នកសុខសប្បាយទេ។", "«បាទ។»",
                                  "ផ្លែឈើ ស្វាយ ចេក ។ល។", "ចប់៕"]
    assert document.join(document.sentences) == text
    sentence = "ខ្ញុំ ចង់ ទៅ លេង សមុទ្រ ជាមួយ គ្រួសារ របស់ ខ្ញុំ។"  # 9 words, 49 characters
    paragraph = " ".join([sentence] * 10)
    assert split_text(paragraph, "km").sentences == [sentence] * 10
    assert split_html(f"<p>{paragraph}</p>", "km-KH").sentences == [sentence] * 10


def test_whitespace_only_text_has_no_sentences():
    for text in ("", "   ", "\t\r\n \n", "\xa0\u3000"):
        document = split_text(text, "en")
        assert document.sentences == [] and document.join([]) == text


def test_join_needs_one_translation_per_sentence():
    document = split_text("One. Two.", "en")
    with pytest.raises(ValueError, match="1 translations for 2 sentences"):
        document.join(["Eins."])
    with pytest.raises(ValueError, match="3 translations for 2 sentences"):
        document.join(["a", "b", "c"])
    with pytest.raises(ValueError, match="a string"):
        document.join("ab")  # two characters are not two translations
    with pytest.raises(ValueError, match="0 translations for 2"):
        document.join([])


def test_the_space_between_sentences_follows_the_target_language():
    """Japanese and Chinese write no space after a sentence, English one: joined for a
    target, two sentences that touched in Japanese are spaced in English, and the space of
    English is dropped in Japanese; line breaks, tabs and block tags stay as they were."""
    japanese = split_text("今日は晴れです。明日は雨でしょう！\n次。", "ja")
    english = ["It is sunny today.", "It will rain tomorrow!", "Next."]
    assert japanese.join(english) == "It is sunny today.It will rain tomorrow!\nNext."
    assert japanese.join(english, target="en") == (
        "It is sunny today. It will rain tomorrow!\nNext.")
    assert split_text("今天很好。明天会下雨吗？", "zh").join(
        ["It is nice today.", "Will it rain tomorrow?"], target="en-GB") == (
        "It is nice today. Will it rain tomorrow?")
    source = split_text("It is sunny today. It will rain tomorrow!  Yes.\tNo.", "en")
    japanese_text = ["今日は晴れです。", "明日は雨でしょう！", "はい。", "いいえ。"]
    assert source.join(japanese_text, target="ja") == (
        "今日は晴れです。明日は雨でしょう！はい。\tいいえ。")
    assert source.join(japanese_text, target="ko") == source.join(japanese_text)
    # Only after a sentence's end: a space after a name or a number stays.
    assert split_text("Call Bob. Now.", "en").join(["ボブに電話 API", "今。"], target="ja") == (
        "ボブに電話 API 今。")
    # HTML: the space goes outside the inline tags around it; blocks are not sentences
    # of one text, and a source's space between them is no space between sentences.
    markup = split_html("<p>今日は晴れです。<b>明日は雨でしょう！</b></p><p>次。</p>", "ja")
    assert markup.join(english, target="en") == (
        "<p>It is sunny today. <b>It will rain tomorrow!</b></p><p>Next.</p>")
    markup = split_html("<p><i>Sunny.</i> <b>Rain!</b></p> <p>Next.</p>", "en")
    assert markup.join(["晴れ。", "雨！", "次。"], target="zh") == (
        "<p><i>晴れ。</i><b>雨！</b></p> <p>次。</p>")


def test_a_translation_cannot_break_the_layout():
    document = split_text("One. Two.\nThree.", "en")
    joined = document.join(["Eins\nund\r\nzwei.", "  Zwei.\n", "Drei.\r"])
    assert joined == "Eins und zwei. Zwei.\nDrei."  # "\r\n" is one break, one space
    assert joined.count("\n") == 1


def test_a_segmenter_panic_loses_no_text(monkeypatch):
    """sentencex's Rust panics derive from BaseException: the line stays one sentence."""
    class PanicException(BaseException):
        pass

    def panic(language, text):
        raise PanicException("byte index is not a char boundary")

    monkeypatch.setattr(paragraphs, "segment", panic)
    document = split_text(" First. Second.\nThird. ", "en")
    assert document.sentences == ["First. Second.", "Third."]
    assert _round_trip(document) == " First. Second.\nThird. "

    def interrupted(language, text):
        raise KeyboardInterrupt

    monkeypatch.setattr(paragraphs, "segment", interrupted)
    with pytest.raises(KeyboardInterrupt):
        split_text("One. Two.", "en")


def test_non_ascii_spaces_do_not_crash_the_segmenter(capfd):
    """sentencex 1.0.32 panics on "D\xa0." (and prints a Rust backtrace): it is shown plain
    spaces, so the line is still split, and quietly."""
    document = split_text("Plan D\xa0. Then we go.\u3000Fine.", "en")
    assert document.sentences == ["Plan D\xa0.", "Then we go.", "Fine."]
    assert document.between == ["", " ", "\u3000", ""]
    assert capfd.readouterr().err == ""


def test_segments_that_do_not_add_up_are_not_trusted(monkeypatch):
    monkeypatch.setattr(paragraphs, "segment", lambda language, text: ["One.", "Two."])
    document = split_text("One. Two.", "en")  # the space is missing from the segments
    assert document.sentences == ["One. Two."]


# ----------------------------------------------------------------------------- HTML

PAGE = ("<!DOCTYPE html>\n<html lang=\"en\"><head><title>A title. Here</title>"
        "<style>p > b { color: red; } /* a. b */</style></head>\n"
        "<body>\n  <p class=\"a>b\" data-x='1'>Hello <b>world</b>. Bye!</p>"
        "<!-- c. d --><script>var a = \"x. y\"; if (a<b) {}</script>\n"
        "  <p>Fish &amp; chips. 1 &lt; 2!</p><br/><img alt=\"Not. Text.\" src=x>"
        "<![CDATA[ raw. text ]]><?php echo 'x. y'; ?>\n</body></html>\n")


def test_html_identity_gives_the_markup_back():
    document = split_html(PAGE, "en")
    # <b> is inline: "Hello <b>world</b>." is one sentence.
    assert document.sentences == ["A title.", "Here", "Hello world.", "Bye!",
                                  "Fish & chips.", "1 < 2!"]
    assert _round_trip(document) == PAGE


def test_html_tags_attributes_and_code_are_kept_byte_for_byte():
    markup = ("<p class=\"a>b\" data-x='1'>Hello <b>world</b>. Bye!</p><!-- c -->"
              "<script>var a = \"x. y\";</script>")
    document = split_html(markup, "en")
    assert document.sentences == ["Hello world.", "Bye!"]
    aligned = word_alignment("Hello world.", "Welt, hallo.", {0: 1, 1: 2, 2: 0, 3: 2})
    assert document.join(["Welt, hallo.", "Tschüss!"], {0: aligned}) == (
        "<p class=\"a>b\" data-x='1'><b>Welt</b>, hallo. Tschüss!</p><!-- c -->"
        "<script>var a = \"x. y\";</script>")
    upper = split_html(PAGE, "en")
    translated = upper.join([s.upper() for s in upper.sentences])
    tags = re.compile(r"<[^>]*>")
    assert tags.findall(translated) == tags.findall(PAGE)
    assert "var a = \"x. y\"; if (a<b) {}" in translated  # script untouched
    assert "p > b { color: red; } /* a. b */" in translated  # style untouched
    assert "<!-- c. d -->" in translated and "<![CDATA[ raw. text ]]>" in translated
    assert "FISH &amp; CHIPS. 1 &lt; 2!" in translated


def test_html_entities_are_text_and_translations_are_escaped():
    document = split_html("<p>Fish &amp; chips &lt;3. A&nbsp;&nbsp;B&#44;&#x20;c.</p>", "en")
    assert document.sentences == ["Fish & chips <3.", "A\xa0\xa0B, c."]
    assert document.join(["<b>&</b>", "x > y"]) == ("<p>&lt;b&gt;&amp;&lt;/b&gt; "
                                                    "x &gt; y</p>")
    # Whitespace around sentences is copied as it was written, references included.
    document = split_html("<td>&nbsp;Yes.&#32;&nbsp;No.&nbsp;</td><td>&nbsp;</td>", "en")
    assert document.sentences == ["Yes.", "No."]
    assert document.join(["Ja.", "Nein."]) == "<td>&nbsp;Ja.&#32;&nbsp;Nein.&nbsp;</td>" \
                                              "<td>&nbsp;</td>"


def test_unescape_maps_every_character_to_where_it_was_written():
    raw = "a&amp;b &nbsp;&#59;&ampx &unknown; &#x1F600;\u3000c"
    plain, where = unescape_with_offsets(raw)
    assert plain == "a&b \xa0;&x &unknown; 😀\u3000c"
    assert len(where) == len(plain) + 1 and where[-1] == len(raw)
    assert where == sorted(where)
    for i, char in enumerate(plain):
        if char in "abcx u\u3000":  # written as themselves
            assert raw[where[i]] == char, i


def test_html_whitespace_runs_are_kept_and_translate_nothing():
    markup = "<ul>\n  <li> </li>\r\n\t<li>&#10;&nbsp;</li>\n</ul>"
    document = split_html(markup, "en")
    assert document.sentences == [] and document.join([]) == markup


def test_html_lines_matter_only_where_they_show():
    document = split_html("<p>A sentence wrapped\n   over two lines. Next.</p>"
                          "<pre>first line\nsecond line. X</pre><p>After\npre.</p>", "en")
    assert document.sentences == ["A sentence wrapped\n   over two lines.", "Next.",
                                  "first line", "second line.", "X", "After\npre."]
    # A wrapped sentence comes back on one line; <pre> keeps its lines.
    assert document.join(document.sentences) == (
        "<p>A sentence wrapped    over two lines. Next.</p>"
        "<pre>first line\nsecond line. X</pre><p>After pre.</p>")


@pytest.mark.parametrize("newline", ["&#10;", "&#xA;", "&NewLine;", "&#13;&#10;"])
def test_by_line_html_cuts_at_written_line_breaks_not_encoded_ones(newline):
    """translate.py --html (by_line) cuts a sentence where the markup breaks its line, but an
    encoded line break is a space there as in the server's cut."""
    markup = f"<p>Ein Mann{newline}fährt. Ein Hund\nläuft. Zwei <b>Kinder{newline}spielen</b>.</p>"
    lined, served = split_html(markup, "de", by_line=True), split_html(markup, "de")
    assert lined.sentences == [f"Ein Mann{html.unescape(newline)}fährt.", "Ein Hund", "läuft.",
                               f"Zwei Kinder{html.unescape(newline)}spielen."]
    assert served.sentences == [lined.sentences[0], "Ein Hund\nläuft.", lined.sentences[3]]
    joined = lined.join([sentence.upper() for sentence in lined.sentences])
    assert joined == "<p>EIN MANN FÄHRT. EIN HUND\nLÄUFT. ZWEI <b>KINDER SPIELEN</b>.</p>"
    assert joined.count("\n") == markup.count("\n")


def test_html_verbatim_elements():
    markup = ("<p>Translate me.</p><code translate=\"no\">f(). <code>g().</code> h().</code>"
              "<p>And me.</p><template><p>Not me.</p></template><div translate=no>No. "
              "<img translate=\"no\" src=x>Still no.</div><span>Yes.</span>"
              "<img translate=\"no\"> After a void element.<br translate=\"no\"/> More.")
    document = split_html(markup, "en")
    assert document.sentences == ["Translate me.", "And me.", "Yes.",
                                  "After a void element.", "More."]
    assert _round_trip(document) == markup



def test_class_notranslate_marks_an_element_as_translate_no_does():
    markup = ('<p class="brand notranslate">ACME Widget. <b>Still kept.</b></p>'
              '<p class=notranslate>Kept too.</p><p class="NoTranslate">Translated.</p>'
              '<p class="notranslated">Translated too.</p>'
              '<p>Run <code class="notranslate">ls -l</code> now.</p>')
    document = split_html(markup, "en")
    assert document.sentences == ["Translated.", "Translated too.", "Run", "now."]
    assert _round_trip(document) == markup


def test_translate_yes_inside_an_element_kept_whole_is_kept_too():
    """As in Firefox's translator, an element marked translate="no" is skipped whole."""
    markup = ('<div translate="no">Kept. <span translate="yes">Kept too.</span></div>'
              '<p>Translated.</p>')
    assert split_html(markup, "en").sentences == ["Translated."]

@pytest.mark.parametrize("markup, sentences", [
    ('<p translate="no">ACME Widget<p>Click here.<p>Thanks.', ["Click here.", "Thanks."]),
    ("<ul><li translate=no>ACME<li>Buy now.<li>Sell later.</ul><p>More text.</p>",
     ["Buy now.", "Sell later.", "More text."]),
    ("<ul><li translate=no>A<ul><li>B.<li>C.</ul>D.<li>E.</ul>", ["E."]),   # a nested list
    ("<dl><dt translate=no>Term<dd>Meaning.</dl>", ["Meaning."]),
    ("<table><tr><td translate=no>SKU-1<td>Price.</table>", ["Price."]),
    ("<table><tr><td translate=no><table><tr><td>In.</td></tr></table>Out.<td>Yes.</table>",
     ["Yes."]),
    ("<p translate=no>A.<div>B.</div>", ["B."]),
    ("<div translate=no><p>a.<p>b.</div>c.", ["c."]),
    ("<div><span translate=no>Hidden.</div><p>Shown.</p>", ["Shown."]),   # the parent's end
    ("<p>x.</p><div translate=no>No.</span> Still no.</div>Yes.", ["x.", "Yes."]),  # stray
    ("<div><div translate=no>No.</div>Yes.</div>Also.", ["Yes.", "Also."]),
])
def test_a_verbatim_element_ends_where_html_ends_it(markup, sentences):
    """An end tag HTML lets one leave out (</p>, </li>, </td>) is implied by the next start
    tag that needs it closed, or by the end tag of an element around it: the text after
    is translated, not kept verbatim to the end of the document."""
    document = split_html(markup, "en")
    assert document.sentences == sentences
    assert _round_trip(document) == markup



@pytest.mark.parametrize("markup, sentences", [
    ('<div translate="no"/>Kept: the div is open.</div><p>Translated.</p>', ["Translated."]),
    ("<div translate=no/>Translated: no/ is not no.</div>", ["Translated: no/ is not no."]),
    ("<pre/>one line\nand another</pre>", ["one line", "and another"]),  # lines in <pre>
    # In SVG and MathML "/>" does end an element.
    ('<svg><g translate="no"/><text>Translated.</text></svg>', ["Translated."]),
    ('<math><mi translate="no" /><mtext>Translated.</mtext></math>', ["Translated."]),
])
def test_a_slash_before_the_end_of_a_start_tag_ends_only_void_and_foreign_elements(
        markup, sentences):
    """As browsers read HTML, "/>" ends no element but a void one, except in SVG and MathML,
    and the "/" that ends an unquoted value (href=/docs/) is the value's."""
    document = split_html(markup, "en")
    assert document.sentences == sentences
    assert _round_trip(document) == markup

def test_html_malformed_markup_keeps_its_text():
    for markup, sentences in [
        ("If 1 < 2 holds. Then it is true.", ["If 1 < 2 holds.", "Then it is true."]),
        ("x <3 y. <p>z.</p>", ["x <3 y.", "z."]),
        ("Open <b tag never closed. Text.", ["Open <b tag never closed.", "Text."]),
        ("<p title=\"unclosed>Text. More.", ["Text.", "More."]),  # the quote is a character
        ("<a '>'c. D.", ["'c.", "D."]),  # a quote opens a value only after "="
        ("<a b='>'c. D.", ["<a b='>'c.", "D."]),  # ... as here: a tag never closed
        ("< p>Spaced. </ p>", ["< p>Spaced.", "</ p>"]),
        ("Before. <!-- never closed. Text", ["Before."]),
        ("A. <!-->B. <!--->C. <!---->D.", ["A.", "B.", "C.", "D."]),  # empty comments
        ("Text <script>never closed. x", ["Text"]),
        ("<<b>>Double.", ["<>Double."]),  # <b> is inline: it does not cut the sentence
        ("<", ["<"]),
        ("&", ["&"]),
    ]:
        document = split_html(markup, "en")
        assert document.sentences == sentences, markup
        identity = document.join(document.sentences)
        # Nothing is lost: unescaped again, the output reads as the input did.
        assert identity.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&") \
            == markup, markup


def word_alignment(source: str, target: str, pairs: dict[int, int]) -> Alignment:
    """An alignment with one token per word: target word j attends to source word
    pairs[j] only."""
    source_spans = [m.span() for m in re.finditer(r"\w+|[^\w\s]", source)]
    target_spans = [m.span() for m in re.finditer(r"\w+|[^\w\s]", target)]
    weights = np.full((len(target_spans), len(source_spans)), 0.01, np.float32)
    for j, i in pairs.items():
        weights[j, i] = 1.0
    return Alignment(source_spans, target_spans, weights)


def escape(sentence: str) -> str:
    return html.escape(re.sub(r"\r\n?|\n", " ", sentence), quote=False)


def test_many_lone_angle_brackets_take_linear_time():
    """A "<" that opens nothing must not cost a scan to the end of the markup each."""
    for markup in ("a <b " * 40000, "<a x='>' " * 25000, "<!x " * 50000, "<a '" * 50000,
                   "<p x=\"" * 40000, "<li translate=no>a " * 25000 + "</ul>" * 25000,
                   "<div>" * 40000 + "</b>" * 40000 + "</div>"):
        start = time.perf_counter()
        document = split_html(markup, "en")
        assert time.perf_counter() - start < 10, markup[:20]  # quadratic: minutes
        assert document.join(document.sentences).replace("&lt;", "<").replace(
            "&gt;", ">") == markup


def test_many_sentences_with_inline_tags_take_linear_time():
    """Each sentence of a block finds its own inline tags, not every tag of the block: a
    scan of all tags per sentence took 52 s for the 8,000 sentences below."""
    for markup, sentence, count, tags in (
            ("Ein <b>Mann</b> fährt. " * 8000, "Ein Mann fährt.", 8000, 2),
            ("<p>" + ("Ab. " + "<i></i>" * 20) * 2000 + "</p>", "Ab.", 2000, 0)):
        start = time.perf_counter()
        document = split_html(markup, "de")
        assert time.perf_counter() - start < 10  # quadratic: minutes
        assert document.sentences == [sentence] * count
        assert [len(points) for points in document.points or [()] * count] == [tags] * count
        assert document.join(document.sentences) == markup


def test_random_markup_round_trips():
    rng = random.Random(99)
    pieces = ["<p>", "</p>", "<b class='x>y'>", "</b>", "<br/>", "<!-- a. b -->", " ", "\n",
              "Dr. Smith came.", " He left! ", "Why?", "&amp;", "&nbsp;", "&#32;", "\xa0",
              "<script>a<b. c</script>", "<pre>", "</pre>", "<code translate=no>", "</code>",
              "x", "。", "<!DOCTYPE html>", "\r\n", "\t"]
    for _ in range(1000):
        markup = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 25)))
        document = split_html(markup, rng.choice(["en", "ja", "xx"]))
        expected = document.join(document.sentences)
        # Every tag and other markup is kept, once and in order, inline ones included.
        assert _markup_pieces(expected) == _markup_pieces(markup), markup
        if not document.needs_alignment:
            # Every marker, back to its sentence escaped, gives the identity translation:
            # nothing moved, nothing lost.
            assert _unmarked(document, _marked(document), escape) == expected
        if not re.search(r"&(amp|nbsp|#32);", markup) and "\n" not in markup \
                and "\r" not in markup and not re.search(r"\w<b|</b>\w", markup):
            assert expected == markup, markup


def _markup_pieces(markup: str) -> list[str]:
    return [piece for piece, is_text, _ in _pieces(markup) if not is_text]


def test_a_sentence_joined_as_itself_keeps_its_tags_whatever_its_alignment():
    """An untranslated sentence (one without letters) is its own translation: its tags go
    back where they were, not where an alignment of the text with itself would put them."""
    document = split_html('<p><b>12</b> 345 678</p>', "de")
    mirrored = Alignment([(0, 2), (3, 6), (7, 10)], [(0, 2), (3, 6), (7, 10)],
                         np.eye(3, dtype=np.float32)[::-1].copy())
    assert document.join(["12 345 678"], {0: mirrored}) == '<p><b>12</b> 345 678</p>'
    assert document.join(["12 345 678."], {0: mirrored}) == '<p>12 345 <b>678</b>.</p>'


def _counting_tags(monkeypatch) -> list:
    """A list that grows by one for each tag (or other markup) split_html reads."""
    read = []
    markup_at = paragraphs._markup_at
    monkeypatch.setattr(paragraphs, "_markup_at", lambda *args: read.append(1) or markup_at(*args))
    return read


@pytest.mark.parametrize("tag", ["<b>", "<p>", "<br>", "<!-- -->"])
def test_a_page_of_tags_alone_is_refused_once_its_tags_pass_the_limit(monkeypatch, tag):
    """Tags hold no character, yet each costs about as much to read as one: a page of more
    tags than its limit of characters is refused as the tags are read, not after all of them."""
    read = _counting_tags(monkeypatch)
    assert paragraphs.markup_allowed(1000) == 2000 + paragraphs.MARKUP_BESIDES
    monkeypatch.setattr(paragraphs, "MARKUP_BESIDES", 5)
    with pytest.raises(paragraphs.TooMuchMarkup, match=r"more than 2005 tags, the most read for "
                                                       r"1000 characters to translate \(2 per "
                                                       r"character and 5 more\)"):
        split_html(tag * 20_000, "en", max_characters=1000)
    assert len(read) == 2006
    assert split_html(tag * 2005 + "Hi.", "en", max_characters=1000).sentences == ["Hi."]


def test_a_sentence_that_runs_on_is_refused_once_it_passes_the_limit(monkeypatch):
    """Inline tags do not end a sentence, so the characters of one that runs on through them
    are counted as they are read, not once it ends."""
    read = _counting_tags(monkeypatch)
    with pytest.raises(paragraphs.TooManyCharacters, match="more than 1000 characters") as err:
        split_html("<p>" + "<b>word</b> " * 5000 + "</p>", "en", max_characters=1000)
    assert not isinstance(err.value, paragraphs.TooMuchMarkup)
    assert len(read) <= 2 * 1000 // 4 + 3  # two tags per word of four characters
