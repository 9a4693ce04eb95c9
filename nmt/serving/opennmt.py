"""OpenNMT-py's REST API, under /translator: POST /translate, GET /models (and GET /health,
the server's own `app.health`).

    POST /translator/translate  [{"src": "A sentence.", "id": 0}, ...]
    -> [[{"src": ..., "tgt": ..., "n_best": N, "pred_score": ...}, ...], ...]

The outer list has one list per n-best rank, each in input order, as OpenNMT-py answers.
Each src is translated as one segment (OpenNMT-py does not split sentences), without the
whitespace at its edges, which goes back around its tgt as OpenNMT-py puts it; `id` picks the
model (its position among the server's --model flags, from 0); left out, it is 0, as
OpenNMT-py reads it.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse

from nmt.serving.errors import RequestError
from nmt.serving.limits import ServerLimits
from nmt.serving.params import api_key, json_body
from nmt.serving.service import Service, unless_client_leaves


def _items(request: Request, body: bytes, limits: ServerLimits) -> list[dict]:
    items = json_body(request, body)
    if not isinstance(items, list) or not items:
        raise RequestError(400, 'the request body must be a non-empty JSON list such as '
                                '[{"src": "A sentence.", "id": 0}]')
    limits.check_sentences(len(items))
    for n, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("src"), str):
            raise RequestError(400, f"item {n} of the request has no src string: each item is "
                                    '{"src": "text", "id": MODEL_ID}')
    return items


def _edges(src: str) -> tuple[str, str]:
    """The whitespace before and after the words of `src` (all of it before, if it has none)."""
    before = src[:len(src) - len(src.lstrip())]
    return before, src[len(src.rstrip()):] if before != src else ""


async def translate(request: Request) -> JSONResponse:
    service: Service = request.app.state.service
    service.check_key(api_key(request))
    items = _items(request, await request.body(), service.limits)
    characters = sum(len(item["src"]) for item in items)
    service.limits.check_characters(characters)
    service.charge(request, len(items), characters)
    models = [service.catalog.by_id(item.get("id")) for item in items]
    groups: dict[int, list[int]] = {}
    for n, model in enumerate(models):
        groups.setdefault(model.id, []).append(n)
    # The whitespace around a src goes around its translation, as OpenNMT-py keeps it.
    edges = [_edges(item["src"]) for item in items]
    answers = await unless_client_leaves(request, asyncio.gather(*(
        service.translate(models[rows[0]], [items[n]["src"].strip() for n in rows])
        for rows in groups.values())))
    hypotheses: list = [None] * len(items)
    for rows, nbest_lists in zip(groups.values(), answers):
        for n, nbest in zip(rows, nbest_lists):
            hypotheses[n] = nbest
    ranks = max(len(nbest) for nbest in hypotheses)
    return JSONResponse([
        [{"src": item["src"], "tgt": before + nbest[rank].text + after, "n_best": len(nbest),
          "pred_score": nbest[rank].score}
         for item, nbest, (before, after) in zip(items, hypotheses, edges)
         if rank < len(nbest)]
        for rank in range(ranks)])


async def models(request: Request) -> JSONResponse:
    """OpenNMT-py's GET /translator/models: its fields (model_id, models, opt: the model's
    search settings, loaded, timeout: -1, never unloaded) and the pair and path of each."""
    service: Service = request.app.state.service
    return JSONResponse([{"model_id": m.id, "source": m.source, "target": m.target,
                          "path": m.path, "models": [m.path],
                          "opt": m.translator.search.to_dict(), "loaded": service.ready,
                          "timeout": -1}
                         for m in service.catalog.models])

