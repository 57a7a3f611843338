"""The LibreTranslate API, for the clients and plug-ins that speak it.

    POST /translate   q (string or list), source (a code or "auto"), target, format ("text" | "html"),
                      alternatives (extra outputs per text, default 0), api_key,
                      beam (transduce's: the beam size, default --beam, at most --max-beam)
                      -> {"translatedText": "..."}            (a list when q is a list)
                         "alternatives": [...]                 when alternatives > 0 (empty lists for html)
                         "detectedLanguage": {"language", "confidence"}   when source is "auto"
                         "route": ["fr-en", "en-de"]           when the text went through a pivot language
    POST /detect      q -> [{"language": "en", "confidence": 97.2}, ...]   best first (GET: 405, as LibreTranslate)
    GET  /languages   -> [{"code": "en", "name": "English", "targets": ["de", "en"]}, ...]   (each lists itself)
    GET  /frontend/settings   what LibreTranslate's page and Nextcloud read: limits, keys, languages
    POST /suggest     q, s (the suggested translation), source, target -> {"success": true}
                      (403 unless the server keeps suggestions: --suggestions FILE)

Fields are read from the query string, JSON, form or multipart data (:mod:`~transduce.serve.fields`).
Each text is translated whole: split into sentences, all sentences of the request batched together,
put back with its layout (:mod:`~transduce.serve.texts`). ``source: "auto"`` identifies each text's
language among the sources that reach ``target`` (:mod:`transduce.langid`).

A text asked into its own language comes back as it is. Errors answer ``{"error": "..."}``, worded as
LibreTranslate words them where it has the case ("zz is not supported", "Invalid request: missing q
parameter"): 400 bad request or unknown pair, 403 key, 413 a size limit
(``--char-limit``, ``--batch-limit``, a sentence over ``--max-chars``), 429 request limit, 500
translation failed, 503 memory budget full, 504 timeout.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from .. import langid
from ..decode.search_options import BadSearch, SearchOptions
from ..text.markup import translate_html_batch
from .fields import api_key, client_host, error, ignore_unknown, read_fields
from .languages import Hop, check_pair, detect_sources, listing, not_available, plan, same_language
from .service import Rejected, Service, Translate
from .texts import aligned, keep_case, needs_model, repaired_html, split

FIELDS = {"q", "source", "target", "format", "alternatives", "beam", "api_key", "secret"}
_TAG = re.compile(r"<[^>]*>")


def check_size(service: Service, texts: list[str], key_char_limit: int = 0) -> None:
    """LibreTranslate's limits: texts per request (--batch-limit) and characters per request (--char-limit
    or the key's own)."""
    s = service.settings
    if len(texts) > s.max_sentences:
        raise Rejected(413, f"Invalid request: {len(texts)} texts exceed the batch limit of {s.max_sentences}")
    limit = key_char_limit or s.char_limit
    chars = sum(len(t) for t in texts)
    if limit and chars > limit:
        raise Rejected(413, f"Invalid request: request ({chars} characters) exceeds the text limit of {limit}")


def distinct(best: str, others: list[str]) -> list[str]:
    """Alternatives as LibreTranslate answers them: each once, none empty or equal to the translation."""
    return [t for t in dict.fromkeys(others) if t and t != best]


def check_sentences(service: Service, sentences: list[str]) -> None:
    """Each sentence of whole texts within ``--max-chars`` (413 naming the sentence)."""
    for i, sentence in enumerate(sentences):
        if len(sentence) > service.settings.max_chars:
            raise Rejected(
                413,
                f"field 'q': sentence {i + 1} has {len(sentence)} characters, over the limit of "
                f"{service.settings.max_chars} (--max-chars)",
            )


async def run_text(service: Service, hops: list[Hop], texts: list[str], search: SearchOptions) -> list[list[str]]:
    """Each text through ``hops`` with ``search``: best first, then ``search.nbest - 1`` alternatives (sentence by
    sentence; the hops before the last give one). Sentences with nothing to translate skip the model, and none
    is lost (:mod:`~transduce.serve.texts`)."""
    current = texts
    for k, hop in enumerate(hops):
        last = k == len(hops) - 1
        parts = split(current, langid.base_language(hop.source))
        check_sentences(service, parts.sentences)
        hop_search = search if last else search.replace(nbest=1)
        wanted = parts.to_translate
        results = await service.translate(hop.spec, wanted, hop_search, "q", hop.target_lang, False) if wanted else []
        ranked = parts.fill([[h.text for h in r] if isinstance(r, list) else [r.text] for r in results])
        if not last:
            current = parts.join([r[0] for r in ranked])
            continue
        n = search.nbest
        return [list(t) for t in zip(*(parts.join([r[min(j, len(r) - 1)] for r in ranked]) for j in range(n)))]
    return [[t] for t in current]


class _Batched:
    """A translator whose ``translate`` sends the sentences through the model's batcher: handed to
    :func:`transduce.text.markup.translate_html_batch` on a worker thread, so the sentences of HTML
    snippets are checked and batched like text while markup is parsed and rendered off the event loop.
    As for text, a sentence with nothing to translate skips the model and one translated to nothing comes
    back as its source, each word aligned to itself so the tags around it stay there (:func:`~.texts.aligned`)."""

    def __init__(self, service: Service, hop: Hop, loop: asyncio.AbstractEventLoop):
        self.service, self.hop, self.loop = service, hop, loop

    def translate(
        self, sentences: list[str], search: SearchOptions | None = None, alignments="cover", alignment_layer=None, **_
    ) -> list:
        job = Translate(search or self.service.settings.search, self.hop.target_lang, alignments, alignment_layer)
        wanted = [s for s in sentences if needs_model(s)]
        self.service.check_text(self.hop.spec, wanted, "q", count=False)
        done = iter(self._run(wanted, job) if wanted else [])
        return [aligned(s, next(done) if needs_model(s) else None) for s in sentences]

    def _run(self, sentences: list[str], job: Translate) -> list:
        work = self.service.run(self.hop.spec, sentences, job, "q")
        return asyncio.run_coroutine_threadsafe(work, self.loop).result()


async def run_html(service: Service, hops: list[Hop], texts: list[str], search: SearchOptions) -> list[list[str]]:
    """Each HTML snippet through ``hops`` with ``search`` (one translation per sentence)."""
    current = [repaired_html(t, i) for i, t in enumerate(texts)]
    loop = asyncio.get_running_loop()
    for hop in hops:
        translator = _Batched(service, hop, loop)
        lang = langid.base_language(hop.source)
        current = await asyncio.to_thread(translate_html_batch, translator, current, lang, search=search)
    return [[t] for t in current]


async def run_group(
    service: Service, source: str, target: str, texts: list[str], fmt: str, search: SearchOptions
) -> tuple[list[list[str]], list[str]]:
    """``texts``, all in ``source``, into ``target``: each text's outputs (best first) and the pairs they went
    through; plain text keeps the case of a text all in lower or upper case (:func:`~.texts.keep_case`).
    Into its own language, a text comes back as it is, through no model."""
    if same_language(service, source, target):
        return [[t] for t in texts], []
    try:
        hops = plan(service, source, target)
    except Rejected as e:
        if e.status != 400:
            raise
        raise Rejected(400, not_available(source, target)) from None
    route = [h.pair for h in hops]
    if fmt == "html":
        return await run_html(service, hops, texts, search.replace(nbest=1)), route
    done = await run_text(service, hops, texts, search)
    return [[keep_case(text, t) for t in out] for text, out in zip(texts, done)], route


def read_search(service: Service, fields: dict[str, Any]) -> tuple[str, SearchOptions]:
    """A /translate request's ``format``, and its search: ``alternatives`` and ``beam`` over the server's
    (:meth:`SearchOptions.from_request`), checked (400 naming the field)."""
    fmt = fields.get("format", "text")
    if fmt not in ("text", "html"):
        raise Rejected(400, f"Invalid request: format must be 'text' or 'html', got {fmt!r}")
    asked = {k: fields[k] for k in ("alternatives", "beam") if k in fields}
    try:
        return fmt, SearchOptions.from_request(asked, service.settings.search, service.settings.max_beam)
    except BadSearch as e:
        raise Rejected(400, f"Invalid request: {e}") from None


async def translate(service: Service, request: Request) -> dict:
    fields = await read_fields(request)
    if "q" not in fields and "text" in fields:
        raise Rejected(
            400, "Invalid request: missing q parameter (transduce's own API, with 'text', is at POST /v1/translate)"
        )
    ignore_unknown(fields, FIELDS, "/translate")
    for name in ("q", "source", "target"):
        if fields.get(name) in (None, "", []):
            raise Rejected(400, f"Invalid request: missing {name} parameter")
    char_limit = service.authorize_chars(api_key(fields, request), client_host(request))
    q, target = fields["q"], str(fields["target"])
    batch = isinstance(q, list)
    texts = q if batch else [q]
    if not all(isinstance(t, str) for t in texts):
        raise Rejected(400, "Invalid request: q must be a string or a list of strings")
    fmt, search = read_search(service, fields)
    check_size(service, texts, char_limit)
    source = str(fields["source"])
    check_pair(service, source, target)
    detected = detect_sources(service, texts, target) if source == "auto" else [(source, 0.0)] * len(texts)
    outputs: list[list[str]] = [[]] * len(texts)
    routes: list[list[str]] = [[]] * len(texts)
    for src in dict.fromkeys(s for s, _ in detected):
        where = [i for i, (s, _) in enumerate(detected) if s == src]
        done, route = await run_group(service, src, target, [texts[i] for i in where], fmt, search)
        for i, out in zip(where, done):
            outputs[i], routes[i] = out, route
    answer: dict[str, Any] = {"translatedText": [o[0] for o in outputs] if batch else outputs[0][0]}
    if search.nbest > 1:
        alts = [distinct(o[0], o[1:]) for o in outputs]  # empty for html: no alternatives of markup
        answer["alternatives"] = alts if batch else alts[0]
    if source == "auto":
        found = [{"language": s, "confidence": round(c, 1)} for s, c in detected]
        answer["detectedLanguage"] = found if batch else found[0]
    if any(len(r) > 1 for r in routes):
        answer["route"] = routes if batch else routes[0]
    return answer


async def detect(service: Service, request: Request) -> list[dict]:
    fields = await read_fields(request)
    ignore_unknown(fields, {"q", "api_key", "secret"}, "/detect")
    if fields.get("q") in (None, ""):
        raise Rejected(400, "Invalid request: missing q parameter")
    service.authorize(api_key(fields, request), client_host(request))
    q = fields["q"]
    text = " ".join(q) if isinstance(q, list) else str(q)
    check_size(service, [text])
    candidates = [lang["code"] for lang in listing(service)]
    return [{"language": c, "confidence": round(p, 1)} for c, p in langid.rank(_TAG.sub(" ", text), candidates)]


async def suggest(service: Service, request: Request) -> dict:
    fields = await read_fields(request)
    ignore_unknown(fields, {"q", "s", "source", "target", "api_key", "secret"}, "/suggest")
    if service.suggestions is None:
        raise Rejected(403, "Suggestions are disabled on this server (transduce serve --suggestions FILE)")
    for name in ("q", "s", "source", "target"):
        if not isinstance(fields.get(name), str) or not fields[name]:
            raise Rejected(400, f"Invalid request: missing {name} parameter (a string)")
    char_limit = service.authorize_chars(api_key(fields, request), client_host(request))
    check_size(service, [fields["q"], fields["s"]], char_limit)
    service.suggestions.add(fields["q"], fields["s"], fields["source"], fields["target"])
    return {"success": True}


def frontend_settings(service: Service) -> dict:
    langs = listing(service)
    others = {lang["code"]: [t for t in lang["targets"] if t != lang["code"]] for lang in langs}
    sources = [lang for lang in langs if others[lang["code"]]] or langs
    first = sources[0] if sources else {"code": "", "name": ""}
    target_code = (others.get(first["code"]) or [first["code"]])[0]
    target = next((lang for lang in langs if lang["code"] == target_code), first)
    return {
        "charLimit": service.settings.char_limit or -1,
        "frontendTimeout": 500,
        "apiKeys": bool(service.access.keys),
        "keyRequired": service.access.require == "always",
        "suggestions": service.suggestions is not None,
        "filesTranslation": bool(service.file_formats),
        "supportedFilesFormat": list(service.file_formats),
        "language": {
            "source": {"code": "auto", "name": "Auto Detect"},
            "target": {"code": target["code"], "name": target["name"]},
        },
    }


def _answer(work, name: str):
    async def handler(request: Request):
        try:
            return JSONResponse(await work(request))
        except Rejected as e:  # LibreTranslate answers a bad value with 400 where the own API says 422
            return error(400 if e.status == 422 else e.status, e.message, e.retry_after)
        except Exception as e:  # noqa: BLE001 - answered in LibreTranslate's shape, not a traceback
            return error(500, f"translation failed: {type(e).__name__}: {e}")

    handler.__name__ = name  # the OpenAPI operation's id
    return handler


def router(service: Service) -> APIRouter:
    api = APIRouter(tags=["LibreTranslate API"])
    errors = {
        400: {"description": "bad request or unknown language pair"},
        403: {"description": "API key wrong, or missing where required"},
        413: {"description": "a size limit"},
        429: {"description": "request limit"},
        500: {"description": "translation failed"},
    }
    api.add_api_route(
        "/translate",
        _answer(lambda r: translate(service, r), "libre_translate"),
        methods=["POST"],
        summary="LibreTranslate: translate q from source to target",
        responses=errors,
    )
    api.add_api_route(  # POST only, as LibreTranslate: GET is 405; Nextcloud POSTs /detect?q=...
        "/detect",
        _answer(lambda r: detect(service, r), "libre_detect"),
        methods=["POST"],
        summary="LibreTranslate: the language of q",
        responses=errors,
    )
    api.add_api_route(
        "/suggest",
        _answer(lambda r: suggest(service, r), "libre_suggest"),
        methods=["POST"],
        summary="LibreTranslate: keep a suggested translation (for fine-tuning)",
        responses=errors,
    )

    @api.get("/languages", summary="LibreTranslate: languages and their targets")
    async def libre_languages():
        return listing(service)

    @api.get("/frontend/settings", summary="LibreTranslate: the server's settings for front ends")
    async def libre_frontend_settings():
        return frontend_settings(service)

    return api
