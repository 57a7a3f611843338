"""Streaming translation: read a chunk, translate it, write it, flush, repeat.

Memory is bounded by the chunk (``chunk`` sentences, at most one overlong paragraph more), not by the
input: a 1 GB file is never held in memory. Output comes in input order, and each chunk is flushed
as soon as it is translated, so an interrupted run (Ctrl-C) leaves every finished chunk written.
Because translations do not depend on their batch (:mod:`~transduce.decode.translator`), the chunk
size does not change the output.

A *unit* is what is written together: a line (line mode) or a paragraph or run of blank lines
(document mode). Each unit is a list of :class:`~transduce.text.document.Piece` s; its sentence
pieces are translated, the rest written as is.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TextIO

from .document import Piece, paragraphs, split_paragraph

DEFAULT_CHUNK = 2000  # sentences translated (and sorted into batches) together


@dataclass
class Unit:
    pieces: list[Piece]
    line: int  # input line number (from 1) where the unit starts
    end: int  # input bytes read up to the end of this unit
    raw: bool = False  # translate the sentence pieces as they are (line mode), not whitespace-collapsed

    @property
    def sentences(self) -> list[str]:
        return [p.text if self.raw else p.source for p in self.pieces if p.sentence]


def decoded_lines(stream: Iterable[bytes], name: str, counter: list[int] | None = None) -> Iterator[str]:
    """Strict UTF-8 lines, each with its line end; an error names the file and line. ``counter[0]``
    is kept at the number of bytes read."""
    for n, raw in enumerate(stream, 1):
        if counter is not None:
            counter[0] += len(raw)
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{name}:{n}: invalid UTF-8 at byte {e.start}") from None


def line_units(stream: Iterable[bytes], name: str) -> Iterator[Unit]:
    """Line mode: one sentence per line; the output line ends with ``\\n``."""
    read = [0]
    for n, line in enumerate(decoded_lines(stream, name, read), 1):
        text = line.rstrip("\n").rstrip("\r")
        yield Unit([Piece(text, sentence=True)], n, read[0], raw=True)


def document_units(stream: Iterable[bytes], name: str, lang: str) -> Iterator[Unit]:
    """Document mode: paragraphs split into sentences, blank lines kept (:mod:`.document`)."""
    read, line = [0], [1]

    def lines():
        for text in decoded_lines(stream, name, read):
            yield text
            line[0] += 1

    start = 1
    for block, is_para in paragraphs(lines()):
        pieces = split_paragraph(block, lang) if is_para else [Piece(block)]
        yield Unit(pieces, start, read[0])
        start = line[0]


def chunks(units: Iterable[Unit], size: int) -> Iterator[list[Unit]]:
    """Consecutive units holding about ``size`` sentences (a unit is never split)."""
    chunk: list[Unit] = []
    count = 0
    for unit in units:
        chunk.append(unit)
        count += len(unit.sentences)
        if count >= size:
            yield chunk
            chunk, count = [], 0
    if chunk:
        yield chunk


@dataclass
class StreamStats:
    sentences: int = 0
    tokens: int = 0  # output tokens with eos
    seconds: float = 0.0  # in the translator


def translate_stream(
    translate: Callable[[list[str]], list],
    units: Iterable[Unit],
    out: TextIO,
    render: Callable[[Unit, list, int], str],
    chunk: int = DEFAULT_CHUNK,
    name: str = "<stdin>",
    progress=None,
) -> StreamStats:
    """Translate ``units`` chunk by chunk with ``translate(sentences) -> results`` and write
    ``render(unit, its results, index of its first sentence)`` for each unit, flushing after each chunk.

    Warnings raised while translating a chunk (e.g. truncated sentences) are printed to stderr with
    the input lines the chunk covers. ``progress``: a tqdm bar (or None) advanced by bytes read.
    """
    stats = StreamStats()
    done_bytes = 0
    for part in chunks(units, chunk):
        batch = [s for u in part for s in u.sentences]
        start = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                results = translate(batch) if batch else []
            except ValueError as e:
                raise ValueError(f"{name}, lines {part[0].line}-{part[-1].line} ({e})") from None
        stats.seconds += time.perf_counter() - start
        for w in caught:
            print(
                f"transduce translate: warning: {name}, lines {part[0].line}-{part[-1].line}: {w.message}",
                file=sys.stderr,
            )
        k = stats.sentences
        for unit in part:
            n = len(unit.sentences)
            out.write(render(unit, results[k - stats.sentences : k - stats.sentences + n], k))
            k += n
        out.flush()
        stats.sentences = k
        stats.tokens += sum(_tokens(r) for r in results)
        if progress is not None:
            progress.update(part[-1].end - done_bytes)
            progress.set_postfix_str(
                f"{stats.sentences} sent, {stats.tokens / max(stats.seconds, 1e-9):.0f} tok/s", refresh=True
            )
        done_bytes = part[-1].end
    return stats


def _tokens(result) -> int:
    """Output tokens (with eos) of a result, its 1-best for an n-best list; 0 for plain strings."""
    first = result[0] if isinstance(result, list) else result
    return len(first.tokens) + 1 if hasattr(first, "tokens") else 0


def progress_bar(total: int | None):
    """A tqdm bar over input bytes on stderr when stderr is a terminal, else None (nothing printed)."""
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(
        total=total, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr, dynamic_ncols=True, desc="translate"
    )
