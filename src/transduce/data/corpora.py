"""What every corpus reader returns: NFC text per split, what was skipped, and the inputs' hashes.

The readers are :mod:`.multi30k`, :mod:`.bible` and :mod:`.userfiles`; :mod:`.prepare` turns a
:class:`Corpus` into a data directory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .reading import Lines

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
class Corpus:
    """A parallel corpus read into memory.

    ``inputs`` maps each input (a file, a database and version) to its SHA-256, so a data
    directory knows when to rebuild; ``aliases`` maps extra split names to stored ones
    (Multi30k: ``test_2016_flickr`` -> ``test``); ``info`` is recorded in the manifest as is.
    """

    name: str
    src_lang: str
    tgt_lang: str
    splits: dict[str, SplitText]
    inputs: dict[str, str]
    aliases: dict[str, str] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


def pair_lines(src: Lines, tgt: Lines) -> SplitText:
    """Pairs of two aligned files; a pair with an undecodable side (``--skip-invalid``) is counted."""
    keep = [(a, b) for a, b in zip(src.lines, tgt.lines) if a is not None and b is not None]
    skipped = len(src.lines) - len(keep)
    return SplitText([a for a, _ in keep], [b for _, b in keep], {"invalid_utf8": skipped} if skipped else {})
