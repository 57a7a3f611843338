"""Sentence-pair filters. Nothing is dropped silently: each filter returns how many pairs it removed.

- ``empty``: a side that is empty or only whitespace (every split: such a pair cannot be scored).
- ``duplicate``: an exact repeat of an earlier (source, target) pair (training data, optional).
- ``too_long``: a side with more than ``max_tokens_per_sentence`` subword tokens (training data, optional).
- ``ratio``: longer side / shorter side, in subword tokens, above ``max_ratio`` (training data, optional),
  as Moses' ``clean-corpus-n.perl`` does with words.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import check


@dataclass
class FilterSettings:
    max_tokens_per_sentence: int | None = None
    max_ratio: float | None = None
    dedup: bool = False

    def __post_init__(self):
        n = self.max_tokens_per_sentence
        check(n is None or n >= 1, "max_tokens_per_sentence", f"must be >= 1, got {n}")
        check(self.max_ratio is None or self.max_ratio >= 1, "max_ratio", f"must be >= 1, got {self.max_ratio}")


def token_filters(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, settings: FilterSettings, counts: dict[str, int]
) -> np.ndarray:
    """(B,) bool: pairs within ``max_tokens_per_sentence`` and ``max_ratio`` (lengths (B,) in subword
    tokens); adds how many each filter removed to ``counts`` (a pair too long is not also counted for ratio)."""
    longer, shorter = np.maximum(src_lengths, tgt_lengths), np.minimum(src_lengths, tgt_lengths)  # (B,)
    keep = np.ones(len(longer), dtype=bool)
    if settings.max_tokens_per_sentence is not None:
        too_long = longer > settings.max_tokens_per_sentence
        counts["too_long"] = counts.get("too_long", 0) + int(too_long.sum())
        keep &= ~too_long
    if settings.max_ratio is not None:
        ratio = keep & (longer / np.maximum(1, shorter) > settings.max_ratio)
        counts["ratio"] = counts.get("ratio", 0) + int(ratio.sum())
        keep &= ~ratio
    return keep
