"""A split with the model's own translations of it added: data diversification.

Data diversification (Nguyen et al., NeurIPS 2020) trains on the original pairs plus the pairs a forward
model and a backward model make of them: (x, f(x)) and (b(y), y). With BiT (``train.bidirectional``) one
model already translates both ways when the run switches to source→target, so the trainer makes both
halves there (``train.diversify``, :mod:`transduce.train.diversify`) and trains on this split afterwards.

    split = Diversified(pairs, forward=[f(x) ids...], backward=[b(y) ids...])
    split.src[i], split.tgt[i]    # i < N: pair i, then the (x, f(x)) pairs, then the (b(y), y) pairs

Either list may be None (``train.diversify = "forward"`` or ``"back"``): that half is left out;
a None inside a list leaves that one made pair out.
"""

from __future__ import annotations

from typing import Sequence

from .bidirectional import concatenate
from .dataset import ParallelIds, TokenArray


class Diversified:
    """``split`` followed by its forward translations (as targets) and back-translations (as sources).

    A ``None`` in either list leaves that made pair out (the trainer drops empty and runaway outputs);
    ``kept`` counts the made pairs of each part. Has what :class:`~transduce.data.batching.TokenBatches`
    reads from a split (``name``, ``src``, ``tgt``, ``len()``); ``origin(i)`` says where pair ``i`` comes from.
    """

    def __init__(self, split: ParallelIds, forward: Sequence[Sequence[int] | None] | None,
                 backward: Sequence[Sequence[int] | None] | None):
        n = len(split)
        for name, made in (("forward", forward), ("backward", backward)):
            if made is not None and len(made) != n:
                raise ValueError(f"{name} translations: {len(made)} sentences for a split of {n} pairs")
        src, tgt = split.src, split.tgt
        self.kept: dict[str, int] = {}
        self._ends = [("original", n)]  # (part, index one past its last pair)
        if forward is not None:
            keep = [i for i, ids in enumerate(forward) if ids is not None]
            src = concatenate(src, TokenArray.from_sentences([split.src[i] for i in keep]))
            tgt = concatenate(tgt, TokenArray.from_sentences([forward[i] for i in keep]))
            self._ends.append(("forward", len(src)))
            self.kept["forward"] = len(keep)
        if backward is not None:
            keep = [i for i, ids in enumerate(backward) if ids is not None]
            src = concatenate(src, TokenArray.from_sentences([backward[i] for i in keep]))
            tgt = concatenate(tgt, TokenArray.from_sentences([split.tgt[i] for i in keep]))
            self._ends.append(("backward", len(src)))
            self.kept["backward"] = len(keep)
        self.src, self.tgt = src, tgt
        self.name = "+".join([split.name] + list(self.kept))

    def __len__(self) -> int:
        return len(self.src)

    def origin(self, i: int) -> str:
        """``"original"``, ``"forward"`` (a made target) or ``"backward"`` (a made source)."""
        if not 0 <= i < len(self):
            raise IndexError(f"pair {i} of {len(self)}")
        return next(part for part, end in self._ends if i < end)
