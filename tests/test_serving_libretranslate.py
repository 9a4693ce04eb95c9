"""The server as a peer of LibreTranslate: what its clients and browsers expect besides
/translate. A real `python -m nmt.serving` on 127.0.0.1 serving the tiny untrained model of
tests/translate_model.py twice, as de->en and fr->en (so that /detect and source "auto" have
two languages to tell apart): CORS, JSON only as JSON, /detect and detectedLanguage,
alternatives, /suggest, /spec, rate limits, files, and HTML whose inline tags no longer cut
sentences.
"""

from __future__ import annotations

import io
import json
import re
import uuid

import pytest
from serving_process import Server
from test_inline_markup import parents

from translate_model import sentences

SHAPES = ["--buckets", "16,64", "--batch-tokens", "256"]
# 127.0.0.1's own requests stay under these; the rate tests speak as other clients
# (X-Forwarded-For, which uvicorn trusts from 127.0.0.1).
FLAGS = [*SHAPES, "--char-limit", "30000", "--req-limit", "150",
         "--char-limit-per-minute", "20000", "--alternatives-limit", "2"]
GERMAN = "Der Hund läuft schnell durch den großen Park und die Kinder spielen am Strand."
FRENCH = "Le chien court rapidement dans le grand parc et les enfants jouent sur la plage."
POOL = sentences(12, seed=11)


@pytest.fixture(scope="module")
def server(run_dir, env):
    server = Server.start(["--model", f"de:en={run_dir}", "--model", f"fr:en={run_dir}",
                           *FLAGS], env)
    yield server
    assert server.stop() == 0, "".join(server.log)


def translate(server: Server, q, source: str = "de", **more) -> tuple[int, dict]:
    return server.post_json("/translate", {"q": q, "source": source, "target": "en", **more})


# ----------------------------------------------------------------------------- CORS, bodies


def test_cors_preflight_and_simple_requests(server):
    origin = {"Origin": "https://page.example"}
    status, headers, _ = server.request("OPTIONS", "/translate", headers={
        **origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, authorization"})
    headers = {k.lower(): v for k, v in headers.items()}
    assert status == 200
    assert headers["access-control-allow-origin"] == "*"
    assert "POST" in headers["access-control-allow-methods"]
    assert "content-type" in headers["access-control-allow-headers"].lower()
    for method, path, body in (("POST", "/translate", {"q": POOL[0], "source": "de",
                                                      "target": "en"}),
                               ("GET", "/languages", None),
                               ("POST", "/translate", {"q": POOL[0]})):  # a refusal too
        status, headers, _ = server.request(method, path, body, headers=origin)
        assert status in (200, 400)
        assert {k.lower(): v for k, v in headers.items()}["access-control-allow-origin"] == "*"


def test_only_the_origins_given_may_read_answers():
    from starlette.testclient import TestClient

    from nmt.serving.app import build_app
    from nmt.serving.catalog import Catalog
    from nmt.serving.limits import ServerLimits
    from nmt.serving.metrics import Metrics
    from nmt.serving.service import Service

    service = Service(Catalog([]), ServerLimits(), Metrics())
    client = TestClient(build_app(service, cors_origins=["https://mine.example"]))
    preflight = {"Access-Control-Request-Method": "POST"}
    mine = client.options("/translate", headers={"Origin": "https://mine.example", **preflight})
    assert mine.status_code == 200
    assert mine.headers["access-control-allow-origin"] == "https://mine.example"
    other = client.options("/translate", headers={"Origin": "https://evil.example", **preflight})
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    read = client.get("/languages", headers={"Origin": "https://evil.example"})
    assert read.status_code == 200 and "access-control-allow-origin" not in read.headers
    none = TestClient(build_app(service, cors_origins=[]))
    answer = none.get("/languages", headers={"Origin": "https://mine.example"})
    assert "access-control-allow-origin" not in answer.headers


def test_a_refused_preflight_is_a_json_error():
    from starlette.testclient import TestClient

    from nmt.serving.app import build_app
    from nmt.serving.catalog import Catalog
    from nmt.serving.limits import ServerLimits
    from nmt.serving.metrics import Metrics
    from nmt.serving.service import Service

    service = Service(Catalog([]), ServerLimits(), Metrics())
    client = TestClient(build_app(service, cors_origins=["https://mine.example"]))
    answer = client.options("/translate", headers={"Origin": "https://evil.example",
                                                   "Access-Control-Request-Method": "POST"})
    assert answer.status_code == 400 and answer.headers["content-type"] == "application/json"
    assert answer.json() == {"error": "Disallowed CORS origin: not allowed by this server's "
                                      "CORS settings (--cors-origins)"}


def test_json_is_read_only_as_json(server):
    body = json.dumps({"q": POOL[0], "source": "de", "target": "en"})
    status, _, answer = server.request("POST", "/translate", body,
                                       headers={"Content-Type": "text/plain"})
    assert status == 415 and "application/json" in json.loads(answer)["error"]
    status, _, answer = server.request("POST", "/translate", body)  # no type at all
    assert status == 415
    # curl -d '{json}' sends a form type: the answer says what to add.
    status, _, answer = server.request(
        "POST", "/translate", body,
        headers={"Content-Type": "application/x-www-form-urlencoded"})
    message = json.loads(answer)["error"]
    assert status == 400 and "looks like JSON" in message
    assert "-H 'Content-Type: application/json'" in message
    status, answer = translate(server, POOL[0])
    assert status == 200 and answer["translatedText"]


# ----------------------------------------------------------------------------- endpoints


def test_suggest_spec_and_frontend_settings(server):
    status, answer = server.post_json("/suggest", {"q": "a", "s": "b", "source": "de",
                                                   "target": "en"})
    assert (status, answer) == (403, {"error": "Suggestions are disabled on this server."})
    status, _, body = server.request("GET", "/spec")
    spec = json.loads(body)
    assert status == 200 and spec["openapi"].startswith("3.")
    assert {"/translate", "/detect", "/translate_file", "/languages"} <= set(spec["paths"])
    source = spec["paths"]["/translate"]["post"]["requestBody"]["content"][
        "application/json"]["schema"]["properties"]["source"]
    assert source["enum"] == ["de", "en", "fr", "auto"]
    status, _, body = server.request("GET", "/frontend/settings")
    settings = json.loads(body)
    assert settings["suggestions"] is False and ".docx" in settings["supportedFilesFormat"]
    assert settings["language"]["source"]["code"] == "de"


def test_alternatives_up_to_the_limit(server):
    status, one = translate(server, POOL[1])
    status, answer = translate(server, POOL[1], alternatives=2)
    assert status == 200
    alternatives = answer["alternatives"]
    assert isinstance(alternatives, list) and len(alternatives) <= 2
    assert len(set(alternatives)) == len(alternatives)
    assert answer["translatedText"] not in alternatives
    assert all(isinstance(text, str) and text for text in alternatives)
    status, answer = translate(server, POOL[1:3], alternatives="1")  # a form's string too
    assert status == 200 and len(answer["alternatives"]) == 2
    status, answer = translate(server, POOL[1], alternatives=3)
    assert status == 400 and "--alternatives-limit" in answer["error"]
    status, answer = translate(server, POOL[1])
    assert status == 200 and "alternatives" not in answer and answer == one


def test_rate_limits_answer_429_with_retry_after_per_client(server):
    first = {"X-Forwarded-For": "10.9.9.1"}
    status, _, _ = server.request("POST", "/translate", {"q": [""] * 100, "source": "de",
                                                         "target": "en"}, headers=first)
    assert status == 200
    status, headers, body = server.request("POST", "/translate", {
        "q": [""] * 60, "source": "de", "target": "en"}, headers=first)
    assert status == 429, body
    assert json.loads(body)["error"].startswith("Slowdown:")
    assert "--req-limit" in json.loads(body)["error"]
    assert 1 <= int(headers["retry-after"]) <= 60
    # Refused requests cost nothing, and another client has its own window.
    status, _, _ = server.request("POST", "/translate", {"q": [""] * 50, "source": "de",
                                                         "target": "en"}, headers=first)
    assert status == 200
    other = {"X-Forwarded-For": "10.9.9.2"}
    status, _, _ = server.request("POST", "/detect", {"q": GERMAN}, headers=other)
    assert status == 200
    # More characters than a minute allows would never pass: 413, not 429.
    status, _, body = server.request("POST", "/translate", {
        "q": "Ein Mann. " * 2500, "source": "de", "target": "en"}, headers=other)
    assert status == 413 and "--char-limit-per-minute" in json.loads(body)["error"]


# ----------------------------------------------------------------------------- languages


def test_detect_with_libretranslatepy_and_source_auto(server):
    from libretranslatepy import LibreTranslateAPI

    client = LibreTranslateAPI(server.url)
    german, french = client.detect(GERMAN), client.detect(FRENCH)
    assert german[0]["language"] == "de" and french[0]["language"] == "fr"
    assert 50 < german[0]["confidence"] <= 100
    assert [d["confidence"] for d in german] == sorted(d["confidence"] for d in german)[::-1]
    assert {d["language"] for d in german} <= {"de", "fr", "en"}  # only the languages served
    # No letters: nothing to tell a language by, but an answer to read the first entry of.
    status, answer = server.post_json("/detect", {"q": "12345 !!"})
    assert (status, answer) == (200, [{"language": "de", "confidence": 0.0}])
    assert client.detect("\U0001F600")[0] == {"language": "de", "confidence": 0.0}
    status, answer = server.post_json("/detect", {"q": ""})
    assert status == 400 and "missing q" in answer["error"]
    # A list: one answer for the texts together, as LibreTranslate gives.
    status, answer = server.post_json("/detect", {"q": [GERMAN, GERMAN]})
    assert status == 200 and answer[0]["language"] == "de", answer
    status, answer = server.post_json("/detect", {"q": [GERMAN, 3]})
    assert status == 400 and "a list of strings" in answer["error"]
    for text, language in ((GERMAN, "de"), (FRENCH, "fr")):
        status, auto = translate(server, text, source="auto")
        status, known = translate(server, text, source=language)
        assert status == 200 and auto["detectedLanguage"]["language"] == language
        assert auto["translatedText"] == known["translatedText"]
    status, answer = translate(server, [GERMAN, GERMAN], source="auto")
    assert [d["language"] for d in answer["detectedLanguage"]] == ["de", "de"]


def fake_client(*pairs: str, limits=None):
    """In-process (Starlette's test client): a server of `pairs` ("de:en") whose models say
    which they are ("de-en: SENTENCE"), and the list of every sentence they were given;
    `limits`: its ServerLimits, the defaults without."""
    from types import SimpleNamespace

    from starlette.testclient import TestClient

    from nmt.models.translations import Hypothesis
    from nmt.serving.app import build_app
    from nmt.serving.catalog import Catalog, ServedModel
    from nmt.serving.limits import ServerLimits
    from nmt.serving.metrics import Metrics
    from nmt.serving.service import Service
    from transformer.config import SearchConfig

    searched: list[str] = []

    def model(index: int, pair: str) -> ServedModel:
        source, target = pair.split(":")

        async def search(batch):
            searched.extend(batch)
            return [[Hypothesis(f"{source}-{target}: {sentence}", 0.0, ())]
                    for sentence in batch]

        translator = SimpleNamespace(search=SearchConfig(), describe=lambda: "fake")
        batcher = SimpleNamespace(translate=search)
        return ServedModel(index, source, target, f"runs/{source}-{target}", translator,
                           batcher=batcher, alternatives_batcher=batcher)

    service = Service(Catalog([model(n, pair) for n, pair in enumerate(pairs)]),
                      limits or ServerLimits(), Metrics(), ready=True, alternatives_limit=2)
    return TestClient(build_app(service)), searched


ENGLISH = "The children are playing football in the park after school."


def test_source_auto_tells_each_text_of_a_list_apart():
    """A list of a German and a French text, source auto, has each text detected on its own
    and translated by its own model, in the list's order."""
    client, _ = fake_client("de:en", "fr:en")
    answer = client.post("/translate", json={"q": [GERMAN, FRENCH, GERMAN], "source": "auto",
                                             "target": "en"}).json()
    assert [d["language"] for d in answer["detectedLanguage"]] == ["de", "fr", "de"]
    assert answer["translatedText"] == [f"de-en: {GERMAN}", f"fr-en: {FRENCH}",
                                        f"de-en: {GERMAN}"]


def test_source_auto_detects_even_with_one_source_and_knows_the_target():
    """Source auto detects among the sources and targets served, with one source too: a
    text already in the target language comes back as it is, one in a served target goes
    through its own model, and the confidence is the one detected."""
    client, searched = fake_client("de:en")

    def auto(q, target="en", **more):
        answer = client.post("/translate", json={"q": q, "source": "auto", "target": target,
                                                 **more})
        assert answer.status_code == 200, answer.text
        return answer.json()

    english = auto(ENGLISH)
    assert english["translatedText"] == ENGLISH and searched == []
    assert english["detectedLanguage"]["language"] == "en"
    assert 50 < english["detectedLanguage"]["confidence"] <= 100
    german = auto(GERMAN)
    assert german["translatedText"] == f"de-en: {GERMAN}"
    assert german["detectedLanguage"]["language"] == "de"
    assert auto([ENGLISH, GERMAN])["translatedText"] == [ENGLISH, f"de-en: {GERMAN}"]
    markup = f"<p>{ENGLISH[:-1]} <b>today</b>.</p>"
    assert auto(markup, format="html")["translatedText"] == markup
    assert auto(f"<p>{GERMAN}</p>", format="html")["translatedText"] == \
        f"<p>de-en: {GERMAN}</p>"
    detected = client.post("/detect", json={"q": ENGLISH}).json()
    assert detected[0]["language"] == "en"
    assert {d["language"] for d in detected} <= {"de", "en"}
    url = client.post("/translate_file", data={"source": "auto", "target": "en"}, files={
        "file": ("a.txt", f"{ENGLISH}\n".encode(), "text/plain")}).json()["translatedFileUrl"]
    assert client.get(url).content == f"{ENGLISH}\n".encode()

    client, searched = fake_client("de:en", "en:de")
    german = auto(GERMAN, target="de")
    assert german["translatedText"] == GERMAN and searched == []
    assert german["detectedLanguage"]["language"] == "de"
    english = auto(ENGLISH, target="de")
    assert english["translatedText"] == f"en-de: {ENGLISH}"
    assert english["detectedLanguage"]["language"] == "en"


def test_source_auto_refuses_a_language_read_that_does_not_go_to_the_target():
    """On a de:en server, English text asked into German has no model: it is refused naming
    the language read, not passed off as German returned as it is."""
    client, searched = fake_client("de:en")
    answer = client.post("/translate", json={"q": ENGLISH, "source": "auto", "target": "de"})
    assert answer.status_code == 400 and searched == []
    assert answer.json()["error"].startswith("the text reads as en (")
    assert "does not translate en->de" in answer.json()["error"]


def test_a_language_to_itself_comes_back_as_it_is():
    """A pair whose source is its target, that language served (as a source or a target),
    is LibreTranslate's identity translation: texts, HTML and files come back as they are,
    with no alternatives and no search; a language not served is still refused."""
    client, searched = fake_client("de:en")
    markup = "<p>Zwei <b>Hunde</b> spielen.</p>"
    for language, q, more in (("en", ENGLISH, {}), ("de", GERMAN, {}),
                              ("en", [ENGLISH, "", "Two dogs."], {}),
                              ("de", markup, {"format": "html"}),
                              ("en", ENGLISH, {"alternatives": 2})):
        answer = client.post("/translate", json={"q": q, "source": language,
                                                 "target": language, **more})
        assert answer.status_code == 200, answer.text
        assert answer.json()["translatedText"] == q
        assert answer.json().get("alternatives", []) == []
    url = client.post("/translate_file", data={"source": "en", "target": "en"}, files={
        "file": ("a.txt", b"Two dogs.\n", "text/plain")}).json()["translatedFileUrl"]
    assert client.get(url).content == b"Two dogs.\n"
    assert searched == []
    answer = client.post("/translate", json={"q": "Hi.", "source": "fr", "target": "fr"})
    assert answer.status_code == 400
    assert answer.json()["error"] == "no model for fr->fr: this server translates de->en"


def test_messages_name_pairs_of_hyphenated_codes_readably():
    """A pair is named source->target in messages, since "pt-BR-zh-Hant" could be cut
    anywhere; /health keeps its documented "source-target"."""
    client, _ = fake_client("pt-BR:zh-Hant", "en:de")
    answer = client.post("/translate", json={"q": "Olá.", "source": "pt-BR", "target": "de"})
    assert answer.status_code == 400
    assert answer.json()["error"] == ("no model for pt-BR->de: this server translates "
                                      "pt-BR->zh-Hant, en->de")
    answer = client.post("/translator/translate", json=[{"src": "Olá.", "id": 7}])
    assert answer.json()["error"].endswith("the ids served are 0 (pt-BR->zh-Hant), 1 (en->de)")
    assert client.get("/health").json()["models"] == ["pt-BR-zh-Hant", "en-de"]


def test_language_names_keep_the_region_and_script_of_their_codes():
    """pt-BR and pt-PT, zh-Hant and zh-Hans served side by side are four names in a menu,
    not Portuguese twice and Chinese twice."""
    client, _ = fake_client("pt-BR:en", "pt_PT:en", "zh-Hant:zh-Hans", "de:en", "xx-YY:en")
    names = {entry["code"]: entry["name"] for entry in client.get("/languages").json()}
    assert names == {"pt-BR": "Portuguese (BR)", "pt_PT": "Portuguese (PT)",
                     "zh-Hant": "Chinese (Hant)", "zh-Hans": "Chinese (Hans)",
                     "de": "German", "en": "English", "xx-YY": "xx-YY"}
    settings = client.get("/frontend/settings").json()["language"]
    assert settings == {"source": {"code": "pt-BR", "name": "Portuguese (BR)"},
                        "target": {"code": "en", "name": "English"}}


def test_a_model_served_for_a_language_to_itself_is_used():
    """A model served as en:en (a paraphraser, a normalizer) translates its texts and files,
    source auto included: the identity is for languages no such model serves."""
    client, searched = fake_client("de:en", "en:en")
    for source in ("en", "auto"):
        answer = client.post("/translate", json={"q": ENGLISH, "source": source,
                                                 "target": "en"}).json()
        assert answer["translatedText"] == f"en-en: {ENGLISH}"
    assert answer["detectedLanguage"]["language"] == "en"
    url = client.post("/translate_file", data={"source": "en", "target": "en"}, files={
        "file": ("a.txt", b"Two dogs.\n", "text/plain")}).json()["translatedFileUrl"]
    assert client.get(url).content == b"en-en: Two dogs.\n"
    assert searched == [ENGLISH, ENGLISH, "Two dogs."]
    answer = client.post("/translate", json={"q": GERMAN, "source": "de", "target": "de"})
    assert answer.json()["translatedText"] == GERMAN


def test_a_text_without_letters_comes_back_as_it_is():
    """Emoji, digits and punctuation are no language and nothing to translate: each such
    text of a request comes back as it is, without a search (a model would make words of
    it); source auto says the first source, with confidence 0."""
    client, searched = fake_client("de:en", "fr:en")
    emoji, digits = "\U0001F600\U0001F600", "3.14 + 2 = 5.14 !!"
    answer = client.post("/translate", json={"q": [GERMAN, emoji, digits], "source": "de",
                                             "target": "en"}).json()
    assert answer["translatedText"] == [f"de-en: {GERMAN}", emoji, digits]
    assert searched == [GERMAN]
    answer = client.post("/translate", json={"q": [emoji, FRENCH], "source": "auto",
                                             "target": "en", "alternatives": 1}).json()
    assert answer["translatedText"] == [emoji, f"fr-en: {FRENCH}"]
    assert answer["detectedLanguage"][0] == {"language": "de", "confidence": 0.0}
    assert answer["alternatives"][0] == []
    markup = "<p>\U0001F600 <b>12</b></p>"
    answer = client.post("/translate", json={"q": markup, "source": "fr", "target": "en",
                                             "format": "html"}).json()
    assert answer["translatedText"] == markup
    url = client.post("/translate_file", data={"source": "auto", "target": "en"}, files={
        "file": ("a.txt", f"{emoji}\n12\n".encode(), "text/plain")}).json()["translatedFileUrl"]
    assert client.get(url).content == f"{emoji}\n12\n".encode()
    assert searched == [GERMAN, FRENCH]


def test_a_sentence_without_letters_inside_a_text_or_file_comes_back_as_it_is():
    """As a whole text without a letter: a line "2024" or a table cell "12" between
    sentences is not searched, in every alternative and in files."""
    client, searched = fake_client("de:en")
    text = "Hallo.\n2024\nWelt."
    answer = client.post("/translate", json={"q": text, "source": "de", "target": "en",
                                             "alternatives": 2}).json()
    assert answer["translatedText"] == "de-en: Hallo.\n2024\nde-en: Welt."
    assert searched == ["Hallo.", "Welt."]
    assert all("\n2024\n" in alternative for alternative in answer["alternatives"])
    url = client.post("/translate_file", data={"source": "de", "target": "en"}, files={
        "file": ("a.txt", b"Hund\n12\n", "text/plain")}).json()["translatedFileUrl"]
    assert client.get(url).content == b"de-en: Hund\n12\n"
    assert searched == ["Hallo.", "Welt.", "Hund"]


def test_a_null_or_empty_format_is_text():
    client, _ = fake_client("de:en")
    for given in ({"format": None}, {"format": ""}):
        answer = client.post("/translate", json={"q": "<b>Hund</b>", "source": "de",
                                                 "target": "en", **given})
        assert answer.status_code == 200, answer.text
        assert answer.json()["translatedText"] == "de-en: <b>Hund</b>"  # not read as HTML
    answer = client.post("/translate", data={"q": "Hund", "source": "de", "target": "en",
                                              "format": ""})
    assert answer.status_code == 200 and answer.json()["translatedText"] == "de-en: Hund"
    answer = client.post("/translate", json={"q": "Hund", "source": "de", "target": "en",
                                             "format": "xml"})
    assert answer.status_code == 400 and "use text or html" in answer.json()["error"]


def test_what_clients_of_libretranslate_and_opennmt_py_read_is_there():
    """The page's typing debounce (frontendTimeout), a negative alternatives read as 0, and
    OpenNMT-py's fields of /translator/models."""
    client, _ = fake_client("de:en")
    assert client.get("/frontend/settings").json()["frontendTimeout"] == 500
    for count in (-1, "-3", -10**12):
        answer = client.post("/translate", json={"q": "Hund.", "source": "de", "target": "en",
                                                 "alternatives": count})
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"translatedText": "de-en: Hund."}
    models = client.get("/translator/models").json()
    assert models[0]["models"] == ["runs/de-en"] and models[0]["timeout"] == -1
    assert models[0]["opt"]["beam_size"] == 4 and models[0]["loaded"] is True
    assert models[0]["model_id"] == 0 and models[0]["path"] == "runs/de-en"


def test_sentences_are_joined_with_the_target_languages_spaces():
    """In-process, a ja->en model: the sentences of a Japanese text, which touch, are
    joined with a space in English, in text, in HTML and in a .txt file."""
    from types import SimpleNamespace

    from starlette.testclient import TestClient

    from nmt.models.translations import Hypothesis
    from nmt.serving.app import build_app
    from nmt.serving.catalog import Catalog, ServedModel
    from nmt.serving.limits import ServerLimits
    from nmt.serving.metrics import Metrics
    from nmt.serving.service import Service

    english = {"今日は晴れです。": "It is sunny.", "明日は雨でしょう！": "It will rain!"}

    async def search(batch):
        return [[Hypothesis(english[sentence], 0.0, ())] for sentence in batch]

    translator = SimpleNamespace(search=SimpleNamespace(nbest=1))
    model = ServedModel(0, "ja", "en", "runs/x", translator,
                        batcher=SimpleNamespace(translate=search))
    client = TestClient(build_app(Service(Catalog([model]), ServerLimits(), Metrics(),
                                          ready=True)))
    for form, text, expected in (
            ("text", "今日は晴れです。明日は雨でしょう！", "It is sunny. It will rain!"),
            ("html", "<p>今日は晴れです。<b>明日は雨でしょう！</b></p>",
             "<p>It is sunny. <b>It will rain!</b></p>")):
        answer = client.post("/translate", json={"q": text, "source": "ja", "target": "en",
                                                 "format": form}).json()
        assert answer["translatedText"] == expected
    answer = client.post("/translate_file", data={"source": "ja", "target": "en"}, files={
        "file": ("a.txt", "今日は晴れです。明日は雨でしょう！\n".encode(), "text/plain")})
    url = answer.json()["translatedFileUrl"]
    assert client.get(url).content == "It is sunny. It will rain!\n".encode()


# ----------------------------------------------------------------------------- HTML


INLINE_CASES = [
    "<p>Ein mann <b>fährt <i>das fahrrad</i></b> im park.</p>",
    '<p>Der hund <a href="/park?x=1&amp;y=2" title="Park">läuft im park</a> schnell.</p>',
    "<p><b>Zwei kinder</b> spielen am <i>strand</i></p>",
    "<p>Die katze <span class='x'>schläft</span> auf dem <em>sofa</em>.</p>",
    "<div>Eine frau <strong>liest</strong> das buch. Der hund <b>läuft</b>.</div>",
]


@pytest.mark.parametrize("markup", INLINE_CASES)
def test_inline_tags_no_longer_cut_sentences(server, markup):
    from nmt.translation.paragraphs import split_html

    status, answer = translate(server, markup, format="html")
    assert status == 200
    out = answer["translatedText"]
    # Each sentence is translated once, whole: the text without tags is the translation of
    # the sentences without tags.
    sentences = split_html(markup, "de").sentences
    status, plain = translate(server, sentences)
    assert status == 200
    tag = re.compile(r"<[^>]*>")
    text_of = tag.sub("", out)
    assert " ".join(text_of.split()) == " ".join(" ".join(plain["translatedText"]).split())
    # Every tag is kept, once, balanced, and each element inside the one it was in.
    assert sorted(tag.findall(out)) == sorted(tag.findall(markup))
    assert parents(out) == parents(markup)


# ----------------------------------------------------------------------------- files


def _docx_bytes() -> bytes:
    import docx

    document = docx.Document()
    paragraph = document.add_paragraph()
    paragraph.add_run("Der hund ").bold = True
    paragraph.add_run("läuft im park.").italic = True
    document.add_paragraph("Eine frau liest das buch.")
    table = document.add_table(rows=1, cols=2)
    table.cell(0, 0).text, table.cell(0, 1).text = "Zwei kinder spielen.", "Die katze schläft."
    document.sections[0].header.paragraphs[0].text = "Das buch."
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def _upload(server: Server, name: str, data: bytes, **fields) -> tuple[int, dict, bytes]:
    boundary = uuid.uuid4().hex
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{key}"\r\n\r\n{value}\r\n'
             .encode() for key, value in {"source": "de", "target": "en", **fields}.items()]
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename='
                 f'"{name}"\r\nContent-Type: application/octet-stream\r\n\r\n'.encode()
                 + data + b"\r\n")
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    return server.request("POST", "/translate_file", body, headers={
        "Content-Type": f"multipart/form-data; boundary={boundary}"})


def _download(server: Server, answer: bytes) -> bytes:
    url = json.loads(answer)["translatedFileUrl"]
    assert url.startswith(server.url + "/download_file/")
    status, headers, data = server.request("GET", url[len(server.url):])
    assert status == 200 and "attachment" in headers["content-disposition"]
    return data


def test_translate_file_docx_keeps_paragraphs_tables_headers_and_formatting(server):
    import docx

    status, _, answer = _upload(server, "report.docx", _docx_bytes())
    assert status == 200, answer
    translated = docx.Document(io.BytesIO(_download(server, answer)))
    texts = ["Der hund läuft im park.", "Eine frau liest das buch.", "Zwei kinder spielen.",
             "Die katze schläft.", "Das buch."]
    status, expected = translate(server, texts)
    want = expected["translatedText"]
    first, second = translated.paragraphs[:2]
    assert first.text.strip() == want[0] and second.text == want[1]
    assert [c.text for c in translated.tables[0].rows[0].cells] == want[2:4]
    assert translated.sections[0].header.paragraphs[0].text == want[4]
    # The two runs keep their formatting, and the words they hold are the translation's.
    assert [(run.bold, run.italic) for run in first.runs] == [(True, None), (None, True)]
    assert "".join(run.text for run in first.runs).strip() == want[0]


def test_translate_file_text_and_html_and_its_refusals(server):
    text = "Der hund läuft.\n\nDie katze schläft. Ein mann liest.\n"
    status, _, answer = _upload(server, "notes.txt", text.encode())
    assert status == 200, answer
    status, expected = translate(server, text)
    assert _download(server, answer).decode() == expected["translatedText"]
    markup = "<html><body><p>Der hund <b>läuft</b>.</p></body></html>"
    status, _, answer = _upload(server, "page.html", markup.encode())
    status, expected = translate(server, markup, format="html")
    assert _download(server, answer).decode() == expected["translatedText"]
    status, _, answer = _upload(server, "image.png", b"\x89PNG")
    assert status == 400 and ".docx" in json.loads(answer)["error"]
    status, _, answer = _upload(server, "broken.docx", b"not a zip")
    assert status == 400 and "not a valid .docx" in json.loads(answer)["error"]
    status, _, answer = _upload(server, "latin1.txt", "Größe".encode("latin-1"))
    assert status == 400 and "not UTF-8" in json.loads(answer)["error"]
    status, _, answer = server.request("GET", "/download_file/nothing-here.docx")
    assert status == 404


def test_translate_file_refuses_a_docx_of_more_empty_paragraphs_than_its_limit_reads(
        monkeypatch):
    """Empty paragraphs hold no character to translate, yet a few kilobytes of zip can hold
    millions, each read at a cost: a .docx's paragraphs count against --file-char-limit too
    (413, nothing searched), as do its XML tags, before python-docx parses it."""
    import docx

    from nmt.serving.limits import ServerLimits
    from nmt.translation import paragraphs

    monkeypatch.setattr(paragraphs, "MARKUP_BESIDES", 0)  # 2 pieces of markup a character
    client, searched = fake_client("de:en", limits=ServerLimits(max_file_characters=100))
    document = docx.Document()
    for _ in range(400):
        document.add_paragraph()
    document.add_paragraph(GERMAN[:40])
    data = io.BytesIO()
    document.save(data)
    answer = client.post("/translate_file", data={"source": "de", "target": "en"},
                         files={"file": ("empty.docx", data.getvalue())})
    assert answer.status_code == 413 and searched == []
    assert answer.json()["error"].startswith(
        "the file holds more markup than this server reads for its limit of 100 characters "
        "(--file-char-limit): the .docx file has more than 200 paragraphs")
    one = io.BytesIO()
    document = docx.Document()
    document.add_paragraph(GERMAN[:40])
    document.save(one)
    assert client.post("/translate_file", data={"source": "de", "target": "en"}, files={
        "file": ("one.docx", one.getvalue())}).status_code == 200


def test_translate_file_refuses_a_page_of_more_tags_than_its_limit_reads(monkeypatch):
    from nmt.serving.limits import ServerLimits
    from nmt.translation import paragraphs

    monkeypatch.setattr(paragraphs, "MARKUP_BESIDES", 0)  # 2 tags a character

    client, searched = fake_client("de:en", limits=ServerLimits(max_file_characters=100))
    for name, page in (("tags.html", "<b>" * 5000), ("long.html", "<i>Wort</i> " * 30)):
        answer = client.post("/translate_file", data={"source": "de", "target": "en"},
                             files={"file": (name, page.encode())})
        assert answer.status_code == 413 and searched == []
    assert answer.json()["error"] == ("the file has more characters to translate than this "
                                      "server's limit of 100 (--file-char-limit)")
    answer = client.post("/translate_file", data={"source": "de", "target": "en"},
                         files={"file": ("tags.html", b"<b>" * 5000)})
    assert answer.json()["error"].startswith(
        "the file holds more markup than this server reads for its limit of 100 characters "
        "(--file-char-limit): the page has more than 200 tags")


def test_translate_file_says_when_a_form_was_cut_short_or_its_file_has_no_filename():
    """A form whose closing boundary never came is told so, not that it lacks a file; a file
    part named only by filename* (RFC 5987, which RFC 7578 rules out in forms) is a text
    field to the parser: the answer says the file needs a filename."""
    client, searched = fake_client("de:en")
    head = b'--B\r\nContent-Disposition: form-data; name="source"\r\n\r\nde\r\n' \
           b'--B\r\nContent-Disposition: form-data; name="target"\r\n\r\nen\r\n'

    def post(body: bytes) -> tuple[int, str]:
        answer = client.post("/translate_file", content=body, headers={
            "Content-Type": "multipart/form-data; boundary=B"})
        return answer.status_code, answer.json().get("error", "")

    part = b'--B\r\nContent-Disposition: form-data; name="file"; filename="a.txt"\r\n\r\n'
    cut = head + part + f"{GERMAN}\n".encode()
    assert post(cut) == (400, "malformed multipart form: the body ends before its closing "
                              "boundary, cut short; send the whole form")
    assert post(cut + b"\r\n--B--\r\n")[0] == 200
    named = head + (b"--B\r\nContent-Disposition: form-data; name=\"file\"; "
                    b"filename*=UTF-8''%E6%8A%A5.txt\r\n\r\n") + GERMAN.encode() + b"\r\n--B--\r\n"
    status, error = post(named)
    assert status == 400 and "without a filename" in error and "filename*" in error
    assert searched == [GERMAN]


# ------------------------------------------------------- markup of a sentence kept as it is


def _reversing_service(aligned: list):
    """A Service in this process whose model upper-cases a sentence and aligns each target
    word with the source word at the mirrored place (so any tag placed by it moves); the
    pairs sent to be aligned go to `aligned`."""
    from types import SimpleNamespace

    import numpy as np

    from nmt.models.alignment import Alignment
    from nmt.models.translations import Hypothesis
    from nmt.serving.catalog import Catalog, ServedModel
    from nmt.serving.limits import ServerLimits
    from nmt.serving.metrics import Metrics
    from nmt.serving.service import Service

    def spans(text):
        return [m.span() for m in re.finditer(r"\S+", text)]

    def align(sources, targets):
        aligned.extend(zip(sources, targets))
        found = []
        for source, target in zip(sources, targets):
            s, t = spans(source), spans(target)
            weights = np.full((len(t), len(s)), 0.01, np.float32)
            for j in range(len(t)):
                weights[j, len(s) - 1 - min(j, len(s) - 1)] = 1
            found.append(Alignment(s, t, weights))
        return found

    async def search(batch):
        return [[Hypothesis(sentence.upper(), 0.0, ())] for sentence in batch]

    translator = SimpleNamespace(search=SimpleNamespace(nbest=1), align=align)
    model = ServedModel(0, "de", "en", "runs/x", translator,
                        batcher=SimpleNamespace(translate=search))
    return Service(Catalog([model]), ServerLimits(), Metrics(), ready=True)


def test_a_sentence_without_letters_keeps_its_markup_where_it_was():
    """A sentence without letters comes back as it is, so its inline tags stay around the
    same characters: no alignment is asked for it (a model's alignment of a text with itself
    may move them), in HTML and in .docx runs alike."""
    import docx
    from starlette.testclient import TestClient

    from nmt.serving.app import build_app

    aligned: list = []
    client = TestClient(build_app(_reversing_service(aligned)))
    markup = ('<p>Hallo <i>Welt</i>.</p><p><b>12</b> 345 678</p>'
              '<td>10 <a href="/x">20</a> 30 40</td>')
    answer = client.post("/translate", json={"q": markup, "source": "de", "target": "en",
                                             "format": "html"})
    assert answer.status_code == 200, answer.text
    translated = answer.json()["translatedText"]
    assert translated.endswith('<p><b>12</b> 345 678</p><td>10 <a href="/x">20</a> 30 40</td>')
    assert translated.startswith("<p><i>HALLO</i> WELT.</p>")  # by the alignment
    assert aligned == [("Hallo Welt.", "HALLO WELT.")]

    aligned.clear()
    document = docx.Document()
    paragraph = document.add_paragraph()
    paragraph.add_run("12").bold = True
    paragraph.add_run(" 345 678")
    data = io.BytesIO()
    document.save(data)
    answer = client.post("/translate_file", data={"source": "de", "target": "en"},
                         files={"file": ("numbers.docx", data.getvalue())})
    assert answer.status_code == 200, answer.text
    url = answer.json()["translatedFileUrl"]
    result = docx.Document(io.BytesIO(client.get(url[url.index("/download_file/"):]).content))
    assert [(run.text, run.bold) for run in result.paragraphs[0].runs] == [
        ("12", True), (" 345 678", None)]
    assert aligned == []
