"""The server's errors: a request refused with an HTTP status and a one-line message, a client
that left before its answer, and how a message quotes what a client sent."""

from __future__ import annotations

import json
from typing import Any


class RequestError(Exception):
    """Answered as {"error": message} with `status` (and `headers`, e.g. Retry-After)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


class ClientGone(Exception):
    """The client closed its connection before its answer: there is no one to answer."""


def shown(value: Any, width: int = 40) -> str:
    """`value` as an error message quotes it: a string or number cut to `width` characters, a
    list or object by its kind (its repr could be a megabyte, or nested past repr's depth)."""
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return "an object"
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def error_body(message: str) -> bytes:
    """Every error's body: {"error": message} as JSON."""
    return json.dumps({"error": message}).encode()


async def send_error(send, status: int, message: str) -> None:
    """Answer {"error": message} on raw ASGI and close the connection: for answers given
    outside the routes (the body's limits, a fault), after which the connection's state is
    not worth keeping."""
    body = error_body(message)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
