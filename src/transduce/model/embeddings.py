"""Embeddings (§3.4) and positional encodings (§3.5; learned positions: Table 3, row E)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sinusoid_table(max_len: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(same). Returns (max_len, d_model)."""
    pos = torch.arange(max_len, dtype=torch.float64, device="cpu").unsqueeze(1)  # (L, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64, device="cpu")  # (d/2,)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (L, d/2)
    table = torch.zeros(max_len, d_model, dtype=torch.float64, device="cpu")
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()


def init_normal(weight: Tensor, std: float, zero_row: int | None = None) -> None:
    """N(0, std²) in place, with row ``zero_row`` zero (a padding embedding). A weight on the meta device
    (``Transformer.empty``) has no values to set, and torch's meta ``normal_`` imports its compiler (seconds)."""
    if weight.is_meta:
        return
    with torch.no_grad():
        nn.init.normal_(weight, mean=0.0, std=std)
        if zero_row is not None:
            weight[zero_row].zero_()


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal encodings (§3.5), a non-trainable buffer."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        table, device = sinusoid_table(max_len, d_model), torch.get_default_device()
        # a fixed table, not a weight: real even in a model built on the meta device to take a file's weights
        self.register_buffer("table", table if device.type == "meta" else table.to(device), persistent=False)

    def forward(self, length: int, start: int = 0) -> Tensor:
        """Encodings for positions start .. start+length-1: (length, d_model)."""
        if start + length > self.table.size(0):
            raise ValueError(f"position {start + length - 1} exceeds max_positions={self.table.size(0)}")
        return self.table[start : start + length]


class LearnedPositions(nn.Module):
    """Learned position embeddings (Table 3, row E)."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_len, d_model))
        init_normal(self.weight, d_model**-0.5)

    def forward(self, length: int, start: int = 0) -> Tensor:
        if start + length > self.weight.size(0):
            raise ValueError(f"position {start + length - 1} exceeds max_positions={self.weight.size(0)}")
        return self.weight[start : start + length]


class Embeddings(nn.Module):
    """Token embedding × √d_model plus positions, then dropout (§3.4, §3.5, §5.4).

    The token table may be shared with another ``Embeddings`` and the output
    projection (three-way tying, §3.4): pass the other's ``token`` module.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        pad_id: int,
        positions: nn.Module,
        dropout: float,
        scale: bool = True,
        token: nn.Embedding | None = None,
    ):
        super().__init__()
        if token is None:
            # on the meta device, given a weight so that it skips its own N(0, 1) (torch's meta normal_ is slow)
            empty = torch.empty(vocab_size, d_model) if torch.get_default_device().type == "meta" else None
            token = nn.Embedding(vocab_size, d_model, padding_idx=pad_id, _weight=empty)
            init_normal(token.weight, d_model**-0.5, zero_row=pad_id)
        self.token = token
        self.positions = positions
        self.scale = math.sqrt(d_model) if scale else 1.0
        self.dropout = nn.Dropout(dropout)

    def forward(self, ids: Tensor, start: int = 0) -> Tensor:
        """ids (B, T) -> (B, T, d_model); ``start`` is the first position (incremental decoding)."""
        x = self.token(ids) * self.scale  # (B, T, d_model)
        x = x + self.positions(ids.size(1), start).to(x.dtype)  # broadcast over B
        return self.dropout(x)
