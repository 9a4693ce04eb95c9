"""The ASGI application: routes, errors as {"error": ...}, metrics around every request.

    GET  /                       the page (nmt/serving/page/index.html)
    POST /translate, /detect     LibreTranslate (nmt.serving.libretranslate)
    POST /suggest                LibreTranslate's answer with suggestions off (403)
    POST /translate_file         LibreTranslate's files (nmt.serving.files), fetched from
    GET  /download_file/NAME     the URL it answers
    GET  /languages, /frontend/settings
    GET  /spec                   an OpenAPI 3 description of these (nmt.serving.openapi)
    POST /translator/translate   OpenNMT-py (nmt.serving.opennmt)
    GET  /translator/models, /translator/health
    GET  /health                 200 once every model is loaded and its search compiled, else 503
    GET  /metrics                Prometheus' text format

Layers, outermost first: `RequestMetrics` (every answer counted and timed, refusals too, and
requests whose client left before its answer), CORS (Starlette's, which answers preflight
OPTIONS requests itself), `FaultGuard` (an unexpected exception answered
500 in one line, a request cut off by the server's stop 503), `BodyReader` (the body under its
limits), then Starlette's routing.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import logging
import re
import time
import traceback
from collections.abc import Sequence
from importlib import resources

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Match, Route

from nmt.serving import files, libretranslate, openapi, opennmt
from nmt.serving.errors import ClientGone, RequestError, send_error, shown
from nmt.serving.limits import BodyReader
from nmt.serving.service import Service

log = logging.getLogger("nmt.serving")
CORS_MAX_AGE = 20 * 24 * 3600  # seconds a browser may keep a preflight's answer


@functools.cache
def page() -> str:
    return resources.files("nmt.serving").joinpath("page/index.html").read_text("utf-8")


@functools.cache
def page_headers() -> dict[str, str]:
    """The page's security headers: it runs its own inline script and style (allowed by their
    SHA-256, so that nothing else inline runs), talks to this server only, and is shown in no
    other site's frame."""
    def hashes(tag: str) -> str:
        blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", page(), re.DOTALL)
        return " ".join("'sha256-" + base64.b64encode(hashlib.sha256(block.encode()).digest())
                        .decode() + "'" for block in blocks)

    policy = (f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; "
              "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "
              "frame-ancestors 'none'")
    return {"Content-Security-Policy": policy, "X-Frame-Options": "DENY",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


async def index(request: Request) -> HTMLResponse:
    return HTMLResponse(page(), headers=page_headers())


async def no_icon(request: Request) -> Response:
    """GET /favicon.ico, which a browser asks for with the page: nothing, rather than a 404
    counted as a client's error each time the page is opened."""
    return Response(status_code=204)


async def health(request: Request) -> JSONResponse:
    """GET /health and OpenNMT-py's GET /translator/health: {"status": "ok", ...} once ready
    (what OpenNMT-py's clients look for), else 503 with what it is doing."""
    service: Service = request.app.state.service
    body = {"status": "ok" if service.ready else service.status,
            "models": [m.pair for m in service.catalog.models],
            "engines": {m.pair: m.translator.describe() for m in service.catalog.models}}
    return JSONResponse(body, 200 if service.ready else 503)


async def metrics(request: Request) -> Response:
    service: Service = request.app.state.service
    return Response(service.metrics.exposition(), media_type=service.metrics.content_type)


async def spec(request: Request) -> JSONResponse:
    """GET /spec; under --url-prefix, its server is that path, which clients put before the
    paths it lists."""
    document = openapi.describe(request.app.state.service)
    if request.scope.get("root_path"):
        document["servers"] = [{"url": request.scope["root_path"]}]
    return JSONResponse(document)


ROUTES = [
    Route("/", index, methods=["GET"]),
    Route("/favicon.ico", no_icon, methods=["GET"]),
    Route("/translate", libretranslate.translate, methods=["POST"]),
    Route("/detect", libretranslate.detect, methods=["POST"]),
    Route("/translate_file", files.translate_file, methods=["POST"]),
    Route("/download_file/{name}", files.download_file, methods=["GET"]),
    Route("/suggest", libretranslate.suggest, methods=["POST"]),
    Route("/languages", libretranslate.languages, methods=["GET", "POST"]),
    Route("/frontend/settings", libretranslate.frontend_settings, methods=["GET"]),
    Route("/spec", spec, methods=["GET"]),
    Route("/translator/translate", opennmt.translate, methods=["POST"]),
    Route("/translator/models", opennmt.models, methods=["GET"]),
    Route("/translator/health", health, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
]


async def request_error(request: Request, err: Exception) -> JSONResponse:
    assert isinstance(err, RequestError)
    if err.status != 504:  # refused: it costs no rate limit (one that timed out was worked on)
        request.app.state.service.refund(request)
    body = {"error": err.message}
    if request.url.path.startswith("/translator/"):
        body["status"] = "error"  # OpenNMT-py's clients look for it
    return JSONResponse(body, err.status, headers=err.headers)


async def http_error(request: Request, err: Exception) -> JSONResponse:
    assert isinstance(err, HTTPException)
    path = request.url.path
    path = path if len(path) <= 100 and path.isprintable() else shown(path, 100)
    return JSONResponse({"error": f"{err.detail}: {request.method} {path}"},
                        err.status_code, headers=err.headers)


class FaultGuard:
    """ASGI middleware: an exception no route handled is answered 500 with `Connection: close`
    and logged in one line (its traceback at debug level), instead of reaching uvicorn, which
    logs a traceback and drops a keep-alive connection without saying so; a client that left
    (`ClientGone`) is sent nothing. A request still running when a stop's grace runs out is
    cancelled by uvicorn (which would answer a plain-text 500): it is answered 503."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def send_tracked(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except ClientGone:
            return
        except asyncio.CancelledError:
            log.warning("%s %s answered 503: the server stopped before its answer",
                        scope["method"], scope["path"])
            if not started:
                await send_error(send, 503, "the server stopped before this request was "
                                            "answered; send it again")
        except Exception as err:  # noqa: BLE001 - the last line of defence
            where = traceback.extract_tb(err.__traceback__)[-1]
            log.error("%s %s answered 500: %s: %s (%s, line %d)", scope["method"], scope["path"],
                      type(err).__name__, " ".join(str(err).split())[:200], where.filename,
                      where.lineno)
            log.debug("the traceback of that 500", exc_info=err)
            if not started:
                await send_error(send, 500, f"the server failed on this request "
                                            f"({type(err).__name__}); its log says where")


def endpoint_of(scope) -> str:
    """The path template of the route `scope` is for ("other" if none), matched here rather
    than read from the router's scope, since a body refused before routing has a route too."""
    for route in ROUTES:
        if route.matches(scope)[0] != Match.NONE:
            return route.path
    return "other"


def is_preflight(scope) -> bool:
    """A browser's CORS preflight: asks whether it may send a request, and is none itself."""
    headers = {name for name, _ in scope["headers"]}
    return (scope["method"] == "OPTIONS" and b"origin" in headers
            and b"access-control-request-method" in headers)


class RequestMetrics:
    """ASGI middleware: every answer's status and time, by the path template of the route
    that matched (`/download_file/{name}`; paths no route matches as "other"). CORS
    preflights are left out."""

    def __init__(self, app, service: Service):
        self.app = app
        self.service = service

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or is_preflight(scope):
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), None

        async def send_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            endpoint = endpoint_of(scope)
            if status is None:  # the client left before its answer
                self.service.metrics.observe_abort(endpoint)
            else:
                self.service.metrics.observe_request(endpoint, status,
                                                     time.perf_counter() - start)


class URLPrefix:
    """ASGI middleware for a server reached at a path behind a reverse proxy (--url-prefix
    /mt): a request is taken with the path or without it (a proxy that strips it) and routed
    without it, and the path is the ASGI root_path, which the URLs the server writes
    (translatedFileUrl) begin with."""

    def __init__(self, app, prefix: str):
        self.app = app
        self.prefix = prefix

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            path = scope["path"]
            if path == self.prefix or path.startswith(self.prefix + "/"):
                path = path[len(self.prefix):] or "/"
            scope = {**scope, "path": path, "root_path": self.prefix}
        await self.app(scope, receive, send)


class JSONCORSMiddleware(CORSMiddleware):
    """Starlette's CORS middleware, its refused preflights answered as JSON errors too."""

    def preflight_response(self, request_headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 400:
            return response
        headers = {name: value for name, value in response.headers.items()
                   if name not in ("content-length", "content-type")}
        return JSONResponse({"error": f"{response.body.decode()}: not allowed by this "
                                      "server's CORS settings (--cors-origins)"},
                            status_code=400, headers=headers)


def build_app(service: Service, lifespan=None, cors_origins: Sequence[str] = ("*",),
              url_prefix: str = "") -> Starlette:
    """The application; `cors_origins`: the web origins whose pages may read its answers
    ("*": any; none: no CORS headers, so browsers keep answers from other origins' pages);
    `url_prefix`: the path it is reached at behind a proxy ("/mt"; "": none)."""
    app = Starlette(routes=ROUTES, lifespan=lifespan,
                    exception_handlers={RequestError: request_error, HTTPException: http_error})
    app.state.service = service
    app.add_middleware(BodyReader, limits=service.limits)
    app.add_middleware(FaultGuard)
    if cors_origins:
        # Outside the body's limits and the fault guard, so that their refusals carry the
        # headers too and a page can read why it was refused.
        app.add_middleware(JSONCORSMiddleware, allow_origins=list(cors_origins),
                           allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"],
                           expose_headers=["Retry-After"], max_age=CORS_MAX_AGE)
    app.add_middleware(RequestMetrics, service=service)
    if url_prefix:
        app.add_middleware(URLPrefix, prefix=url_prefix)  # outermost: all else sees the route
    return app
