"""What one request may ask of the server, API keys, and the request body read under limits.

`BodyReader` is the application's first layer to read a request (raw ASGI; only the metrics
and the fault guard wrap it): it reads each request's body before anything else sees it,
refusing a body over `max_body_bytes` (413, at once when Content-Length says so) and a client
that has not sent its whole body within `body_timeout` seconds (408), so that a slow or huge
upload holds neither memory nor a search.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from nmt.serving.errors import RequestError, send_error

FILE_PATH = "/translate_file"  # its body is a file, under a limit of its own
# Seconds a request may take besides its waits for a search or an alignment: reading the
# body, splitting the text, rebuilding a file.
REQUEST_SLACK = 5.0


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    max_body_bytes: int = 1 << 20    # request body
    max_file_bytes: int = 10 << 20   # request body of POST /translate_file
    max_file_characters: int = 200_000  # text of one file to translate
    max_characters: int = 20_000     # text of one request, all of q together
    max_sentences: int = 1_000       # sentences of one request, after splitting
    max_queue: int = 4_096           # sentences waiting for a search, per model
    timeout: float = 30.0            # seconds from request to answer
    header_timeout: float = 10.0     # seconds to receive a request's line and headers
    body_timeout: float = 10.0       # seconds to receive a request's body

    @property
    def part_sentences(self) -> int:
        """The most sentences of a long piece of work (a file) searched or aligned at once:
        what one request may send, and what the queue holds."""
        return min(self.max_sentences, self.max_queue)

    def longest_request(self, alternatives: int) -> float:
        """Seconds one accepted request may take, each of its waits for a search or an
        alignment within `timeout`: a file of `max_file_characters` (a sentence holds one at
        least) searched and then aligned in parts of `part_sentences`, or a text's search and
        the alignment of each of its `alternatives` + 1 translations; plus REQUEST_SLACK."""
        file_parts = -(-self.max_file_characters // self.part_sentences)
        waits = max(2 * file_parts, 1 + alternatives + 1)
        return waits * self.timeout + REQUEST_SLACK

    def check_characters(self, characters: int) -> None:
        """RequestError 413 if a request's texts have more characters than it may."""
        if characters > self.max_characters:
            raise RequestError(413, f"the request has {characters} characters, more than this "
                                    f"server's limit of {self.max_characters} (--char-limit)")

    def check_texts(self, texts: int) -> None:
        """RequestError 413 if a request has more texts than it may have sentences: checked
        before they are split, each counting as one sentence at least, an empty one too."""
        if texts > self.max_sentences:
            raise RequestError(413, f"the request has {texts} texts, more than this server's "
                                    f"limit of {self.max_sentences} sentences (--max-sentences; "
                                    "each text counts as one at least)")

    def check_sentences(self, sentences: int) -> None:
        """RequestError 413 if a request has more sentences than it may."""
        if sentences > self.max_sentences:
            raise RequestError(413, f"the request has {sentences} sentences, more than this "
                                    f"server's limit of {self.max_sentences} (--max-sentences)")

    def check_queue(self, sentences: int) -> None:
        """RequestError 413 if `sentences` for one model could never fit its queue: a 503
        would have the client retry forever."""
        if sentences > self.max_queue:
            raise RequestError(413, f"the request has {sentences} sentences for one model, more "
                                    f"than this server queues for it ({self.max_queue}, "
                                    "--queue-sentences); send fewer at a time")


def read_api_keys(path: str | Path) -> frozenset[str]:
    """The keys in `path`, one per line, each read whole (a '#' inside a key is part of it;
    a line starting with '#' is a comment), a UTF-8 byte order mark dropped; ValueError naming
    the file if the path is empty, the file cannot be read, or it holds no key."""
    if not str(path).strip():
        raise ValueError("--api-keys was given an empty path; give the file of keys, or leave "
                         "the flag out to serve without keys")
    try:
        lines = Path(path).read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"--api-keys {path}: cannot be read ({err})") from None
    keys = frozenset(line.strip() for line in lines
                     if line.strip() and not line.lstrip().startswith("#"))
    if not keys:
        raise ValueError(f"--api-keys {path}: holds no key; write one key per line")
    return keys


class _TooLarge(Exception):
    pass


class BodyReader:
    """ASGI middleware: the body read whole under the limits, then replayed to `app`."""

    def __init__(self, app, limits: ServerLimits):
        self.app = app
        self.limits = limits

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit, flag = ((self.limits.max_file_bytes, "--max-file-bytes")
                       if scope["path"] == FILE_PATH else
                       (self.limits.max_body_bytes, "--max-body-bytes"))
        declared = _content_length(scope)
        try:
            if declared is not None and declared > limit:
                raise _TooLarge
            body = await asyncio.wait_for(self._read(receive, limit), self.limits.body_timeout)
        except _TooLarge:
            return await send_error(send, 413, f"the request body is larger than this "
                                               f"server's limit of {limit} bytes ({flag})")
        except TimeoutError:
            return await send_error(send, 408, f"the request body did not arrive within "
                                               f"{self.limits.body_timeout:g} s "
                                               "(--body-timeout)")
        except _Disconnected:
            return None
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the client to disconnect

        return await self.app(scope, replay, send)

    @staticmethod
    async def _read(receive, limit: int) -> bytes:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


class _Disconnected(Exception):
    pass


def _content_length(scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None

