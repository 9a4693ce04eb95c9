"""GET /spec: an OpenAPI 3.0 description of the server's API, for clients generated from one
(LibreTranslate serves its own at the same path). Built from the served models and limits,
so that the language codes and bounds it states are this server's. Every route the
application takes is here, each with the statuses it can answer."""

from __future__ import annotations

from typing import Any

from nmt.serving.service import Service
from nmt.translation.document_files import MEDIA_TYPES

_ERROR = {"type": "object", "properties": {"error": {"type": "string"}}}
_STATUSES = {
    "400": "Invalid request", "403": "API key missing or not valid",
    "404": "No such file: it was never made, or its time ran out",
    "408": "The body did not arrive in time (--body-timeout)", "413": "Over a limit",
    "415": "Body of a type not read", "429": "Over a client's rate limit (Retry-After)",
    "500": "The server failed on this request; its log says where",
    "503": "Starting, busy or stopping (Retry-After)", "504": "Timed out",
}
# What any request with a body may be answered: its body is read under the server's limits.
_READ = ("408", "413", "500")
# And one that is translated: refused, rate-limited, or waiting for a search.
_TRANSLATED = (*_READ, "400", "403", "415", "429", "503", "504")
_STRING = {"type": "string"}
_STRINGS = {"type": "array", "items": _STRING}
_INTEGER = {"type": "integer"}
_BOOLEAN = {"type": "boolean"}


def _answers(content: dict[str, dict] | None, *statuses: str) -> dict[str, Any]:
    """200 with `content` ({media type: schema}; None: no 200), then each of `statuses`
    with the error object every refusal carries."""
    out: dict[str, Any] = {}
    if content is not None:
        out["200"] = {"description": "Success", "content": _media(content)}
    for status in sorted(set(statuses)):
        out[status] = {"description": _STATUSES[status], "content": _media(_json(_ERROR))}
    return out


def _media(content: dict[str, dict]) -> dict[str, dict]:
    """OpenAPI's content of {media type: schema}."""
    return {media: {"schema": schema} for media, schema in content.items()}


def _json(schema: dict) -> dict[str, dict]:
    return {"application/json": schema}


def _object(**properties: dict) -> dict:
    return {"type": "object", "properties": properties}


def _fields(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """LibreTranslate's parameters, as a JSON object or a form in the body, or in the query
    string (a request without a body; the body's fields win over the query's). A list of
    texts in a query or a form repeats q."""
    body = {"type": "object", "properties": properties, "required": required}
    kinds = ["application/json", "application/x-www-form-urlencoded", "multipart/form-data"]
    query = [{"name": name, "in": "query", "style": "form", "explode": True,
              **({"schema": _STRINGS, "description": "text(s): q=A&q=B for a list"}
                 if name == "q" else {"schema": field})}
             for name, field in properties.items()]
    return {"parameters": query, "requestBody": {
        "required": False, "content": _media(dict.fromkeys(kinds, body))}}


def _libretranslate(service: Service) -> dict[str, Any]:
    # A language served as a source or as a target is a source and a target: to itself,
    # its texts come back as they are.
    languages = service.languages()
    code = {"type": "string", "enum": [*languages, "auto"]}
    target = {"type": "string", "enum": languages}
    key = {"type": "string", "description": "API key, where the server needs one (or "
                                            "Authorization: Bearer KEY)"}
    text_or_list = {"oneOf": [_STRING, _STRINGS]}
    texts = {**text_or_list, "description": f"text(s), at most "
                                            f"{service.limits.max_characters} characters in all"}
    detected = _object(language=_STRING, confidence={"type": "number"})
    language = {"type": "array", "items": _object(code=_STRING, name=_STRING,
                                                  targets=_STRINGS)}
    pair = _object(source=_STRING, target=_STRING)
    named = _object(code=_STRING, name=_STRING)
    return {
        "/translate": {"post": {
            "summary": "Translate text or HTML",
            **_fields({"q": texts, "source": code, "target": target,
                       "format": {"type": "string", "enum": ["text", "html"], "default": "text"},
                       "alternatives": {"type": "integer", "minimum": 0,
                                        "maximum": service.alternatives_limit, "default": 0},
                       "api_key": key}, ["q", "source", "target"]),
            "responses": _answers(_json(_object(
                translatedText=text_or_list,
                # The shape of q: one of each for a text, a list of them for a list (anyOf,
                # since an empty list of alternatives is both).
                alternatives={"anyOf": [_STRINGS, {"type": "array", "items": _STRINGS}]},
                detectedLanguage={"oneOf": [detected, {"type": "array", "items": detected}]},
            )), *_TRANSLATED)}},
        "/detect": {"post": {
            "summary": "Identify the language of a text (a list: of its texts together), "
                       "among the languages served",
            **_fields({"q": texts, "api_key": key}, ["q"]),
            "responses": _answers(_json({"type": "array", "items": detected}),
                                  *_READ, "400", "403", "415", "429")}},
        "/translate_file": {"post": {
            "summary": "Translate a file; the answer gives the URL of the translation",
            "requestBody": {"required": True, "content": _media({"multipart/form-data": {
                "type": "object", "required": ["file", "source", "target"],
                "properties": {"file": {"type": "string", "format": "binary"},
                               "source": code, "target": target, "api_key": key}}})},
            "responses": _answers(_json(_object(translatedFileUrl=_STRING)), *_TRANSLATED)}},
        "/download_file/{name}": {"get": {
            "summary": "A translated file, for a while after its translation",
            "parameters": [{"name": "name", "in": "path", "required": True, "schema": _STRING}],
            "responses": _answers({media: {"type": "string", "format": "binary"}
                                   for media in dict.fromkeys(MEDIA_TYPES.values())},
                                  "404", "500")}},
        "/languages": {method: {
            "summary": "The languages served and the targets of each",
            "responses": _answers(_json(language), *(_READ if method == "post" else ["500"]))}
            for method in ("get", "post")},
        "/frontend/settings": {"get": {
            "summary": "What a page needs to know of the server",
            "responses": _answers(_json(_object(
                apiKeys=_BOOLEAN, keyRequired=_BOOLEAN, charLimit=_INTEGER,
                frontendTimeout=_INTEGER, suggestions=_BOOLEAN, filesTranslation=_BOOLEAN,
                supportedFilesFormat=_STRINGS, language=_object(source=named, target=named),
                pairs={"type": "array", "items": pair})), "500")}},
        "/suggest": {"post": {"summary": "Suggestions are off on this server (403)",
                              "responses": _answers(None, *_READ, "403")}},
    }


def _opennmt() -> dict[str, Any]:
    key = {"name": "api_key", "in": "query", "schema": _STRING,
           "description": "API key, where the server needs one: as ?api_key=KEY or "
                          "Authorization: Bearer KEY (the body is a list, with no place "
                          "for it)"}
    hypothesis = {**_object(src=_STRING, tgt=_STRING, n_best=_INTEGER,
                            pred_score={"type": "number"}),
                  "required": ["src", "tgt", "n_best", "pred_score"]}
    return {
        "/translator/translate": {"post": {
            "summary": "OpenNMT-py's REST API: one list per n-best rank, in input order",
            "parameters": [key],
            "requestBody": {"required": True, "content": _media(_json({
                "type": "array", "items": {**_object(src=_STRING, id=_INTEGER),
                                           "required": ["src"]}}))},
            "responses": _answers(_json({"type": "array", "items": {
                "type": "array", "items": hypothesis}}), *_TRANSLATED)}},
        "/translator/models": {"get": {
            "summary": "OpenNMT-py's list of the models served",
            "responses": _answers(_json({"type": "array", "items": _object(
                model_id=_INTEGER, source=_STRING, target=_STRING, path=_STRING,
                models=_STRINGS, opt={"type": "object"}, loaded=_BOOLEAN,
                timeout=_INTEGER)}), "500")}},
    }


def _server() -> dict[str, Any]:
    health = {"summary": "200 once every model is ready, else 503 saying what it is doing",
              "responses": {status: {"description": text, "content": _media(_json(_object(
                  status=_STRING, models=_STRINGS,
                  engines={"type": "object", "additionalProperties": _STRING})))}
                  for status, text in (("200", "Ready"), ("503", "Loading or compiling"))}}
    health["responses"].update(_answers(None, "500"))
    return {
        "/translator/health": {"get": health},
        "/health": {"get": health},
        "/metrics": {"get": {"summary": "Prometheus' text format",
                             "responses": _answers({"text/plain": _STRING}, "500")}},
        "/spec": {"get": {"summary": "This description",
                          "responses": _answers(_json({"type": "object"}), "500")}},
        "/": {"get": {"summary": "A page to translate with",
                      "responses": _answers({"text/html": _STRING}, "500")}},
        "/favicon.ico": {"get": {"summary": "No icon",
                                 "responses": {"204": {"description": "No content"}}}},
    }


def describe(service: Service) -> dict[str, Any]:
    """The OpenAPI document of `service`."""
    return {"openapi": "3.0.3",
            "info": {"title": "flax-nmt translation server", "version": "1"},
            "paths": {**_libretranslate(service), **_opennmt(), **_server()}}
