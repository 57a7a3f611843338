"""Both directions of a split: every pair as source→target and again as target→source.

Bidirectional training (BiT; Ding et al., Findings of ACL 2021) trains the model on this doubled split
for the first part of the budget, then on the source→target pairs alone (``train.bidirectional``).
It adds no data and no language tag: the reversed copy only makes sense with one shared vocabulary,
so that a target id means the same piece on the source side.

    both = BothDirections(data.split("train"))     # len(both) == 2 * len(split)
    both.src[i], both.tgt[i]                        # pair i, i < N: as given; i >= N: pair i - N reversed
"""

from __future__ import annotations

import numpy as np

from .dataset import ParallelIds, TokenArray


def concatenate(a: TokenArray, b: TokenArray) -> TokenArray:
    """The sentences of ``a`` followed by those of ``b``, in memory."""
    ids = np.concatenate([np.asarray(a.ids), np.asarray(b.ids)])  # (sum of lengths,) int32
    offsets = np.concatenate([a.offsets, b.offsets[1:] + a.offsets[-1]])  # (N_a + N_b + 1,) int64
    return TokenArray(ids, offsets)


class BothDirections:
    """``split`` doubled: ``src`` = its sources then its targets, ``tgt`` = its targets then its sources.

    Has what :class:`~transduce.data.batching.TokenBatches` reads from a split (``name``, ``src``,
    ``tgt``, ``len()``); ``reversed(i)`` says whether pair ``i`` is a reversed copy.
    """

    def __init__(self, split: ParallelIds):
        self.name, self.forward = f"{split.name}+reversed", len(split)
        self.src = concatenate(split.src, split.tgt)
        self.tgt = concatenate(split.tgt, split.src)

    def __len__(self) -> int:
        return 2 * self.forward

    def reversed(self, i: int) -> bool:
        return i >= self.forward
