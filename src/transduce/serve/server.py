"""The HTTP app of ``transduce serve`` (FastAPI; its command line is command.py), one model or many.

    POST /translate, /detect, GET /languages, /frontend/settings   the LibreTranslate API (libre.py)
    GET  /spec        the OpenAPI document (LibreTranslate's path for it)
    POST /v1/translate, /v1/attention, GET /v1/models, /v1/health   transduce's own API (v1.py)
    GET  /            a page to translate in the browser (static/)
    GET  /metrics     Prometheus metrics (metrics.py)
    GET  /health      -> {"status": "ok"}   (as LibreTranslate; models and batching: GET /v1/health)
    GET  /openapi.json, /docs   the API description FastAPI derives from the request models

Concurrent requests for one model are batched by :class:`~transduce.serve.batcher.Batcher` (one
worker thread per loaded model). Models load on first use within ``--memory-budget-mb``.
Every answer carries CORS headers for ``--cors-origins`` (default ``*``, as LibreTranslate), and
preflight ``OPTIONS`` requests are answered, so browser extensions on other origins can call it.
uvicorn's graceful shutdown (SIGINT/SIGTERM) stops accepting connections, lets in-flight
requests finish, then the batchers drain their queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .keys import Access
from .registry import ModelPool, ModelSpec
from .service import Service, Settings, make_batcher_factory

if TYPE_CHECKING:
    from ..decode.translator import Translator
    from .suggestions import Store

try:
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.middleware.cors import CORSMiddleware
    from fastapi.responses import HTMLResponse, JSONResponse, Response

    from . import files as files_api
    from . import libre, v1
    from .files import FORMATS, FileStore, default_folder
    from .metrics import CONTENT_TYPE, Metrics
except ImportError as e:  # pragma: no cover - the serve extra is missing
    raise ImportError(
        "transduce serve needs fastapi, uvicorn and prometheus-client: pip install 'transduce[serve]'"
    ) from e

STATIC = Path(__file__).with_name("static")
__all__ = ["Settings", "create_app"]


class BodyLimit:
    """ASGI middleware: answer 413 once a request body passes ``max_bytes`` (declared or streamed).

    The body is read here, up to the limit, and handed on whole; FastAPI would turn an error
    raised while it reads the body into a generic 400.
    """

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        message = f"request body larger than the limit of {self.max_bytes} bytes"
        too_large = JSONResponse(status_code=413, content={"detail": message, "error": message})  # both APIs' keys
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await too_large(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # client went away
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await too_large(scope, receive, send)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # later calls wait for the disconnect, as usual

        await self.app(scope, replay, send)


def _field(loc) -> str:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) if parts else "body"


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    bad_json = [e for e in errors if e.get("type") == "json_invalid"]
    if bad_json:
        ctx = bad_json[0].get("ctx", {})
        where = _field(bad_json[0]["loc"])
        return JSONResponse(
            status_code=400,
            content={"detail": f"malformed JSON at character {where}: {ctx.get('error', bad_json[0].get('msg'))}"},
        )
    text = "; ".join(f"field '{_field(e['loc'])}': {e['msg']}" for e in errors)
    return JSONResponse(
        status_code=422,
        content={"detail": text, "errors": [{"field": _field(e["loc"]), "message": e["msg"]} for e in errors]},
    )


class Observe:
    """ASGI middleware: count each HTTP request and its latency in the metrics."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), [500]

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.observe(scope["path"], status[0], time.perf_counter() - start)


def single_spec(translator: Translator, name: str) -> ModelSpec:
    meta = getattr(translator, "meta", {}) or {}
    languages = tuple(sorted(getattr(translator, "target_languages", {}) or {}))  # a multilingual model's
    target = str(meta.get("tgt_lang", "")) or ("mul" if languages else "")
    return ModelSpec(name or "model", Path(name or "."), str(meta.get("src_lang", "")), target, None, languages)


def create_app(
    translator: Translator | None = None,
    settings: Settings | None = None,
    *,
    specs: Sequence[ModelSpec] = (),
    load: Callable[[ModelSpec], Translator] | None = None,
    name: str = "",
    budget_bytes: int = 0,
    access: Access | None = None,
    cors_origins: tuple[str, ...] = ("*",),
    suggestions: Store | None = None,
    files: FileStore | bool = True,
) -> FastAPI:
    """The ASGI app around one loaded ``translator`` (served as ``name``), or around ``specs``, each loaded on
    first use by ``load(spec)`` within ``budget_bytes`` of models (0: no limit); one or the other.

    ``access``: API keys and rate limits (default: none needed). ``cors_origins``: where browsers may call
    from (empty: no CORS headers). ``suggestions``: where POST /suggest keeps what users suggest (None: off).
    ``files``: where translated files go (True: a folder under the system's temporary folder; False: no file
    translation)."""
    settings = settings or Settings()
    pool, metrics = _pool(translator, specs, load, name, budget_bytes, settings)
    service = Service(pool, settings, access or Access([], require="never"), suggestions)
    if files is True:
        files = FileStore(default_folder())
    if files:
        service.file_formats = FORMATS

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await asyncio.to_thread(pool.stop)  # after uvicorn has finished in-flight requests

    app = FastAPI(
        title="transduce",
        version=_version(),
        lifespan=lifespan,
        description="Translation with a Transformer (Vaswani et al., 2017). " + v1.__doc__.split("\n\n")[0],
    )
    app.state.pool, app.state.service, app.state.settings, app.state.metrics = pool, service, settings, metrics
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body)
    app.add_middleware(Observe, metrics=metrics)
    if cors_origins:  # outermost: errors of the inner layers (413, 500) carry the headers too
        app.add_middleware(
            CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST"], allow_headers=["*"]
        )
    app.include_router(libre.router(service))
    app.include_router(v1.router(service))
    if files:
        app.include_router(files_api.router(service, files))
    _add_pages(app, metrics)
    return app


def _pool(
    translator: Translator | None,
    specs: Sequence[ModelSpec],
    load: Callable[[ModelSpec], Translator] | None,
    name: str,
    budget_bytes: int,
    settings: Settings,
) -> tuple[ModelPool, Metrics]:
    """The models :func:`create_app` serves, with batchers that report to the metrics."""
    if (translator is None) == (not specs):
        raise ValueError("create_app serves one translator or model specs (with load), not both or neither")
    if translator is None:
        if load is None:
            raise ValueError("serving model specs needs load(spec) -> Translator")
        pool = ModelPool(list(specs), load, None, budget_bytes)
    else:
        pool = ModelPool([single_spec(translator, name)], lambda spec: translator, None, 0)
    metrics = Metrics(pool)
    pool.make_batcher = make_batcher_factory(settings, metrics)
    if translator is not None:
        pool.add_loaded(next(iter(pool.specs.values())), translator)
    return pool, metrics


def _add_pages(app: FastAPI, metrics: Metrics) -> None:
    """The routes around the two APIs: health, the OpenAPI document, metrics, the page."""

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}  # exactly LibreTranslate's answer; the server's state is at /v1/health

    @app.get("/spec", include_in_schema=False)
    def spec() -> dict:
        return app.openapi()

    @app.get("/metrics", include_in_schema=False)
    def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/", include_in_schema=False)
    def page() -> HTMLResponse:
        return HTMLResponse((STATIC / "index.html").read_text(encoding="utf-8"))

    @app.get("/page.js", include_in_schema=False)
    def page_script() -> Response:
        return Response((STATIC / "page.js").read_text(encoding="utf-8"), media_type="text/javascript")


def _version() -> str:
    from .. import __version__

    return __version__
