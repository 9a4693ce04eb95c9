"""What one request may ask of the server, API keys, and the request body read under limits.

`BodyReader` is the outermost layer of the application (raw ASGI): it reads each request's
body before anything else sees it, refusing a body over `max_body_bytes` (413, at once when
Content-Length says so) and a client that has not sent its whole body within `body_timeout`
seconds (408), so that a slow or huge upload holds neither memory nor a search.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

from nmt.serving.errors import RequestError


@dataclasses.dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 1 << 20    # request body
    max_characters: int = 20_000     # text of one request, all of q together
    max_sentences: int = 1_000       # sentences of one request, after splitting
    max_queue: int = 4_096           # sentences waiting for a search, per model
    timeout: float = 30.0            # seconds from request to answer
    body_timeout: float = 10.0       # seconds to receive a request's body

    def check_text(self, characters: int, sentences: int) -> None:
        """RequestError 413 naming the limit a request passes."""
        if characters > self.max_characters:
            raise RequestError(413, f"the request has {characters} characters, more than this "
                                    f"server's limit of {self.max_characters} (--char-limit)")
        if sentences > self.max_sentences:
            raise RequestError(413, f"the request has {sentences} sentences, more than this "
                                    f"server's limit of {self.max_sentences} (--max-sentences)")


def read_api_keys(path: str | Path) -> frozenset[str]:
    """The keys in `path`, one per line ('#' starts a comment); ValueError naming the file
    if it cannot be read or holds none."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"--api-keys {path}: cannot be read ({err})") from None
    keys = frozenset(line.split("#", 1)[0].strip() for line in lines) - {""}
    if not keys:
        raise ValueError(f"--api-keys {path}: holds no key; write one key per line")
    return keys


class _TooLarge(Exception):
    pass


class BodyReader:
    """ASGI middleware: the body read whole under the limits, then replayed to `app`."""

    def __init__(self, app, limits: Limits):
        self.app = app
        self.limits = limits

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.limits.max_body_bytes
        declared = _content_length(scope)
        try:
            if declared is not None and declared > limit:
                raise _TooLarge
            body = await asyncio.wait_for(self._read(receive, limit), self.limits.body_timeout)
        except _TooLarge:
            return await _error(send, 413, f"the request body is larger than this server's "
                                           f"limit of {limit} bytes (--max-body-bytes)")
        except TimeoutError:
            return await _error(send, 408, f"the request body did not arrive within "
                                           f"{self.limits.body_timeout:g} s (--body-timeout)")
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


async def _error(send, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
