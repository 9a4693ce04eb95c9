"""A request's parameters from its query string and body (JSON, form or multipart), decoded
strictly: invalid UTF-8 or malformed JSON is refused with the place it goes wrong, never
replaced by U+FFFD."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl

from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request

from nmt.serving.errors import RequestError


def decode(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RequestError(400, f"the {what} is not valid UTF-8: byte 0x{data[err.start]:02x} "
                                f"at offset {err.start}; send UTF-8 text") from None


def parse_json(body: bytes) -> Any:
    try:
        return json.loads(decode(body, "request body"))
    except json.JSONDecodeError as err:
        raise RequestError(400, f"malformed JSON in the request body: {err.msg} (line "
                                f"{err.lineno}, column {err.colno})") from None


def _pairs(text: str, what: str) -> list[tuple[str, str]]:
    try:
        return parse_qsl(text, keep_blank_values=True, encoding="utf-8", errors="strict")
    except UnicodeDecodeError as err:
        raise RequestError(400, f"the {what} holds a percent-escape that is not UTF-8 "
                                f"({err.reason}); send UTF-8 text") from None


def _add(params: dict[str, Any], key: str, value: Any) -> None:
    """A repeated key collects its values in a list (several q fields: a list of texts)."""
    if key in params:
        previous = params[key]
        params[key] = [*previous, value] if isinstance(previous, list) else [previous, value]
    else:
        params[key] = value


async def request_params(request: Request) -> dict[str, Any]:
    """The query string's parameters, overridden by those of the body: a JSON object, an
    urlencoded or a multipart form (LibreTranslate's clients send each of these)."""
    params: dict[str, Any] = {}
    query = request.scope.get("query_string", b"")
    for key, value in _pairs(query.decode("latin-1"), "query string"):
        _add(params, key, value)
    body = await request.body()
    if not body.strip():
        return params
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/x-www-form-urlencoded":
        form: dict[str, Any] = {}
        for key, value in _pairs(decode(body, "request body"), "request body"):
            _add(form, key, value)
        params.update(form)
    elif kind == "multipart/form-data":
        params.update(await _multipart(request))
    else:  # JSON, whatever the content type says (curl -d sends a form type by default)
        values = parse_json(body)
        if not isinstance(values, dict):
            raise RequestError(400, "the request body must be a JSON object such as "
                                    '{"q": "text", "source": "en", "target": "de"}')
        params.update(values)
    return params


async def _multipart(request: Request) -> dict[str, Any]:
    form: dict[str, Any] = {}
    try:
        async with request.form() as multipart:
            for key, value in multipart.multi_items():
                if not isinstance(value, str):
                    raise RequestError(400, f"form field {key!r} is a file; send text fields")
                _add(form, key, value)
    except MultiPartException as err:
        raise RequestError(400, f"malformed multipart form: {err.message}") from None
    except HTTPException as err:  # what Starlette makes of MultiPartException inside an app
        raise RequestError(400, f"malformed multipart form: {err.detail}") from None
    return form


def api_key(request: Request, params: dict[str, Any] | None = None) -> str | None:
    """The key sent as the api_key parameter or as `Authorization: Bearer KEY`."""
    if params and params.get("api_key"):
        return params["api_key"]
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return request.query_params.get("api_key")
