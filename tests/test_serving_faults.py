"""The translation server against a hostile client: bodies built to stall it, values of every
JSON type where another is expected, clients that leave or dawdle, and flags that would make it
serve nothing. Each request gets a 4xx naming its limit or its fault, in one line, on a
connection that stays usable; the server stays live after each (/health); a flag that cannot
serve ends the command in one line before the model loads.

The server is a real `python -m nmt.serving` process on 127.0.0.1 (tests/serving_process.py)
serving the tiny untrained model of tests/translate_model.py, once per engine (JAX,
CTranslate2).
"""

from __future__ import annotations

import json
import logging
import random
import re
import socket
import time

import pytest
from serving_process import ENGINE_FLAGS, Server, for_engine

from translate_model import sentences

SHAPES = ["--buckets", "16", "--batch-tokens", "128"]
KEYS = "\ufeffbom-first-key\n# a comment line\np#ssw0rd-long-secret\n"
KEY = "p#ssw0rd-long-secret"
QUEUE = 8
PAIR = {"source": "de", "target": "en"}


@pytest.fixture(scope="module", params=sorted(ENGINE_FLAGS))
def engine(request) -> list[str]:
    return ENGINE_FLAGS[request.param]


@pytest.fixture(scope="module")
def guarded(run_dir, env, tmp_path_factory, engine):
    """A server with keys, a queue of 8 sentences and a one-second deadline for headers."""
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(KEYS, encoding="utf-8")
    server = Server.start(["--model", run_dir, *for_engine(SHAPES, engine), "--api-keys", keys,
                           "--queue-sentences", QUEUE, "--max-sentences", 200,
                           "--header-timeout", 1, "--body-timeout", 2, *engine], env)
    yield server
    assert server.stop() == 0, "".join(server.log)


def http_request(method: str, path: str, body: bytes = b"", content_type: str =
                 "application/json", headers: str = "") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n{headers}\r\n").encode() + body


def exchange(server: Server, data: bytes, answers: int, wait: float = 30
             ) -> list[tuple[int, dict[str, str], bytes]]:
    """Send `data` (one or several pipelined requests) on one connection and read `answers`
    responses, or as many as come before the server closes it."""
    out = []
    with socket.create_connection(("127.0.0.1", server.port), timeout=wait) as sock:
        sock.sendall(data)
        stream = sock.makefile("rb")
        for _ in range(answers):
            status_line = stream.readline()
            if not status_line:
                break
            headers = {}
            while (line := stream.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                headers[name.strip().lower()] = value.strip()
            out.append((int(status_line.split()[1]), headers,
                        stream.read(int(headers.get("content-length", 0)))))
    return out


def post(server: Server, path: str, body: bytes | dict | list, wait: float = 30,
         content_type: str = "application/json", headers: str = "") -> tuple[int, dict]:
    if not isinstance(body, bytes):
        body = json.dumps(body).encode()
    [(status, _, answer)] = exchange(
        server, http_request("POST", path, body, content_type, headers), 1, wait)
    return status, json.loads(answer)


BEARER = f"Authorization: Bearer {KEY}\r\n"


def metric(server: Server, name: str, labels: str = "") -> float:
    """The value of one series of /metrics (0 if the server has not made it yet)."""
    text = server.request("GET", "/metrics")[2].decode()
    found = re.search(rf"^{re.escape(name)}(?:{{{re.escape(labels)}}})? (\S+)$", text,
                      re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def assert_live(server: Server) -> None:
    status, _, body = server.request("GET", "/health", timeout=10)
    assert status == 200, body


# ----------------------------------------------------------------------------- bodies


def test_349000_form_fields_are_refused_at_once_and_the_server_stays_live(guarded):
    """Repeated fields once cost quadratic time: 349,000 `q=&` fields (1 MiB) held the event
    loop for two minutes, with or without a key. Now the fields are counted before the form is
    parsed, and parsing is linear."""
    for key in (f"api_key={KEY}&", ""):
        body = f"source=de&target=en&{key}".encode() + b"q=&" * 349_000
        began = time.monotonic()
        status, answer = post(guarded, "/translate", body, wait=20,
                              content_type="application/x-www-form-urlencoded")
        assert status == 413, answer
        assert "fields, more than this server's limit" in answer["error"]
        assert "--max-sentences" in answer["error"]
        assert time.monotonic() - began < 10
        assert_live(guarded)


def test_form_parsing_is_linear_in_the_fields():
    """The parser alone, past any limit: 349,000 repeats of one field in well under a second
    (the quadratic one took 84 s on this machine)."""
    from nmt.serving.params import _collect

    began = time.perf_counter()
    params = _collect([("q", "")] * 349_000 + [("source", "de")])
    assert time.perf_counter() - began < 2
    assert params["q"] == [""] * 349_000 and params["source"] == "de"


def test_empty_texts_count_against_the_sentence_limit(guarded):
    status, answer = post(guarded, "/translate", {"q": [""] * 260_000, **PAIR, "api_key": KEY})
    assert status == 413, answer
    assert "260000 texts, more than this server's limit of 200 sentences" in answer["error"]
    status, answer = post(guarded, "/translator/translate", [{"src": ""}] * 5_000,
                          headers=BEARER)
    assert status == 413, answer
    assert "5000 sentences, more than this server's limit of 200" in answer["error"]
    status, answer = post(guarded, "/translate", {"q": ["", " ", ""], **PAIR, "api_key": KEY})
    assert (status, answer) == (200, {"translatedText": ["", " ", ""]})


FAULTY_BODIES = [
    ("an integer of 5,001 digits", "/translate",
     b'{"q": "Hallo.", "source": "de", "target": "en", "api_key": "%s", "alternatives": 1%s}'
     % (KEY.encode(), b"0" * 5000), "cannot read"),
    ("q nested 100,000 lists deep", "/translate",
     b'{"q": ' + b"[" * 100_000 + b"]" * 100_000 + b', "source": "de", "target": "en"}',
     "nests lists or objects too deeply"),
    ("a lone surrogate in q", "/translate",
     b'{"q": "Ein \\ud800 Mann.", "source": "de", "target": "en"}', "\\ud800, half of"),
    ("a lone surrogate in source", "/translate",
     b'{"q": "Ein Mann.", "source": "\\udfff", "target": "en"}', "\\udfff, half of"),
    ("a lone surrogate in html", "/translate",
     b'{"q": "<p>Ein \\ud834</p>", "format": "html", "source": "de", "target": "en"}',
     "\\ud834, half of"),
    ("a lone surrogate in an OpenNMT src", "/translator/translate",
     b'[{"src": "Ein Mann \\ud800.", "id": 0}]', "\\ud800, half of"),
    ("alternatives 1e400", "/translate",
     b'{"q": "Hallo.", "source": "de", "target": "en", "api_key": "%s", "alternatives": 1e400}'
     % KEY.encode(), "alternatives must be an integer"),
    ("api_key a list", "/translate",
     b'{"q": "Hallo.", "source": "de", "target": "en", "api_key": ["a", "b"]}',
     "api_key must be one string, got a list of 2"),
    ("api_key an object", "/translate",
     b'{"q": "Hallo.", "source": "de", "target": "en", "api_key": {"k": 1}}',
     "api_key must be one string, got an object"),
]


@pytest.mark.parametrize("path, body, message", [case[1:] for case in FAULTY_BODIES],
                         ids=[case[0] for case in FAULTY_BODIES])
def test_bodies_that_once_ended_in_a_500_get_400_on_a_connection_that_stays_open(
        guarded, path, body, message):
    """Each is answered 400 in one line, and the request pipelined behind it on the same
    keep-alive connection is answered too (a 500 used to drop the connection)."""
    follow = http_request("GET", "/health")
    answers = exchange(guarded, http_request("POST", path, body, headers=BEARER) + follow, 2)
    assert len(answers) == 2, answers
    (status, headers, answer), (next_status, _, _) = answers
    error = json.loads(answer)["error"]
    assert status == 400, error
    assert message in error and "\n" not in error
    assert headers.get("connection") != "close"
    assert next_status == 200


def test_a_repeated_api_key_field_is_refused(guarded):
    body = f"q=Hallo.&source=de&target=en&api_key={KEY}&api_key=other".encode()
    status, answer = post(guarded, "/translate", body,
                          content_type="application/x-www-form-urlencoded")
    assert status == 400 and "api_key must be one string" in answer["error"]


def test_a_500_closes_its_connection_and_is_logged_in_one_line(caplog):
    """A fault no one foresaw (here a search that raises): 500 with `Connection: close` and a
    one-line error, one log line naming the exception and where; no traceback at INFO."""
    from types import SimpleNamespace

    from starlette.testclient import TestClient

    from nmt.serving.app import build_app
    from nmt.serving.catalog import Catalog, ServedModel
    from nmt.serving.limits import ServerLimits
    from nmt.serving.metrics import Metrics
    from nmt.serving.service import Service

    async def broken_search(sentences):
        raise ZeroDivisionError("a bug")

    translator = SimpleNamespace(search=SimpleNamespace(nbest=1))
    model = ServedModel(0, "de", "en", "runs/x", translator,
                        batcher=SimpleNamespace(translate=broken_search))
    service = Service(Catalog([model]), ServerLimits(), Metrics(), ready=True)
    client = TestClient(build_app(service))
    with caplog.at_level(logging.INFO, logger="nmt.serving"):
        answer = client.post("/translate", json={"q": "Hallo.", **PAIR})
    assert answer.status_code == 500
    assert answer.headers["connection"] == "close"
    assert answer.json() == {"error": "the server failed on this request (ZeroDivisionError); "
                                      "its log says where"}
    [record] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "POST /translate answered 500: ZeroDivisionError: a bug" in record.getMessage()
    assert "test_serving_faults.py" in record.getMessage() and record.exc_info is None
    assert 'nmt_request_errors_total{code="500"} 1.0' in service.metrics.exposition().decode()


def test_a_request_cut_off_by_the_stop_gets_a_json_503():
    """uvicorn cancels the requests still running when a stop's grace runs out: the answer
    is a JSON 503, not uvicorn's plain-text 500."""
    import asyncio

    from nmt.serving.app import FaultGuard

    sent = []

    async def main():
        async def slow(scope, receive, send):
            await asyncio.sleep(30)

        async def send(message):
            sent.append(message)

        request = asyncio.ensure_future(FaultGuard(slow)(
            {"type": "http", "method": "POST", "path": "/translate_file"}, None, send))
        await asyncio.sleep(0.05)
        request.cancel()
        await asyncio.wait_for(request, 5)

    asyncio.run(main())
    assert sent[0]["status"] == 503
    assert json.loads(sent[1]["body"]) == {
        "error": "the server stopped before this request was answered; send it again"}


# ----------------------------------------------------------------------------- keys


def test_keys_are_read_whole_and_a_bom_is_dropped(guarded):
    request = {"q": "Hallo.", **PAIR}
    assert post(guarded, "/translate", {**request, "api_key": KEY})[0] == 200
    assert post(guarded, "/translate", {**request, "api_key": "bom-first-key"})[0] == 200
    for cut in ("p", "\ufeffbom-first-key", "# a comment line"):
        status, answer = post(guarded, "/translate", {**request, "api_key": cut})
        assert (status, answer) == (403, {"error": "Invalid API key"}), cut


def test_a_key_that_is_not_ascii_works_as_a_bearer_header_too():
    """Starlette reads headers as Latin-1: a key sent as `Authorization: Bearer` in UTF-8 is
    read as UTF-8, as api_key is, and a header that is not UTF-8 is an invalid key (403,
    not a 500)."""
    from starlette.requests import Request
    from starlette.testclient import TestClient

    from nmt.serving.app import build_app
    from nmt.serving.errors import RequestError
    from nmt.serving.limits import ServerLimits
    from nmt.serving.params import api_key

    service, _ = _file_service(ServerLimits(), align=None)
    service.api_keys = frozenset({"schlüssel", "clé"})
    client = TestClient(build_app(service))
    request = {"q": "Hallo.", **PAIR}
    assert client.post("/translate", json={**request, "api_key": "schlüssel"}).status_code == 200
    for key in ("schlüssel", "clé"):
        answer = client.post("/translate", json=request,
                             headers={"Authorization": f"Bearer {key}".encode()})
        assert answer.status_code == 200, answer.text
    # (The test client sends headers as UTF-8: these bytes go straight to the request.)
    for header in ("Bearer clé".encode("latin-1"), b"Bearer schl\xc3", b"Bearer \xff\xfe"):
        sent = Request({"type": "http", "query_string": b"",
                        "headers": [(b"authorization", header)]})
        with pytest.raises(RequestError) as refused:
            service.check_key(api_key(sent))
        assert (refused.value.status, refused.value.message) == (403, "Invalid API key")


def _within(seconds: float, done) -> bool:
    """Whether `done()` comes true within `seconds` (asked every 0.1 s)."""
    deadline = time.monotonic() + seconds
    for _ in range(int(seconds * 10) + 1):
        if done() or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return done()


def test_a_changed_keys_file_is_read_again_and_an_edit_never_turns_keys_off(
        run_dir, env, tmp_path):
    """Keys were read once at start: a revoked key kept working until a restart, a new one was
    refused. Now a change is read within a second or so of a request; a change to a file
    without a key, or none at all, keeps the keys before it, with one warning."""
    keys = tmp_path / "keys.txt"
    keys.write_text("first-key\n", encoding="utf-8")
    server = Server.start(["--model", run_dir, *SHAPES, "--api-keys", keys], env)

    def answers(*sent: str) -> tuple[int, ...]:
        return tuple(server.request("POST", "/translate", {"q": "Hallo.", **PAIR,
                                                           "api_key": key}, timeout=30)[0]
                     for key in sent)

    def logged(text: str) -> int:
        return "".join(server.log).count(text)

    try:
        assert answers("first-key", "second-key") == (200, 403)
        keys.write_text("second-key\n", encoding="utf-8")
        assert _within(5, lambda: answers("first-key", "second-key") == (403, 200))
        for edit in (lambda: keys.write_text("# no key left\n", encoding="utf-8"),
                     keys.unlink):
            warned = logged("WARNING: --api-keys")
            edit()
            assert _within(5, lambda: answers("second-key") == (200,)
                           and logged("WARNING: --api-keys") > warned)
            time.sleep(1.5)  # another look at the file, unchanged since: no second warning
            assert answers("second-key", "first-key", "") == (200, 403, 403)
            assert logged("WARNING: --api-keys") == warned + 1, "".join(server.log)
        assert logged(f"WARNING: --api-keys {keys}: holds no key") == 1
        keys.write_text("first-key\nthird-key\n", encoding="utf-8")
        assert _within(5, lambda: answers("first-key", "third-key", "second-key")
                       == (200, 200, 403))
        assert logged(f"--api-keys {keys} changed; keys in use: 2") == 1
    finally:
        assert server.stop() == 0, "".join(server.log)


def test_read_api_keys(tmp_path):
    from nmt.serving.limits import read_api_keys

    path = tmp_path / "keys.txt"
    path.write_bytes(b"\xef\xbb\xbfk1\r\n  # comment\n\nk#2 # not a comment\n")
    assert read_api_keys(path) == {"k1", "k#2 # not a comment"}
    with pytest.raises(ValueError, match="empty path"):
        read_api_keys("")
    path.write_text("# only a comment\n")
    with pytest.raises(ValueError, match="holds no key"):
        read_api_keys(path)


# ----------------------------------------------------------------------------- the queue


def test_a_request_larger_than_the_queue_gets_413_not_503(guarded):
    text = " ".join(sentences(QUEUE + 1, seed=3))
    status, answer = post(guarded, "/translate", {"q": text, **PAIR, "api_key": KEY})
    assert status == 413, answer
    assert f"more than this server queues for it ({QUEUE}, --queue-sentences)" in answer["error"]
    status, answer = post(guarded, "/translate", {"q": " ".join(sentences(QUEUE, seed=3)),
                                                  **PAIR, "api_key": KEY})
    assert status == 200, answer


def _file_service(limits, align):
    """A Service whose model upper-cases each sentence and aligns with `align`; the sizes of
    its search calls go to the list returned."""
    from types import SimpleNamespace

    from nmt.models.translations import Hypothesis
    from nmt.serving.catalog import Catalog, ServedModel
    from nmt.serving.metrics import Metrics
    from nmt.serving.service import Service

    searched = []

    async def search(batch):
        searched.append(len(batch))
        return [[Hypothesis(sentence.upper(), 0.0, ())] for sentence in batch]

    translator = SimpleNamespace(search=SimpleNamespace(nbest=1), align=align)
    model = ServedModel(0, "de", "en", "runs/x", translator,
                        batcher=SimpleNamespace(translate=search))
    return Service(Catalog([model]), limits, Metrics(), ready=True), searched


def _translate_file(service, name: str, data: str | bytes):
    from starlette.testclient import TestClient

    from nmt.serving.app import build_app

    client = TestClient(build_app(service))
    body = data if isinstance(data, bytes) else data.encode()
    answer = client.post("/translate_file", data=PAIR, files={"file": (name, body)})
    if answer.status_code != 200:
        return answer.status_code, answer.json()["error"]
    url = answer.json()["translatedFileUrl"]
    return 200, client.get(url[url.index("/download_file/"):]).content.decode()


def test_multipart_fields_that_are_not_utf8_are_refused():
    """A multipart form's text field is read as UTF-8 or refused 400, as an urlencoded form's
    is, on /translate and /translate_file (Starlette would read it as Latin-1)."""
    from starlette.testclient import TestClient

    from nmt.serving.app import build_app
    from nmt.serving.limits import ServerLimits

    service, searched = _file_service(ServerLimits(), align=None)
    client = TestClient(build_app(service))

    def form(fields, file: bytes | None = None) -> bytes:
        parts = [b'--B\r\nContent-Disposition: form-data; name="%s"\r\n\r\n%s\r\n' % field
                 for field in fields]
        if file is not None:
            parts.append(b'--B\r\nContent-Disposition: form-data; name="file"; '
                         b'filename="a.txt"\r\n\r\n%s\r\n' % file)
        return b"".join(parts) + b"--B--\r\n"

    multipart = {"Content-Type": "multipart/form-data; boundary=B"}
    answer = client.post("/translate", content=form([(b"q", b"Hund \xe9."), (b"source", b"de"),
                                                     (b"target", b"en")]), headers=multipart)
    assert answer.status_code == 400
    assert answer.json()["error"] == ("the form field 'q' is not valid UTF-8: byte 0xe9 at "
                                      "offset 5; send UTF-8 text")
    answer = client.post("/translate_file", content=form([(b"source", b"d\xe9"),
                                                          (b"target", b"en")], b"Hund."),
                         headers=multipart)
    assert answer.status_code == 400 and "'source' is not valid UTF-8" in answer.json()["error"]
    assert searched == []
    answer = client.post("/translate", content=form([(b"q", "Hund ä.".encode()),
                                                     (b"source", b"de"), (b"target", b"en")]),
                         headers=multipart)
    assert answer.status_code == 200 and answer.json() == {"translatedText": "HUND Ä."}


def test_opennmt_reads_json_only_as_json():
    """OpenNMT-py's endpoint, as /translate: JSON under another type, or none, is refused 415
    (a page could have a browser send it without a CORS preflight)."""
    from starlette.testclient import TestClient

    from nmt.serving.app import build_app
    from nmt.serving.limits import ServerLimits

    service, searched = _file_service(ServerLimits(), align=None)
    client = TestClient(build_app(service))
    body = json.dumps([{"src": "Ein Mann."}])
    for headers in ({"Content-Type": "text/plain"}, {}):
        answer = client.post("/translator/translate", content=body, headers=headers)
        assert answer.status_code == 415, answer.text
        assert "send JSON with Content-Type: application/json" in answer.json()["error"]
    assert searched == []
    answer = client.post("/translator/translate", content=body,
                         headers={"Content-Type": "application/json; charset=utf-8"})
    assert answer.status_code == 200 and answer.json()[0][0]["tgt"] == "EIN MANN."


def test_a_file_longer_than_the_queue_is_searched_and_aligned_in_parts():
    """A .txt or .html file is one document: its sentences still go to the queue, and to the
    aligner, at most --max-sentences (and --queue-sentences) at a time, not all at once."""
    from test_inline_markup import _identity

    from nmt.serving.limits import ServerLimits

    aligned = []

    def align(sources, targets):
        aligned.append(len(sources))
        return [_identity(source) for source in sources]

    service, searched = _file_service(ServerLimits(max_sentences=4, max_queue=3), align)
    text = "".join(f"Satz {i} ist hier.\n" for i in range(10))
    assert _translate_file(service, "notes.txt", text) == (200, text.upper())
    assert (searched, aligned) == ([3, 3, 3, 1], [])
    searched.clear()
    markup = "<p>" + " ".join(f"Satz <b>{i}</b> ist hier." for i in range(10)) + "</p>"
    expected = "<p>" + " ".join(f"SATZ <b>{i}</b> IST HIER." for i in range(10)) + "</p>"
    assert _translate_file(service, "page.html", markup) == (200, expected)
    assert (searched, aligned) == ([3, 3, 3, 1], [3, 3, 3, 1])


def test_a_docx_past_the_character_limit_is_refused_413_while_it_is_read():
    """A few kilobytes of .docx can hold a million paragraphs: reading stops at the limit."""
    import io

    import docx

    from nmt.serving.limits import ServerLimits

    document = docx.Document()
    for _ in range(10):
        document.add_paragraph("Zwanzig Zeichen hier")
    out = io.BytesIO()
    document.save(out)
    service, searched = _file_service(ServerLimits(max_file_characters=50), None)
    status, error = _translate_file(service, "notes.docx", out.getvalue())
    assert status == 413 and not searched
    assert error == ("the file has more characters to translate than this server's limit of "
                     "50 (--file-char-limit)")


def test_an_alignment_past_the_timeout_is_a_504():
    from nmt.serving.limits import ServerLimits

    service, _ = _file_service(ServerLimits(timeout=0.2),
                               lambda sources, targets: time.sleep(1) or [])
    status, error = _translate_file(service, "page.html", "<p>Der <b>Hund</b> läuft.</p>")
    assert status == 504 and "(--timeout)" in error and "\n" not in error


def test_behind_a_proxys_sub_path_the_file_url_and_spec_carry_the_url_prefix():
    """--url-prefix /mt: translatedFileUrl and /spec's server begin with it; a request is
    taken with it (a proxy that passes it, a client that comes straight) or without it (one
    that strips it), and a file past --max-body-bytes still gets the file's bound. Without
    the flag, the URL is the request's own."""
    from starlette.testclient import TestClient

    from nmt.serving.app import build_app
    from nmt.serving.limits import ServerLimits

    service, _ = _file_service(ServerLimits(), align=None)
    client = TestClient(build_app(service, url_prefix="/mt"))
    text = "Ein Hund.\n" + "\n" * 1_200_000  # more bytes than a body that is not a file
    for path in ("/translate_file", "/mt/translate_file"):
        answer = client.post(path, data=PAIR, files={"file": ("a.txt", text.encode())})
        assert answer.status_code == 200, answer.text
        url = answer.json()["translatedFileUrl"]
        assert url.startswith("http://testserver/mt/download_file/")
        name = url.rsplit("/", 1)[1]
        for download in (f"/mt/download_file/{name}", f"/download_file/{name}"):
            assert client.get(download).content.decode() == "EIN HUND." + text[9:]
    assert client.get("/mt/spec").json()["servers"] == [{"url": "/mt"}]
    assert 'endpoint="/translate_file"} 2.0' in service.metrics.exposition().decode()

    plain = TestClient(build_app(_file_service(ServerLimits(), align=None)[0]))
    answer = plain.post("/translate_file", data=PAIR, files={"file": ("a.txt", b"Hund.")})
    assert answer.json()["translatedFileUrl"].startswith("http://testserver/download_file/")
    assert "servers" not in plain.get("/spec").json()
    assert plain.post("/mt/translate_file", data=PAIR,
                      files={"file": ("a.txt", b"Hund.")}).status_code == 404


def test_url_prefix_is_read_as_a_path_or_refused_in_one_line(capsys):
    from nmt.serving import command

    def prefix(value: str) -> str:
        return command.build_parser().parse_args(["--model", "m", "--url-prefix",
                                                  value]).url_prefix

    assert [prefix(value) for value in ("/mt", "mt/", "/a/b/", "/", "")] == [
        "/mt", "/mt", "/a/b", "", ""]
    for value in ("/m t", "/mt?x=1", "http://host/mt", "/a//b", "../mt", "/mt/./x"):
        with pytest.raises(SystemExit) as exited:
            prefix(value)
        err = capsys.readouterr().err
        assert exited.value.code == 2 and len(err.strip().splitlines()) == 1, err
        assert f"{value!r} is not a URL path" in err and "--url-prefix" in err


def test_a_download_keeps_its_name_as_sent_beside_an_ascii_one():
    """Content-Disposition carries the uploaded name, its folders dropped, in RFC 6266's
    filename* (UTF-8, percent-encoded), with the ASCII name for clients that read only
    filename; a name of ASCII letters has that alone."""
    from starlette.testclient import TestClient

    from nmt.serving.app import build_app
    from nmt.serving.limits import ServerLimits

    client = TestClient(build_app(_file_service(ServerLimits(), align=None)[0]))
    header, name = _downloaded_as(client, "报告 2024.txt")
    assert name == "报告 2024.txt"
    assert header == ("attachment; filename=\"___2024.txt\"; "
                      "filename*=UTF-8''%E6%8A%A5%E5%91%8A%202024.txt")
    assert _downloaded_as(client, "..\\Berichte/.Größe; 100%.html")[1] == "Größe; 100%.html"
    assert _downloaded_as(client, "notes-1.txt") == ('attachment; filename="notes-1.txt"',
                                                     "notes-1.txt")


def _downloaded_as(client, name: str) -> tuple[str, str]:
    """The Content-Disposition of the download of a file uploaded as `name`, and the name a
    browser saves it by (filename*, where there is one)."""
    import urllib.parse

    answer = client.post("/translate_file", data=PAIR, files={"file": (name, b"Hund.")})
    url = answer.json()["translatedFileUrl"]
    header = client.get(url[url.index("/download_file/"):]).headers["content-disposition"]
    params = dict(part.strip().split("=", 1) for part in header.split(";")[1:])
    if "filename*" not in params:
        return header, params["filename"].strip('"')
    charset, _, encoded = params["filename*"].split("'", 2)
    return header, urllib.parse.unquote(encoded, encoding=charset, errors="strict")


def test_a_download_name_keeps_no_character_that_hides_or_reorders_what_it_shows():
    """U+202E (right-to-left override) survived in filename*: "\u202egnp.txt" was shown as
    "txt.png". Bidi marks and overrides, other format characters, controls and line or
    paragraph separators are dropped from both names."""
    from starlette.testclient import TestClient

    from nmt.serving.app import build_app
    from nmt.serving.file_store import content_disposition
    from nmt.serving.limits import ServerLimits

    client = TestClient(build_app(_file_service(ServerLimits(), align=None)[0]))
    assert _downloaded_as(client, "\u202egnp.txt") == ('attachment; filename="gnp.txt"',
                                                       "gnp.txt")
    hidden = ["\u200e", "\u200f", "\u202a", "\u202b", "\u202c", "\u202d", "\u2066", "\u2067",
              "\u2068", "\u2069", "\u061c", "\u200b", "\u00ad", "\ufeff", "\u2028", "\u2029",
              "\x85", "\x1b", "\x7f", "\U000e0041"]
    for char in hidden:
        assert content_disposition(f"re{char}port.txt") == 'attachment; filename="report.txt"', (
            ascii(char))
    assert content_disposition("Ber\u202eicht.txt\u202c") == 'attachment; filename="Bericht.txt"'
    assert _downloaded_as(client, "Grö\u2067ße.html")[1] == "Größe.html"


def test_a_download_of_a_name_of_dots_and_a_suffix_ends_in_that_suffix():
    """"...txt" is read as a .txt file (its suffix is what follows the last dot), but its
    leading dots were stripped with the suffix's own: it downloaded as "txt"."""
    from starlette.testclient import TestClient

    from nmt.serving.app import build_app
    from nmt.serving.file_store import safe_name
    from nmt.serving.limits import ServerLimits

    client = TestClient(build_app(_file_service(ServerLimits(), align=None)[0]))
    for sent, named in (("...txt", "file.txt"), ("..html", "file.html"),
                        ("Berichte\\..htm", "file.htm"), (".\u202e.txt", "file.txt"),
                        (".notes.txt", "notes.txt"), ("..a.b.txt", "a.b.txt")):
        assert _downloaded_as(client, sent) == (f'attachment; filename="{named}"', named), sent
    assert safe_name("...") == "file"


def test_translate_file_refuses_a_body_that_is_not_a_multipart_form_415():
    from starlette.testclient import TestClient

    from nmt.serving.app import build_app
    from nmt.serving.limits import ServerLimits

    service, searched = _file_service(ServerLimits(), align=None)
    client = TestClient(build_app(service))
    for answer in (client.post("/translate_file", json=PAIR),
                   client.post("/translate_file", data=PAIR),
                   client.post("/translate_file", content=b"Hund.")):
        assert answer.status_code == 415, answer.text
        assert "send the file as multipart/form-data" in answer.json()["error"]
    assert answer.json()["error"].startswith("a request body of type 'none' is not read here")
    assert searched == []


def test_a_translated_file_larger_than_the_store_is_refused_and_drops_no_other(monkeypatch):
    from nmt.serving import file_store
    from nmt.serving.errors import RequestError

    monkeypatch.setattr(file_store, "KEEP_BYTES", 100)
    store = file_store.FileStore()
    kept = store.put(b"x" * 60, "a.txt", "text/plain")
    with pytest.raises(RequestError) as refused:
        store.put(b"y" * 101, "big.txt", "text/plain")
    assert refused.value.status == 413
    assert refused.value.message == ("the translated file is 101 bytes, more than this server "
                                     "keeps for download (100 bytes)")
    assert store.get(kept).data == b"x" * 60


# ----------------------------------------------------------------------------- metrics


def in_process_client(**options):
    """Starlette's test client on a server of no models, and its metrics' exposition."""
    from starlette.testclient import TestClient

    from nmt.serving.app import build_app
    from nmt.serving.catalog import Catalog
    from nmt.serving.limits import ServerLimits
    from nmt.serving.metrics import Metrics
    from nmt.serving.service import Service

    service = Service(Catalog([]), ServerLimits(), Metrics(), ready=True)
    return (TestClient(build_app(service, **options)),
            lambda: service.metrics.exposition().decode())


def test_requests_are_counted_by_their_routes_path_template():
    client, exposition = in_process_client()
    assert client.get("/download_file/gone.txt").status_code == 404
    assert client.get("/no/such/path").status_code == 404
    big = client.post("/translate", content=b"x" * 2_000_000)  # refused before routing
    assert big.status_code == 413
    assert 'nmt_requests_total{code="404",endpoint="/download_file/{name}"} 1.0' in exposition()
    assert 'nmt_requests_total{code="413",endpoint="/translate"} 1.0' in exposition()
    assert 'nmt_requests_total{code="404",endpoint="other"} 1.0' in exposition()


def test_cors_preflights_are_left_out_of_the_request_metrics():
    client, exposition = in_process_client()
    preflight = {"Origin": "https://a.example", "Access-Control-Request-Method": "POST"}
    assert client.options("/translate", headers=preflight).status_code == 200
    assert "nmt_requests_total{" not in exposition()
    assert "nmt_request_seconds_count{" not in exposition()


# ----------------------------------------------------------------------------- clients


def test_clients_that_close_mid_body_are_counted_as_aborts_not_500s(guarded):
    errors_before = metric(guarded, "nmt_request_errors_total", 'code="500"')
    aborts_before = metric(guarded, "nmt_requests_aborted_total", 'endpoint="/translate"')
    for _ in range(50):
        with socket.create_connection(("127.0.0.1", guarded.port), timeout=10) as sock:
            sock.sendall(b"POST /translate HTTP/1.1\r\nHost: test\r\nContent-Type: "
                         b'application/json\r\nContent-Length: 100\r\n\r\n{"q": "Hal')
    deadline = time.monotonic() + 20
    while (metric(guarded, "nmt_requests_aborted_total", 'endpoint="/translate"')
           < aborts_before + 50 and time.monotonic() < deadline):
        time.sleep(0.1)
    assert metric(guarded, "nmt_requests_aborted_total",
                  'endpoint="/translate"') == aborts_before + 50
    assert metric(guarded, "nmt_request_errors_total", 'code="500"') == errors_before


def test_slow_headers_get_408_and_the_connection_closed(guarded):
    counted_before = metric(guarded, "nmt_requests_total", 'code="408",endpoint="other"')
    began = time.monotonic()
    with socket.create_connection(("127.0.0.1", guarded.port), timeout=15) as sock:
        sock.sendall(b"POST /translate HTTP/1.1\r\nHost: te")
        answer = sock.recv(65536)
        assert sock.recv(65536) == b""  # closed
    assert answer.startswith(b"HTTP/1.1 408")
    assert b"did not arrive within 1 s (--header-timeout)" in answer
    assert time.monotonic() - began < 5
    with socket.create_connection(("127.0.0.1", guarded.port), timeout=15) as sock:
        assert sock.recv(65536).startswith(b"HTTP/1.1 408")  # nothing sent at all
    assert_live(guarded)
    assert metric(guarded, "nmt_requests_total",
                  'code="408",endpoint="other"') == counted_before + 2


NOT_HTTP = (
    (b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", "not valid HTTP"),
    (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n", "use http://, not https://"),
    (b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", "not valid HTTP"),
)


def test_bytes_that_are_not_http_get_a_json_400_counted_and_logged_as_ours(guarded):
    """A Content-Length that is not a number, a TLS handshake on the plain port, a header line
    without a colon: uvicorn answered them in plain text, uncounted, with a warning of its
    own."""
    counted_before = metric(guarded, "nmt_requests_total", 'code="400",endpoint="other"')
    logged_before = len(guarded.log)
    for data, says in NOT_HTTP:
        [(status, headers, body)] = exchange(guarded, data, 1, wait=10)
        assert (status, headers["content-type"], headers["connection"]) == (
            400, "application/json", "close"), body
        assert says in json.loads(body)["error"]
    assert_live(guarded)
    assert metric(guarded, "nmt_requests_total",
                  'code="400",endpoint="other"') == counted_before + len(NOT_HTTP)
    deadline = time.monotonic() + 5  # the log is read by a thread of its own
    while time.monotonic() < deadline and "".join(guarded.log[logged_before:]).count(
            "400 to 127.0.0.1") < len(NOT_HTTP):
        time.sleep(0.1)
    logged = "".join(guarded.log[logged_before:])
    assert logged.count("400 to 127.0.0.1") == len(NOT_HTTP), logged
    assert "Invalid HTTP request" not in logged


def _head(size: int, path: str = "/health") -> bytes:
    """A GET of `path` whose request line and headers, blank line included, are `size` bytes;
    it asks the server to close the connection after its answer, which ends the answer."""
    start = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: ".encode()
    end = b"\r\n\r\n"
    return start + b"a" * (size - len(start) - len(end)) + end


def _answer_in_pieces(server: Server, data: bytes, piece: int) -> tuple[int, bytes]:
    """The status and body of the answer to `data`, sent `piece` bytes at a time, 10 ms apart
    (each piece a read of its own), and read to the connection's end (at most 10 s)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for start in range(0, len(data), piece):
            sock.sendall(data[start:start + piece])
            time.sleep(0.01 if piece < len(data) else 0)
        answer, deadline = b"", time.monotonic() + 10
        while time.monotonic() < deadline and (got := sock.recv(65536)):
            answer += got
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_a_request_line_and_headers_past_16_kib_get_431_however_they_arrive(guarded):
    """A 200 KB header or 20,000 header lines got a 400 saying the request was not HTTP/1.1,
    then a reset; a 100 KB URL in one write was served, the same URL in pieces refused. Now a
    head of 16,384 bytes is served and one byte more refused 431, in one write or 1 KiB pieces,
    with an answer the client can read before the connection closes."""
    limit = 16 * 1024  # nmt.serving.protocol.MAX_HEAD_BYTES
    counted_before = metric(guarded, "nmt_requests_total", 'code="431",endpoint="other"')
    for piece in (1 << 20, 1024):
        assert _answer_in_pieces(guarded, _head(limit), piece)[0] == 200, piece
        status, body = _answer_in_pieces(guarded, _head(limit + 1), piece)
        assert status == 431, (piece, body)
        assert json.loads(body)["error"].startswith(
            "the request line and headers are more than 16384 bytes, this server's limit; ")
    many_lines = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-A: a\r\n" * 20_000 + b"\r\n"
    for data in (_head(200_000), many_lines, _head(120_000, "/languages?" + "a" * 100_000)):
        assert _answer_in_pieces(guarded, data, len(data))[0] == 431
    behind = exchange(guarded, http_request("GET", "/health") + _head(limit + 1), 2)
    assert [status for status, _, _ in behind] == [200, 431]  # pipelined behind another
    assert_live(guarded)
    assert metric(guarded, "nmt_requests_total",
                  'code="431",endpoint="other"') == counted_before + 6


def test_a_chunk_size_line_past_16_kib_gets_431(guarded):
    """h11's own bound on a line it has not read whole, past the headers: its hint (431) is
    the status, not a 400 saying the request is not HTTP/1.1."""
    data = (b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n5;" + b"x" * 20_000)
    status, body = _answer_in_pieces(guarded, data, len(data))
    assert status == 431, body
    assert json.loads(body)["error"] == ("a chunk-size line or the trailers of the request's "
                                         "chunked body are more than 16384 bytes, this "
                                         "server's limit")
    assert_live(guarded)


def test_a_request_whose_client_left_is_not_searched(run_dir, env, engine):
    """The request waits a second for company; its client leaves after a fifth of that: the
    server searches nothing, and counts the request as aborted."""
    server = Server.start(["--model", run_dir, *for_engine(SHAPES, engine), "--batch-wait-ms",
                           "1000", *engine], env)
    try:
        calls = metric(server, "nmt_batch_sentences_count", 'pair="de-en"')
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(http_request("POST", "/translate", json.dumps(
                {"q": "Ein Mann.", **PAIR}).encode()))
            time.sleep(0.2)
        time.sleep(2)
        assert metric(server, "nmt_batch_sentences_count", 'pair="de-en"') == calls
        assert metric(server, "nmt_requests_aborted_total", 'endpoint="/translate"') == 1
        status, answer = server.post_json("/translate", {"q": "Ein Mann.", **PAIR})
        assert status == 200, answer  # a client that stays is answered
        assert metric(server, "nmt_batch_sentences_count", 'pair="de-en"') == calls + 1
    finally:
        assert server.stop() == 0, "".join(server.log)


# ----------------------------------------------------------------------------- a fuzz


def _value(rng: random.Random, depth: int = 0):
    """A random JSON value: every type, strings with what breaks text handling."""
    kinds = ["str", "int", "float", "bool", "null", "list", "object"]
    kind = rng.choice(kinds if depth < 4 else kinds[:5])
    if kind == "str":
        return rng.choice(["", " ", "Ein Mann.", "de", "en", "html", "text", "\x00", "\u2028",
                           "<p>Ein <b>Mann</b>.</p>", "<", "&amp;", "\ufeff", "\U0001f600",
                           "a" * rng.randint(1, 3000), "Ein Mann. " * rng.randint(1, 40),
                           "\n\n\t", "\\ud800", "%ff", "auto"])
    if kind == "int":
        return rng.choice([0, 1, -1, 2, 7, 10**rng.randint(1, 30), -(2**63)])
    if kind == "float":
        return rng.choice([0.0, 1.0, 0.5, -1.5, 1e300, -1e-300])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    return {rng.choice(["q", "src", "id", "x"]): _value(rng, depth + 1)
            for _ in range(rng.randint(0, 3))}


def _body(rng: random.Random) -> tuple[str, bytes, str]:
    """(path, body, content type) of a random request."""
    fields = ["q", "source", "target", "format", "alternatives", "api_key", "extra"]
    shape = rng.choice(["libre", "libre", "opennmt", "form", "multipart", "raw"])
    if shape == "libre":
        params = {"q": "Ein Mann.", **PAIR, "api_key": KEY}
        for _ in range(rng.randint(1, 3)):
            params[rng.choice(fields)] = _value(rng)
        text = json.dumps(params, ensure_ascii=rng.random() < 0.5)
        text = text.replace('"\\\\ud800"', '"\\ud800"')  # a lone surrogate, escaped
        return "/translate", _encoded(rng, text), "application/json"
    if shape == "opennmt":
        items = [rng.choice([{"src": "Ein Mann.", "id": 0}, {"src": _value(rng)},
                             {"src": "Ein Mann.", "id": _value(rng)}, _value(rng)])
                 for _ in range(rng.randint(0, 4))]
        return "/translator/translate", _encoded(rng, json.dumps(items)), "application/json"
    if shape == "form":
        values = ["", "de", "en", "x", "%ff", "%ed%a0%80", "%", "Ein+Mann.", KEY]
        pairs = [f"{rng.choice(fields)}={rng.choice(values)}" for _ in range(rng.randint(0, 12))]
        return ("/translate", "&".join(pairs).encode(),
                rng.choice(["application/x-www-form-urlencoded", "text/plain"]))
    if shape == "multipart":
        boundary = "b0undary"
        values = ["de", "en", "", KEY, "Ein Mann."]
        parts = "".join(f'--{boundary}\r\nContent-Disposition: form-data; name="'
                        f'{rng.choice(fields)}"\r\n\r\n{rng.choice(values)}\r\n'
                        for _ in range(rng.randint(0, 6)))
        end = rng.choice([f"--{boundary}--\r\n", "", "--"])
        return ("/translate", (parts + end).encode(),
                f"multipart/form-data; boundary={boundary}")
    raw = rng.choice([b"", b"null", b"[]", b"{}", b'"q"', b"1e400", b"NaN", b"{" * 5000,
                      b"[" * 5000, b'[{"src": ' + b"[" * 900 + b"]" * 900 + b"}]",
                      b'{"q": "\xff"}', b"\xef\xbb\xbf{}", b'{"q": "a", "q": ["b"]}',
                      "{\"q\": \"Ein Mann.\"}".encode("utf-16")])
    return rng.choice(["/translate", "/translator/translate"]), raw, "application/json"


def _encoded(rng: random.Random, text: str) -> bytes:
    """`text` as UTF-8 mostly; sometimes UTF-16, Latin-1 or with a byte order mark."""
    how = rng.random()
    if how < 0.8:
        return text.encode("utf-8", "surrogatepass")
    if how < 0.9:
        return text.encode("utf-16", "surrogatepass")
    if how < 0.95:
        return text.encode("latin-1", "replace")
    return b"\xef\xbb\xbf" + text.encode("utf-8", "surrogatepass")


def test_a_fuzz_of_request_bodies_gets_no_5xx(guarded):
    """Random JSON shapes, types, depths, repeated fields and encodings, 300 requests (at most
    90 s): none is answered 5xx or left unanswered, and /health answers after each."""
    rng = random.Random(20261203)
    deadline = time.monotonic() + 90
    statuses: dict[int, int] = {}
    for n in range(300):
        if time.monotonic() > deadline:
            break
        path, body, kind = _body(rng)
        headers = BEARER if rng.random() < 0.8 else ""
        answers = exchange(guarded, http_request("POST", path, body, kind, headers), 1)
        assert answers, f"request {n} got no answer: {path} {body[:200]!r}"
        status, _, answer = answers[0]
        assert status < 500, f"request {n}: {status} {answer[:300]!r} for {body[:300]!r}"
        error = json.loads(answer).get("error", "") if status >= 400 else ""
        assert "\n" not in error
        statuses[status] = statuses.get(status, 0) + 1
        assert_live(guarded)
    assert sum(statuses.values()) >= 100, statuses
    assert statuses.get(200, 0) > 0 and statuses.get(400, 0) > 0, statuses


# ----------------------------------------------------------------------------- flags


def _serve(argv: list[str], capsys, monkeypatch) -> tuple[int, str]:
    """`python -m nmt.serving ARGV` in this process, failing if it gets to load a model."""
    from nmt.serving import command

    def no_model(args):
        raise AssertionError("the model was loaded before the flags were refused")

    monkeypatch.setattr(command, "load_served_models", no_model)
    code = command.main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--api-keys", ""], "--api-keys was given an empty path"),
    (["--host", ""], "--host is empty"),
    (["--host", "bad.invalid"], "--host bad.invalid: not an address this machine can listen on"),
    (["--host", "192.0.2.1"], "--host 192.0.2.1: not an address of this machine"),
    (["--timeout", "inf"], "--timeout must be more than 0 and at most 3600 seconds, got inf"),
    (["--header-timeout", "nan"], "--header-timeout must be more than 0"),
    (["--batch-tokens", "1000000000"], "--batch-tokens 1000000000: this server searches at "
                                       "most 65536"),
    (["--gather-tokens", "100000"], "--gather-tokens 100000"),
    (["--model", "de-en=runs/none"], "--model de-en=runs/none: write the pair as SRC:TGT=PATH"),
    (["--model", ":en=runs/none"], "--model :en=runs/none: write the pair as SRC:TGT=PATH"),
], ids=["empty keys path", "empty host", "bad host", "other host", "timeout inf",
        "header timeout nan", "batch tokens", "gather tokens", "pair without colon",
        "pair without source"])
def test_flags_that_cannot_serve_end_in_one_line_before_the_model_loads(
        run_dir, flags, message, capsys, monkeypatch):
    code, err = _serve(["--model", str(run_dir), "--port", "0", *flags], capsys, monkeypatch)
    assert code == 2, err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_a_port_in_use_ends_in_one_line_before_the_model_loads(run_dir, capsys, monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = _serve(["--model", str(run_dir), "--port", str(port)], capsys, monkeypatch)
    assert code == 1, err
    assert f"cannot listen on 127.0.0.1:{port}: the port is in use" in err
    assert len(err.strip().splitlines()) == 1, err


def test_search_bounds_are_named_when_a_model_passes_them(run_dir):
    from nmt.runtime.cli import UsageError
    from nmt.serving import command

    def load(*flags):
        args = command.build_parser().parse_args(["--model", str(run_dir), *flags])
        command.check_args(args)
        return command.load_served_models(args)

    with pytest.raises(UsageError, match="--beam 1000: this server searches with a beam of at "
                                         "most 64"):
        load("--beam", "1000")
    buckets = ",".join(map(str, range(8, 65)))
    with pytest.raises(UsageError, match=r"make \d+ search shapes to compile, more than this "
                                         r"server's 128"):
        load("--batch-tokens", "65536", "--buckets", buckets)
    assert load("--beam", "64", "--buckets", "16")  # at the bound


@pytest.mark.parametrize("engine", ["jax", "ctranslate2"])
def test_a_top_k_above_the_vocabulary_is_named_by_its_flag(engine, run_dir, tmp_path,
                                                           monkeypatch):
    """Was the field's name (top_k), and with ctranslate2 an unexpected TopKTooLarge."""
    from nmt.runtime.cli import UsageError
    from nmt.serving import command

    if engine == "ctranslate2":
        pytest.importorskip("ctranslate2")
        monkeypatch.setenv("FLAX_NMT_CACHE", str(tmp_path / "cache"))  # its conversion
    args = command.build_parser().parse_args(["--model", str(run_dir), "--engine", engine,
                                              "--sample", "--top-k", "301"])
    command.check_args(args)
    with pytest.raises(UsageError, match=f"^--model {run_dir}: invalid search settings for "
                                         "this model: --top-k 301 is larger than the model's "
                                         r"vocabulary \(300 tokens\)"):
        command.load_served_models(args)


def test_languages_given_against_the_models_record_are_warned_of(run_dir, caplog):
    from nmt.serving import command

    for pair, warned in (("fr:en", True), ("de:en", False)):
        args = command.build_parser().parse_args(["--model", f"{pair}={run_dir}",
                                                  "--buckets", "16"])
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="nmt.serving"):
            [model] = command.load_served_models(args)
        assert model.pair == pair.replace(":", "-")
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert bool(warnings) == warned, warnings
        if warned:
            assert "trained for de->en (recorded with it); serving it as fr->en" in warnings[0]


# ----------------------------------------------------------------------------- the page


def test_the_page_has_a_content_security_policy_that_allows_its_own_script(guarded):
    import base64
    import hashlib

    status, headers, page = guarded.request("GET", "/")
    assert status == 200
    policy = headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY"
    assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy
    script = re.search(rb"<script>(.*?)</script>", page, re.DOTALL).group(1)
    digest = base64.b64encode(hashlib.sha256(script).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in policy
    assert "unsafe-inline" not in policy


def test_the_hostile_benchs_bodies_fit_the_default_body_limit():
    """bench.serve_hostile times what a server does with each body, so each must pass the
    1 MiB limit rather than be refused unread."""
    from bench.serve_hostile import bodies
    from nmt.serving.limits import ServerLimits

    sizes = {name: len(body) for name, (_, body) in bodies("de", "en").items()}
    assert all(size <= ServerLimits().max_body_bytes for size in sizes.values()), sizes
    assert sizes["form-fields"] > 0.99 * ServerLimits().max_body_bytes


def test_without_the_serve_extra_the_command_says_what_to_install(tmp_path):
    """`pip install -e .` alone has no uvicorn: one line naming the extra, not a traceback."""
    import subprocess
    import sys

    from serving_process import REPO

    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class _NoUvicorn:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'uvicorn':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _NoUvicorn())\n")
    result = subprocess.run([sys.executable, "-m", "nmt.serving", "--model", "runs/x"],
                            cwd=REPO, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin"},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip() == (
        "python -m nmt.serving: error: the server needs the serve extra (uvicorn is not "
        "installed): pip install -e '.[serve]'")
