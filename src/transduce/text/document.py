"""Documents in, documents out: paragraphs split into sentences and put back together.

A document is plain text; a *paragraph* is a run of non-blank lines. Each paragraph is split into
sentences by ``sentencex`` (Wikimedia's rule-based segmenter: about 300 languages through language
fallbacks, and about 1,000× faster than ``pysbd`` on English, which matters for gigabyte inputs; see
docs/documents.md). Closing quotes and brackets after a sentence's end belong to that sentence (``…was it?”``,
``…left.")``), including those the segmenter leaves at the start of the next sentence, and a sentence end
behind them followed by whitespace and a capital is a boundary too. Everything that is not a sentence's text — blank lines, the whitespace between
sentences, a paragraph's leading indentation and trailing newline, ``\\r\\n`` line ends — is kept verbatim,
so ``"".join`` of the pieces gives the input back exactly. Inside a sentence, a run of whitespace
(a line break of wrapped text, double spaces) is given to the model as one space.

A document is a list of :class:`Piece` s; :func:`split_text` makes them and :func:`reassemble` puts
translations in place of the sentence pieces.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from sentencex import segment

from ..decode.search_options import LOOSE, SearchOptions

_SPACE = re.compile(r"\s+")
_EDGES = re.compile(r"^(\s*)(.*?)(\s*)$", re.DOTALL)
_QUOTES = "\"'\u2018-\u201f\u00ab\u00bb\u2039\u203a"  # straight and typographic, either way round
_CLOSING = _QUOTES + ")\\]}\u300d\u300f\uff09"
_ENDS = ".!?\u2026"
# closing marks (and sentence ends) the segmenter left at the start of the next sentence, then whitespace
_CLOSERS = re.compile(f"([{_CLOSING}{_ENDS}]+)(?=\\s|$)")
# a sentence end, closing marks, whitespace, then opening marks and a letter: maybe a boundary the segmenter missed
_CLOSED_END = re.compile(f"[{_ENDS}][{_CLOSING}]+(\\s+)[{_QUOTES}(\\[]*([^\\W\\d_])")
# a sentence piece longer than this that holds sentence ends inside quotes or brackets is split at them
LONG_SENTENCE_CHARS = 200
_PAIRED = re.compile(f"[{_QUOTES}`()\\[\\]{{}}\u300c-\u300f\uff08\uff09]")
_CLOSING_RUN = re.compile(f"[{_QUOTES}`)\\]}}\u300d\u300f\uff09{_ENDS}]*")


@dataclass(frozen=True)
class Piece:
    """A stretch of the input: a sentence to translate (``sentence`` True) or text kept verbatim."""

    text: str
    sentence: bool = False

    @property
    def source(self) -> str:
        """What the model translates: the sentence with each whitespace run as one space."""
        return _SPACE.sub(" ", self.text)


def _spans(lang: str, text: str):
    """``(start, end)`` of each sentence the segmenter finds in ``text``, in order; it stops where the segmenter
    changed the text (what follows is then one sentence, for the caller)."""
    pos = 0
    for seg in segment(lang, text):
        if not seg:
            continue
        start = text.find(seg, pos)
        if start < 0:
            return
        pos = start + len(seg)
        yield start, pos


def _stretch(text: str) -> list[Piece]:
    """A stretch of text as its leading whitespace, its sentence and its trailing whitespace (those not empty)."""
    lead, core, trail = _EDGES.match(text).groups()
    return [Piece(t, s) for t, s in ((lead, False), (core, True), (trail, False)) if t]


def split_paragraph(text: str, lang: str) -> list[Piece]:
    """Sentences and the verbatim whitespace around them; ``"".join(p.text for p in pieces) == text``."""
    pieces: list[Piece] = []
    pos = 0
    for start, end in _spans(lang, text):
        if start > pos:
            pieces.append(Piece(text[pos:start]))
        pieces += _stretch(text[start:end])
        pos = end
    if pos < len(text):  # the segmenter changed the text: the rest is one sentence
        pieces += _stretch(text[pos:])
    return _merge([q for p in _closers_back(pieces) for q in _split_closed(p) for q in _split_long(q, lang)])


def _split_long(piece: Piece, lang: str) -> list[Piece]:
    """A sentence piece of more than ``LONG_SENTENCE_CHARS`` characters cut at the sentence ends inside its
    quotes and brackets. The segmenter keeps a quotation or a bracket whole, however many sentences it
    holds (``"The patriarchs … sold him. God was with him. …"`` over 800 characters in Acts 7), and a model
    trained on sentences translates such a stretch worse and slower than its sentences one by one; a short
    quotation (``"Stop. Now," he said.``) stays one piece. The marks are hidden from a second segmentation
    (each replaced by a space, so positions are unchanged) and stay in the text of the sentence they begin or
    end: the marks right after a sentence's end close it, those after the space open the next."""
    if not piece.sentence or len(piece.text) <= LONG_SENTENCE_CHARS:
        return [piece]
    text, hidden = piece.text, _PAIRED.sub(" ", piece.text)
    # each sentence's last character, then the marks that close it
    bounds = [
        _CLOSING_RUN.match(text, start + len(hidden[start:end].rstrip())).end() for start, end in _spans(lang, hidden)
    ]
    if len(bounds) < 2:
        return [piece]
    cuts = [0, *bounds[:-1], len(text)]
    return [q for a, b in zip(cuts, cuts[1:]) for q in _stretch(text[a:b])]


def _closers_back(pieces: list[Piece]) -> list[Piece]:
    """Closing marks the segmenter put at the start of the next sentence (``?'”``, ``.")``, German ``?“``)
    given back to the sentence they close, so the whitespace after them lies between the sentences."""
    out: list[Piece] = []
    for p in pieces:
        run = _CLOSERS.match(p.text) if out and out[-1].sentence and p.sentence else None
        if run is None:
            out.append(p)
            continue
        out[-1] = Piece(out[-1].text + run.group(1), sentence=True)
        out += _stretch(p.text[run.end(1) :])
    return out


def _split_closed(piece: Piece) -> list[Piece]:
    """A sentence piece cut where a sentence end and closing marks are followed by whitespace and a capital
    (``…left.") Then``, ``…asked?!] She``; not a lower-case letter): boundaries the segmenter does not see
    behind a bracket or quote."""
    if not piece.sentence:
        return [piece]
    out, pos = [], 0
    for m in _CLOSED_END.finditer(piece.text):
        if not m.group(2).islower():
            out += [Piece(piece.text[pos : m.start(1)], True), Piece(m.group(1))]
            pos = m.end(1)
    return out + [Piece(piece.text[pos:], True)]


def _merge(pieces: list[Piece]) -> list[Piece]:
    """Join neighbouring verbatim pieces (fewer, longer pieces; the text is unchanged)."""
    out: list[Piece] = []
    for p in pieces:
        if out and not p.sentence and not out[-1].sentence:
            out[-1] = Piece(out[-1].text + p.text)
        else:
            out.append(p)
    return out


def paragraphs(lines: Iterable[str], max_chars: int = 1 << 16) -> Iterator[tuple[str, bool]]:
    """Group lines (each with its line end) into ``(text, is_paragraph)`` blocks: paragraphs of non-blank
    lines and runs of blank lines. A paragraph longer than ``max_chars`` characters is cut at a line
    end (memory stays bounded on inputs without blank lines); a sentence running over the cut is then
    translated as two."""
    block: list[str] = []
    size, para = 0, None
    for line in lines:
        blank = not line.strip()
        if block and (para == blank or (para and size >= max_chars)):
            yield "".join(block), bool(para)
            block, size = [], 0
        block.append(line)
        size += len(line)
        para = not blank
    if block:
        yield "".join(block), bool(para)


def split_text(text: str, lang: str) -> list[Piece]:
    """A whole document as pieces: each paragraph split into sentences, blank lines verbatim."""
    out: list[Piece] = []
    for block, is_para in paragraphs(text.splitlines(keepends=True), max_chars=len(text) + 1):
        out += split_paragraph(block, lang) if is_para else [Piece(block)]
    return _merge(out)


def reassemble(pieces: list[Piece], translations: Iterable[str]) -> str:
    """The document with each sentence piece replaced by the next translation, in order."""
    given = list(translations)
    wanted = sum(p.sentence for p in pieces)
    if len(given) != wanted:
        raise ValueError(f"{len(given)} translations for {wanted} sentences")
    it = iter(given)
    return "".join(next(it) if p.sentence else p.text for p in pieces)


def sentences(pieces: list[Piece]) -> list[str]:
    """The model inputs of a document's sentence pieces, in order."""
    return [p.source for p in pieces if p.sentence]


def translate_document(translator, text: str, lang: str | None = None, **options) -> str:
    """Translate a plain-text document with a :class:`~transduce.decode.translator.Translator`:
    every sentence in one batched call, paragraphs and whitespace as in ``text``. ``lang`` (the
    segmenter's language) defaults to the model's source language, else English rules. ``options``
    are :meth:`Translator.translate`'s (``search=SearchOptions(...)``, ...): one translation per sentence."""
    one_per_sentence(options, "a document")
    lang = lang or source_language(translator)
    pieces = split_text(text, lang)
    return reassemble(pieces, translator.translate(sentences(pieces), **options))


def one_per_sentence(options: dict[str, Any], who: str) -> None:
    """Refuse translation ``options`` whose search gives several translations per sentence, where ``who`` (a
    document, HTML, a file) puts one in each sentence's place: :meth:`SearchOptions.check`'s rule."""
    loose = {k: options[k] for k in LOOSE if k in options}
    SearchOptions.of(options.get("search"), **loose).check(one=who)


def source_language(translator) -> str:
    """The model directory's source language code (``[meta] src_lang``), or ``"en"``."""
    return str(translator.meta.get("src_lang") or "en")
