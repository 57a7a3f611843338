"""Restricted self-attention (Table 1, last row) computed as banded attention: O(r·n·d), not a masked n².

Each query i reads the r keys j ∈ [i − (r−1)//2, i + r//2] — the same neighbourhood as
:func:`transduce.model.transformer.window_mask` with ``causal=False``. The keys/values are padded
by the window's reach on both sides and viewed as (B, n, d, r) windows with ``unfold`` (a strided
view, no copy), so scores and the weighted sum cost 2·n·r·d multiply–adds each.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def banded_attention(q: Tensor, k: Tensor, v: Tensor, r: int) -> Tensor:
    """softmax over each query's r-neighbourhood. q, k, v: (B, n, d) -> (B, n, d)."""
    B, n, d = q.shape
    before, after = (r - 1) // 2, r // 2
    k_win = F.pad(k, (0, 0, before, after)).unfold(1, r, 1)  # (B, n, d, r): keys i-before .. i+after
    v_win = F.pad(v, (0, 0, before, after)).unfold(1, r, 1)  # (B, n, d, r)
    scores = torch.einsum("bnd,bndr->bnr", q, k_win) / math.sqrt(d)  # (B, n, r)
    j = torch.arange(n, device=q.device)[:, None] - before + torch.arange(r, device=q.device)  # (n, r) key index
    scores = scores.masked_fill((j < 0) | (j >= n), float("-inf"))  # padding outside the sequence
    return torch.einsum("bnr,bndr->bnd", torch.softmax(scores, dim=-1), v_win)  # (B, n, d)
