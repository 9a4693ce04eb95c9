"""Per-client rate limits over a moving minute: counted per text and per character, refused
requests cost nothing, Retry-After says when the window has room, and a request larger than
a minute's budget is told so (413) rather than asked to wait."""

from __future__ import annotations

import pytest

from nmt.serving import ratelimit
from nmt.serving.errors import RequestError
from nmt.serving.ratelimit import RateLimiter, RateLimits


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(ratelimit.time, "monotonic", lambda: now[0])
    return now


def refused(limiter: RateLimiter, client: str, requests: int, characters: int) -> RequestError:
    with pytest.raises(RequestError) as caught:
        limiter.charge(client, requests, characters)
    return caught.value


def test_requests_per_minute_over_a_moving_window(clock):
    limiter = RateLimiter(RateLimits(requests=10))
    limiter.charge("a", 6, 100)          # a list of 6 texts counts 6
    clock[0] += 20
    limiter.charge("a", 4, 100)
    err = refused(limiter, "a", 1, 10)
    assert err.status == 429 and err.message.startswith("Slowdown:")
    assert "--req-limit" in err.message
    assert err.headers == {"Retry-After": "40"}  # the first 6 leave the window at 60 s
    limiter.charge("b", 10, 100)          # another client has its own window
    clock[0] += 40
    limiter.charge("a", 6, 10)            # the first request has left the window
    assert refused(limiter, "a", 1, 10).headers == {"Retry-After": "20"}


def test_characters_per_minute_and_refusals_cost_nothing(clock):
    limiter = RateLimiter(RateLimits(requests=100, characters=1000))
    limiter.charge("a", 1, 900)
    assert refused(limiter, "a", 1, 200).status == 429
    limiter.charge("a", 1, 100)           # the refused 200 were not counted
    assert refused(limiter, "a", 1, 1).status == 429
    err = refused(limiter, "b", 1, 1001)  # never fits a minute: 413, not 429
    assert err.status == 413 and "--char-limit-per-minute" in err.message
    assert refused(limiter, "b", 101, 1).status == 413


def test_no_limits_count_nothing_and_quiet_clients_are_forgotten(clock, monkeypatch):
    assert not RateLimits() and RateLimits(requests=1)
    monkeypatch.setattr(ratelimit, "SWEEP_EVERY", 4)
    limiter = RateLimiter(RateLimits(requests=5))
    for client in "abc":
        limiter.charge(client, 1, 1)
    clock[0] += 61
    limiter.charge("d", 1, 1)  # the fourth charge sweeps: a, b and c have nothing left
    assert {client for _, client in limiter._windows} == {"d"}


def test_a_refund_gives_a_charge_back(clock):
    limiter = RateLimiter(RateLimits(requests=10, characters=100))
    charged = limiter.charge("a", 8, 90)
    assert refused(limiter, "a", 3, 5).status == 429
    limiter.refund(charged)
    limiter.charge("a", 10, 100)  # the whole minute's budget again
    clock[0] += 61
    limiter.refund(limiter.charge("a", 1, 1))
    limiter.refund(charged)  # out of the window already: nothing to give back


def test_requests_the_server_refuses_after_their_charge_cost_nothing():
    """In-process (Starlette's test client), --req-limit 20: a client refused 503 (the server
    starting, the queue full) or 413 (more sentences than a request may have) has its charge
    given back; one answered is charged."""
    from types import SimpleNamespace

    from starlette.testclient import TestClient

    from nmt.models.translations import Hypothesis
    from nmt.serving.app import build_app
    from nmt.serving.batching import QueueFull
    from nmt.serving.catalog import Catalog, ServedModel
    from nmt.serving.limits import ServerLimits
    from nmt.serving.metrics import Metrics
    from nmt.serving.service import Service

    full = [True]

    async def search(batch):
        if full[0]:
            raise QueueFull("20 sentences are waiting; the queue holds 20")
        return [[Hypothesis(sentence, 0.0, ())] for sentence in batch]

    model = ServedModel(0, "de", "en", "runs/x", SimpleNamespace(search=None),
                        batcher=SimpleNamespace(translate=search))
    service = Service(Catalog([model]), ServerLimits(max_sentences=8), Metrics(),
                      rate=RateLimiter(RateLimits(requests=20)))
    client = TestClient(build_app(service))

    def translate(texts: int, text: str = "Ja.") -> int:
        return client.post("/translate", json={"q": [text] * texts, "source": "de",
                                               "target": "en"}).status_code

    assert translate(6) == 503  # starting
    service.ready = True
    assert [translate(6), translate(6), translate(6)] == [503] * 3  # the queue full
    assert client.post("/translator/translate", json=[{"src": "Ja."}] * 6).status_code == 503
    assert translate(5, "Ein Hund. Eine Katze.") == 413  # 10 sentences
    full[0] = False
    assert [translate(8), translate(8), translate(4)] == [200, 200, 200]
    assert translate(1) == 429


def test_never_fitting_is_413_before_any_429_and_retry_after_is_the_longest_wait(clock):
    limiter = RateLimiter(RateLimits(requests=1, characters=40))
    limiter.charge("a", 1, 1)             # the request limit is used up
    assert refused(limiter, "a", 1, 41).status == 413  # waiting would not help
    limiter = RateLimiter(RateLimits(requests=3, characters=40))
    limiter.charge("a", 1, 1)
    clock[0] += 1
    limiter.charge("a", 1, 1)
    clock[0] += 19
    limiter.charge("a", 1, 38)
    clock[0] += 5
    err = refused(limiter, "a", 1, 5)     # past both: requests free at 60 s, characters at 80 s
    assert err.status == 429 and "--char-limit-per-minute" in err.message
    assert err.headers == {"Retry-After": "55"}
    clock[0] += 55
    limiter.charge("a", 1, 5)


def _file_client(monkeypatch, rate: RateLimits, max_file_characters: int):
    """A server of an echoing de->en model with `rate`'s limits: (a function posting a .txt
    of a text to /translate_file and returning the status, the byte sizes of the files read)."""
    from types import SimpleNamespace

    from starlette.testclient import TestClient

    from nmt.models.translations import Hypothesis
    from nmt.serving.app import build_app
    from nmt.serving.catalog import Catalog, ServedModel
    from nmt.serving.limits import ServerLimits
    from nmt.serving.metrics import Metrics
    from nmt.serving.service import Service
    from nmt.translation import document_files

    read = []
    prepare = document_files.prepare
    monkeypatch.setattr(document_files, "prepare",
                        lambda data, *args: read.append(len(data)) or prepare(data, *args))

    async def search(batch):
        return [[Hypothesis(sentence, 0.0, ())] for sentence in batch]

    model = ServedModel(0, "de", "en", "runs/x", SimpleNamespace(search=None),
                        batcher=SimpleNamespace(translate=search))
    service = Service(Catalog([model]), ServerLimits(max_file_characters=max_file_characters),
                      Metrics(), rate=RateLimiter(rate), ready=True)
    client = TestClient(build_app(service))

    def translate_file(text: str) -> int:
        return client.post("/translate_file", data={"source": "de", "target": "en"},
                           files={"file": ("a.txt", text.encode())}).status_code

    return translate_file, read


def test_a_file_from_a_client_past_its_limit_is_refused_before_it_is_read(monkeypatch):
    """--req-limit 3: once a client's requests are spent, its next file is refused 429 without
    being read (cut into sentences); a file past --file-char-limit was read up to the limit,
    and counts as a request."""
    translate_file, read = _file_client(monkeypatch, RateLimits(requests=3), 100)
    assert translate_file("Ja.") == 200
    assert translate_file("Ja. " * 100) == 413  # read up to the limit: it counts
    assert translate_file("Ja.") == 200
    assert read == [3, 400, 3]
    assert translate_file("Ein langer Satz. " * 1000) == 429
    assert read == [3, 400, 3]


def test_a_file_past_the_characters_a_minute_counts_as_a_request_as_it_was_read(monkeypatch):
    """--char-limit-per-minute 1000: a file of 3,200 characters is refused 413 once read, and
    that reading counts against --req-limit 3 (it was free, so such files were read forever)."""
    translate_file, read = _file_client(
        monkeypatch, RateLimits(requests=3, characters=1000), 100_000)
    long = "Ein langer Satz. " * 200
    assert [translate_file(long) for _ in range(3)] == [413] * 3
    assert translate_file(long) == 429
    assert len(read) == 3
