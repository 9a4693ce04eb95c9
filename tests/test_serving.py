"""The translation server, tested as its users meet it: a real `python -m nmt.serving`
process on 127.0.0.1 and a free port, spoken to over HTTP by our requests, by LibreTranslate
clients written elsewhere (libretranslatepy, deep-translator) and by a browser.

The model is the tiny untrained one of tests/translate_model.py: its translations are fixed
gibberish, but deterministic, so every answer can be compared with translate.py's. Every
server of the module runs once per engine (JAX, CTranslate2), compared with translate.py on
the same engine.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from serving_process import ENGINE_FLAGS, REPO, Server, for_engine

from translate_model import sentences

KEY = "test-key-1"
# Few search shapes (widths 16 and 64, one or two rows): each costs seconds to compile.
SHAPES = ["--buckets", "16", "--batch-tokens", "128"]
SERVER_FLAGS = [*SHAPES, "--body-timeout", "2",
                "--max-sentences", "200", "--char-limit", "30000"]
POOL = sentences(40, seed=7)


def translate_py(run_dir: Path, lines: list[str], env, *flags) -> list[str]:
    """translate.py's translations of `lines`, one per line."""
    result = subprocess.run([sys.executable, "translate.py", "--model", str(run_dir), "-q",
                             *flags], input="\n".join(lines) + "\n", cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout.split("\n")[:-1]


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "keys.txt"
    path.write_text(f"# keys of this server\n{KEY}\nsecond-key\n")
    return path


@pytest.fixture(scope="module", params=sorted(ENGINE_FLAGS))
def engine(request) -> list[str]:
    """The flags of the engine this module's servers and translate.py runs use."""
    return ENGINE_FLAGS[request.param]


@pytest.fixture(scope="module")
def server(run_dir, env, keys_file, engine):
    server = Server.start(["--model", run_dir, "--api-keys", keys_file,
                           *for_engine(SERVER_FLAGS, engine), *engine], env)
    yield server
    assert server.stop() == 0, "".join(server.log)


@pytest.fixture(scope="module")
def translations(run_dir, env, engine) -> dict[str, str]:
    """translate.py's translation of every sentence of POOL, as it writes it."""
    return dict(zip(POOL, translate_py(run_dir, POOL, env, *engine)))


@pytest.fixture(scope="module")
def expected(translations) -> dict[str, str]:
    """The same, as a text of LibreTranslate's comes back: a sentence's translation is set in
    its place without spaces at its edges (the untrained model can start one with a space)."""
    return {source: text.strip() for source, text in translations.items()}


def libre(server: Server, payload: dict, key: str | None = KEY) -> tuple[int, dict]:
    if key is not None:
        payload = {**payload, "api_key": key}
    return server.post_json("/translate", payload)


# ----------------------------------------------------------------------------- the two APIs


def test_libretranslate_gives_translate_py_translations(server, expected):
    for sentence in POOL[:8]:
        status, answer = libre(server, {"q": sentence, "source": "de", "target": "en"})
        assert status == 200, answer
        assert answer == {"translatedText": expected[sentence]}
    status, answer = libre(server, {"q": POOL, "source": "de", "target": "en"})
    assert status == 200
    assert answer["translatedText"] == [expected[s] for s in POOL]  # a list keeps its order


def test_libretranslate_forms_and_query_strings(server, expected):
    """Clients send a urlencoded form (libretranslatepy), a multipart form (LibreTranslate's
    own page) or query parameters (deep-translator)."""
    from urllib.parse import urlencode

    sentence = POOL[3]
    fields = {"q": sentence, "source": "de", "target": "en", "api_key": KEY}
    form = urlencode(fields)
    status, _, body = server.request("POST", "/translate", form, {
        "Content-Type": "application/x-www-form-urlencoded"})
    assert (status, json.loads(body)) == (200, {"translatedText": expected[sentence]})
    status, _, body = server.request("POST", "/translate?" + form)
    assert (status, json.loads(body)) == (200, {"translatedText": expected[sentence]})
    boundary = "b0undary"
    multipart = "".join(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'
                        f"{value}\r\n" for name, value in fields.items()) + f"--{boundary}--\r\n"
    status, _, body = server.request("POST", "/translate", multipart, {
        "Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert (status, json.loads(body)) == (200, {"translatedText": expected[sentence]})
    status, _, body = server.request("POST", "/translate", multipart, {
        "Content-Type": "multipart/form-data"})  # no boundary
    assert status == 400 and "malformed multipart form" in json.loads(body)["error"]


def test_opennmt_gives_translate_py_translations(server, translations):
    items = [{"src": s, "id": 0} for s in POOL[:10]]
    status, answer = server.post_json("/translator/translate", items,
                                      headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200, answer
    assert len(answer) == 1  # one list per n-best rank
    assert [r["src"] for r in answer[0]] == POOL[:10]
    assert [r["tgt"] for r in answer[0]] == [translations[s] for s in POOL[:10]]
    assert all(r["n_best"] == 1 and isinstance(r["pred_score"], float) for r in answer[0])
    status, models = server.post_json("/translator/translate", [{"src": POOL[0], "id": 7}],
                                      headers={"Authorization": f"Bearer {KEY}"})
    assert status == 400 and "0 (de->en)" in models["error"]
    status, _, body = server.request("GET", "/translator/models")
    assert status == 200 and json.loads(body)[0]["model_id"] == 0


def test_opennmt_keeps_the_whitespace_around_src():
    """In-process: OpenNMT-py puts a src's leading and trailing whitespace around its tgt;
    the model is given the words only."""
    from test_serving_libretranslate import fake_client

    client, searched = fake_client("de:en")
    answer = client.post("/translator/translate", json=[
        {"src": "  Der Hund. \n", "id": 0}, {"src": "Die Katze.", "id": 0},
        {"src": " \t", "id": 0}])
    assert answer.status_code == 200, answer.text
    assert [r["tgt"] for r in answer.json()[0]] == ["  de-en: Der Hund. \n",
                                                    "de-en: Die Katze.", " \tde-en: "]
    assert searched == ["Der Hund.", "Die Katze.", ""]


def test_opennmt_without_an_id_uses_model_0():
    from test_serving_libretranslate import fake_client

    client, _ = fake_client("de:en", "fr:en")
    answer = client.post("/translator/translate", json=[{"src": "Hund."},
                                                        {"src": "Chien.", "id": 1}])
    assert answer.status_code == 200, answer.text
    assert [r["tgt"] for r in answer.json()[0]] == ["de-en: Hund.", "fr-en: Chien."]
    answer = client.post("/translator/translate", json=[{"src": "Hund.", "id": 2}])
    assert answer.status_code == 400 and "0 (de->en), 1 (fr->en)" in answer.json()["error"]


def test_languages_health_and_metrics(server):
    status, _, body = server.request("GET", "/languages")
    assert status == 200
    # The target language is listed too, with nothing to translate into (docs/serving.md).
    assert json.loads(body) == [{"code": "de", "name": "German", "targets": ["en"]},
                                {"code": "en", "name": "English", "targets": []}]
    status, _, body = server.request("GET", "/health")
    health = json.loads(body)
    served = health["engines"]["de-en"]  # CTranslate2's "auto": the fastest type of this CPU
    assert (status, health) == (200, {"status": "ok", "models": ["de-en"],
                                      "engines": {"de-en": served}})
    assert served == "jax float32" or ("ctranslate2" in server.args
                                       and served.startswith("ctranslate2 "))
    from prometheus_client.parser import text_string_to_metric_families

    status, headers, body = server.request("GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    names = {family.name for family in text_string_to_metric_families(body.decode())}
    assert {"nmt_requests", "nmt_request_errors", "nmt_request_seconds", "nmt_batch_sentences",
            "nmt_batch_requests", "nmt_queue_sentences", "nmt_model_info"} <= names
    engine, compute_type = served.split()
    assert (f'nmt_model_info{{compute_type="{compute_type}",engine="{engine}",pair="de-en"}} 1.0'
            in body.decode())


# ----------------------------------------------------------------------------- documents


def test_paragraphs_are_split_translated_and_joined_with_their_whitespace(server, expected):
    a, b, c = POOL[10:13]
    text = f"  {a}  {b}\n\n\t{c}\r\n"
    status, answer = libre(server, {"q": text, "source": "de", "target": "en"})
    assert status == 200, answer
    assert answer["translatedText"] == f"  {expected[a]}  {expected[b]}\n\n\t{expected[c]}\r\n"


def test_html_keeps_every_tag_and_attribute(server, expected):
    a, b = POOL[14:16]
    markup = (f'<div class="x" data-note=\'a > b\'><p id=p1>{a}</p><!-- not translated -->'
              f'<a href="/x?y=1&amp;z=2" title="kept">{b}</a><br/>'
              '<script>var s = "Ein Mann.";</script></div>')
    status, answer = libre(server, {"q": markup, "source": "de", "target": "en",
                                    "format": "html"})
    assert status == 200, answer
    tags = re.compile(r"<[^>]*>|<!--.*?-->")
    out = answer["translatedText"]
    assert tags.findall(out) == tags.findall(markup)
    assert f"<p id=p1>{expected[a]}</p>" in out
    assert f'title="kept">{expected[b]}</a>' in out
    assert '<script>var s = "Ein Mann.";</script>' in out


# ----------------------------------------------------------------------------- bad input


def _raw(server: Server, data: bytes, wait: float = 10) -> bytes:
    """Send raw bytes and read what comes back until the server closes (bounded)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=wait) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


BAD_REQUESTS = [
    ("malformed JSON", b'{"q": "Hallo", "source": ', 400, "malformed JSON"),
    ("not an object", b'["Hallo"]', 400, "must be a JSON object"),
    ("missing q", {"source": "de", "target": "en"}, 400, "missing q parameter"),
    ("empty q", {"q": "", "source": "de", "target": "en"}, 400, "missing q parameter"),
    ("q of numbers", {"q": [1, 2], "source": "de", "target": "en"}, 400, "list of strings"),
    ("unknown pair", {"q": "Hallo.", "source": "fr", "target": "en"}, 400,
     "no model for fr->en: this server translates de->en"),
    ("missing target", {"q": "Hallo.", "source": "de"}, 400, "missing target parameter"),
    ("unknown format", {"q": "Hallo.", "source": "de", "target": "en", "format": "pdf"}, 400,
     "format 'pdf'"),
    ("invalid UTF-8", b'{"q": "Hallo \xff\xfe", "source": "de", "target": "en"}', 400,
     "not valid UTF-8: byte 0xff at offset 13"),
    ("10,000 sentences", {"q": ["Ja."] * 10_000, "source": "de", "target": "en"}, 413,
     "10000 texts, more than this server's limit of 200 sentences (--max-sentences"),
    ("too many characters", {"q": "Ein Mann. " * 4000, "source": "de", "target": "en"}, 413,
     "40000 characters, more than this server's limit of 30000 (--char-limit)"),
    ("alternatives", {"q": "Hallo.", "source": "de", "target": "en", "alternatives": 4}, 400,
     "alternatives 4: this server gives 0 to 3 (--alternatives-limit)"),
]


@pytest.mark.parametrize("payload, status, message",
                         [case[1:] for case in BAD_REQUESTS], ids=[c[0] for c in BAD_REQUESTS])
def test_bad_requests_get_their_status_and_one_line(server, payload, status, message):
    if isinstance(payload, dict):
        payload = {**payload, "api_key": KEY}
    got, headers, body = server.request("POST", "/translate", payload,
                                        {"Content-Type": "application/json"})
    answer = json.loads(body)
    assert got == status, answer
    assert message in answer["error"] and "\n" not in answer["error"]


def test_bodies_over_the_limit_get_413(server):
    """Declared too large: refused before a byte of it is read. Chunked (no length given):
    refused once the limit is passed."""
    answer = _raw(server, b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: "
                          b"application/json\r\nContent-Length: 10000000\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 413")
    assert b"limit of 1048576 bytes (--max-body-bytes)" in answer
    chunk = b"x" * 65536
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(17))
    answer = _raw(server, b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: "
                          b"application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked)
    assert answer.startswith(b"HTTP/1.1 413")


def test_api_keys(server):
    request = {"q": "Hallo.", "source": "de", "target": "en"}
    status, answer = libre(server, request, key=None)
    assert status == 403 and "needs an API key" in answer["error"]
    status, answer = libre(server, request, key="wrong")
    assert (status, answer) == (403, {"error": "Invalid API key"})
    assert libre(server, request, key="second-key")[0] == 200
    status, _ = server.post_json("/translator/translate", [{"src": "Hallo."}])
    assert status == 403


def test_a_slow_client_gets_408_and_others_are_served(server, expected):
    started = time.monotonic()
    slow = threading.Thread(target=lambda: result.append(_raw(server, (
        b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 500\r\n\r\n{\"q\": \"Hal"))))
    result: list[bytes] = []
    slow.start()
    status, answer = libre(server, {"q": POOL[0], "source": "de", "target": "en"})
    assert (status, answer) == (200, {"translatedText": expected[POOL[0]]})
    slow.join(30)
    assert result and result[0].startswith(b"HTTP/1.1 408")
    assert b"did not arrive within 2 s (--body-timeout)" in result[0]
    assert time.monotonic() - started < 30


def test_unknown_paths_and_methods(server):
    status, _, body = server.request("GET", "/nowhere")
    assert status == 404 and "GET /nowhere" in json.loads(body)["error"]
    status, _, body = server.request("GET", "/translate")
    assert status == 405


# ----------------------------------------------------------------------------- clients


def test_libretranslatepy_translates_through_the_server(server, expected):
    from libretranslatepy import LibreTranslateAPI

    client = LibreTranslateAPI(server.url, api_key=KEY)
    assert client.translate(POOL[5], "de", "en") == expected[POOL[5]]
    assert {"code": "de", "name": "German", "targets": ["en"]} in client.languages()


def test_deep_translator_translates_through_the_server(server, expected):
    from deep_translator import LibreTranslator

    client = LibreTranslator(source="de", target="en", api_key=KEY, custom_url=server.url + "/")
    assert client.translate(POOL[6]) == expected[POOL[6]]
    assert client.translate_batch(POOL[7:9]) == [expected[s] for s in POOL[7:9]]


def _histogram_counts(server: Server, name: str) -> tuple[float, float]:
    """(observations of `name`, those <= 1) from /metrics."""
    text = server.request("GET", "/metrics")[2].decode()
    total = re.search(rf"^{name}_count{{[^}}]*}} (\S+)$", text, re.MULTILINE)
    ones = re.search(rf'^{name}_bucket{{le="1.0"[^}}]*}} (\S+)$', text, re.MULTILINE)
    if total is None:  # no search yet
        return 0.0, 0.0
    return float(total.group(1)), float(ones.group(1))


def test_32_concurrent_clients_get_their_own_translations(server, expected):
    """Each client sends its own sentences several times; every answer must be its own, and
    the search must have seen batches holding several requests."""
    before_total, before_single = _histogram_counts(server, "nmt_batch_requests")
    failures: list[str] = []

    def client(n: int) -> None:
        mine = [POOL[(n + i) % len(POOL)] for i in range(1 + n % 3)]
        for _ in range(4):
            payload = {"q": mine if n % 2 else mine[0], "source": "de", "target": "en"}
            status, answer = libre(server, payload)
            want = [expected[s] for s in mine] if n % 2 else expected[mine[0]]
            if status != 200 or answer["translatedText"] != want:
                failures.append(f"client {n}: {status} {answer}")

    threads = [threading.Thread(target=client, args=(n,)) for n in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, failures[:3]
    total, single = _histogram_counts(server, "nmt_batch_requests")
    assert total - before_total > 0
    assert (total - before_total) - (single - before_single) > 0, "no batch held 2+ requests"
    assert total - before_total < 32 * 4  # fewer searches than requests


# ----------------------------------------------------------------------------- stopping


@pytest.fixture(scope="module")
def strict_server(run_dir, env, engine):
    """A server whose first request waits a second for company, with a half-second timeout
    and room for 20 waiting sentences."""
    server = Server.start(["--model", run_dir, *for_engine(SHAPES, engine),
                           "--timeout", "0.5", "--batch-wait-ms", "1000",
                           "--queue-sentences", "20", *engine], env)
    yield server
    assert server.stop() == 0, "".join(server.log)


def test_timeout_and_full_queue(strict_server):
    status, headers, body = strict_server.request(
        "POST", "/translate", {"q": "Hallo.", "source": "de", "target": "en"})
    assert status == 504 and "0.5 s (--timeout)" in json.loads(body)["error"]
    # A request waiting for company holds 15 of the queue's 20 places until its call is
    # gathered (a second after it came): 10 more sentences are refused for now, with
    # Retry-After; 21 could never fit, and are refused for good.
    waiting = threading.Thread(target=strict_server.request, args=(
        "POST", "/translate", {"q": ["Ja."] * 15, "source": "de", "target": "en"}))
    waiting.start()
    time.sleep(0.2)
    status, headers, body = strict_server.request(
        "POST", "/translate", {"q": ["Ja."] * 10, "source": "de", "target": "en"})
    waiting.join(30)
    assert status == 503 and headers["retry-after"] == "1"
    assert "the queue holds 20" in json.loads(body)["error"]
    status, headers, body = strict_server.request(
        "POST", "/translate", {"q": ["Ja."] * 21, "source": "de", "target": "en"})
    assert status == 413 and "retry-after" not in headers
    assert "(20, --queue-sentences)" in json.loads(body)["error"]


def test_sigterm_answers_every_accepted_request_and_exits_0(run_dir, env, engine, expected):
    """SIGTERM comes while 8 or more requests wait in the queue (one search at a time, of two
    requests or so, each waiting up to half a second for company): every request the server
    accepted gets its translations, a request that came too late is refused, and the server
    exits 0 after the last answer."""
    server = Server.start(["--model", run_dir, *for_engine(SHAPES, engine),
                           "--batch-wait-ms", "500", "--gather-tokens", "100", "--searches", "1",
                           *engine], env)
    answers: list[tuple[int, object, int]] = []
    refused: list[str] = []

    def client(n: int) -> None:
        try:
            answers.append((*server.post_json("/translate", {
                "q": POOL[n: n + 5], "source": "de", "target": "en"}), n))
        except ConnectionError as err:  # connected after the server stopped listening
            refused.append(str(err))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while not _metric_lines(server, 40) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _metric_lines(server, 40), "the requests never queued up"
    status = server.stop()
    for thread in threads:
        thread.join(60)
    assert status == 0, "".join(server.log)
    assert len(answers) >= 8 and len(answers) + len(refused) == 16, refused
    for code, answer, n in answers:
        assert code == 200, answer
        assert answer["translatedText"] == [expected[s] for s in POOL[n: n + 5]]


def test_sigterm_lets_a_file_searched_in_many_parts_finish(run_dir, env):
    """A file is searched in parts of --max-sentences (2), each within --timeout (2 s) but
    each waiting a second for company: 12 parts, longer than --timeout and a few seconds
    more. SIGTERM a second in still lets the file finish, and the server exits 0 after."""
    server = Server.start(["--model", run_dir, *SHAPES, "--timeout", "2",
                           "--batch-wait-ms", "1000", "--max-sentences", "2"], env)
    text = "\n".join(POOL[:24]).encode()
    body = (b'--B\r\nContent-Disposition: form-data; name="file"; filename="a.txt"\r\n\r\n'
            + text + b'\r\n--B\r\nContent-Disposition: form-data; name="source"\r\n\r\nde'
            b'\r\n--B\r\nContent-Disposition: form-data; name="target"\r\n\r\nen\r\n--B--\r\n')
    answers = []
    client = threading.Thread(target=lambda: answers.append(server.request(
        "POST", "/translate_file", body, {"Content-Type": "multipart/form-data; boundary=B"},
        timeout=90)))
    client.start()
    time.sleep(1)
    status = server.stop(timeout=90)
    client.join(90)
    assert status == 0, "".join(server.log)
    [(code, _, answer)] = answers
    assert code == 200, answer
    assert b"/download_file/" in answer


def _metric_lines(server: Server, queued: int) -> str:
    """The /metrics lines saying that `queued` sentences or more are waiting."""
    text = server.request("GET", "/metrics")[2].decode()
    found = re.search(r'^nmt_queue_sentences{pair="de-en"} (\S+)$', text, re.MULTILINE)
    return found.group(0) if found and float(found.group(1)) >= queued else ""


# ----------------------------------------------------------------------------- start-up


def test_bad_flags_and_models_end_in_one_line(run_dir, env, tmp_path, capsys):
    """The command as a process once (its exit status and its one line), then in this
    process: the same `main`, without starting Python and JAX again for each case."""
    from nmt.serving import command

    result = subprocess.run([sys.executable, "-m", "nmt.serving", "--model",
                             str(tmp_path / "missing")], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "does not exist" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr

    def serve(*args) -> tuple[int, str]:
        code = command.main(["--port", "0", *map(str, args)])
        return code, capsys.readouterr().err

    code, err = serve("--model", run_dir, "--api-keys", tmp_path / "nokeys.txt")
    assert code == 2 and "--api-keys" in err
    code, err = serve("--model", run_dir, "--model", run_dir)
    assert code == 2 and "both serve de->en" in err
    code, err = serve("--model", run_dir, "--timeout", "0")
    assert code == 2 and "--timeout must be more than 0" in err


# ----------------------------------------------------------------------------- the page

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")


@pytest.fixture
def browser():
    """Headless Chromium from the system packages (.ci/run installs them)."""
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        if os.environ.get("CI") == "true":
            pytest.fail("CI has no /usr/bin/chromium or /usr/bin/chromedriver: .ci/run installs "
                        "Debian's chromium and chromium-driver")
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium "
                    "chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1100,700"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the page's console
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def test_the_page_translates_in_a_browser(server, expected, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as shown
    from selenium.webdriver.support.ui import Select, WebDriverWait

    not_found = _not_found_count(server)
    browser.get(server.url + "/")
    wait = WebDriverWait(browser, 30)
    wait.until(lambda driver: Select(driver.find_element(By.ID, "pair")).options)
    assert Select(browser.find_element(By.ID, "pair")).first_selected_option.text == "de → en"
    key = wait.until(shown.visibility_of_element_located((By.ID, "api-key")))
    key.send_keys(KEY)
    sentence = POOL[9]
    browser.find_element(By.ID, "source-text").send_keys(sentence)
    browser.find_element(By.ID, "translate-button").click()
    wait.until(lambda driver: driver.find_element(By.ID, "translation").text)
    assert browser.find_element(By.ID, "translation").text == expected[sentence]
    assert browser.find_element(By.ID, "error").text == ""
    key.clear()
    key.send_keys("wrong")
    browser.find_element(By.ID, "translate-button").click()
    wait.until(lambda driver: driver.find_element(By.ID, "error").text)
    assert browser.find_element(By.ID, "error").text == "Invalid API key"
    assert browser.get_screenshot_as_file(str(tmp_path / "page.png"))
    requests_made = browser.execute_script(
        "return performance.getEntriesByType('resource').map(entry => entry.name)")
    assert all(url.startswith(server.url) for url in requests_made), requests_made
    console = [entry["message"] for entry in browser.get_log("browser")]
    assert not [line for line in console if "Content Security Policy" in line], console
    assert not [line for line in console if "favicon" in line], console  # answered, no 404
    assert _not_found_count(server) == not_found


def _not_found_count(server) -> float:
    """The 404s the server has answered (other tests of the module ask for missing paths)."""
    text = server.request("GET", "/metrics")[2].decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("nmt_requests_total{") and 'code="404"' in line)


def test_the_page_shows_a_settings_error_instead_of_throwing(server, browser):
    """With /frontend/settings out of reach, the page says so, and Translate says why it
    cannot translate, with nothing thrown uncaught."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/frontend/settings"]})
    browser.get(server.url + "/")
    wait = WebDriverWait(browser, 30)
    error = lambda driver: driver.find_element(By.ID, "error").text  # noqa: E731
    wait.until(error)
    assert error(browser).startswith("cannot read the server's settings: ")
    browser.find_element(By.ID, "source-text").send_keys(POOL[0])
    browser.find_element(By.ID, "translate-button").click()
    wait.until(lambda driver: "no language pair" in error(driver))
    console = [entry["message"] for entry in browser.get_log("browser")]
    assert not [line for line in console if "Uncaught" in line], console



class PageStub:
    """The page with its security headers, as the server sends it, in front of a stand-in for
    the rest, all under a proxy's sub-path (/mt/, so the page must ask relative paths):
    /mt/frontend/settings offers `PAIRS`, and /mt/translate answers `reply(body)`:
    (status, reason, content type, body, seconds to wait first); by default the text, its
    target's code in front. `asked` holds the bodies /translate was sent, in order."""

    PAIRS = [{"source": "de", "target": "en"}, {"source": "en", "target": "he"}]

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from nmt.serving.app import page, page_headers

        stub = self
        self.asked: list[dict] = []
        self.reply = self.echo

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path == "/mt/":
                    self.send(200, "OK", "text/html; charset=utf-8", page(), page_headers())
                elif self.path == "/mt/frontend/settings":
                    self.send(200, "OK", "application/json", json.dumps(
                        {"apiKeys": False, "charLimit": 200, "pairs": stub.PAIRS}))
                else:
                    self.send(404, "Not Found", "text/plain", "not under /mt/")

            def do_POST(self):
                if self.path != "/mt/translate":
                    self.send(404, "Not Found", "text/plain", "not under /mt/")
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.asked.append(body)
                status, reason, kind, text, wait = stub.reply(body)
                time.sleep(wait)
                self.send(status, reason, kind, text)

            def send(self, status, reason, kind, text, headers=None):
                data = text.encode()
                try:
                    self.send_response(status, reason)
                    for name, value in {"Content-Type": kind, **(headers or {})}.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except ConnectionError:  # the page gave up on this answer
                    pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    @staticmethod
    def echo(body: dict) -> tuple[int, str, str, str, float]:
        return (200, "OK", "application/json",
                json.dumps({"translatedText": f"{body['target']}: {body['q']}"}), 0)

    @staticmethod
    def refuse(status: int, reason: str, kind: str, text: str
               ) -> Callable[[dict], tuple[int, str, str, str, float]]:
        return lambda body: (status, reason, kind, text, 0)

    def open(self, browser):
        """The page in `browser`, once it has read the settings; (find by id, wait)."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import Select, WebDriverWait

        browser.get(self.url + "/mt/")
        wait = WebDriverWait(browser, 30)
        wait.until(lambda driver: Select(driver.find_element(By.ID, "pair")).options)
        return (lambda name: browser.find_element(By.ID, name)), wait

    def stop(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def page_stub():
    stub = PageStub()
    yield stub
    stub.stop()


def _no_page_errors(browser) -> None:
    console = [entry["message"] for entry in browser.get_log("browser")]
    assert not [line for line in console if "Uncaught" in line or "Security Policy" in line], \
        console


def test_the_page_keeps_long_words_and_narrow_windows_in_its_layout(page_stub, browser):
    """A word wider than its pane (a long URL) is broken inside the pane, not stretching it
    past the window; in a phone's width the panes stand one above the other."""
    find, wait = page_stub.open(browser)
    url = "https://example.com/" + "x" * 400
    find("source-text").send_keys(url)
    find("translate-button").click()
    wait.until(lambda driver: find("translation").text)
    layout = """const box = (id) => document.getElementById(id).getBoundingClientRect();
        return {width: innerWidth, page: document.documentElement.scrollWidth,
                output: box("translation"), text: box("source-text")};"""
    shown = browser.execute_script(layout)
    assert shown["page"] <= shown["width"] and shown["output"]["right"] <= shown["width"]
    assert shown["output"]["width"] == pytest.approx(shown["text"]["width"], abs=1)
    browser.set_window_size(400, 700)
    shown = browser.execute_script(layout)
    assert shown["page"] <= shown["width"] and shown["output"]["right"] <= shown["width"]
    assert shown["text"]["width"] >= shown["width"] - 60  # the window's width, less margins
    assert shown["output"]["top"] >= shown["text"]["bottom"]
    _no_page_errors(browser)


def test_the_page_shows_an_error_answer_that_is_not_json(page_stub, browser):
    """A proxy in front of the server (docs/serving.md) answers some requests with its own
    HTML page: the page shows its status, not the error of reading it as JSON."""
    nginx = ("<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>"
             "<center><h1>413 Request Entity Too Large</h1></center><hr><center>nginx</center>"
             "</body>\r\n</html>\r\n")
    page_stub.reply = page_stub.refuse(413, "Request Entity Too Large", "text/html", nginx)
    find, wait = page_stub.open(browser)
    find("source-text").send_keys("Hallo Welt.")
    find("translate-button").click()
    wait.until(lambda driver: find("error").text)
    assert find("error").text == "413 Request Entity Too Large"
    page_stub.reply = page_stub.refuse(200, "OK", "text/html", "<html>a portal</html>")
    find("translate-button").click()
    wait.until(lambda driver: find("error").text.startswith("200"))
    assert find("error").text == "200 OK: the answer holds no translation"
    assert find("translation").text == ""
    _no_page_errors(browser)


def test_the_page_says_when_the_server_is_gone(page_stub, browser):
    """A server stopped after the page was opened is named as out of reach, not only with
    the browser's own words for a failed fetch."""
    find, wait = page_stub.open(browser)
    page_stub.stop()
    find("source-text").send_keys("Hallo Welt.")
    find("translate-button").click()
    wait.until(lambda driver: find("error").text)
    assert find("error").text.startswith("cannot reach the server (")
    assert find("error").text.endswith("): is it still running?")
    assert find("translate-button").is_enabled()
    _no_page_errors(browser)


def test_the_page_shows_no_translation_of_another_text_or_pair(page_stub, browser):
    """A request that failed, and a change of languages, clear the translation shown: it is
    no translation of the text, or not into the language chosen."""
    from selenium.webdriver.support.ui import Select

    find, wait = page_stub.open(browser)
    find("source-text").send_keys("Hallo Welt.")
    find("translate-button").click()
    wait.until(lambda driver: find("translation").text == "en: Hallo Welt.")
    page_stub.reply = page_stub.refuse(429, "Too Many Requests", "application/json",
                                       json.dumps({"error": "Too many requests"}))
    find("source-text").send_keys(" Noch ein Satz.")
    find("translate-button").click()
    wait.until(lambda driver: find("error").text)
    assert (find("error").text, find("translation").text) == ("Too many requests", "")
    page_stub.reply = page_stub.echo
    find("translate-button").click()
    wait.until(lambda driver: find("translation").text == "en: Hallo Welt. Noch ein Satz.")
    assert find("error").text == ""
    Select(find("pair")).select_by_index(1)
    assert find("translation").text == ""
    _no_page_errors(browser)


def test_the_page_sends_a_request_once_and_shows_only_the_latest_answer(page_stub, browser):
    """Ctrl+Enter while a translation is on its way sends nothing more for the same text (each
    request counts against the rate limit); for a text changed meanwhile, or after a change of
    languages, the answer still on its way is dropped, though it arrives last."""
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    slow = ("Erster Text.", "Dritter Text.")
    page_stub.reply = lambda body: (*page_stub.echo(body)[:4], 1.5 if body["q"] in slow else 0)
    find, wait = page_stub.open(browser)
    text = find("source-text")
    text.send_keys("Erster Text.")
    for _ in range(3):
        text.send_keys(Keys.CONTROL, Keys.ENTER)
    text.send_keys(" Zweiter.", Keys.CONTROL, Keys.ENTER)
    wait.until(lambda driver: find("translation").text)
    time.sleep(2)  # the first answer has come and gone
    assert find("translation").text == "en: Erster Text. Zweiter."
    assert [body["q"] for body in page_stub.asked] == ["Erster Text.", "Erster Text. Zweiter."]
    assert find("translate-button").is_enabled()
    text.clear()
    text.send_keys("Dritter Text.", Keys.CONTROL, Keys.ENTER)
    Select(find("pair")).select_by_index(1)
    time.sleep(2)
    assert find("translation").text == "" and find("error").text == ""
    assert find("translate-button").is_enabled() and len(page_stub.asked) == 3
    _no_page_errors(browser)


def test_the_page_sends_no_empty_text(page_stub, browser):
    """An empty box, or one of spaces alone, is not sent (the server would refuse it as a
    request without q): the page asks for text instead."""
    from selenium.webdriver.common.keys import Keys

    find, wait = page_stub.open(browser)
    find("translate-button").click()
    assert find("error").text == "type some text to translate"
    find("source-text").send_keys("Hallo Welt.")
    find("translate-button").click()
    wait.until(lambda driver: find("translation").text == "en: Hallo Welt.")
    find("source-text").clear()
    find("source-text").send_keys("  \n ", Keys.CONTROL, Keys.ENTER)
    assert (find("error").text, find("translation").text) == ("type some text to translate", "")
    assert [body["q"] for body in page_stub.asked] == ["Hallo Welt."]
    assert find("translate-button").is_enabled()
    _no_page_errors(browser)


def test_the_page_writes_right_to_left_text_right_to_left(page_stub, browser):
    """The text and its translation each take the direction of their first letters, and the
    translation is marked with its language (for screen readers, fonts, hyphenation)."""
    from selenium.webdriver.support.ui import Select

    page_stub.reply = page_stub.refuse(200, "OK", "application/json",
                                       json.dumps({"translatedText": "שלום עולם."}))
    find, wait = page_stub.open(browser)
    Select(find("pair")).select_by_index(1)
    find("source-text").send_keys("Hello world.")
    find("translate-button").click()
    wait.until(lambda driver: find("translation").text)
    direction = "return getComputedStyle(arguments[0]).direction"
    assert browser.execute_script(direction, find("translation")) == "rtl"
    assert find("translation").get_attribute("lang") == "he"
    assert browser.execute_script(direction, find("source-text")) == "ltr"
    find("source-text").clear()
    find("source-text").send_keys("שלום עולם.")
    assert browser.execute_script(direction, find("source-text")) == "rtl"
    _no_page_errors(browser)


def test_the_page_counts_characters_as_the_server_does(page_stub, browser):
    """The server's --char-limit counts code points: an emoji is one, not two UTF-16 units."""
    find, wait = page_stub.open(browser)
    browser.execute_script("arguments[0].value = arguments[1];"
                           "arguments[0].dispatchEvent(new Event('input'))",
                           find("source-text"), "\U0001F600" * 150 + "é")
    assert find("count").text == "151 / 200 characters"

# ----------------------------------------------------------------------------- before ready


def test_before_its_search_is_compiled_the_server_answers_503_with_retry_after():
    """In-process (Starlette's test client): a service whose warm-up has not finished."""
    from types import SimpleNamespace

    from starlette.testclient import TestClient

    from nmt.serving.app import build_app
    from nmt.serving.catalog import Catalog, ServedModel
    from nmt.serving.limits import ServerLimits
    from nmt.serving.metrics import Metrics
    from nmt.serving.service import Service

    translator = SimpleNamespace(search=SimpleNamespace(nbest=1), describe=lambda: "jax float32")
    catalog = Catalog([ServedModel(0, "de", "en", "runs/x", translator)])
    service = Service(catalog, ServerLimits(), Metrics(), status="compiling de-en search 3/12")
    client = TestClient(build_app(service))
    health = client.get("/health")
    assert health.status_code == 503
    assert health.json() == {"status": "compiling de-en search 3/12", "models": ["de-en"],
                             "engines": {"de-en": "jax float32"}}
    assert client.get("/translator/health").status_code == 503
    answer = client.post("/translate", json={"q": "Hallo.", "source": "de", "target": "en"})
    assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
    assert "starting (compiling de-en search 3/12)" in answer.json()["error"]
    answer = client.post("/translator/translate", json=[{"src": "Hallo.", "id": 0}])
    assert answer.status_code == 503 and answer.json()["status"] == "error"
    assert client.get("/languages").status_code == 200  # what needs no model answers at once
    assert client.get("/").status_code == 200



def test_a_served_model_compacts_every_batch_and_warm_up_compiles_what_that_needs(run_dir):
    """The server compiles before it serves, so its searches leave finished sentences behind
    from the first batch (a translator on its own waits for 16 of a width); after `warm_up`,
    a call that compacts compiles nothing new."""
    from nmt.runtime.compilation import CompileLog
    from nmt.serving import command

    args = command.build_parser().parse_args(["--model", str(run_dir), *SHAPES])
    command.check_args(args)
    translator = command.load_served_models(args)[0].translator
    assert translator.compact_after == 0
    with CompileLog().active() as warming:
        translator.warm_up()
    assert warming.records  # the log hears compilations (of every program, from any thread)
    words = "ein Mann mit einem roten Hut geht mit zwei kleinen Hunden durch den Park".split()
    with CompileLog().active() as serving:
        done = translator.translate_all([" ".join(words[:n]) + " ."
                                         for n in (1, 2, 3, 5, 8, 10, 12, 14)])
    assert any(len(stats.stage_rows) > 1 for stats in done.batches)
    assert serving.records == []


def test_the_status_says_compiling_from_the_start_of_each_models_warm_up():
    """/health said "loading" until the first search shape had compiled, the longest; it
    names the pair being compiled from its start."""
    from types import SimpleNamespace

    from nmt.serving.command import warm_up

    service = SimpleNamespace(status="loading")
    seen = []

    def warm(progress, pair):
        seen.append(service.status)
        progress(1, 2)
        seen.append(service.status)

    models = [SimpleNamespace(pair=pair, translator=SimpleNamespace(
        engine="jax", warm_up=lambda progress, pair=pair: warm(progress, pair)))
        for pair in ("de-en", "en-de")]
    warm_up(models, service, threading.Event())
    assert seen == ["compiling de-en search", "compiling de-en search 1/2",
                    "compiling en-de search", "compiling en-de search 1/2"]


def test_json_bodies_in_utf_16_32_or_with_a_byte_order_mark_are_read():
    """RFC 8259 JSON, as Flask reads it for LibreTranslate and OpenNMT-py: UTF-8 with a byte
    order mark, UTF-16 and UTF-32 were refused as malformed."""
    from nmt.serving.params import RequestError, parse_json

    value = {"q": "Grüße 🙂", "source": "de"}
    text = json.dumps(value, ensure_ascii=False)
    for encoding in ("utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32"):
        assert parse_json(text.encode(encoding)) == value, encoding
    with pytest.raises(RequestError, match=r"not valid UTF-16-LE \(at byte \d+\); send UTF-8"):
        parse_json('{"q": "x"}'.encode("utf-16-le") + b"\x00\xd8")
