"""Languages as LibreTranslate clients see them: standard codes, real names, routes through a pivot.

``/languages`` lists every code in its shortest standard form (BCP 47 by ``langcodes``: ``fr``, not
``fra``; ``zh-Hans``), named by ``language_data`` (English names), because clients match those codes
literally (Mastodon shows its Translate button only when the post's two-letter code is listed). Where
two served pairs share the standard codes (an ``en-fr`` model beside a multilingual model's ``>>fra<<``),
the one requests reach by those codes has them and the other keeps its codes as served.
A request's codes reach the served pair by the same standard form (:meth:`ModelPool.resolve`).

Pivot routing: where no model translates ``Y -> X`` but one translates ``Y -> P`` and another
``P -> X``, the text goes through ``P`` (English first, as Argos Translate does). The pair is listed
in ``/languages`` ``targets``, and the answer names the route that ran. ``source: "auto"`` picks the
source among those that reach the target (:func:`detect_sources`, :mod:`transduce.langid`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from .. import langid
from .registry import ModelSpec, language_key
from .service import Rejected, Service

PIVOTS = ("en",)  # tried first; then any other language both hops share
_TAG = re.compile(r"<[^>]*>")


@dataclass(frozen=True)
class Hop:
    """One model run: the spec, its ``>>xx<<`` target code (None: a one-language model), the pair served."""

    spec: ModelSpec
    target_lang: str | None
    source: str  # the served codes of the pair
    target: str

    @property
    def pair(self) -> str:
        return f"{self.source}-{self.target}"


@functools.lru_cache(maxsize=4096)  # pure; asked on every request
def display_code(code: str) -> str:
    """``code`` as ``/languages`` lists it: "fra" -> "fr", "zho_Hans" -> "zh-Hans"."""
    import langcodes

    try:
        return langcodes.standardize_tag(code)
    except ValueError:  # langcodes' LanguageTagError: kept as written
        return code


@functools.lru_cache(maxsize=4096)  # pure; langcodes takes ~0.1 ms a name, and /translate asks on every request
def name(code: str) -> str:
    """The language's English name ("French"); a code listed as served, not in its standard form, says
    the code too ("French (fra)" beside "fr"); the code itself where no name is known."""
    try:
        import langcodes

        language = langcodes.Language.get(code)
        if not language.is_valid():
            return code
        shown = language.display_name()
        return shown if display_code(code) == code else f"{shown} ({code})"
    except (ImportError, ValueError, LookupError):  # no language_data, or a code langcodes cannot read
        return code


def _hop(service: Service, source: str, target: str) -> Hop:
    spec, target_lang = service.route(source, target)
    s, t = service.pool.resolve(source, target)
    return Hop(spec, target_lang, s, t)


def served_pairs(service: Service) -> set[tuple[str, str]]:
    """Every (source, target) a request can name, in display codes: direct pairs and pivoted ones."""
    direct = set()
    for s, t in service.pool.by_pair:
        if s and t:  # "": a model without [meta]
            shown = display_code(s), display_code(t)
            # the standard codes where they reach this pair; else (another model has them) the codes as served
            direct.add(shown if service.pool.resolve(*shown) == (s, t) else (s, t))
    out = set(direct)
    for s, p in direct:
        for p2, t in direct:
            if p == p2 and s != t and (s, t) not in direct:
                out.add((s, t))
    return out


def plan(service: Service, source: str, target: str) -> list[Hop]:
    """The models a text goes through: one hop, or two through a pivot language."""
    try:
        return [_hop(service, source, target)]
    except Rejected as direct_error:
        if direct_error.status != 400:
            raise
        by_key = {(language_key(s), language_key(t)) for s, t in service.pool.by_pair}
        src, tgt = language_key(source), language_key(target)
        middles = sorted({t for s, t in by_key if s == src} & {s for s, t in by_key if t == tgt} - {src, tgt})
        middles.sort(key=lambda m: (m not in PIVOTS, m))
        if not middles:
            raise
        return [_hop(service, source, middles[0]), _hop(service, middles[0], target)]


def listing(service: Service) -> list[dict]:
    """``GET /languages``: each code, its name, and the targets it reaches (directly or by pivot), itself
    among them as LibreTranslate lists it (a text asked into its own language comes back as it is)."""
    pairs = served_pairs(service)
    codes = sorted({c for pair in pairs for c in pair})
    return [{"code": c, "name": name(c), "targets": sorted({t for s, t in pairs if s == c} | {c})} for c in codes]


def same_language(service: Service, source: str, target: str) -> bool:
    """Whether ``source`` and ``target`` name one listed language ("en" and "eng" too)."""
    key = language_key(source)
    return key == language_key(target) and key in {language_key(lang["code"]) for lang in listing(service)}


def check_pair(service: Service, source: str, target: str) -> None:
    """LibreTranslate's 400 for a code no listed language has, source first: "zz is not supported"."""
    listed = {language_key(lang["code"]) for lang in listing(service)}
    for code in (source, target):
        if code != "auto" and language_key(code) not in listed:
            raise Rejected(400, f"{code} is not supported")


def not_available(source: str, target: str) -> str:
    """LibreTranslate's words for two listed languages no route joins."""
    return (
        f"{name(display_code(target))} ({target}) is not available as a target language from "
        f"{name(display_code(source))} ({source})"
    )


def sources_for(service: Service, target: str) -> list[str]:
    """The display codes a text in which can be translated into ``target``."""
    key = language_key(target)
    return sorted({s for s, t in served_pairs(service) if language_key(t) == key})


def detect_sources(service: Service, texts: list[str], target: str) -> list[tuple[str, float]]:
    """``(source, confidence)`` for each text (``source: "auto"``), among the sources that reach ``target``
    (directly or through a pivot); markup is not counted as text."""
    candidates = sources_for(service, target)
    if not candidates:
        raise Rejected(400, f"source 'auto': no model here translates into {target!r}")
    if len(candidates) == 1:
        return [(candidates[0], 100.0)] * len(texts)
    return [langid.best(_TAG.sub(" ", t), candidates) for t in texts]
