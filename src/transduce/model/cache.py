"""The incremental-decoding cache: keys and values kept between decoder steps."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class LayerCache:
    """One decoder layer's cache.

    memory_k, memory_v: encoder–decoder keys/values, (B, h, S, d_k), one row per sentence.
    self_k, self_v: self-attention keys/values so far, (N, h, t, d_k), N = B·beam.
    """

    memory_k: Tensor
    memory_v: Tensor
    self_k: Tensor | None = None
    self_v: Tensor | None = None

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add this step's (N, h, 1, d_k) key/value; return all so far (N, h, t+1, d_k)."""
        if self.self_k is None:
            self.self_k, self.self_v = k, v
        else:
            self.self_k = torch.cat([self.self_k, k], dim=2)
            self.self_v = torch.cat([self.self_v, v], dim=2)
        return self.self_k, self.self_v


@dataclass
class DecoderCache:
    """Everything a decoder step needs besides the new token.

    memory_mask: (B, 1, 1, S) bool, True on real source tokens.
    beam: rows per sentence; decoder rows are N = B·beam, a sentence's beams adjacent.
    position: how many target tokens have been fed so far.
    """

    layers: list[LayerCache]
    memory_mask: Tensor
    beam: int
    position: int = 0
    sentences: int = field(init=False)

    def __post_init__(self) -> None:
        self.sentences = self.memory_mask.size(0)

    def reorder(self, rows: Tensor, sentences: Tensor | None = None, beam: int | None = None) -> None:
        """Keep decoder rows ``rows`` (indices into N) in that order.

        ``sentences`` (indices into B) drops finished sentences from the encoder-side
        tensors; ``rows`` must then list the surviving sentences' beams in the same order.
        ``beam`` changes the rows per sentence (e.g. 1 -> k after the first beam step).
        """
        for layer in self.layers:
            if layer.self_k is not None:
                layer.self_k = layer.self_k.index_select(0, rows)
                layer.self_v = layer.self_v.index_select(0, rows)
        self.reorder_encoder_side(sentences, beam)

    def reorder_encoder_side(self, sentences: Tensor | None, beam: int | None = None) -> None:
        """The encoder-side part of :meth:`reorder`: keep sentences ``sentences`` (indices into B)."""
        if sentences is not None:
            for layer in self.layers:
                layer.memory_k = layer.memory_k.index_select(0, sentences)
                layer.memory_v = layer.memory_v.index_select(0, sentences)
            self.memory_mask = self.memory_mask.index_select(0, sentences)
            self.sentences = self.memory_mask.size(0)
        if beam is not None:
            self.beam = beam
