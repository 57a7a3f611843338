"""Scaled dot-product attention (§3.2.1) for CPU training in C++ (``native_attention.cpp``): forward and
backward one (sentence, head) at a time, scores and weights in fp32, as :func:`attention.attention_written_out`.

An experiment, kept with its measurement (README, "Which loss kernel trains"): at Multi30k's lengths it is
slower than the written-out tensor ops, so transduce does not use it. Timing and correctness against
``attention_reference``: ``python bench/native_attention/compare.py``.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from torch import Tensor

from transduce.cpp import build

SOURCE = Path(__file__).with_name("native_attention.cpp")


@functools.cache
def extension():
    """The compiled extension module, or None (with a warning saying why) if it cannot be built."""
    return build("transduce_native_attention", SOURCE, "TRANSDUCE_NATIVE_ATTENTION", "the C++ attention",
                 "attention uses the written-out formula")


def applies(q: Tensor, mask: Tensor | None, dropout: float) -> bool:
    """Whether :func:`attend` takes these heads: CPU, fp32 or bf16, no dropout on the weights, a mask
    shared by the heads, and the extension built."""
    return (q.device.type == "cpu" and q.dtype in (torch.float32, torch.bfloat16) and dropout == 0.0
            and (mask is None or mask.dim() == 2 or (mask.dim() == 4 and mask.size(1) == 1))
            and extension() is not None)


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, scale: float) -> Tensor:
        out, probs = extension().forward(q, k, v, mask, causal, scale)  # (B, T_q, h·d_k), (B, h, T_q, T_k)
        ctx.save_for_backward(q, k, v, probs)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, k, v, probs = ctx.saved_tensors
        dq, dk, dv = extension().backward(dout, q, k, v, probs, ctx.scale)  # (B, h, T, d_k) each
        return dq, dk, dv, None, None, None


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, scale: float) -> Tensor:
    """softmax(Q Kᵀ · scale) V with the heads concatenated: q (B, h, T_q, d_k), k/v (B, h, T_k, d_k),
    mask bool broadcastable to (B, 1, T_q, T_k) (True = may attend) or None; ``is_causal`` adds
    tril(T_k − T_q). Returns (B, T_q, h·d_k)."""
    B, T_q, T_k = q.size(0), q.size(2), k.size(2)
    if mask is not None:
        mask = mask.expand(B, T_q, T_k) if mask.dim() == 2 else mask.expand(B, 1, T_q, T_k)[:, 0]  # (B, T_q, T_k)
    return _Attention.apply(q, k, v, mask, is_causal, float(scale))
