"""What every endpoint shares: the models, the limits, the keys, the metrics, readiness."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import hmac
import logging
import os
import time
from collections.abc import Awaitable, Sequence
from typing import TypeVar

from starlette.requests import Request

from nmt.models.translations import Hypothesis
from nmt.serving.batching import QueueFull
from nmt.serving.catalog import Catalog, ServedModel
from nmt.serving.detection import LanguageIdentifier, has_letters
from nmt.serving.errors import ClientGone, RequestError
from nmt.serving.file_store import FileStore
from nmt.serving.limits import ServerLimits, read_api_keys
from nmt.serving.metrics import Metrics
from nmt.serving.ratelimit import RateLimiter, RateLimits

RETRY_AFTER_SECONDS = 1
KEYS_CHECK_SECONDS = 1.0  # how often at most the keys file is looked at for a change
T = TypeVar("T")
log = logging.getLogger("nmt.serving")


def key_file_state(path: str) -> tuple[int, ...] | None:
    """What changes when the file (a link's target) is written, replaced or made unreadable
    (ctime: chmod); None if it cannot be looked at."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class KeyFile:
    """The keys of --api-keys, read again when the file changes (looked at no more than once
    a second, by the requests that need a key), so that keys are added or revoked without a
    restart. A change that leaves the file unreadable or without a key keeps the keys before
    it, with one warning: an edit never turns authentication off."""

    def __init__(self, path: str, keys: frozenset[str], state: tuple[int, ...] | None):
        self.path, self.keys, self._state = path, keys, state  # state: when `keys` were read
        self._checked = time.monotonic()

    def current(self) -> frozenset[str]:
        now = time.monotonic()
        if now - self._checked >= KEYS_CHECK_SECONDS:
            self._checked = now
            self._reread()
        return self.keys

    def _reread(self) -> None:
        state = key_file_state(self.path)
        if state == self._state:
            return
        keys, fault = self._read()
        if key_file_state(self.path) != state:
            return  # written while it was read: read again at the next look
        self._state = state
        if fault:
            log.warning("%s; the keys read before stay in use (%d)", fault, len(self.keys))
            return
        self.keys = keys
        log.info("--api-keys %s changed; keys in use: %d", self.path, len(keys))

    def _read(self) -> tuple[frozenset[str], str]:
        try:
            return read_api_keys(self.path), ""
        except ValueError as err:
            return self.keys, str(err)


@dataclasses.dataclass
class Service:
    catalog: Catalog
    limits: ServerLimits
    metrics: Metrics
    api_keys: frozenset[str] | None = None  # None: no key needed
    rate: RateLimiter = dataclasses.field(default_factory=lambda: RateLimiter(RateLimits()))
    ready: bool = False  # models loaded and every search shape compiled
    status: str = "loading"
    alternatives_limit: int = 0  # alternatives a request may ask for (--alternatives-limit)
    # Where alignments are computed: the search threads (set by the lifespan).
    executor: concurrent.futures.Executor | None = None
    identifier: LanguageIdentifier | None = None  # made at start, or at the first /detect
    files: FileStore = dataclasses.field(default_factory=FileStore)  # translated files
    key_file: KeyFile | None = None  # --api-keys: `api_keys` follows its changes

    def __post_init__(self):
        if self.key_file is not None:
            self.api_keys = self.key_file.keys

    def languages(self) -> list[str]:
        """The codes served, as a source or as a target, sorted."""
        return sorted({code for m in self.catalog.models for code in (m.source, m.target)})

    def detect(self, text: str, limit: int = 3) -> list[tuple[str, float]]:
        """Up to `limit` (language, confidence 0-1) of `text`, best first, among the languages
        served: the targets too, so that a text already in the language asked for is told."""
        if self.identifier is None:
            self.identifier = LanguageIdentifier(self.languages())
        return self.identifier.detect(text, limit)

    def source_model(self, source: str, target: str, texts: Sequence[str]
                     ) -> tuple[ServedModel | None, dict | None]:
        """(the model for source -> target, None where the texts come back as they are;
        LibreTranslate's detectedLanguage, None for a source given). A source that is the
        target, a language served, has no model unless one is served for that pair (a
        paraphraser, a normalizer); RequestError 400 for any other pair not served. Texts
        without a letter (digits, punctuation, emoji) have no model either: there is nothing
        to translate. Source "auto" is the texts' language, detected among the languages
        served; it must go to `target` (400 if not): one of its sources, or the target
        itself, whose texts come back as they are unless a model serves that pair (the first
        source, confidence 0, when nothing tells)."""
        readable = any(map(has_letters, texts))
        if source == target and source in self.languages() and not self.serves(source, source):
            return None, None
        if source != "auto":
            model = self.catalog.find(source, target)
            return (model if readable else None), None
        choices = [m.source for m in self.catalog.models if m.target == target]
        if target in self.languages() and target not in choices:
            choices.append(target)
        if not choices:
            self.catalog.find(source, target)  # 400: no pair goes to `target`
        ranked = dict(self.detect(" ".join(texts), limit=len(self.languages())))
        code = next(iter(ranked), choices[0]) if readable else choices[0]
        if code not in choices:  # as LibreTranslate: a language read that cannot go there
            raise RequestError(400, f"the text reads as {code} ({ranked[code]:.0%} sure), and "
                                    f"this server does not translate {code}->{target}: it "
                                    f"translates {self.catalog.pairs()}")
        detected = {"language": code, "confidence": round(ranked.get(code, 0.0) * 100, 1)}
        if (code == target and not self.serves(code, target)) or not readable:
            return None, detected
        return self.catalog.find(code, target), detected

    def serves(self, source: str, target: str) -> bool:
        return any(m.source == source and m.target == target for m in self.catalog.models)

    def text_models(self, source: str, target: str, texts: Sequence[str]
                    ) -> list[tuple[ServedModel | None, dict | None]]:
        """`source_model` of each text: with source "auto", each text's language is
        detected on its own."""
        return [self.source_model(source, target, [text]) for text in texts]

    async def align(self, model: ServedModel, sources: Sequence[str],
                    targets: Sequence[str]) -> list | None:
        """The model's word alignment of each source with its translation, on a search
        thread, at most `part_sentences` at a time, each part within the request timeout
        (504); None where the engine gives none (inline markup then goes by position)."""
        align = getattr(model.translator, "align", None)
        if align is None or not sources:
            return None
        loop = asyncio.get_running_loop()
        found, step = [], self.limits.part_sentences
        for start in range(0, len(sources), step):
            part = list(sources[start:start + step]), list(targets[start:start + step])
            try:
                found += await asyncio.wait_for(
                    loop.run_in_executor(self.executor, align, *part), self.limits.timeout)
            except TimeoutError:
                raise RequestError(504, f"aligning the translations with their sources (to "
                                        f"place the markup) took longer than this server's "
                                        f"{self.limits.timeout:g} s (--timeout)") from None
        return found

    def check_ready(self) -> None:
        if not self.ready:
            raise RequestError(503, f"the server is starting ({self.status}); try again "
                                    "shortly", {"Retry-After": str(RETRY_AFTER_SECONDS)})

    def check_key(self, key: str | None) -> None:
        """RequestError 403 unless keys are off or `key` is one of them (compared in constant
        time, so that the answer's timing does not tell how much of a key was right)."""
        if self.key_file is not None:
            self.api_keys = self.key_file.current()
        if self.api_keys is None:
            return
        if not key:
            # Said so that it works on every route: OpenNMT-py's body is a list, with no
            # field for a key.
            raise RequestError(403, "this server needs an API key: send it as ?api_key=KEY "
                                    "(or an api_key field of a LibreTranslate request) or "
                                    "Authorization: Bearer KEY; ask the server's operator "
                                    "for one")
        # A header's bytes that are not UTF-8 come as surrogates (`api_key`): compared as sent.
        sent = key.encode("utf-8", "surrogateescape")
        if not any(hmac.compare_digest(sent, known.encode()) for known in self.api_keys):
            raise RequestError(403, "Invalid API key")

    def charge(self, request: Request, texts: int, characters: int) -> None:
        """Count a request against its client's rate limits (429 or 413 past them), until
        `refund` gives it back. Charged again (a file, once it is read and its characters
        known), the new charge replaces the first: a client past its limits is refused before
        the work of reading, and then pays for what was read; where that is refused, the
        first charge stays, refused or not (the file was read)."""
        if not self.rate.limits:
            return
        client = request.client.host if request.client else "unknown"
        earlier = getattr(request.state, "rate_cost", None)
        self.refund(request)
        try:
            request.state.rate_charge = self.rate.charge(client, texts, characters)
        except RequestError:
            if earlier is not None:  # it fitted a moment ago, and nothing ran since
                self.rate.charge(client, *earlier)
            raise
        request.state.rate_cost = (texts, characters)

    def keep_charge(self, request: Request) -> None:
        """Keep the request's charge whatever it is answered: it was worked on."""
        request.state.rate_charge = None

    def refund(self, request: Request) -> None:
        """Give back the request's charge, if it was charged: it was refused, not served."""
        charged = getattr(request.state, "rate_charge", None)
        if charged is not None:
            request.state.rate_charge = None
            self.rate.refund(charged)

    async def translate(self, model: ServedModel, sentences: Sequence[str],
                        alternatives: bool = False) -> list[list[Hypothesis]]:
        """The n-best lists of `sentences` from `model`'s batcher (its n-best batcher with
        `alternatives`), within the request timeout (504) and the queue's bound (503 with
        Retry-After while it is full, 413 for more sentences than it ever holds)."""
        self.check_ready()
        self.limits.check_queue(len(sentences))
        batcher = model.alternatives_batcher if alternatives else model.batcher
        assert batcher is not None
        try:
            return await asyncio.wait_for(batcher.translate(sentences), self.limits.timeout)
        except QueueFull as err:
            raise RequestError(503, f"the server is busy ({err}); try again shortly",
                               {"Retry-After": str(RETRY_AFTER_SECONDS)}) from None
        except TimeoutError:
            raise RequestError(504, f"the translation took longer than this server's "
                                    f"{self.limits.timeout:g} s (--timeout)") from None


async def unless_client_leaves(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result, unless the client closes its connection first: then `work` is
    cancelled (its sentences leave the queue if their search has not started) and ClientGone
    raised, so that no search is spent on an answer no one will read."""
    task = asyncio.ensure_future(work)
    left = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, left}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in (task, left):
            if not waiting.done():
                waiting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiting
    if task.cancelled():
        raise ClientGone
    return task.result()


async def _disconnected(request: Request) -> None:
    """Returns once the client has closed the connection (the body was read already: what
    the server hears next is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
