"""Sentence-pair filters. Nothing is dropped silently: each filter returns how many pairs it removed.

- ``empty``: a side that is empty or only whitespace (every split: such a pair cannot be scored).
- ``duplicate``: an exact repeat of an earlier (source, target) pair (training data, optional).
- ``too_long``: a side with more than ``max_tokens_per_sentence`` subword tokens (training data, optional).
- ``ratio``: longer side / shorter side, in subword tokens, above ``max_ratio`` (training data, optional),
  as Moses' ``clean-corpus-n.perl`` does with words.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..config import check
from .corpora import SplitText


@dataclass
class FilterSettings:
    max_tokens_per_sentence: int | None = None
    max_ratio: float | None = None
    dedup: bool = False

    def __post_init__(self):
        n = self.max_tokens_per_sentence
        check(n is None or n >= 1, "max_tokens_per_sentence", f"must be >= 1, got {n}")
        check(self.max_ratio is None or self.max_ratio >= 1, "max_ratio", f"must be >= 1, got {self.max_ratio}")


def select(split: SplitText, keep: Sequence[int]) -> SplitText:
    return SplitText([split.src[i] for i in keep], [split.tgt[i] for i in keep], dict(split.skipped))


def text_filters(split: SplitText, dedup: bool) -> tuple[SplitText, dict[str, int]]:
    """Drop empty pairs, then (``dedup``) repeated pairs, keeping the first occurrence."""
    keep, seen, counts = [], set(), {"empty": 0}
    if dedup:
        counts["duplicate"] = 0
    for i, (s, t) in enumerate(zip(split.src, split.tgt)):
        if not s.strip() or not t.strip():
            counts["empty"] += 1
        elif dedup and (s, t) in seen:
            counts["duplicate"] += 1
        else:
            seen.add((s, t))
            keep.append(i)
    return select(split, keep), counts


def token_filters(
    src_lengths: Sequence[int], tgt_lengths: Sequence[int], settings: FilterSettings
) -> tuple[list[int], dict[str, int]]:
    """Indices of pairs within ``max_tokens_per_sentence`` and ``max_ratio``, and how many each filter removed."""
    keep, counts = [], {}
    limit = settings.max_tokens_per_sentence
    if limit is not None:
        counts["too_long"] = 0
    if settings.max_ratio is not None:
        counts["ratio"] = 0
    for i, (s, t) in enumerate(zip(src_lengths, tgt_lengths)):
        if limit is not None and max(s, t) > limit:
            counts["too_long"] += 1
        elif settings.max_ratio is not None and max(s, t) / max(1, min(s, t)) > settings.max_ratio:
            counts["ratio"] += 1
        else:
            keep.append(i)
    return keep, counts
