"""BPE-dropout (Provilkov et al., 2020): a new random segmentation of the training text every epoch.

While a word is segmented, each BPE merge is skipped with probability ``p`` (SentencePiece's sampling
mode for BPE models: ``enable_sampling=True, alpha=p, nbest_size=-1``), so a small corpus seen for dozens
of epochs shows the model many segmentations of each word. Validation, evaluation and translation keep
the deterministic segmentation. Not in the paper; a regulariser, off by default (``train.subword_dropout``).

Seeded, SentencePiece's draws repeat within a process but differ between processes (measured with 0.2.3),
so the trainer samples on rank 0 and broadcasts the epoch's segmentation (every rank makes its batch plan
from the same lengths), and checkpoints store it (a resumed run finishes the epoch on the same one).
"""

from __future__ import annotations

import numpy as np
import sentencepiece as spm
import torch

from .dataset import ParallelIds, TokenArray
from .vocab import Vocabs


class SampledSplit:
    """One epoch's segmentation of ``split``; used like a :class:`ParallelIds` (``name``, ``src``, ``tgt``,
    ``len``). Build it with :meth:`sample`, or from a checkpoint's :meth:`tensors` with :meth:`from_tensors`.

    ``kept`` counts the pairs that keep their prepared ids; ``tokens`` and ``base_tokens`` are the
    (source, target) ids of this segmentation and of the prepared one.
    """

    def __init__(self, split: ParallelIds, src: TokenArray, tgt: TokenArray, kept: int):
        if len(src) != len(split) or len(tgt) != len(split):
            raise ValueError(f"split {split.name!r}: a segmentation of {len(src)}/{len(tgt)} sentences for "
                             f"{len(split)} pairs (was it made from another data directory?)")
        self.name, self.src, self.tgt, self.kept = split.name, src, tgt, kept
        self.tokens = (int(src.offsets[-1]), int(tgt.offsets[-1]))
        self.base_tokens = (int(split.src.offsets[-1]), int(split.tgt.offsets[-1]))

    @classmethod
    def sample(cls, split: ParallelIds, vocabs: Vocabs, p: float, seed: int | list[int], max_width: int) -> "SampledSplit":
        """Segment both sides of ``split`` with BPE-dropout ``p``.

        A pair whose sampled form would need more than ``max_width`` positions on either side (ids + eos
        for the source, bos + ids + eos for the target: a batch's per-sentence limit) keeps its prepared
        ids, so that no pair is lost.
        """
        if not 0 < p < 1:
            raise ValueError(f"subword dropout must be in (0, 1), got {p}")
        state = int(np.random.SeedSequence(seed).generate_state(1)[0])  # uint32 for SentencePiece
        src = _sample(vocabs.src, split.lines("src"), p, state)
        tgt = _sample(vocabs.tgt, split.lines("tgt"), p, state ^ 0x5BD1E995)
        kept = 0
        for i in range(len(src)):
            if len(src[i]) + 1 > max_width or len(tgt[i]) + 2 > max_width:
                src[i], tgt[i] = split.src[i].tolist(), split.tgt[i].tolist()
                kept += 1
        return cls(split, TokenArray.from_sentences(src), TokenArray.from_sentences(tgt), kept)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The segmentation as tensors (for a checkpoint's safetensors file)."""
        return {"src.ids": torch.from_numpy(np.asarray(self.src.ids)), "src.offsets": torch.from_numpy(self.src.offsets),
                "tgt.ids": torch.from_numpy(np.asarray(self.tgt.ids)), "tgt.offsets": torch.from_numpy(self.tgt.offsets),
                "kept": torch.tensor([self.kept])}

    @classmethod
    def from_tensors(cls, split: ParallelIds, tensors: dict[str, torch.Tensor]) -> "SampledSplit":
        arrays = [TokenArray(tensors[f"{side}.ids"].numpy(), tensors[f"{side}.offsets"].numpy()) for side in ("src", "tgt")]
        return cls(split, *arrays, int(tensors["kept"][0]))

    def __len__(self) -> int:
        return len(self.src)

    def describe(self) -> str:
        grow = [100 * (t / max(b, 1) - 1) for t, b in zip(self.tokens, self.base_tokens)]
        return (f"BPE-dropout: {self.tokens[0]:,} source and {self.tokens[1]:,} target pieces this epoch "
                f"({grow[0]:+.0f}% / {grow[1]:+.0f}% over the deterministic segmentation); "
                f"{self.kept} pair(s) kept their prepared ids (sampled form longer than a batch allows)")


def _sample(vocab, texts: list[str], p: float, state: int) -> list[list[int]]:
    """BPE-dropout ids of ``texts`` (no bos/eos)."""
    spm.set_random_generator_seed(state)  # repeats within this process (see the module's docstring)
    return vocab.encode_batch(texts, dropout=p)
