"""The server's HTTP connections: uvicorn's h11 protocol, with a deadline for each request's
line and headers and a JSON answer to bytes that are not HTTP/1.1, and the listening socket,
bound before the models load.

uvicorn times out a connection that idles between requests (keep-alive), but not one that
sends its headers a byte at a time, or nothing at all after connecting: a few hundred such
connections would hold every file descriptor. `HeaderDeadline` answers 408 and closes a
connection whose request line and headers have not all arrived `header_timeout` seconds after
it opened, or after the first byte of a request that follows another; the body then has its
own deadline (`limits.BodyReader`).

The server always uses this protocol (never uvicorn's httptools one): a request h11 cannot
parse (a Content-Length that is not a number, a header line without a colon, a TLS handshake
sent to the plain port) is answered 400 `{"error": ...}` with `Connection: close` and counted,
where uvicorn wrote a plain-text 400 and a warning of its own.

A request line and headers of more than `MAX_HEAD_BYTES` are answered 431, however their bytes
arrive. h11 alone refuses them only while they are incomplete after a read: the same head sent
in one write (a read holds up to 256 KiB) was served, sent in pieces refused as a 400.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import re
import socket
import sys
from http import HTTPStatus
from typing import TYPE_CHECKING

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from nmt.runtime.cli import UsageError
from nmt.serving.errors import error_body
from nmt.translation.errors import InputError

if TYPE_CHECKING:
    from nmt.serving.metrics import Metrics

log = logging.getLogger("nmt.serving")
TLS_RECORD = b"\x16"  # the first byte of a TLS handshake: a client speaking https:// to us
# uvicorn's warning for bytes h11 cannot parse; `send_400_response` logs a line of its own.
UVICORN_INVALID = "Invalid HTTP request received."
# The most bytes a request's line and headers may take, their blank line included: h11's bound
# on an event it has not read whole, which uvicorn keeps unless told otherwise.
MAX_HEAD_BYTES = 16 * 1024
BLANK_LINE = re.compile(rb"\n\r?\n")  # where h11 ends a request's headers
LINGER_SECONDS = 2.0  # reading on, after a 431, so that the client reads it before a reset
HEAD_TOO_LARGE = (f"the request line and headers are more than {MAX_HEAD_BYTES} bytes, this "
                  "server's limit; send long texts in the body, not in the URL or a header")


class HeaderDeadline(H11Protocol):
    """uvicorn's h11 protocol, closing connections slow to send a request's headers, and
    answering in JSON those whose bytes are not HTTP/1.1."""

    header_timeout = 10.0  # seconds; `with_header_timeout` makes a class with another
    metrics: Metrics | None = None  # where a 4xx answered here is counted (endpoint "other")

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_timer: asyncio.TimerHandle | None = None
        self._first_byte = b""  # of the connection: a TLS handshake is told by it
        self._refused = False  # answered 431: what comes after is dropped
        super().connection_made(transport)
        self._watch_headers()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # the rest of a request answered 431, read only so that no reset loses it
        self._first_byte = self._first_byte or data[:1]
        super().data_received(data)
        self._watch_headers()

    def handle_events(self) -> None:
        """uvicorn's, after refusing a request whose line and headers, as far as they have
        come, are past `MAX_HEAD_BYTES` (uvicorn calls this after each read and after each
        answer, for the requests sent behind it)."""
        if self._head_too_large():
            self._refuse_head()
        else:
            super().handle_events()

    def _head_too_large(self) -> bool:
        if self.conn.their_state is not h11.IDLE:
            return False
        pending = self.conn.trailing_data[0]  # what has come of this request: at most a read
        return (len(pending) > MAX_HEAD_BYTES
                and BLANK_LINE.search(pending, 0, MAX_HEAD_BYTES) is None)

    def _refuse_head(self) -> None:
        """Answer 431 and close once the client has read it: the answer, then the end of what
        this side sends, then the client's bytes are read and dropped for `LINGER_SECONDS`
        (closing with them unread would reset the connection, and the answer with it)."""
        self._refused = True
        self._stop_timer()
        body = error_body(HEAD_TOO_LARGE)
        self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: "
                             b"application/json\r\ncontent-length: %d\r\nconnection: close"
                             b"\r\n\r\n%s" % (len(body), body))
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_SECONDS, self.transport.close)
        else:
            self.transport.close()
        log.info("431 to %s: %s", "%s:%d" % self.client if self.client else "a client",
                 HEAD_TOO_LARGE)
        if self.metrics is not None:
            self.metrics.observe_request("other", 431, 0.0)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        super().connection_lost(exc)

    def _waiting_for_headers(self) -> bool:
        """Whether a request has begun (or the connection just opened) without its headers:
        h11 says IDLE of the client until a request's headers are complete."""
        return (self.conn.their_state is h11.IDLE and not self.transport.is_closing()
                and not self._refused)

    def _watch_headers(self) -> None:
        if not self._waiting_for_headers():
            self._stop_timer()
        elif self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _stop_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self._waiting_for_headers():
            return
        body = error_body(f"the request's headers did not arrive within "
                          f"{self.header_timeout:g} s (--header-timeout)")
        # Written as it is: h11 sends a response only after a request's headers.
        self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json"
                             b"\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
                             % (len(body), body))
        self.transport.close()
        if self.metrics is not None:  # no route is known before the request line has come
            self.metrics.observe_request("other", 408, self.header_timeout)

    def send_400_response(self, msg: str) -> None:
        """uvicorn calls this when h11 cannot parse what came: answered in JSON, as every
        other error is, and counted (endpoint "other": no route is known)."""
        if self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):  # an answer is under way
            self.transport.close()
            return
        # h11's hint, on the error uvicorn is handling: 431 for an incomplete event past its
        # bound, which (the headers held to `MAX_HEAD_BYTES` before) is a chunked body's line.
        status = getattr(sys.exc_info()[1], "error_status_hint", 400)
        message = self._not_http() if status != 431 else (
            f"a chunk-size line or the trailers of the request's chunked body are more than "
            f"{MAX_HEAD_BYTES} bytes, this server's limit")
        body = error_body(message)
        headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
                   (b"content-length", b"%d" % len(body))]
        answer = h11.Response(status_code=status, headers=headers,
                              reason=HTTPStatus(status).phrase.encode())
        for event in (answer, h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()
        log.info("%d to %s: %s", status, "%s:%d" % self.client if self.client else "a client",
                 message)
        if self.metrics is not None:
            self.metrics.observe_request("other", status, 0.0)  # answered as the bytes came

    def _not_http(self) -> str:
        if self._first_byte == TLS_RECORD:
            return ("the request is a TLS handshake, but this port speaks plain HTTP; use "
                    "http://, not https://")
        return ("the request is not valid HTTP/1.1: its request line, a header line (name: "
                "value) or its body's framing (Content-Length, chunks) could not be read")


def with_header_timeout(seconds: float, metrics: Metrics | None = None
                        ) -> type[HeaderDeadline]:
    """`HeaderDeadline` with a deadline of `seconds`, counting its 408s, 400s and 431s in `metrics`
    (uvicorn makes one instance per connection)."""
    logging.getLogger("uvicorn.error").addFilter(_drop_uvicorn_invalid)  # added once
    return type("HeaderDeadline", (HeaderDeadline,),
                {"header_timeout": seconds, "metrics": metrics})


def _drop_uvicorn_invalid(record: logging.LogRecord) -> bool:
    """False for uvicorn's warning of a request it cannot parse, which `HeaderDeadline`
    answers and logs itself."""
    return record.msg != UVICORN_INVALID


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port` for the server to listen on, bound before the models
    load, so that a port in use or an address not of this machine ends the command at once:
    UsageError (exit status 2) for the address, InputError (1) for the port."""
    if not host.strip():
        raise UsageError("--host is empty, which would listen on every interface unasked; "
                         "give 0.0.0.0 (or ::) for that, or an address such as 127.0.0.1")
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as err:
        raise UsageError(f"--host {host}: not an address this machine can listen on "
                         f"({getattr(err, 'strerror', None) or err}); give an IP address "
                         "such as 127.0.0.1, 0.0.0.0 or ::1, or a name that resolves to one"
                         ) from None
    # A name with both (localhost): its IPv4 address, which clients try first or after ::1.
    family, kind, proto, _, address = min(found, key=lambda info: info[0] != socket.AF_INET)
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as err:
        sock.close()
        where = f"{host}:{port}"
        if err.errno == errno.EADDRINUSE:
            raise InputError(f"cannot listen on {where}: the port is in use; choose another "
                             "--port (0 picks a free one) or stop what uses it") from None
        if err.errno == errno.EADDRNOTAVAIL:
            raise UsageError(f"--host {host}: not an address of this machine; give one of its "
                             "addresses, 127.0.0.1, or 0.0.0.0 for every interface") from None
        if err.errno == errno.EACCES:
            raise InputError(f"cannot listen on {where}: permission denied (ports below 1024 "
                             "need privileges); choose --port 1024 or above") from None
        raise InputError(f"cannot listen on {where}: {err.strerror}") from None
    sock.set_inheritable(True)
    return sock
