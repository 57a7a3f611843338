"""De-duplication in bounded memory: an 8-byte BLAKE2b digest per pair, never the strings.

Memory is 8 bytes per pair (a numpy ``uint64`` array, grown in blocks), about 40 while
:func:`first_occurrences` sorts them; two different pairs share a digest with probability about
n² / 2⁶⁵ (1 in 1.8 million for 4.5 million pairs), which would drop one pair as a repeat.
"""

from __future__ import annotations

from hashlib import blake2b

import numpy as np

SEPARATOR = "\x00"  # never in the text of a line, so ("a b", "c") and ("a", "b c") differ


def pair_digest(src: str, tgt: str) -> int:
    """The pair's 8-byte BLAKE2b digest as an unsigned integer."""
    return int.from_bytes(blake2b((src + SEPARATOR + tgt).encode(), digest_size=8).digest(), "little")


class Digests:
    """An append-only ``uint64`` array of digests: ``append(d)``, ``array()`` (n,)."""

    BLOCK = 1 << 16

    def __init__(self):
        self._blocks: list[np.ndarray] = []
        self._current = np.empty(self.BLOCK, dtype=np.uint64)
        self._fill = 0

    def append(self, digest: int) -> None:
        if self._fill == self.BLOCK:
            self._blocks.append(self._current)
            self._current, self._fill = np.empty(self.BLOCK, dtype=np.uint64), 0
        self._current[self._fill] = digest
        self._fill += 1

    def __len__(self) -> int:
        return len(self._blocks) * self.BLOCK + self._fill

    @property
    def nbytes(self) -> int:
        return (len(self._blocks) + 1) * self.BLOCK * 8

    def array(self) -> np.ndarray:
        return np.concatenate(self._blocks + [self._current[: self._fill]])  # (n,) uint64


def first_occurrences(digests: np.ndarray) -> np.ndarray:
    """(n,) bool: True where a digest appears for the first time (the pair to keep)."""
    keep = np.zeros(len(digests), dtype=bool)
    if len(digests):
        _, first = np.unique(digests, return_index=True)  # index of each digest's first occurrence
        keep[first] = True
    return keep


def sampled(digests: np.ndarray, fraction: float) -> np.ndarray:
    """(n,) bool: a fixed ``fraction`` of the pairs, chosen by digest (the same pairs on every run)."""
    return digests < np.uint64(min(fraction, 1.0) * float(2**64 - 1))
