"""LibreTranslate's API: POST /translate, GET /languages, GET /frontend/settings.

    POST /translate  {"q": "Text." | ["Text.", ...], "source": "en", "target": "de",
                      "format": "text" | "html", "alternatives": 0, "api_key": "..."}
    -> {"translatedText": "..." | ["...", ...]}   (the shape of q; "alternatives" if asked)

Each text of q is split into sentences (`nmt.translation.paragraphs`), all sentences of the
request are searched together (with those of other requests, by the model's batcher), and
each text is joined back with its whitespace; html keeps every tag and attribute.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from nmt.serving.errors import RequestError, shown
from nmt.serving.params import api_key, request_params
from nmt.serving.service import Service, unless_client_leaves
from nmt.translation.paragraphs import split_html, split_text

FORMATS = {"text": split_text, "html": split_html}


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


def _alternatives(params: dict[str, Any], nbest: int) -> int:
    """How many alternatives: an integer, or a string of ASCII digits (a form field)."""
    given = params.get("alternatives", 0)
    count, digits = given, given.strip() if isinstance(given, str) else ""
    if digits.isascii() and digits.isdigit():
        count = int(digits) if len(digits) <= 9 else nbest  # past every nbest: refused below
    elif isinstance(given, float) and given.is_integer():
        count = int(given)
    if not isinstance(count, int) or isinstance(count, bool):
        raise RequestError(400, f"Invalid request: alternatives must be an integer, got "
                                f"{shown(given)}")
    if not 0 <= count < nbest:
        raise RequestError(400, f"Invalid request: alternatives {shown(given)}: this model's "
                                f"search keeps {nbest} hypotheses, so 0 to {nbest - 1} "
                                "alternatives")
    return count


async def translate(request: Request) -> JSONResponse:
    service: Service = request.app.state.service
    params = await request_params(request, service.limits)
    service.check_key(api_key(request, params))
    texts, is_list = _texts(params)
    source = _text_param(params, "source")
    target = _text_param(params, "target")
    form = _text_param(params, "format", "text")
    if form not in FORMATS:
        raise RequestError(400, f"Invalid request: format {shown(form)}: use text or html")
    model = service.catalog.find(source, target)
    alternatives = _alternatives(params, model.translator.search.nbest)
    # Every text counts as one sentence at least, an empty one too: 260,000 empty texts are
    # 260,000 documents to split and join.
    service.limits.check_characters(sum(map(len, texts)))
    service.limits.check_texts(len(texts))
    documents = [FORMATS[form](text, model.source) for text in texts]
    sentences = [sentence for document in documents for sentence in document.sentences]
    service.limits.check_sentences(sum(max(1, len(d.sentences)) for d in documents))
    hypotheses = await unless_client_leaves(request, service.translate(model, sentences))
    results, offset = [], 0
    for document in documents:
        nbest = hypotheses[offset:offset + len(document.sentences)]
        offset += len(document.sentences)
        results.append([document.join([h[rank].text for h in nbest])
                        for rank in range(alternatives + 1)])
    answer: dict[str, Any] = {
        "translatedText": [r[0] for r in results] if is_list else results[0][0]}
    if alternatives:
        answer["alternatives"] = [r[1:] for r in results] if is_list else results[0][1:]
    return JSONResponse(answer)


async def languages(request: Request) -> JSONResponse:
    return JSONResponse(request.app.state.service.catalog.languages())


async def frontend_settings(request: Request) -> JSONResponse:
    """What the page (and LibreTranslate's own front end) needs to know of the server."""
    service: Service = request.app.state.service
    return JSONResponse({"apiKeys": service.api_keys is not None,
                         "keyRequired": service.api_keys is not None,
                         "charLimit": service.limits.max_characters,
                         "pairs": [{"source": m.source, "target": m.target}
                                   for m in service.catalog.models]})
