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
        self.src_len = split.src.lengths + 1  # (N,) ids + eos
        self.tgt_len = split.tgt.lengths + 2  # (N,) bos + ids + eos
        self.width = np.maximum(self.src_len, self.tgt_len)  # (N,)
        if len(split) and self.width.max() > max_tokens:
            i = int(self.width.argmax())
            raise ValueError(
                f"split {split.name!r}, sentence {i}: needs {int(self.width[i])} tokens, more than "
                f"max_tokens={max_tokens}; raise max_tokens or prepare with --max-tokens-per-sentence"
            )
        if len(split) < world_size:
            raise ValueError(f"split {split.name!r} has {len(split)} sentences, fewer than {world_size} ranks")
        self._count = len(self._plan(0)) // world_size

    def __len__(self) -> int:
        return self._count

    def _plan(self, epoch: int) -> list[np.ndarray]:
        """Every rank's batches of ``epoch`` as sentence-index arrays, in epoch order (steps 1-4)."""
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(len(self.split)) if self.shuffle else np.arange(len(self.split))
        # sort by max(S, T), then T, then S; np.lexsort is stable, so exact ties keep the shuffled order
        order = order[np.lexsort((self.src_len[order], self.tgt_len[order], self.width[order]))]
        batches, start = [], 0
        for end in range(1, len(order) + 1):
            if end < len(order) and (end + 1 - start) * self.width[order[end]] <= self.max_tokens:
                continue
            batches.append(order[start:end])
            start = end
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
            int(self.src_len[idx].sum()),
            int(self.tgt_len[idx].sum() - len(idx)),
        )

    def padding_fraction(self, epoch: int = 0) -> float:
        """Share of padding in all ranks' ``src`` and ``tgt`` tensors of ``epoch`` (0 = none)."""
        real = slots = 0
        for idx in self._plan(epoch):
            real += int(self.src_len[idx].sum() + self.tgt_len[idx].sum())
            slots += len(idx) * int(self.src_len[idx].max() + self.tgt_len[idx].max())
        return 1 - real / slots if slots else 0.0


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
