"""Token-budget batches from length-sorted buckets, shuffled per epoch, sharded over ranks (§5.1).

Like fairseq's ``--max-tokens``, the budget counts padding: a batch of B pairs costs
``B * max(S, T)``, with S the longest source (ids + eos) and T the longest target (bos + ids + eos).
The paper used about 25,000 source and 25,000 target tokens per batch; ``DEFAULT_MAX_TOKENS`` is a
CPU-sized default.

One epoch, the same on every rank (all randomness comes from ``(seed, epoch)``):

1. shuffle the sentence indices, then stable-sort them by ``max(S, T)``, T, S (pairs of equal lengths
   are mixed differently every epoch; the sorted lengths are always the same);
2. fill batches greedily along that order up to ``max_tokens`` (the batch boundaries depend on the
   sorted lengths only, so every epoch has the same number of batches);
3. with R ranks, while the number of batches is not a multiple of R, halve the batch with the most
   sentences: nothing is dropped or duplicated, ranks get disjoint batches that together cover the
   epoch, and every rank gets the same number;
4. shuffle the batch order; rank r takes batches r, r+R, r+2R, ...

To resume inside an epoch, keep ``(epoch, batch_index)`` and call ``epoch(e, start=batch_index)``.

Memory: besides the split's lengths (int16), an epoch's plan holds one int32 index per sentence; building
it needs about 20 bytes per sentence for a moment (the shuffled order, its sort keys and the sort).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .dataset import ParallelIds, TokenArray
from .vocab import BOS_ID, EOS_ID, PAD_ID

DEFAULT_MAX_TOKENS = 4096


@dataclass
class Batch:
    """``src`` (B, S) ids + eos, ``tgt`` (B, T) bos + ids + eos, both right-padded with 0; ``index`` (B,)
    sentence indices in the split. Decoder input = ``tgt[:, :-1]``, labels = ``tgt[:, 1:]`` (§3.1).
    ``src_tokens``: non-pad source tokens; ``tgt_tokens``: label tokens (ids + eos)."""

    src: torch.Tensor
    tgt: torch.Tensor
    index: torch.Tensor
    src_tokens: int
    tgt_tokens: int

    def __len__(self) -> int:
        return self.src.shape[0]


class TokenBatches:
    """Batches of one split for one rank; ``len()`` is the number of batches per rank per epoch."""

    def __init__(
        self,
        split: ParallelIds,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        seed: int = 1,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
    ):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size - 1} (world_size {world_size})")
        self.split, self.max_tokens, self.seed, self.shuffle = split, max_tokens, seed, shuffle
        self.rank, self.world_size = rank, world_size
        width = self._width()  # (N,)
        if len(split) and width.max() > max_tokens:
            i = int(width.argmax())
            raise ValueError(
                f"split {split.name!r}, sentence {i}: needs {int(width[i])} tokens, more than "
                f"max_tokens={max_tokens}; raise max_tokens or prepare with --max-tokens-per-sentence"
            )
        del width
        if len(split) < world_size:
            raise ValueError(f"split {split.name!r} has {len(split)} sentences, fewer than {world_size} ranks")
        self._count = len(self._plan(0)) // world_size

    def __len__(self) -> int:
        return self._count

    def _width(self, order: np.ndarray | slice = slice(None)) -> np.ndarray:
        """max(S, T) of the sentences ``order`` (S = ids + eos, T = bos + ids + eos): what a sentence costs."""
        return np.maximum(self.split.src.lengths[order] + 1, self.split.tgt.lengths[order] + 2)

    def _plan(self, epoch: int) -> list[np.ndarray]:
        """Every rank's batches of ``epoch`` as int32 sentence-index arrays, in epoch order (steps 1-4)."""
        rng = np.random.default_rng([self.seed, epoch])
        n = len(self.split)
        order = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)  # (N,): rng.permutation(N)'s draws
        if self.shuffle:
            rng.shuffle(order)
        # sort by max(S, T), then T, then S; np.lexsort is stable, so exact ties keep the shuffled order
        src, tgt = self.split.src.lengths[order], self.split.tgt.lengths[order]  # (N,) each
        order = order[np.lexsort((src, tgt, np.maximum(src + 1, tgt + 2)))]
        del src, tgt
        batches = [order[a:b] for a, b in _greedy_bounds(self._width(order), self.max_tokens)]
        while len(batches) % self.world_size:
            big = max(range(len(batches)), key=lambda b: len(batches[b]))
            if len(batches[big]) < 2:
                raise ValueError(
                    f"split {self.split.name!r}: cannot make {len(batches)} one-sentence batches "
                    f"a multiple of {self.world_size} ranks; raise max_tokens"
                )
            half = len(batches[big]) // 2
            batches[big : big + 1] = [batches[big][:half], batches[big][half:]]
        if self.shuffle:
            batches = [batches[b] for b in rng.permutation(len(batches))]
        return batches

    def indices(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches of ``epoch`` as sentence-index arrays."""
        return self._plan(epoch)[self.rank :: self.world_size]

    def epoch(self, epoch: int, start: int = 0) -> list[Batch]:
        """This rank's batches of ``epoch``, from batch ``start`` on (to resume inside an epoch)."""
        return [self.make(idx) for idx in self.indices(epoch)[start:]]

    def make(self, idx: np.ndarray) -> Batch:
        """The padded tensors of the sentences ``idx``."""
        idx = np.sort(idx)
        src = _padded(self.split.src, idx, bos=False)  # (B, S)
        tgt = _padded(self.split.tgt, idx, bos=True)  # (B, T)
        return Batch(
            torch.from_numpy(src),
            torch.from_numpy(tgt),
            torch.from_numpy(idx.astype(np.int64)),
            int(self.split.src.lengths[idx].sum()) + len(idx),  # ids + eos
            int(self.split.tgt.lengths[idx].sum()) + len(idx),  # labels: ids + eos
        )

    def padding_fraction(self, epoch: int = 0) -> float:
        """Share of padding in all ranks' ``src`` and ``tgt`` tensors of ``epoch`` (0 = none)."""
        real = slots = 0
        src, tgt = self.split.src.lengths, self.split.tgt.lengths
        for idx in self._plan(epoch):
            real += int(src[idx].sum()) + int(tgt[idx].sum()) + 3 * len(idx)  # + eos, bos + eos
            slots += len(idx) * (int(src[idx].max()) + int(tgt[idx].max()) + 3)
        return 1 - real / slots if slots else 0.0


def _greedy_bounds(widths: np.ndarray, max_tokens: int) -> list[tuple[int, int]]:
    """(start, end) of each batch when ``widths`` (N,), non-decreasing, are filled greedily: a batch
    grows while (its size + 1) × the next width fits ``max_tokens``. Each end is found by binary
    search (size × width of the last grows with the end), so the cost is per batch, not per sentence."""
    bounds, start, n = [], 0, len(widths)
    while start < n:
        lo, hi = start + 1, min(n, start + max(1, max_tokens // int(widths[start])))  # the end lies in [lo, hi]
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if (mid - start) * int(widths[mid - 1]) <= max_tokens:
                lo = mid
            else:
                hi = mid - 1
        bounds.append((start, lo))
        start = lo
    return bounds


def _padded(arr: TokenArray, idx: np.ndarray, bos: bool) -> np.ndarray:
    """Sentences ``idx`` as rows ``[bos] + ids + [eos]``, right-padded with PAD_ID: (B, max len) int64."""
    lengths = arr.lengths[idx]  # (B,)
    lead = int(bos)
    out = np.full((len(idx), int(lengths.max()) + lead + 1), PAD_ID, dtype=np.int64)  # (B, L)
    rows = np.repeat(np.arange(len(idx)), lengths)  # (sum L,) row of every token
    cols = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)  # (sum L,)
    out[rows, cols + lead] = arr.ids[np.repeat(arr.offsets[idx], lengths) + cols]
    out[np.arange(len(idx)), lengths + lead] = EOS_ID
    if bos:
        out[:, 0] = BOS_ID
    return out
