"""A request's parameters from its query string and body (JSON, form or multipart), decoded
strictly: invalid UTF-8, malformed JSON, a lone UTF-16 surrogate or a body nested past what
the parser can follow is refused with what goes wrong, never replaced by U+FFFD or left to
fail later. Parsing is linear in the body's size, and a form with more fields than a request
can use is refused before it is parsed."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl

from starlette.datastructures import FormData
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request

from nmt.serving.errors import RequestError, shown
from nmt.serving.limits import ServerLimits

# Form fields a request may have besides its texts (source, target, format, alternatives,
# api_key, and a few a client may add).
OTHER_FIELDS = 16
TOO_DEEP = ("the request body nests lists or objects too deeply for this server; a request "
            "needs two levels at most")


def decode(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RequestError(400, f"the {what} is not valid UTF-8: byte 0x{data[err.start]:02x} "
                                f"at offset {err.start}; send UTF-8 text") from None


def parse_json(body: bytes) -> Any:
    """The JSON value of `body`; RequestError 400 for anything that is not JSON text."""
    try:
        value = json.loads(_json_text(body))
    except json.JSONDecodeError as err:
        raise RequestError(400, f"malformed JSON in the request body: {err.msg} (line "
                                f"{err.lineno}, column {err.colno})") from None
    except RecursionError:
        raise RequestError(400, TOO_DEEP) from None
    except ValueError as err:  # an integer of more digits than Python converts
        raise RequestError(400, f"the request body holds a number this server cannot read "
                                f"({' '.join(str(err).split()[:8])}...)") from None
    _check_whole_characters(value)
    return value


def _json_text(body: bytes) -> str:
    """`body` as text: UTF-8, with or without a byte order mark, or UTF-16 or UTF-32, told
    apart by its first bytes as RFC 8259 and LibreTranslate's and OpenNMT-py's Flask read it."""
    encoding = json.detect_encoding(body)
    if encoding == "utf-8":
        return decode(body, "request body")
    try:
        return body.decode(encoding)
    except UnicodeDecodeError as err:
        name = encoding.upper().replace("-SIG", "")
        raise RequestError(400, f"the request body is not valid {name} (at byte "
                                f"{err.start}); send UTF-8 text") from None


def _check_whole_characters(value: Any) -> None:
    """RequestError 400 if a string of `value` holds half of a UTF-16 surrogate pair: JSON's
    \\uD800-\\uDFFF escapes decode to such halves, which are no character and no UTF-8."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as err:
        half = ord(err.object[err.start])
        raise RequestError(400, f"a string of the request body holds \\u{half:04x}, half of a "
                                "UTF-16 surrogate pair without its other half; send whole "
                                "characters") from None
    except RecursionError:
        raise RequestError(400, TOO_DEEP) from None


def _pairs(text: str, what: str, limits: ServerLimits) -> list[tuple[str, str]]:
    fields = text.count("&") + 1
    most = limits.max_sentences + OTHER_FIELDS
    if fields > most:
        raise RequestError(413, f"the {what} has {fields} fields, more than this server's "
                                f"limit of {most} ({limits.max_sentences} texts, --max-sentences, "
                                f"and {OTHER_FIELDS} others)")
    try:
        return parse_qsl(text, keep_blank_values=True, encoding="utf-8", errors="strict")
    except UnicodeDecodeError as err:
        raise RequestError(400, f"the {what} holds a percent-escape that is not UTF-8 "
                                f"({err.reason}); send UTF-8 text") from None


def _collect(pairs: Iterable[tuple[str, str]]) -> dict[str, str | list[str]]:
    """Fields by name; a repeated name collects its values in a list (several q fields: a
    list of texts), appended in place, so that N repeats cost N steps."""
    params: dict[str, str | list[str]] = {}
    for key, value in pairs:
        previous = params.get(key)
        if previous is None:
            params[key] = value
        elif isinstance(previous, list):
            previous.append(value)
        else:
            params[key] = [previous, value]
    return params


async def request_params(request: Request, limits: ServerLimits) -> dict[str, Any]:
    """The query string's parameters, overridden by those of the body: a JSON object, an
    urlencoded or a multipart form (LibreTranslate's clients send each of these)."""
    query = request.scope.get("query_string", b"").decode("latin-1")
    params: dict[str, Any] = _collect(_pairs(query, "query string", limits)) if query else {}
    body = await request.body()
    if not body.strip():
        return params
    kind = content_type(request)
    if kind == "application/x-www-form-urlencoded":
        fields = _collect(_pairs(decode(body, "request body"), "request body", limits))
        _check_not_json(body, fields)
        params.update(fields)
    elif kind == "multipart/form-data":
        params.update(await _multipart(request, limits))
    elif is_json(kind):
        values = parse_json(body)
        if not isinstance(values, dict):
            raise RequestError(400, "the request body must be a JSON object such as "
                                    '{"q": "text", "source": "en", "target": "de"}')
        params.update(values)
    else:
        # JSON under another type would be a "simple" cross-site request that no CORS
        # preflight guards.
        raise RequestError(415, f"a request body of type {shown(kind or 'none')} is not read; "
                                "send JSON with Content-Type: application/json, or a form "
                                "(application/x-www-form-urlencoded or multipart/form-data)")
    return params


def content_type(request: Request) -> str:
    """The request's media type, lower case, without parameters ("" if none)."""
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def is_json(kind: str) -> bool:
    """Whether media type `kind` is JSON (application/json, or a +json type)."""
    return kind == "application/json" or kind.endswith("+json")


def json_body(request: Request, body: bytes) -> Any:
    """The JSON value of a body that must be JSON; RequestError 415 for one not sent as
    JSON (under another type it would be a cross-site request that no CORS preflight
    guards), 400 for one that is not JSON text."""
    kind = content_type(request)
    if not is_json(kind):
        raise RequestError(415, f"a request body of type {shown(kind or 'none')} is not read; "
                                "send JSON with Content-Type: application/json")
    return parse_json(body)


def _check_not_json(body: bytes, fields: dict[str, Any]) -> None:
    """RequestError 400 with a hint for JSON sent as a form (curl -d's default type)."""
    if body.lstrip()[:1] in (b"{", b"[") and "q" not in fields:
        raise RequestError(400, "the request body looks like JSON but was sent as a form "
                                "(Content-Type: application/x-www-form-urlencoded, what "
                                "curl -d sends); add -H 'Content-Type: application/json'")


class _StrictMultiPartParser(MultiPartParser):
    """Starlette's multipart parser, but a text field that is not UTF-8 is refused (400)
    instead of read as Latin-1."""

    def on_part_end(self) -> None:
        part = self._current_part
        if part.file is None:
            decode(bytes(part.data), f"form field {shown(part.field_name)}")
        super().on_part_end()


async def read_multipart(request: Request, max_fields: int, max_files: int = 1000
                         ) -> FormData:
    """The multipart form of `request`, its text fields strictly UTF-8; RequestError 400 for
    a malformed one. The caller closes the files it holds (`FormData.close`)."""
    parser = _StrictMultiPartParser(request.headers, request.stream(), max_files=max_files,
                                    max_fields=max_fields)
    try:
        return await parser.parse()
    except MultiPartException as err:
        raise RequestError(400, f"malformed multipart form: {err.message}") from None


async def _multipart(request: Request, limits: ServerLimits) -> dict[str, Any]:
    form = await read_multipart(request, limits.max_sentences + OTHER_FIELDS)
    try:
        for key, value in form.multi_items():
            if not isinstance(value, str):
                raise RequestError(400, f"form field {shown(key)} is a file; send text fields")
        return _collect(form.multi_items())
    finally:
        await form.close()


def api_key(request: Request, params: dict[str, Any] | None = None) -> str | None:
    """The key sent as the api_key parameter or as `Authorization: Bearer KEY`; RequestError
    400 if api_key is not one string."""
    key = params.get("api_key") if params else request.query_params.get("api_key")
    if key is not None and key != "":
        if not isinstance(key, str):
            raise RequestError(400, f"Invalid request: api_key must be one string, got "
                                    f"{shown(key)}")
        return key
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        # Starlette reads headers as Latin-1: the key's bytes, read as UTF-8 (bytes that are
        # not UTF-8 stay as they came, as surrogates, and match no key).
        return header[7:].encode("latin-1").decode("utf-8", "surrogateescape").strip()
    return None
