"""``transduce serve``: translation over HTTP (FastAPI + uvicorn), one model or many.

    transduce serve --model DIR                   one model directory
    transduce serve --models models.toml          several, routed by language pair (see registry.py)
    transduce serve --models DIR_OF_MODELS        every model directory in DIR_OF_MODELS

    POST /translate, GET /languages   the LibreTranslate API (libre.py)
    POST /v1/translate, /v1/attention, GET /v1/models   transduce's own API (v1.py)
    GET  /            a page to translate in the browser (static/)
    GET  /metrics     Prometheus metrics (metrics.py)
    GET  /health      -> {"status": "ok", ...}
    GET  /openapi.json, /docs   the API description FastAPI derives from the request models

Concurrent requests for one model are batched by :class:`~transduce.serve.batcher.Batcher` (one
worker thread per loaded model). Models load on first use within ``--memory-budget-mb``.
uvicorn's graceful shutdown (SIGINT/SIGTERM) stops accepting connections, lets in-flight
requests finish, then the batchers drain their queues.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from pathlib import Path

from ..backends.options import add_backend_arguments, backend_from_args
from .keys import Access, read_keys
from .registry import ModelPool, ModelSpec, read_models
from .service import Service, Settings, make_batcher_factory

try:
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse, Response
    from pydantic import BaseModel

    from . import libre, v1
    from .metrics import CONTENT_TYPE, Metrics
except ImportError as e:  # pragma: no cover - the serve extra is missing
    raise ImportError(
        "transduce serve needs fastapi, uvicorn and prometheus-client: pip install 'transduce[serve]'"
    ) from e

STATIC = Path(__file__).with_name("static")
__all__ = ["Settings", "create_app", "add_arguments", "run"]


class Health(BaseModel):
    status: str
    model: str
    src_lang: str
    tgt_lang: str
    models: int
    loaded: int
    pending: int
    requests: int
    batches: int
    max_requests_in_batch: int


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


def single_spec(translator, name: str) -> ModelSpec:
    meta = getattr(translator, "meta", {}) or {}
    languages = tuple(sorted(getattr(translator, "target_languages", {}) or {}))  # a multilingual model's
    target = str(meta.get("tgt_lang", "")) or ("mul" if languages else "")
    return ModelSpec(name or "model", Path(name or "."), str(meta.get("src_lang", "")), target, None, languages)


def create_app(
    models,
    settings: Settings | None = None,
    name: str = "",
    access: Access | None = None,
    load=None,
    budget_bytes: int = 0,
) -> FastAPI:
    """The ASGI app around one loaded :class:`~transduce.decode.translator.Translator` (``models``), or
    around a list of :class:`~transduce.serve.registry.ModelSpec` loaded on first use by ``load(spec)``
    within ``budget_bytes`` (0: no limit)."""
    settings = settings or Settings()
    access = access or Access([], require="never")
    if isinstance(models, list):
        if load is None:
            raise ValueError("serving model specs needs load(spec) -> Translator")
        pool = ModelPool(models, load, None, budget_bytes)
    else:
        pool = ModelPool([single_spec(models, name)], lambda spec: models, None, 0)
    metrics = Metrics(pool)
    pool.make_batcher = make_batcher_factory(settings, metrics)
    if not isinstance(models, list):
        pool.add_loaded(next(iter(pool.specs.values())), models)
    service = Service(pool, settings, access)

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
    app.include_router(libre.router(service))
    app.include_router(v1.router(service))

    @app.get("/health", response_model=Health)
    def health() -> Health:
        loaded = list(pool.loaded.values())
        first = next(iter(pool.specs.values()))
        stats = [e.batcher.stats for e in loaded]
        return Health(
            status="ok",
            model=first.name if len(pool.specs) == 1 else "",
            models=len(pool.specs),
            src_lang=first.source if len(pool.specs) == 1 else "",
            tgt_lang=first.target if len(pool.specs) == 1 else "",
            loaded=len(loaded),
            pending=pool.pending,
            requests=sum(s.requests for s in stats),
            batches=sum(s.batches for s in stats),
            max_requests_in_batch=max((s.max_requests_in_batch for s in stats), default=0),
        )

    @app.get("/metrics", include_in_schema=False)
    def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/", include_in_schema=False)
    def page() -> HTMLResponse:
        return HTMLResponse((STATIC / "index.html").read_text(encoding="utf-8"))

    @app.get("/page.js", include_in_schema=False)
    def page_script() -> Response:
        return Response((STATIC / "page.js").read_text(encoding="utf-8"), media_type="text/javascript")

    return app


def _version() -> str:
    from .. import __version__

    return __version__


# ---------------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = Settings()
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", type=Path, help="one model directory")
    which.add_argument(
        "--models",
        type=Path,
        help="a models TOML ([[model]] path/source/target) or a directory "
        "of model directories whose [meta] names src_lang/tgt_lang",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: localhost only)")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--device", default="cpu")
    add_backend_arguments(parser)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument(
        "--memory-budget-mb",
        type=float,
        default=0,
        help="with --models: MiB of loaded models; the least recently used idle ones are unloaded "
        "to load another (default 0: no limit)",
    )
    parser.add_argument(
        "--api-keys", type=Path, default=None, help="file of API keys, one per line: KEY [REQUESTS_PER_MINUTE]"
    )
    parser.add_argument(
        "--require-api-key",
        choices=("remote", "always"),
        default="remote",
        help="with --api-keys: who must send a key (default: clients not on this machine)",
    )
    parser.add_argument(
        "--key-limit",
        type=int,
        default=0,
        help="requests per minute for keys without their own number (default 0: no limit)",
    )
    parser.add_argument(
        "--req-limit",
        type=int,
        default=0,
        help="requests per minute per client address without a key (default 0: no limit)",
    )
    parser.add_argument("--beam", type=int, default=d.beam, help="beam of the LibreTranslate API and the page")
    parser.add_argument("--max-sentences", type=int, default=d.max_sentences, help="sentences per request")
    parser.add_argument("--max-chars", type=int, default=d.max_chars, help="characters per sentence")
    parser.add_argument("--max-body", type=int, default=d.max_body, help="request body bytes")
    parser.add_argument("--max-beam", type=int, default=d.max_beam)
    parser.add_argument("--timeout", type=float, default=d.timeout, help="seconds per request")
    parser.add_argument("--wait-ms", type=float, default=d.wait_ms, help="batching window when idle")
    parser.add_argument("--batch-tokens", type=int, default=d.batch_tokens, help="source tokens per batch")
    parser.add_argument(
        "--max-batch-requests",
        type=int,
        default=d.max_batch_requests,
        help="requests per batch (1 disables dynamic batching)",
    )
    parser.add_argument(
        "--graceful-timeout",
        type=float,
        default=None,
        help="seconds to wait for in-flight requests on shutdown (default: no limit)",
    )


def settings_from_args(args: argparse.Namespace) -> Settings:
    s = Settings(
        args.max_sentences,
        args.max_chars,
        args.max_body,
        args.max_beam,
        args.timeout,
        args.wait_ms,
        args.batch_tokens,
        args.max_batch_requests,
        args.beam,
    )
    for key, value in vars(s).items():
        if value < 0 or (value == 0 and key != "wait_ms"):
            raise ValueError(f"--{key.replace('_', '-')} must be positive, got {value}")
    if s.beam > s.max_beam:
        raise ValueError(f"--beam {s.beam} is larger than --max-beam {s.max_beam}")
    for key in ("memory_budget_mb", "key_limit", "req_limit"):
        if getattr(args, key) < 0:
            raise ValueError(f"--{key.replace('_', '-')} must not be negative, got {getattr(args, key)}")
    return s


def access_from_args(args: argparse.Namespace) -> Access:
    if args.api_keys is None:
        return Access([], require="never", anonymous_limit=args.req_limit)
    return Access(read_keys(args.api_keys, args.key_limit), args.require_api_key, args.req_limit)


def run(args: argparse.Namespace) -> int:
    import torch
    import uvicorn

    from ..api import load

    settings = settings_from_args(args)
    access = access_from_args(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    backend = backend_from_args(args)
    if args.model is not None:
        translator = load(args.model, device=args.device, backend=backend)
        print(f"transduce serve: {translator.fast_paths.line()}", flush=True)
        app = create_app(translator, settings, name=Path(args.model).name, access=access)
    else:
        specs = read_models(args.models)

        def load_spec(spec: ModelSpec):
            from ..backends import requested_backend

            # a model's own dtype (its line in --models) names its backend; else the server's options
            chosen = backend if spec.dtype is None else requested_backend("auto", spec.dtype, args.native)
            translator = load(spec.path, device=args.device, backend=chosen)
            print(f"transduce serve: {spec.name}: {translator.fast_paths.line()}", flush=True)
            return translator

        app = create_app(
            specs, settings, access=access, load=load_spec, budget_bytes=int(args.memory_budget_mb * 2**20)
        )
    uvicorn.run(app, host=args.host, port=args.port, timeout_graceful_shutdown=args.graceful_timeout, log_level="info")
    return 0
