"""transduce's own JSON API, versioned under ``/v1`` (its schema is the OpenAPI page at ``/docs``).

    POST /v1/translate  {"text": ["A dog runs."], "source": "en", "target": "de", "beam": 4, "nbest": 1,
                         "alpha": 0.6, "return_scores": false}
                        -> {"translations": ["Ein Hund läuft."]}   (input order; n-best lists when nbest > 1;
                           {"text", "score", "logprob"} objects when return_scores)
    POST /v1/attention  {"text": ["A dog runs."], "source": "en", "target": "de", "beam": 4}
                        -> {"alignments": [{"translation", "source_words", "target_words", "weights"}],
                            "route": ["en-de"]}     (the page's API)
                        source "auto": the language of all the text together, among those that reach
                        target, answered as "detected": {"language", "confidence"}; a pair no model
                        serves goes through a pivot (["fr-en", "en-de"]: :mod:`~transduce.serve.languages`)
                        and the alignments are the last model's, its source the pivot text
    GET  /v1/models     -> [{"name", "source", "target", "targets", "loaded", "bytes"}]
    GET  /v1/health     -> {"status": "ok", "model", "src_lang", "tgt_lang", "models", "loaded", "pending",
                            "requests", "batches", "max_requests_in_batch", "worker_processes",
                            "worker_process_mib"}   (/health is LibreTranslate's)

``/v1/attention`` decodes with the server's length penalty (``transduce serve --alpha``). ``/v1/translate``
answers the model's output as it is: the LibreTranslate API's rules for empty translations, text with
nothing to translate and case (:mod:`~transduce.serve.texts`) are not applied.
``source`` and ``target`` may be left out when the server holds one model. An API key, where
needed, goes in the ``X-API-Key`` header (or ``Authorization: Bearer KEY``). Errors answer
``{"detail": "..."}``: 400 malformed JSON or unknown pair, 403 key, 413 a size limit,
422 a wrong field, 429 request limit, 503 memory budget full, 504 timeout.
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from ..decode.search_options import PAPER
from .languages import Hop, detect_sources, plan
from .service import Attention, Rejected, Service


class TranslateRequest(BaseModel):
    """Sentences to translate and how. Unknown fields and wrong types are rejected (422)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    text: list[str] = Field(description="sentences, translated independently, answered in this order")
    source: str | None = Field(None, description="source language (may be left out with one model)")
    target: str | None = Field(None, description="target language (may be left out with one model)")
    beam: int = Field(PAPER.beam, description=f"beam size (§6.1: {PAPER.beam}); 1 = greedy")
    nbest: int = Field(1, description="hypotheses per sentence (at most beam)")
    alpha: float = Field(PAPER.alpha, description=f"length penalty α (§6.1: {PAPER.alpha})")
    return_scores: bool = Field(False, description="return {text, score, logprob} objects instead of strings")


class Scored(BaseModel):
    text: str
    score: float = Field(description="ranking score: logprob / length penalty")
    logprob: float = Field(description="model log-probability of the tokens and eos")


class TranslateResponse(BaseModel):
    translations: list[str] | list[Scored] | list[list[str]] | list[list[Scored]]


class AttentionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    text: list[str] = Field(description="sentences; each is translated and its attention recorded")
    source: str | None = Field(None, description='source language, or "auto": identified from all the text')
    target: str | None = None
    beam: int = Field(PAPER.beam, description="beam size of the translation whose attention is shown")


class Alignment(BaseModel):
    translation: str
    source_words: list[str]
    target_words: list[str]
    weights: list[list[float]] = Field(
        description="weights[j][i]: encoder–decoder attention of target word j on "
        "source word i, mean over layers and heads"
    )


class Detected(BaseModel):
    language: str
    confidence: float = Field(description="percent")


class AttentionResponse(BaseModel):
    alignments: list[Alignment] = Field(description="the last model's: through a pivot, its source is the pivot text")
    route: list[str] = Field(description='the pairs the text went through: ["fr-en", "en-de"] through a pivot')
    detected: Detected | None = Field(None, description='the language identified when source is "auto"')


class ModelInfo(BaseModel):
    name: str
    source: str
    target: str
    targets: list[str] = Field(description="a multilingual model's target languages (its >>xx<< tokens)")
    loaded: bool
    bytes: int = Field(description="memory of the loaded model (0 when not loaded)")


class Health(BaseModel):
    status: str
    model: str = Field(description="the model's name, with one model ('' with several)")
    src_lang: str
    tgt_lang: str
    models: int
    loaded: int = Field(description="models in memory")
    pending: int = Field(description="requests queued or being translated")
    requests: int = Field(description="requests translated by the loaded models' batchers")
    batches: int
    max_requests_in_batch: int
    worker_processes: int = Field(description="worker processes decoding with a model of their own, ready now")
    worker_process_mib: float = Field(description="their resident memory together, MiB (the cost of processes)")


def health(service: Service) -> Health:
    pool = service.pool
    loaded = list(pool.loaded.values())
    first = next(iter(pool.specs.values()))
    one = len(pool.specs) == 1
    stats = [e.batcher.stats for e in loaded]
    replicas = [r for e in loaded for r in e.batcher.replicas]
    return Health(
        status="ok",
        model=first.name if one else "",
        src_lang=first.source if one else "",
        tgt_lang=first.target if one else "",
        models=len(pool.specs),
        loaded=len(loaded),
        pending=pool.pending,
        requests=sum(s.requests for s in stats),
        batches=sum(s.batches for s in stats),
        max_requests_in_batch=max((s.max_requests_in_batch for s in stats), default=0),
        worker_processes=sum(r.ready for r in replicas),
        worker_process_mib=round(sum(r.rss_mib() for r in replicas if r.ready), 1),
    )


def api_key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key")


def route(service: Service, source: str | None, target: str | None, text: list[str]) -> tuple[list[Hop], dict | None]:
    """The models the text goes through (one, or two through a pivot: :func:`~transduce.serve.languages.plan`)
    and, for ``source: "auto"``, the language identified from all of ``text`` with its confidence."""
    detected = None
    if source == "auto":
        if not target:
            raise Rejected(400, "source 'auto' needs a target language")
        source, confidence = detect_sources(service, ["\n".join(text)], target)[0]
        detected = {"language": source, "confidence": round(confidence, 1)}
    if not source or not target:  # one model: the pair may be left out (else service.route says to name both)
        spec, target_lang = service.route(source, target)
        return [Hop(spec, target_lang, spec.source, spec.target)], detected
    return plan(service, source, target), detected


def _shape(result, scores: bool):
    if isinstance(result, list):
        return [_shape(r, scores) for r in result]
    return {"text": result.text, "score": result.score, "logprob": result.logprob} if scores else result.text


def _http(e: Rejected) -> HTTPException:
    headers = {"Retry-After": str(max(1, round(e.retry_after)))} if e.retry_after else None
    return HTTPException(status_code=e.status, detail=e.message, headers=headers)


def router(service: Service) -> APIRouter:
    api = APIRouter(prefix="/v1", tags=["transduce API"])
    client = lambda request: request.client.host if request.client else None
    errors = {
        400: {"description": "malformed JSON or unknown language pair"},
        403: {"description": "API key"},
        413: {"description": "a limit was exceeded"},
        422: {"description": "wrong field type or value"},
        429: {"description": "request limit"},
        503: {"description": "memory budget full"},
        504: {"description": "timeout"},
    }

    @api.post("/translate", response_model=TranslateResponse, responses=errors)
    async def translate(req: TranslateRequest, request: Request) -> dict:
        try:
            service.authorize(api_key(request), client(request))
            spec, target_lang = service.route(req.source, req.target)
            search = service.search({"beam": req.beam, "nbest": req.nbest, "alpha": req.alpha})
            results = await service.translate(spec, req.text, search, target_lang=target_lang)
        except Rejected as e:
            raise _http(e) from None
        return {"translations": [_shape(r, req.return_scores) for r in results]}

    @api.post("/attention", response_model=AttentionResponse, response_model_exclude_none=True, responses=errors)
    async def attention(req: AttentionRequest, request: Request) -> dict:
        try:
            service.authorize(api_key(request), client(request))
            search = service.search({"beam": req.beam})  # the page's length penalty: transduce serve --alpha
            hops, detected = route(service, req.source, req.target, req.text)
            text = req.text
            for hop in hops[:-1]:  # through a pivot: the first model's translations are the last one's source
                done = await service.translate(hop.spec, text, search, target_lang=hop.target_lang)
                text = [r.text for r in done]
            last = hops[-1]
            service.check_text(last.spec, text, "text")
            result = await service.run(last.spec, text, Attention(search, last.target_lang))
        except Rejected as e:
            raise _http(e) from None
        except ValueError as e:  # e.g. a model decoded by the C++ step records no attention
            raise HTTPException(status_code=400, detail=f"attention is not available: {e}") from None
        return {"alignments": result, "route": [h.pair for h in hops], "detected": detected}

    @api.get("/models", response_model=list[ModelInfo])
    async def models() -> list[dict]:
        loaded = dict(service.pool.loaded)
        return [
            {
                "name": s.name,
                "source": s.source,
                "target": s.target,
                "targets": list(s.languages),
                "loaded": s.name in loaded,
                "bytes": loaded[s.name].nbytes if s.name in loaded else 0,
            }
            for s in service.pool.specs.values()
        ]

    @api.get("/health", response_model=Health)
    def server_health() -> Health:
        return health(service)

    return api
