"""The LibreTranslate API, for the clients and plug-ins that speak it.

    POST /translate   q (string or list), source (a code or "auto"), target, format ("text" | "html"),
                      alternatives (extra n-best outputs, default 0), api_key; JSON or form data
                      -> {"translatedText": "..."}            (a list when q is a list)
                         "alternatives": [...]                 when alternatives > 0
                         "detectedLanguage": {"language", "confidence"}   when source is "auto"
    GET  /languages   -> [{"code": "en", "name": "English", "targets": ["de"]}, ...]

Errors answer ``{"error": "..."}``: 400 bad request or unknown pair, 403 key missing or wrong,
429 over the request limit, 500 translation failed (413/503/504 for size limits, a full memory
budget and timeouts).

``source: "auto"`` does not detect the language: it picks the only source language any model
here translates into ``target`` (``detectedLanguage.confidence`` is then 100), and answers 400
naming the candidates when there are several.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from .service import Rejected, Service, language_option

try:  # HTML-aware translation: markup is kept, only the text between tags is translated
    from ..text.markup import translate_html
except ImportError:  # not in this build: format=html answers 400
    translate_html = None

NAMES = {
    "ar": "Arabic",
    "bg": "Bulgarian",
    "ca": "Catalan",
    "cs": "Czech",
    "da": "Danish",
    "de": "German",
    "el": "Greek",
    "en": "English",
    "eo": "Esperanto",
    "es": "Spanish",
    "et": "Estonian",
    "fa": "Persian",
    "fi": "Finnish",
    "fr": "French",
    "ga": "Irish",
    "he": "Hebrew",
    "hi": "Hindi",
    "hu": "Hungarian",
    "id": "Indonesian",
    "it": "Italian",
    "ja": "Japanese",
    "ko": "Korean",
    "lt": "Lithuanian",
    "lv": "Latvian",
    "nb": "Norwegian Bokmål",
    "nl": "Dutch",
    "pl": "Polish",
    "pt": "Portuguese",
    "ro": "Romanian",
    "ru": "Russian",
    "sk": "Slovak",
    "sl": "Slovenian",
    "sv": "Swedish",
    "th": "Thai",
    "tr": "Turkish",
    "uk": "Ukrainian",
    "vi": "Vietnamese",
    "zh": "Chinese",
}
FIELDS = {"q", "source", "target", "format", "alternatives", "api_key"}


def error(status: int, message: str, retry_after: float = 0.0) -> JSONResponse:
    headers = {"Retry-After": str(max(1, round(retry_after)))} if retry_after else None
    return JSONResponse(status_code=status, content={"error": message}, headers=headers)


async def read_fields(request: Request) -> dict[str, Any]:
    """The request's fields from JSON or form data (application/x-www-form-urlencoded, multipart)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind in ("application/x-www-form-urlencoded", "multipart/form-data"):
        form = await request.form()
        fields: dict[str, Any] = {}
        for name in form:
            values = form.getlist(name)
            fields[name] = values if len(values) > 1 else values[0]
        return fields
    body = await request.body()
    if not body:
        return {}
    try:
        fields = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise Rejected(400, f"Invalid request: malformed JSON ({e})") from None
    if not isinstance(fields, dict):
        raise Rejected(400, "Invalid request: the JSON body must be an object")
    return fields


# ISO 639-3 codes of NAMES' languages: multilingual OPUS-MT models name targets so (>>deu<<, >>fra<<)
THREE_LETTER = dict(
    zip(
        "ara bul cat ces dan deu ell eng epo spa est fas fin fra gle heb hin hun ind ita jpn kor lit lav nob nld "
        "pol por ron rus slk slv swe tha tur ukr vie zho".split(),
        "ar bg ca cs da de el en eo es et fa fi fr ga he hi hu id it ja ko lt lv nb nl pl pt ro ru sk sl sv th tr "
        "uk vi zh".split(),
        strict=True,
    )
)


def name(code: str) -> str:
    """The language's English name; a three-letter code's says the code too ("French (fra)" beside "fr")."""
    if code in NAMES:
        return NAMES[code]
    two = THREE_LETTER.get(code)
    return f"{NAMES[two]} ({code})" if two else code


def languages(service: Service) -> list[dict]:
    """Every source language and where it can go; a multilingual model adds each of its >>xx<< targets."""
    pairs = [(s, t) for s, t in service.pool.by_pair if s and t]  # "": a model without [meta]
    codes = sorted({c for pair in pairs for c in pair})
    return [{"code": c, "name": name(c), "targets": sorted(t for s, t in pairs if s == c)} for c in codes]


def as_int(value, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise Rejected(400, f"Invalid request: {name} must be an integer, got {value!r}") from None


def pick_source(service: Service, source: str, target: str) -> tuple[str, bool]:
    """(source, chosen by auto)."""
    if source != "auto":
        return source, False
    candidates = service.pool.sources_for(target)
    if len(candidates) == 1:
        return candidates[0], True
    if not candidates:
        raise Rejected(400, f"source 'auto': no model here translates into {target!r}")
    raise Rejected(
        400,
        f"source 'auto' does not detect languages on this server; several sources translate into "
        f"{target!r} ({', '.join(candidates)}): name one",
    )


async def translate(service: Service, request: Request) -> dict:
    fields = await read_fields(request)
    unknown = set(fields) - FIELDS - {"text"}
    if "q" not in fields and "text" in fields:
        raise Rejected(
            400, "Invalid request: missing q parameter (transduce's own API, with 'text', is at POST /v1/translate)"
        )
    if unknown:
        raise Rejected(400, f"Invalid request: unknown parameter(s) {', '.join(sorted(unknown))}")
    for name in ("q", "source", "target"):
        if fields.get(name) in (None, "", []):
            raise Rejected(400, f"Invalid request: missing {name} parameter")
    service.authorize(
        fields.get("api_key") or request.headers.get("x-api-key"), request.client.host if request.client else None
    )
    q, target = fields["q"], str(fields["target"])
    batch = isinstance(q, list)
    texts = q if batch else [q]
    if not all(isinstance(t, str) for t in texts):
        raise Rejected(400, "Invalid request: q must be a string or a list of strings")
    source, auto = pick_source(service, str(fields["source"]), target)
    spec, target_lang = service.route(source, target)
    fmt = fields.get("format", "text")
    if fmt not in ("text", "html"):
        raise Rejected(400, f"Invalid request: format must be 'text' or 'html', got {fmt!r}")
    alternatives = as_int(fields.get("alternatives", 0), "alternatives")
    beam = max(service.settings.beam, alternatives + 1)
    if not 0 <= alternatives < service.settings.max_beam:
        raise Rejected(400, f"Invalid request: alternatives must be between 0 and {service.settings.max_beam - 1}")
    if fmt == "html":
        outputs = await html(service, spec, texts, alternatives, target_lang)
    else:
        results = await service.translate(spec, texts, beam, nbest=alternatives + 1, field="q", target_lang=target_lang)
        outputs = [[h.text for h in r] if isinstance(r, list) else [r.text] for r in results]
    answer: dict[str, Any] = {"translatedText": [o[0] for o in outputs] if batch else outputs[0][0]}
    if alternatives:
        answer["alternatives"] = [o[1:] for o in outputs] if batch else outputs[0][1:]
    if auto:
        detected = {"language": source, "confidence": 100.0}
        answer["detectedLanguage"] = [detected] * len(texts) if batch else detected
    return answer


async def html(service: Service, spec, texts: list[str], alternatives: int, target_lang: str | None) -> list[list[str]]:
    """format=html: the one place that calls :func:`transduce.text.markup.translate_html`."""
    if translate_html is None:
        raise Rejected(
            400,
            "format 'html' is not supported by this server build (transduce.text.markup is "
            "missing); send format 'text'",
        )
    if alternatives:
        raise Rejected(400, "alternatives are not available with format 'html'")
    service.check_text(spec, texts, "q")
    out = []
    for text in texts:

        def call(translator, text=text):
            return translate_html(translator, text, **dict(language_option(target_lang)))

        (result,) = await service.run(spec, [call], ("call", (("id", id(call)),)), "q")
        out.append([result])
    return out


def router(service: Service) -> APIRouter:
    api = APIRouter(tags=["LibreTranslate API"])

    @api.post(
        "/translate",
        summary="LibreTranslate: translate q from source to target",
        responses={
            400: {"description": "bad request or unknown language pair"},
            403: {"description": "API key missing or wrong"},
            429: {"description": "request limit"},
            500: {"description": "translation failed"},
        },
    )
    async def libre_translate(request: Request):
        try:
            return JSONResponse(await translate(service, request))
        except Rejected as e:  # LibreTranslate answers a bad value with 400 where the own API says 422
            return error(400 if e.status == 422 else e.status, e.message, e.retry_after)
        except Exception as e:  # noqa: BLE001 - answered in LibreTranslate's shape, not a traceback
            return error(500, f"translation failed: {type(e).__name__}: {e}")

    @api.get("/languages", summary="LibreTranslate: languages and their targets")
    async def libre_languages():
        return languages(service)

    return api
