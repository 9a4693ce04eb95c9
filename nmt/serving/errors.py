"""The server's one error: an HTTP status and a one-line message for the client."""

from __future__ import annotations


class RequestError(Exception):
    """Answered as {"error": message} with `status` (and `headers`, e.g. Retry-After)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}
