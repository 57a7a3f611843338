"""How to decode: :class:`SearchOptions` (beam, length penalty, length limits, n-best, sampling, and the choosers
MBR and reranking), passed whole, and its one door at each edge.

One frozen value carries the search settings from a command line (:func:`add_search_arguments`,
:meth:`SearchOptions.from_args`), a server request (:meth:`SearchOptions.from_request`) or an API call through
:meth:`~transduce.decode.translator.Translator.translate` down to :func:`~transduce.decode.search.search`. The
paper's defaults (§6.1: beam 4, α 0.6, at most input length + 50 tokens) are written here only. The rules of
the settings and of how the modes combine are :meth:`SearchOptions.check`, run when a value is made; an error
(:class:`BadSearch`) names the offending key, which each edge spells as its own (``--nbest``, ``field 'nbest'``).

This module imports no torch, so the command lines read their options without it.
"""

from __future__ import annotations

import argparse
import dataclasses
import warnings
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

UTILITIES = ("bleu", "chrf")  # MBR's sentence-level utility
WEIGHTS = ("model", "uniform")  # MBR's weights of the pseudo-references
MAX_ALPHA = 10.0  # the largest length penalty a server request may ask for


class BadSearch(ValueError):
    """A search setting that breaks a rule: ``key`` (the field, e.g. ``"nbest"``) and ``reason``, a phrase that
    follows the key's name (``"must be between 1 and the beam size 2, got 5"``)."""

    def __init__(self, key: str, reason: str):
        super().__init__(f"{key} {reason}")
        self.key, self.reason = key, reason


@dataclass(frozen=True)
class SampleConfig:
    """Sampling instead of search: temperature, then top-k, then nucleus (top-p) filtering."""

    temperature: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1.0: no nucleus filter
    seed: int = 1

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"sampling temperature must be > 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top-k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top-p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True)
class MBRConfig:
    """Minimum Bayes risk (:mod:`~transduce.decode.mbr`): ``candidates``, how many of the beam's finished
    hypotheses are compared (≤ the beam size), by ``utility``, weighted by ``weights``."""

    candidates: int = 5
    utility: str = "bleu"
    weights: str = "model"

    def __post_init__(self) -> None:
        if self.candidates < 1:
            raise ValueError(f"MBR candidates must be at least 1, got {self.candidates}")
        if self.utility not in UTILITIES:
            raise ValueError(f"MBR utility must be one of {', '.join(UTILITIES)}, got {self.utility!r}")
        if self.weights not in WEIGHTS:
            raise ValueError(f"MBR weights must be one of {', '.join(WEIGHTS)}, got {self.weights!r}")


@dataclass(frozen=True)
class RerankConfig:
    """Noisy-channel reranking (:mod:`~transduce.decode.rerank`): ``candidates``, how many of the beam's
    finished hypotheses are rescored (≤ the beam size); ``weight``: λ, the channel term's weight."""

    candidates: int = 5
    weight: float = 1.0

    def __post_init__(self) -> None:
        if self.candidates < 1:
            raise ValueError(f"rerank candidates must be at least 1, got {self.candidates}")
        if not self.weight >= 0:
            raise ValueError(f"rerank weight must be >= 0, got {self.weight}")


LOOSE = ("beam", "alpha", "max_len_a", "max_len_b", "nbest", "sample", "mbr", "rerank")  # the fields


@dataclass(frozen=True)
class SearchOptions:
    """The search settings (defaults: the paper, §6.1).

    beam: hypotheses kept per step (1: greedy); alpha: GNMT length penalty ((5+|Y|)/6)^α; max_len_a,
    max_len_b: at most a·|x| + b output tokens for a source of |x| tokens (capped by the model's positions);
    nbest: hypotheses returned per sentence (at most ``beam``); sample: sample tokens instead of searching
    (one output per sentence); mbr, rerank: choose each sentence's one output among the beam's candidates
    by minimum Bayes risk or by a channel model's score instead of taking the first.
    """

    beam: int = 4
    alpha: float = 0.6
    max_len_a: float = 1.0
    max_len_b: int = 50
    nbest: int = 1
    sample: SampleConfig | None = None
    mbr: MBRConfig | None = None
    rerank: RerankConfig | None = None

    def __post_init__(self) -> None:
        self.check()

    def check(self, one: str = "", constrained: bool = False) -> SearchOptions:
        """The rules of the settings and of how the modes (n-best, sampling, MBR, reranking) combine, the one
        place they are written; the first broken one raises :class:`BadSearch` naming its key. ``one``: the
        caller (a document, HTML, a file) writes one translation per sentence, so ``nbest`` must be 1;
        ``constrained``: constrained beam search finds one best hypothesis, so no sampling, MBR, reranking or
        n-best. Returns ``self``."""
        if self.beam < 1:
            raise BadSearch("beam", f"must be at least 1, got {self.beam}")
        if self.sample is not None and self.nbest != 1:
            raise BadSearch("nbest", f"must be 1 with sampling (one output per sentence), got {self.nbest}")
        if self.sample is None and not 1 <= self.nbest <= self.beam:
            raise BadSearch("nbest", f"must be between 1 and the beam size {self.beam}, got {self.nbest}")
        if self.mbr is not None and self.rerank is not None:
            raise BadSearch("rerank", "chooses one translation from the beam, as mbr does: give one of them")
        for key, chooser in (("mbr", self.mbr), ("rerank", self.rerank)):
            if chooser is None:
                continue
            if self.sample is not None or self.nbest != 1:
                raise BadSearch(key, "chooses one translation from the beam: not with nbest > 1 or sampling")
            if chooser.candidates > self.beam:
                raise BadSearch(
                    key, f"over {chooser.candidates} candidates needs a beam of at least that, got {self.beam}"
                )
        if one and self.nbest != 1:
            raise BadSearch("nbest", f"must be 1: {one} gets one translation per sentence, got {self.nbest}")
        if constrained:
            used = [k for k, on in (("sample", self.sample), ("mbr", self.mbr), ("rerank", self.rerank)) if on]
            if used or self.nbest != 1:
                raise BadSearch(
                    (used or ["nbest"])[0], "is not for constrained search, which finds one best hypothesis"
                )
        return self

    @property
    def single(self) -> bool:
        """One hypothesis per step (greedy decoding or sampling), not beam search."""
        return self.beam == 1 or self.sample is not None

    @property
    def searched(self) -> SearchOptions:
        """What search runs: these settings, with the chooser's candidates as the n-best it chooses from."""
        chooser = self.mbr or self.rerank
        if chooser is None:
            return self
        return dataclasses.replace(self, nbest=chooser.candidates, mbr=None, rerank=None)

    def replace(self, **changes: Any) -> SearchOptions:
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def of(cls, search: SearchOptions | None = None, **loose: Any) -> SearchOptions:
        """``search``, or one made from the loose keyword arguments that are not None (``beam=4, alpha=0.6``,
        the older way to pass them); giving both is an error naming the loose ones."""
        given = {k: v for k, v in loose.items() if v is not None}
        unknown = set(given) - set(LOOSE)
        if unknown:
            raise TypeError(f"unknown search options: {', '.join(sorted(unknown))}")
        if search is None:
            return cls(**given)
        if not isinstance(search, SearchOptions):
            raise TypeError(f"search must be a SearchOptions, got {type(search).__name__}")
        if given:
            raise ValueError(f"give either search=SearchOptions(...) or {', '.join(sorted(given))}, not both")
        return search

    @classmethod
    def deprecated(cls, where: str, search: SearchOptions | None, loose: dict[str, Any]) -> SearchOptions:
        """:meth:`of`, warning (DeprecationWarning, at the caller of ``where``) when loose keywords are given."""
        unknown = sorted(set(loose) - set(LOOSE))
        if unknown:
            raise TypeError(f"{where}() got an unexpected keyword argument {unknown[0]!r}")
        if loose:
            named = ", ".join(f"{k}=" for k in loose)
            warnings.warn(
                f"{where}({named}) is deprecated: pass search=SearchOptions({named}...)", DeprecationWarning, 3
            )
        return cls.of(search, **loose)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SearchOptions:
        """The search the options of :func:`add_search_arguments` name; an error names the flag."""
        get = lambda name, default=None: getattr(args, name, default)  # noqa: E731
        paper = cls()
        sample = None
        if get("sample"):
            sample = SampleConfig(args.temperature, args.top_k, args.top_p, args.seed)
        for flag in ("mbr", "rerank"):
            if get(flag, 0) < 0:
                raise ValueError(f"--{flag} must be 0 (off) or a number of candidates, got {get(flag)}")
        if get("rerank") and not get("channel"):
            raise ValueError("--rerank needs --channel DIR (a target→source model)")
        with as_flags():
            return cls(
                args.beam,
                args.alpha,
                get("max_len_a", paper.max_len_a),
                get("max_len_b", paper.max_len_b),
                get("nbest", paper.nbest),
                sample,
                MBRConfig(args.mbr, args.mbr_utility, args.mbr_weights) if get("mbr") else None,
                RerankConfig(args.rerank, args.rerank_weight) if get("rerank") else None,
            )

    @classmethod
    def from_request(
        cls, fields: Mapping[str, Any], defaults: SearchOptions | None = None, max_beam: int = 16
    ) -> SearchOptions:
        """The search a server request asks for: its ``beam``, ``alpha`` and ``nbest`` fields (or the
        LibreTranslate API's ``alternatives``: ``nbest - 1``, the beam widened to hold them) over ``defaults``
        (the server's), within the server's limits: a beam of at most ``max_beam``, α in [0, 10]. A field of
        the wrong type or out of its limits raises :class:`BadSearch` naming it."""
        defaults = defaults or cls()
        alternatives = _number(fields, "alternatives", int, 0)
        if not 0 <= alternatives < max_beam:
            raise BadSearch("alternatives", f"must be between 0 and {max_beam - 1}, got {alternatives}")
        beam = _number(fields, "beam", int, defaults.beam)
        if not 1 <= beam <= max_beam:
            raise BadSearch("beam", f"must be between 1 and {max_beam}, got {beam}")
        alpha = _number(fields, "alpha", float, defaults.alpha)
        if not 0.0 <= alpha <= MAX_ALPHA:
            raise BadSearch("alpha", f"must be between 0 and {MAX_ALPHA:g}, got {alpha}")
        if "alternatives" in fields:
            nbest, beam = alternatives + 1, max(beam, alternatives + 1)
        else:
            nbest = _number(fields, "nbest", int, 1)
            if not 1 <= nbest <= beam:
                raise BadSearch("nbest", f"must be between 1 and beam={beam}, got {nbest}")
        return defaults.replace(beam=beam, alpha=alpha, nbest=nbest)


@contextmanager
def as_flags() -> Iterator[None]:
    """A :class:`BadSearch` raised inside, raised again as a ValueError naming the command-line flag
    (``--nbest must be ...``)."""
    try:
        yield
    except BadSearch as e:
        raise ValueError(f"--{e.key.replace('_', '-')} {e.reason}") from None


def _number(fields: Mapping[str, Any], key: str, kind: type, default: Any) -> Any:
    """``fields[key]`` as an int or float (a form's "4" too), else ``default``; another value is a BadSearch."""
    if key not in fields:
        return default
    value = fields[key]
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise BadSearch(key, f"must be {'an integer' if kind is int else 'a number'}, got {value!r}") from None


PAPER = SearchOptions()  # the paper's search, §6.1
MODES = ("nbest", "sample", "mbr", "rerank")


def add_search_arguments(p, modes: Iterable[str] = MODES, lengths: bool = True) -> None:
    """The search options of a command that decodes, defaults the paper's: ``--beam``, ``--alpha``, with
    ``lengths`` ``--max-len-a``/``--max-len-b``, and the options of each of ``modes``: ``nbest``
    (``--nbest``), ``sample`` (``--sample`` and its filters), ``mbr`` (``--mbr`` ...), ``rerank`` (``--rerank``,
    ``--channel`` ...). :meth:`SearchOptions.from_args` reads them. ``p``: a parser or an argument group."""
    unknown = set(modes) - set(MODES)
    if unknown:
        raise ValueError(f"unknown search modes: {', '.join(sorted(unknown))}")
    p.add_argument("--beam", type=int, default=PAPER.beam, help=f"beam size; 1 = greedy (default {PAPER.beam})")
    p.add_argument(
        "--alpha", type=float, default=PAPER.alpha, help=f"length penalty ((5+|Y|)/6)^alpha (default {PAPER.alpha})"
    )
    if lengths:
        p.add_argument(
            "--max-len-a", type=float, default=PAPER.max_len_a, help="max output length = a*source length + b"
        )
        p.add_argument("--max-len-b", type=int, default=PAPER.max_len_b, help=f"(default {PAPER.max_len_b})")
    if "nbest" in modes:
        p.add_argument("--nbest", type=int, default=1, help="print the N best hypotheses (Moses n-best format)")
    if "sample" in modes:
        _add_sampling(p)
    if "mbr" in modes:
        _add_mbr(p)
    if "rerank" in modes:
        _add_rerank(p)


def _add_sampling(p) -> None:
    p.add_argument("--sample", action="store_true", help="sample tokens instead of searching")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling: divide the logits by this")
    p.add_argument("--top-k", type=int, default=0, help="sampling: keep the k likeliest tokens (0 = all)")
    p.add_argument("--top-p", type=float, default=1.0, help="sampling: nucleus filter (1.0 = none)")
    p.add_argument("--seed", type=int, default=1, help="sampling: line i is sampled with seed + i")


def _add_mbr(p) -> None:
    p.add_argument(
        "--mbr",
        type=int,
        default=0,
        metavar="N",
        help="minimum Bayes risk: choose among the beam's N best (N <= --beam; 0 = off)",
    )
    p.add_argument("--mbr-utility", choices=UTILITIES, default="bleu", help="sentence BLEU or chrF")
    p.add_argument(
        "--mbr-weights",
        choices=WEIGHTS,
        default="model",
        help="weigh pseudo-references by model probability or equally",
    )


def _add_rerank(p) -> None:
    p.add_argument(
        "--channel", metavar="DIR", help="target→source model directory for --rerank (a BiT run's RUN/bit-model is one)"
    )
    p.add_argument(
        "--rerank",
        type=int,
        default=0,
        metavar="N",
        help="noisy-channel reranking of the beam's N best with --channel (N <= --beam; 0 = off)",
    )
    p.add_argument(
        "--rerank-weight",
        type=float,
        default=1.0,
        metavar="LAMBDA",
        help="weight of the channel score log p(x|y)/(|x|+1) (default 1.0)",
    )
