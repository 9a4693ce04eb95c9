"""GET /spec: an OpenAPI 3.0 description of the server's API, for clients generated from one
(LibreTranslate serves its own at the same path). Built from the served models and limits,
so that the language codes and bounds it states are this server's."""

from __future__ import annotations

from typing import Any

from nmt.serving.service import Service

_ERROR = {"type": "object", "properties": {"error": {"type": "string"}}}
_REFUSALS = {
    "400": "Invalid request", "403": "API key missing or not valid", "413": "Over a limit",
    "415": "Body of a type not read", "429": "Over a client's rate limit (Retry-After)",
    "503": "Starting or busy (Retry-After)", "504": "Timed out",
}


def _answers(schema: dict, media: str = "application/json") -> dict[str, Any]:
    out: dict[str, Any] = {"200": {"description": "Success",
                                   "content": {media: {"schema": schema}}}}
    for status, text in _REFUSALS.items():
        out[status] = {"description": text,
                       "content": {"application/json": {"schema": _ERROR}}}
    return out


def _body(properties: dict[str, Any], required: list[str], form: str = "") -> dict[str, Any]:
    schema = {"type": "object", "properties": properties, "required": required}
    kinds = [form] if form else ["application/json", "application/x-www-form-urlencoded",
                                 "multipart/form-data"]
    return {"required": True, "content": {kind: {"schema": schema} for kind in kinds}}


def describe(service: Service) -> dict[str, Any]:
    """The OpenAPI document of `service`."""
    # A language served as a source or as a target is a source and a target: to itself,
    # its texts come back as they are.
    languages = service.languages()
    code = {"type": "string", "enum": [*languages, "auto"]}
    target = {"type": "string", "enum": languages}
    key = {"type": "string", "description": "API key (or Authorization: Bearer KEY)"}
    strings = {"type": "array", "items": {"type": "string"}}
    text_or_list = {"oneOf": [{"type": "string"}, strings]}
    detected = {"type": "object", "properties": {"language": {"type": "string"},
                                                 "confidence": {"type": "number"}}}
    paths = {
        "/translate": {"post": {
            "summary": "Translate text or HTML",
            "requestBody": _body({
                "q": {**text_or_list, "description": f"text(s), at most "
                                                    f"{service.limits.max_characters} "
                                                    "characters in all"},
                "source": code, "target": target,
                "format": {"type": "string", "enum": ["text", "html"], "default": "text"},
                "alternatives": {"type": "integer", "minimum": 0,
                                 "maximum": service.alternatives_limit, "default": 0},
                "api_key": key}, ["q", "source", "target"]),
            "responses": _answers({"type": "object", "properties": {
                "translatedText": text_or_list,
                # The shape of q: one of each for a text, a list of them for a list (anyOf,
                # since an empty list of alternatives is both).
                "alternatives": {"anyOf": [strings, {"type": "array", "items": strings}]},
                "detectedLanguage": {"oneOf": [detected,
                                               {"type": "array", "items": detected}]}}})}},
        "/detect": {"post": {
            "summary": "Identify the language of a text, among the sources served",
            "requestBody": _body({"q": {"type": "string"}, "api_key": key}, ["q"]),
            "responses": _answers({"type": "array", "items": detected})}},
        "/translate_file": {"post": {
            "summary": "Translate a file; the answer gives the URL of the translation",
            "requestBody": _body({"file": {"type": "string", "format": "binary"},
                                  "source": code, "target": target, "api_key": key},
                                 ["file", "source", "target"], "multipart/form-data"),
            "responses": _answers({"type": "object", "properties": {
                "translatedFileUrl": {"type": "string"}}})}},
        "/download_file/{name}": {"get": {
            "summary": "A translated file, for a while after its translation",
            "parameters": [{"name": "name", "in": "path", "required": True,
                            "schema": {"type": "string"}}],
            "responses": _answers({"type": "string", "format": "binary"},
                                  "application/octet-stream")}},
        "/languages": {"get": {
            "summary": "The languages served and the targets of each",
            "responses": _answers({"type": "array", "items": {"type": "object", "properties": {
                "code": {"type": "string"}, "name": {"type": "string"},
                "targets": {"type": "array", "items": {"type": "string"}}}}})}},
        "/suggest": {"post": {"summary": "Suggestions are off on this server (403)",
                              "responses": _answers({"type": "object"})}},
        "/translator/translate": {"post": {
            "summary": "OpenNMT-py's REST API: [{\"src\": ..., \"id\": ...}]",
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "array", "items": {"type": "object", "properties": {
                    "src": {"type": "string"}, "id": {"type": "integer"}}}}}}},
            "responses": _answers({"type": "array"})}},
        "/health": {"get": {"summary": "200 once every model is ready, else 503",
                            "responses": _answers({"type": "object"})}},
    }
    return {"openapi": "3.0.3",
            "info": {"title": "flax-nmt translation server", "version": "1"},
            "paths": paths}
