"""LibreTranslate's API: POST /translate, /detect, /suggest, GET /languages and
/frontend/settings (POST /translate_file is `nmt.serving.files`).

    POST /translate  {"q": "Text." | ["Text.", ...], "source": "en" | "auto", "target": "de",
                      "format": "text" | "html", "alternatives": 0, "api_key": "..."}
    -> {"translatedText": "..." | ["...", ...]}   (the shape of q; "alternatives" if asked,
       "detectedLanguage" for source "auto")
    POST /detect  {"q": "Text."}  -> [{"language": "en", "confidence": 97.5}, ...]

Each text of q is split into sentences (`nmt.translation.paragraphs`), all sentences of the
request are searched together (with those of other requests, by the model's batcher), and
each text is joined back with its whitespace; html keeps every tag and attribute, and a
sentence's inline tags go back around the words they enclosed, by the model's alignment.
Alternatives come from the model's n-best search (`Service.translate`), distinct from the
translation and from each other, so there may be fewer than asked.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from nmt.serving.catalog import language_name
from nmt.serving.errors import RequestError, shown
from nmt.serving.params import api_key, request_params
from nmt.serving.service import Service, unless_client_leaves
from nmt.translation.document_files import FILE_SUFFIXES
from nmt.translation.paragraphs import (
    Document,
    alignments_by_document,
    markup_pairs,
    readable as readable_positions,
    split_html,
    split_text,
)

FORMATS = {"text": split_text, "html": split_html}
FRONTEND_TIMEOUT_MS = 500  # LibreTranslate's default --frontend-timeout


def _texts(params: dict[str, Any]) -> tuple[list[str], bool]:
    """(the texts of q, whether q was a list)."""
    q = params.get("q")
    if q is None or q == "" or q == []:
        raise RequestError(400, "Invalid request: missing q parameter")
    if isinstance(q, str):
        return [q], False
    if isinstance(q, list) and all(isinstance(text, str) for text in q):
        return q, True
    raise RequestError(400, "Invalid request: q must be a string or a list of strings")


def _text_param(params: dict[str, Any], name: str, default: str | None = None) -> str:
    value = params.get(name, default)
    if value is None or value == "":
        raise RequestError(400, f"Invalid request: missing {name} parameter")
    if not isinstance(value, str):
        raise RequestError(400, f"Invalid request: {name} must be a string, got {shown(value)}")
    return value


def _alternatives(params: dict[str, Any], limit: int) -> int:
    """How many alternatives: an integer, or a string of ASCII digits (a form field), with a
    minus sign or not; a negative count is 0, as LibreTranslate reads it."""
    given = params.get("alternatives", 0)
    count, text = given, given.strip() if isinstance(given, str) else ""
    sign, digits = (-1, text[1:]) if text.startswith("-") else (1, text)
    if digits.isascii() and digits.isdigit():
        # Past the limit (refused below) if too long to read.
        count = sign * (int(digits) if len(digits) <= 9 else limit + 1)
    elif isinstance(given, float) and given.is_integer():
        count = int(given)
    if not isinstance(count, int) or isinstance(count, bool):
        raise RequestError(400, f"Invalid request: alternatives must be an integer, got "
                                f"{shown(given)}")
    count = max(count, 0)
    if count > limit:
        raise RequestError(400, f"Invalid request: alternatives {shown(given)}: this server "
                                f"gives 0 to {limit} (--alternatives-limit)")
    return count


async def translate(request: Request) -> JSONResponse:
    service: Service = request.app.state.service
    params = await request_params(request, service.limits)
    service.check_key(api_key(request, params))
    texts, is_list = _texts(params)
    source = _text_param(params, "source")
    target = _text_param(params, "target")
    # Null or empty is text, as LibreTranslate reads it.
    form = _text_param(params, "format") if params.get("format") not in (None, "") else "text"
    if form not in FORMATS:
        raise RequestError(400, f"Invalid request: format {shown(form)}: use text or html")
    alternatives = _alternatives(params, service.alternatives_limit)
    # Every text counts as one sentence at least, an empty one too: 260,000 empty texts are
    # 260,000 documents to split and join.
    service.limits.check_characters(sum(map(len, texts)))
    service.limits.check_texts(len(texts))
    service.charge(request, len(texts), sum(map(len, texts)))
    # Languages are told by the words of a text, not by its tags.
    readable = texts if form == "text" else [" ".join(split_html(text, "en").sentences)
                                             for text in texts]
    chosen = service.text_models(source, target, readable)
    rows = [n for n, (model, _) in enumerate(chosen) if model is not None]
    models = [chosen[n][0] for n in rows]
    documents = [FORMATS[form](texts[n], model.source) for n, model in zip(rows, models)]
    service.limits.check_sentences(sum(max(1, len(d.sentences)) for d in documents)
                                   + len(texts) - len(rows))
    ranks = await unless_client_leaves(request, translate_by_model(
        service, models, documents, alternatives + 1 if alternatives else 0))
    # A text with no model comes back as it is, without alternatives.
    results = [[text] for text in texts]
    for row, n in enumerate(rows):
        results[n] = [rank[row] for rank in ranks]
    answer: dict[str, Any] = {
        "translatedText": [r[0] for r in results] if is_list else results[0][0]}
    detected = [language for _, language in chosen]
    if detected[0] is not None:
        answer["detectedLanguage"] = detected if is_list else detected[0]
    if alternatives:
        others = [_other_texts(r, alternatives) for r in results]
        answer["alternatives"] = others if is_list else others[0]
    return JSONResponse(answer)


def _other_texts(texts: list[str], count: int) -> list[str]:
    """Up to `count` texts after the first, each once and none the same as the first."""
    return [text for n, text in enumerate(texts[1:], 1)
            if text not in texts[:n]][:count]


async def translate_by_model(service: Service, models: list, documents: list[Document],
                             ranks: int = 0) -> list[list[str]]:
    """`translate_documents` for documents each with its own model: each model's documents
    translated together (the models at once), the texts of each rank in the documents'
    order."""
    groups: dict[int, list[int]] = {}
    for n, model in enumerate(models):
        groups.setdefault(model.id, []).append(n)
    answers = await asyncio.gather(*(
        translate_documents(service, models[rows[0]], [documents[n] for n in rows], ranks)
        for rows in groups.values()))
    texts = [[""] * len(documents) for _ in range(max(ranks, 1))]
    for rows, ranked in zip(groups.values(), answers):
        for rank, translated in enumerate(ranked):
            for n, text in zip(rows, translated):
                texts[rank][n] = text
    return texts


async def translate_documents(service: Service, model, documents: list[Document],
                              ranks: int = 0) -> list[list[str]]:
    """The documents translated: one list of texts per n-best rank (one rank unless `ranks`,
    which asks the model's n-best search for that many), inline markup placed by alignment."""
    sentences = [sentence for document in documents for sentence in document.sentences]
    return [await join_documents(service, model, documents, translations)
            for translations in await translate_sentences(service, model, sentences, ranks)]


async def translate_sentences(service: Service, model, sentences: list[str], ranks: int = 0
                              ) -> list[list[str]]:
    """The translation of each sentence, one list per n-best rank (as `translate_documents`);
    a sentence without a letter (a number, a bullet, an emoji) is its own translation in
    every rank, as a whole text without one is: a model would make words of it."""
    readable = readable_positions(sentences)
    hypotheses = await service.translate(model, [sentences[n] for n in readable],
                                         alternatives=ranks > 0) if readable else []
    ranked = []
    for rank in range(max(ranks, 1)):
        translations = list(sentences)
        for n, nbest in zip(readable, hypotheses):
            translations[n] = nbest[min(rank, len(nbest) - 1)].text
        ranked.append(translations)
    return ranked


async def join_documents(service: Service, model, documents: list[Document],
                         translations: list[str]) -> list[str]:
    """The documents with `translations` (one per sentence of them all, in order) in place of
    their sentences, inline markup placed by the model's word alignment, the space between
    sentences as the model's target language writes it."""
    sources, targets = markup_pairs(documents, translations)
    found = await service.align(model, sources, targets)
    aligned = alignments_by_document(documents, translations, found)
    texts, offset = [], 0
    for document, alignments in zip(documents, aligned):
        count = len(document.sentences)
        texts.append(document.join(translations[offset:offset + count], alignments,
                                   model.target))
        offset += count
    return texts


async def detect(request: Request) -> JSONResponse:
    """LibreTranslate's POST /detect: [{"language": code, "confidence": 0-100}, ...], best
    first, among the languages served (sources and targets); one entry at least. A list of
    texts gets one answer for all of them, as LibreTranslate gives, read as source "auto"
    reads a list."""
    service: Service = request.app.state.service
    params = await request_params(request, service.limits)
    service.check_key(api_key(request, params))
    texts, _ = _texts(params)
    characters = sum(map(len, texts))
    service.limits.check_characters(characters)
    service.charge(request, len(texts), characters)
    # Never empty, as LibreTranslate's (its clients read the first entry): a text that tells
    # nothing (no letters) gets the first language served, with confidence 0.
    found = (service.detect(" ".join(texts))
             or [(language, 0.0) for language in service.languages()[:1]])
    return JSONResponse([{"language": code, "confidence": round(confidence * 100, 1)}
                         for code, confidence in found])


async def suggest(request: Request) -> JSONResponse:
    """LibreTranslate's POST /suggest, answered as a server with suggestions off answers."""
    raise RequestError(403, "Suggestions are disabled on this server.")


async def languages(request: Request) -> JSONResponse:
    return JSONResponse(request.app.state.service.catalog.languages())


async def frontend_settings(request: Request) -> JSONResponse:
    """What the page (and LibreTranslate's own front end) needs to know of the server."""
    service: Service = request.app.state.service
    first = service.catalog.models[0]
    return JSONResponse({"apiKeys": service.api_keys is not None,
                         "keyRequired": service.api_keys is not None,
                         "charLimit": service.limits.max_characters,
                         # LibreTranslate's page waits this long (ms) after a keystroke
                         # before it translates.
                         "frontendTimeout": FRONTEND_TIMEOUT_MS,
                         "suggestions": False,
                         "filesTranslation": True,
                         "supportedFilesFormat": list(FILE_SUFFIXES),
                         "language": {"source": {"code": first.source,
                                                 "name": language_name(first.source)},
                                      "target": {"code": first.target,
                                                 "name": language_name(first.target)}},
                         "pairs": [{"source": m.source, "target": m.target}
                                   for m in service.catalog.models]})
