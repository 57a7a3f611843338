"""``transduce serve``: a JSON translation API over HTTP (FastAPI + uvicorn).

    transduce serve --model DIR [--host 127.0.0.1] [--port 8080]

    POST /translate  {"text": ["A dog runs."], "beam": 4, "nbest": 1, "alpha": 0.6, "return_scores": false}
                     -> {"translations": ["Ein Hund läuft."]}   (input order; n-best lists when nbest > 1;
                        {"text", "score", "logprob"} objects when return_scores)
    GET  /health     -> {"status": "ok", ...}
    GET  /openapi.json, /docs   the API description FastAPI derives from the models below

Concurrent requests are batched by :class:`~transduce.serve.batcher.Batcher` (one worker
thread runs the translator). Limits answer with a status and a message naming the field:
too many sentences, too long a sentence or too large a body -> 413; malformed JSON -> 400;
wrong types or values -> 422; a request slower than ``--timeout`` -> 504. uvicorn's graceful
shutdown (SIGINT/SIGTERM) stops accepting connections, lets in-flight requests finish,
then the batcher drains its queue.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path

from ..decode.options import add_backend_arguments, backend_from_args
from .batcher import Batcher, Job

try:
    from fastapi import FastAPI, HTTPException, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, ConfigDict, Field
except ImportError as e:  # pragma: no cover - the serve extra is missing
    raise ImportError("transduce serve needs fastapi and uvicorn: pip install 'transduce[serve]'") from e


@dataclass
class Settings:
    """Limits and batching; every field is a command-line option of ``transduce serve``."""

    max_sentences: int = 64  # per request
    max_chars: int = 2000  # per sentence
    max_body: int = 1_000_000  # bytes
    max_beam: int = 16
    timeout: float = 60.0  # seconds per request, queueing included
    wait_ms: float = 5.0  # how long an idle worker waits for company
    batch_tokens: int = 4096  # source tokens per batch
    max_batch_requests: int = 64  # 1 = one request at a time


class TranslateRequest(BaseModel):
    """Sentences to translate and how. Unknown fields and wrong types are rejected (422)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    text: list[str] = Field(description="sentences, translated independently, answered in this order")
    beam: int = Field(4, description="beam size (§6.1: 4); 1 = greedy")
    nbest: int = Field(1, description="hypotheses per sentence (at most beam)")
    alpha: float = Field(0.6, description="length penalty α (§6.1: 0.6)")
    return_scores: bool = Field(False, description="return {text, score, logprob} objects instead of strings")


class Scored(BaseModel):
    text: str
    score: float = Field(description="ranking score: logprob / length penalty")
    logprob: float = Field(description="model log-probability of the tokens and eos")


class TranslateResponse(BaseModel):
    translations: list[str] | list[Scored] | list[list[str]] | list[list[Scored]]


class Health(BaseModel):
    status: str
    model: str
    src_lang: str
    tgt_lang: str
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
        too_large = JSONResponse(status_code=413, content={
            "detail": f"request body larger than the limit of {self.max_bytes} bytes"})
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
        return JSONResponse(status_code=400, content={
            "detail": f"malformed JSON at character {where}: {ctx.get('error', bad_json[0].get('msg'))}"})
    text = "; ".join(f"field '{_field(e['loc'])}': {e['msg']}" for e in errors)
    return JSONResponse(status_code=422, content={"detail": text, "errors": [
        {"field": _field(e["loc"]), "message": e["msg"]} for e in errors]})


def _reject(status: int, field: str, message: str):
    raise HTTPException(status_code=status, detail=f"field '{field}': {message}")


def create_app(translator, settings: Settings | None = None, name: str = "") -> FastAPI:
    """The ASGI app around a loaded :class:`~transduce.decode.translator.Translator`."""
    settings = settings or Settings()
    vocab, max_tokens = translator.vocabs.src, translator.config.max_positions

    def run_batch(sentences: list[str], key) -> list:
        beam, nbest, alpha = key
        return translator.translate(sentences, beam=beam, nbest=nbest, alpha=alpha, return_scores=True,
                                    truncate=False)

    batcher = Batcher(run_batch, settings.wait_ms / 1000, settings.batch_tokens, settings.max_batch_requests)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        batcher.start()
        yield
        await asyncio.to_thread(batcher.stop)  # after uvicorn has finished in-flight requests

    app = FastAPI(title="transduce", version=_version(), lifespan=lifespan,
                  description="Translation with a Transformer (Vaswani et al., 2017). " + __doc__.split("\n\n")[0])
    app.state.batcher, app.state.settings = batcher, settings
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body)

    @app.get("/health", response_model=Health)
    def health() -> Health:
        s = batcher.stats
        return Health(status="ok", model=name, src_lang=str(translator.meta.get("src_lang", "")),
                      tgt_lang=str(translator.meta.get("tgt_lang", "")), pending=batcher.pending,
                      requests=s.requests, batches=s.batches, max_requests_in_batch=s.max_requests_in_batch)

    @app.post("/translate", response_model=TranslateResponse,
              responses={400: {"description": "malformed JSON"}, 413: {"description": "a limit was exceeded"},
                         422: {"description": "wrong field type or value"}, 504: {"description": "timeout"}})
    async def translate(req: TranslateRequest) -> dict:
        if len(req.text) > settings.max_sentences:
            _reject(413, "text", f"{len(req.text)} sentences exceed the limit of {settings.max_sentences} per request")
        if not 1 <= req.beam <= settings.max_beam:
            _reject(422, "beam", f"must be between 1 and {settings.max_beam}, got {req.beam}")
        if not 1 <= req.nbest <= req.beam:
            _reject(422, "nbest", f"must be between 1 and beam={req.beam}, got {req.nbest}")
        if not 0.0 <= req.alpha <= 10.0:
            _reject(422, "alpha", f"must be between 0 and 10, got {req.alpha}")
        tokens = 0
        for i, sentence in enumerate(req.text):
            if len(sentence) > settings.max_chars:
                _reject(413, f"text.{i}", f"{len(sentence)} characters exceed the limit of {settings.max_chars}")
            n = len(vocab.encode(sentence)) + 1
            if n > max_tokens:
                _reject(413, f"text.{i}", f"{n} source tokens exceed the model's max_positions={max_tokens}")
            tokens += n
        if not req.text:
            return {"translations": []}
        try:
            future = batcher.submit(Job(req.text, (req.beam, req.nbest, req.alpha), tokens))
        except RuntimeError as e:
            raise HTTPException(status_code=503, detail=str(e)) from None
        try:
            results = await asyncio.wait_for(asyncio.wrap_future(future), settings.timeout)
        except asyncio.TimeoutError:
            raise HTTPException(status_code=504, detail=f"translation took longer than the "
                                                        f"{settings.timeout:g} s per-request timeout") from None
        return {"translations": [_shape(r, req.return_scores) for r in results]}

    return app


def _shape(result, scores: bool):
    if isinstance(result, list):
        return [_shape(r, scores) for r in result]
    return {"text": result.text, "score": result.score, "logprob": result.logprob} if scores else result.text


def _version() -> str:
    from .. import __version__

    return __version__


# ---------------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = Settings()
    parser.add_argument("--model", required=True, type=Path, help="model directory")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: localhost only)")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--device", default="cpu")
    add_backend_arguments(parser)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--max-sentences", type=int, default=d.max_sentences, help="sentences per request")
    parser.add_argument("--max-chars", type=int, default=d.max_chars, help="characters per sentence")
    parser.add_argument("--max-body", type=int, default=d.max_body, help="request body bytes")
    parser.add_argument("--max-beam", type=int, default=d.max_beam)
    parser.add_argument("--timeout", type=float, default=d.timeout, help="seconds per request")
    parser.add_argument("--wait-ms", type=float, default=d.wait_ms, help="batching window when idle")
    parser.add_argument("--batch-tokens", type=int, default=d.batch_tokens, help="source tokens per batch")
    parser.add_argument("--max-batch-requests", type=int, default=d.max_batch_requests,
                        help="requests per batch (1 disables dynamic batching)")
    parser.add_argument("--graceful-timeout", type=float, default=None,
                        help="seconds to wait for in-flight requests on shutdown (default: no limit)")


def settings_from_args(args: argparse.Namespace) -> Settings:
    s = Settings(args.max_sentences, args.max_chars, args.max_body, args.max_beam, args.timeout, args.wait_ms,
                 args.batch_tokens, args.max_batch_requests)
    for key, value in vars(s).items():
        if value < 0 or (value == 0 and key != "wait_ms"):
            raise ValueError(f"--{key.replace('_', '-')} must be positive, got {value}")
    return s


def run(args: argparse.Namespace) -> int:
    import torch
    import uvicorn

    from ..api import load

    settings = settings_from_args(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    translator = load(args.model, device=args.device, backend=backend_from_args(args))
    print(f"transduce serve: {translator.fast_paths.line()}", flush=True)
    app = create_app(translator, settings, name=Path(args.model).name)
    uvicorn.run(app, host=args.host, port=args.port, timeout_graceful_shutdown=args.graceful_timeout,
                log_level="info")
    return 0
