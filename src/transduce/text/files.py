"""Files translated with their structure kept: what ``transduce translate --input`` and the server's
``POST /translate_file`` share.

    .txt          a whole text (UTF-8): paragraphs split into sentences, layout kept (:mod:`.document`)
    .html, .htm   one HTML document (UTF-8): markup kept, tags placed by alignment (:mod:`.markup`)
    .srt          subtitles (UTF-8): each cue's text translated as a text, its number and timing kept
    .docx .pptx .odt .odp   each paragraph, its runs' formatting placed by alignment (:mod:`.office`)

:func:`read` turns a file's bytes into :class:`Units`: the texts or HTML snippets the model translates
and how their translations go back (:meth:`Units.write`); :func:`translate_file` runs them through a
:class:`~transduce.decode.translator.Translator`. The server runs the same units on its batchers.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import office
from .document import one_per_sentence, reassemble, sentences, source_language, split_text
from .markup import translate_html_batch

SUFFIXES = (".txt", ".html", ".htm", ".srt", ".docx", ".pptx", ".odt", ".odp")
OFFICE = (".docx", ".pptx", ".odt", ".odp")
NOT_SUPPORTED = {".epub": " (EPUB books: chapters of XHTML in a zip, not read here)"}
_CUE = re.compile(r"^(\d+\s*\n[^\n]*-->[^\n]*\n)(.*)$", re.DOTALL)
_TAG = re.compile(r"<[^>]*>")


class UnsupportedFile(ValueError):
    """A file whose suffix is none of :data:`SUFFIXES`."""


@dataclass
class Units:
    """A file's translatable units: plain texts (each split into sentences) or HTML snippets (``markup``:
    tags placed by alignment); ``kind`` names a unit in messages ("text", "document", "cue", "paragraph")."""

    name: str
    markup: bool
    texts: list[str]
    kind: str
    _write: Callable[[list[str]], bytes]

    @property
    def plain(self) -> str:
        """The units' text without markup, one per line: for size limits and language identification."""
        if not self.markup:
            return "\n".join(self.texts)
        return "\n".join(html.unescape(_TAG.sub("", t)) for t in self.texts)

    def write(self, translations: list[str]) -> bytes:
        """The file with each unit replaced by its translation (one per unit, in order)."""
        if len(translations) != len(self.texts):
            raise ValueError(f"{self.name}: {len(translations)} translations for {len(self.texts)} {self.kind}s")
        return self._write(translations)


def suffix_of(name: str) -> str:
    """``name``'s suffix if it is one of :data:`SUFFIXES`; else :class:`UnsupportedFile` naming the file."""
    suffix = Path(name).suffix.lower()
    if suffix not in SUFFIXES:
        why = NOT_SUPPORTED.get(suffix, "")
        raise UnsupportedFile(
            f"{name}: file type {suffix or '(none)'}{why} is not supported (supported: {', '.join(SUFFIXES)})"
        )
    return suffix


def srt_cues(text: str) -> list[tuple[str, str]]:
    """``(head, text)`` per cue: head is the number and timing lines (kept), text the lines translated;
    blocks that are not cues are kept whole as heads with no text."""
    blocks = re.split(r"(\n\s*\n)", text.replace("\r\n", "\n"))
    out = []
    for block in blocks:
        m = _CUE.match(block)
        out.append((m.group(1), m.group(2)) if m else (block, ""))
    return out


def read(data: bytes, name: str, max_unpacked: int | None = None) -> Units:
    """The units of file ``name`` (its suffix picks the format) holding ``data``; an office archive
    unpacking to more than ``max_unpacked`` bytes, a damaged one, or text that is not UTF-8 raises
    ValueError naming the file."""
    suffix = suffix_of(name)
    if suffix in OFFICE:
        try:
            archive, trees = office.read_parts(data, suffix, max_unpacked)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
        paras = office.paragraphs(trees, suffix)

        def write_office(translations: list[str]) -> bytes:
            for (paragraph, _), t in zip(paras, translations):
                office.put_back(paragraph, suffix, t)
            return office.write(archive, trees)

        return Units(name, True, [snippet for _, snippet in paras], "paragraph", write_office)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{name} is not UTF-8 text ({e})") from None
    if suffix == ".srt":
        cues = srt_cues(text)
        where = [i for i, (_, body) in enumerate(cues) if body.strip()]

        def write_srt(translations: list[str]) -> bytes:
            bodies = dict(zip(where, translations))
            return "".join(head + bodies.get(i, body) for i, (head, body) in enumerate(cues)).encode("utf-8")

        return Units(name, False, [cues[i][1] for i in where], "cue", write_srt)
    whole = lambda translations: translations[0].encode("utf-8")  # noqa: E731
    if suffix == ".txt":
        return Units(name, False, [text], "text", whole)
    return Units(name, True, [text], "document", whole)


@dataclass
class Done:
    """A translated file: its bytes, its units, and how many sentences the model translated."""

    data: bytes
    units: Units
    sentences: int


class _Counted:
    """``translator`` counting the sentences it is given."""

    def __init__(self, translator):
        self.inner, self.sentences = translator, 0

    def translate(self, batch: list[str], **options) -> list:
        self.sentences += len(batch)
        return self.inner.translate(batch, **options)


def translate_file(translator, data: bytes, name: str, lang: str | None = None, **options) -> Done:
    """File ``name`` (bytes ``data``) translated by ``translator`` with its structure kept. ``lang`` is the
    sentence splitter's language (default: the model's source language); ``options`` are
    :meth:`Translator.translate`'s (``search=SearchOptions(...)``, ...): one translation per sentence."""
    one_per_sentence(options, "a file")
    units = read(data, name)
    lang = lang or source_language(translator)
    counted = _Counted(translator)
    if units.markup:
        out = translate_html_batch(counted, units.texts, lang, **options) if units.texts else []
    else:
        pieces = [split_text(t, lang) for t in units.texts]
        batch = [s for p in pieces for s in sentences(p)]
        results = counted.translate(batch, **options) if batch else []
        out, start = [], 0
        for p in pieces:
            n = sum(piece.sentence for piece in p)
            out.append(reassemble(p, results[start : start + n]))
            start += n
    return Done(units.write(out), units, counted.sentences)
