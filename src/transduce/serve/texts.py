"""Whole texts in, whole texts out: what the LibreTranslate API does with a ``q`` before and after the model.

``format: text``: each text is split into paragraphs and sentences (:mod:`transduce.text.document`,
the same splitting as ``transduce translate --document``); the sentences of every text of a request go
to the model together, and each text is put back with its blank lines, indentation and line ends exactly
as sent. Nothing is lost on the way:

- a sentence with nothing to translate (no letter: emoji, numbers, punctuation; or a bare URL or e-mail
  address) is not sent to the model and comes back as it is (:func:`needs_model`);
- a translation without a letter or digit (an empty hypothesis: the model's first token was ``</s>``) is
  replaced by its source sentence, as LibreTranslate answers an empty translation with the source
  (:func:`or_source`), so every sentence of a text is in its translation;
- a text all in lower case is answered in lower case, one all in upper case in upper case, as
  LibreTranslate answers (:func:`keep_case`, applied to the whole text, alternatives included).

``format: html``: each snippet must parse (:func:`transduce.text.markup.parse`). One that does not (an
unclosed ``<p>``, a stray end tag) is repaired as browsers do, by lxml's HTML parser, and translated
in its repaired form; a snippet lxml cannot read either is a 400 naming the problem. Its sentences follow
the first two rules above too (:func:`aligned`); its case is the model's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..decode.translator import Translation
from ..text.document import Piece, reassemble, split_text
from .service import Rejected

_LETTER_OR_DIGIT = re.compile(r"[^\W_]")
_BARE_ADDRESS = re.compile(r"(?:[a-z][a-z0-9+.-]*://|www\.)\S+|[^\s@]+@[^\s@]+\.[^\s@]+", re.IGNORECASE)


def needs_model(sentence: str) -> bool:
    """Whether ``sentence`` is translated: it has a letter and is not a bare URL or e-mail address."""
    return any(c.isalpha() for c in sentence) and not _BARE_ADDRESS.fullmatch(sentence.strip())


def or_source(source: str, translation: str) -> str:
    """``translation``, or ``source`` where the translation has no letter or digit (empty, a lone full stop)."""
    return translation if _LETTER_OR_DIGIT.search(translation) else source


def aligned(source: str, result: Translation | None) -> Translation:
    """An HTML sentence's translation (None: not translated): ``result``, or where it has no letter or digit
    (or is None) the source itself with each word aligned to itself."""
    if result is not None and _LETTER_OR_DIGIT.search(result.text):
        return result
    return Translation(source, [], 0.0, 0.0, [(i, i) for i in range(len(source.split()))])


def keep_case(source: str, translation: str) -> str:
    """``translation`` in lower case where every cased letter of ``source`` is lower case, in upper case where
    every one is upper case (Python's ``str.islower`` / ``isupper``); otherwise as it is."""
    if source.islower():
        return translation.lower()
    return translation.upper() if source.isupper() else translation


@dataclass
class Split:
    """The texts of a request as sentence pieces; ``sentences`` are the model's inputs, all texts in order."""

    pieces: list[list[Piece]]

    @property
    def sentences(self) -> list[str]:
        return [p.source for text in self.pieces for p in text if p.sentence]

    @property
    def to_translate(self) -> list[str]:
        """The sentences the model sees (:func:`needs_model`), in order."""
        return [s for s in self.sentences if needs_model(s)]

    def fill(self, translated: list[list[str]]) -> list[list[str]]:
        """Outputs for every sentence from ``translated`` (each sentence of :attr:`to_translate`'s outputs,
        best first): each output through :func:`or_source`; the sentences not translated as they are."""
        given = iter(translated)
        return [[or_source(s, t) for t in next(given)] if needs_model(s) else [s] for s in self.sentences]

    def join(self, translations: list[str]) -> list[str]:
        """Each text with its sentences replaced by ``translations`` (one per sentence, in order)."""
        out, start = [], 0
        for pieces in self.pieces:
            n = sum(p.sentence for p in pieces)
            out.append(reassemble(pieces, translations[start : start + n]))
            start += n
        return out


def split(texts: list[str], lang: str) -> Split:
    """``texts`` split into sentences by the segmenter rules of ``lang`` (a language code)."""
    return Split([split_text(text, lang) for text in texts])


def repaired_html(text: str, index: int) -> str:
    """``text`` if it parses strictly, else its repair by lxml's lenient HTML parser (module docstring)."""
    from ..text.markup import parse

    try:
        parse(text)
        return text
    except ValueError as strict:
        problem = strict
    try:
        import lxml.html

        parts = lxml.html.fragments_fromstring(text)
        fixed = "".join(p if isinstance(p, str) else lxml.html.tostring(p, encoding="unicode") for p in parts)
        parse(fixed)
        return fixed
    except Exception:  # noqa: BLE001 - lxml missing or unable: the strict parser's message names the problem
        raise Rejected(400, f"Invalid request: q.{index} is not well-formed HTML: {problem}") from None
