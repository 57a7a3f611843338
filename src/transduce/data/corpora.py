"""What every corpus reader returns: NFC text per split, what was skipped, and the inputs' hashes.

The readers are :mod:`.multi30k`, :mod:`.bible`, :mod:`.userfiles` and :mod:`.wmt`; :mod:`.prepare` turns a
:class:`Corpus` into a data directory.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .reading import Lines
from .sources import Source

DEFAULT_CACHE = "~/.cache/transduce"


@dataclass
class SplitText:
    """Aligned sentences of one split; ``skipped`` counts pairs left out while reading, by reason."""

    src: list[str]
    tgt: list[str]
    skipped: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.src)


@dataclass
class StreamSplit:
    """A split read from files while it is built, never held in memory: one or more weighted corpora."""

    sources: list[Source]

    def __len__(self) -> int:
        raise TypeError("a streamed split has no length before it is read")


@dataclass
class Corpus:
    """A parallel corpus: splits read into memory (:class:`SplitText`) or streamed (:class:`StreamSplit`).

    ``inputs`` maps each input (a file, a database and version) to its SHA-256, so a data
    directory knows when to rebuild; ``aliases`` maps extra split names to stored ones
    (Multi30k: ``test_2016_flickr`` -> ``test``); ``info`` is recorded in the manifest as is.
    """

    name: str
    src_lang: str
    tgt_lang: str
    splits: dict[str, SplitText | StreamSplit]
    inputs: dict[str, str]
    aliases: dict[str, str] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


def pair_lines(src: Lines, tgt: Lines) -> SplitText:
    """Pairs of two aligned files; a pair with an undecodable side (``--skip-invalid``) is counted."""
    keep = [(a, b) for a, b in zip(src.lines, tgt.lines) if a is not None and b is not None]
    skipped = len(src.lines) - len(keep)
    return SplitText([a for a, _ in keep], [b for _, b in keep], {"invalid_utf8": skipped} if skipped else {})


def split_sources(split: SplitText | StreamSplit, skip_invalid: bool) -> list[tuple[str, float, Iterator]]:
    """(corpus name, weight, pair generator) for each corpus of ``split``."""
    if isinstance(split, StreamSplit):
        return [(s.name, s.weight, s.pairs(skip_invalid)) for s in split.sources]
    return [("", 1.0, zip(split.src, split.tgt))]
