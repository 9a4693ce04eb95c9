"""The ASGI application: routes, errors as {"error": ...}, metrics around every request.

    GET  /                       the page (nmt/serving/page/index.html)
    POST /translate              LibreTranslate (nmt.serving.libretranslate)
    GET  /languages, /frontend/settings
    POST /translator/translate   OpenNMT-py (nmt.serving.opennmt)
    GET  /translator/models, /translator/health
    GET  /health                 200 once every model is loaded and its search compiled, else 503
    GET  /metrics                Prometheus' text format

Layers, outermost first: `RequestMetrics` (every answer counted and timed, refusals too),
`BodyReader` (the body under its limits), then Starlette's routing.
"""

from __future__ import annotations

import time
from importlib import resources

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from nmt.serving import libretranslate, opennmt
from nmt.serving.errors import RequestError
from nmt.serving.limits import BodyReader
from nmt.serving.service import Service

ROUTES = [
    Route("/", lambda request: HTMLResponse(page()), methods=["GET"]),
    Route("/translate", libretranslate.translate, methods=["POST"]),
    Route("/languages", libretranslate.languages, methods=["GET", "POST"]),
    Route("/frontend/settings", libretranslate.frontend_settings, methods=["GET"]),
    Route("/translator/translate", opennmt.translate, methods=["POST"]),
    Route("/translator/models", opennmt.models, methods=["GET"]),
    Route("/translator/health", opennmt.health, methods=["GET"]),
]
PATHS = frozenset(route.path for route in ROUTES) | {"/health", "/metrics"}


def page() -> str:
    return resources.files("nmt.serving").joinpath("page/index.html").read_text("utf-8")


async def health(request: Request) -> JSONResponse:
    service: Service = request.app.state.service
    body = {"status": "ok" if service.ready else service.status,
            "models": [m.pair for m in service.catalog.models]}
    return JSONResponse(body, 200 if service.ready else 503)


async def metrics(request: Request) -> Response:
    service: Service = request.app.state.service
    return Response(service.metrics.exposition(), media_type=service.metrics.content_type)


async def request_error(request: Request, err: Exception) -> JSONResponse:
    assert isinstance(err, RequestError)
    body = {"error": err.message}
    if request.url.path.startswith("/translator/"):
        body["status"] = "error"  # OpenNMT-py's clients look for it
    return JSONResponse(body, err.status, headers=err.headers)


async def http_error(request: Request, err: Exception) -> JSONResponse:
    assert isinstance(err, HTTPException)
    return JSONResponse({"error": f"{err.detail}: {request.method} {request.url.path}"},
                        err.status_code, headers=err.headers)


async def unexpected_error(request: Request, err: Exception) -> JSONResponse:
    return JSONResponse({"error": f"translation failed: {type(err).__name__}: {err}"}, 500)


class RequestMetrics:
    """ASGI middleware: every answer's status and time, by route (other paths as "other")."""

    def __init__(self, app, service: Service):
        self.app = app
        self.service = service

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), 500

        async def send_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            endpoint = scope["path"] if scope["path"] in PATHS else "other"
            self.service.metrics.observe_request(endpoint, status, time.perf_counter() - start)


def build_app(service: Service, lifespan=None) -> Starlette:
    routes = ROUTES + [Route("/health", health, methods=["GET"]),
                       Route("/metrics", metrics, methods=["GET"])]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={RequestError: request_error, HTTPException: http_error,
                                        Exception: unexpected_error})
    app.state.service = service
    app.add_middleware(BodyReader, limits=service.limits)
    app.add_middleware(RequestMetrics, service=service)
    return app
