"""Ensembles: several models decoded in lockstep, their log-probabilities averaged.

:class:`Ensemble` exposes the decoder interface that :mod:`~transduce.decode.search` uses
(``config``, ``encode``, ``init_cache``, ``decode_step``; a cache with ``reorder``), so
search code does not know whether it drives one model or several.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..model import Transformer


@dataclass
class EnsembleCache:
    """One decoder cache per model, reordered together."""

    caches: list

    def reorder(self, rows: Tensor, sentences: Tensor | None = None, beam: int | None = None) -> None:
        for cache in self.caches:
            cache.reorder(rows, sentences, beam)


class Ensemble(nn.Module):
    """Average of the members' log-probabilities: log p(y) ∝ (1/M) Σ_m log p_m(y).

    ``decode_step`` returns that average as logits (N, V); search renormalises it with a
    log-softmax (a normalised geometric mean of the members' distributions). Members must
    share the special token ids and target vocabulary size; ``config.max_positions`` is the
    smallest member's.
    """

    def __init__(self, models: list[Transformer]):
        super().__init__()
        if not models:
            raise ValueError("an ensemble needs at least one model")
        first = models[0].config
        for m in models[1:]:
            c = m.config
            same = (c.target_vocab_size, c.pad_id, c.bos_id, c.eos_id) == (
                first.target_vocab_size,
                first.pad_id,
                first.bos_id,
                first.eos_id,
            )
            if not same:
                raise ValueError("ensemble members must share the target vocabulary and special ids")
        self.models = nn.ModuleList(models)
        self.config = dataclasses.replace(first, max_positions=min(m.config.max_positions for m in models))

    def encode(self, src: Tensor) -> list:
        """src (B, S) -> one :class:`~transduce.model.transformer.Encoded` per member."""
        return [m.encode(src) for m in self.models]

    def init_cache(self, encoded: list, beam: int = 1) -> EnsembleCache:
        return EnsembleCache([m.init_cache(e, beam) for m, e in zip(self.models, encoded)])

    def decode_step(self, tokens: Tensor, cache: EnsembleCache) -> Tensor:
        """tokens (N,) -> averaged log-probabilities (N, V)."""
        total = None
        for m, c in zip(self.models, cache.caches):
            lp = torch.log_softmax(m.decode_step(tokens, c).float(), dim=-1)  # (N, V)
            total = lp if total is None else total + lp
        return total / len(self.models)
