"""Multi-head scaled dot-product attention (§3.2.1–3.2.2) as one C++ kernel each way, for training on CPU.

:func:`~transduce.model.attention.attention_written_out`, the readable reference beside it, splits the heads out of
the projections' packed output (a copy of Q, K and V each, with fp32 casts), runs two batched products that reach a
few percent of the GEMM peak at Multi30k's ~20 tokens, the softmax, and merges the heads again (another copy); its
backward makes as many passes, and the split's gradient is a concatenation. ``native_attention.h`` reads the heads
where the projection wrote them and writes the merged heads that ``W^O`` takes, one task per (sentence, head) in
fp32 scratch; the weights it keeps for the backward are fp32 (the reference mixes V with bf16 weights under
autocast). Same values up to rounding; a step's speed: ``python bench/attention_native.py``.

:func:`use_native_attention` gives every :class:`~transduce.model.attention.MultiHeadAttention` of a model the
kernel; the choice is made in :mod:`transduce.train.kernels` (``train.attention_kernel``). Attention the kernel does
not take (dropout on the weights, additive scores, recorded weights, not CPU, mixed dtypes) keeps the modules'
path.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from ..model.attention import MultiHeadAttention
from .native import extension


class _NativeAttention(torch.autograd.Function):
    """Merged heads (B, T_q, h·d_v) from q_src (B, T_q, ·) and kv_src (B, T_k, ·) at the given column offsets;
    ``kv_src`` None: self-attention, K and V in q_src too. Backward: the sources' gradients from the kept P."""

    @staticmethod
    def forward(ctx, q_src, kv_src, layout, mask, causal, scale):
        packed = kv_src is None
        kv = q_src if packed else kv_src
        out, P = extension().attention(q_src, kv, *layout, mask, causal, scale)
        ctx.save_for_backward(q_src, kv, P)
        ctx.layout, ctx.scale, ctx.packed = layout, scale, packed
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        q_src, kv, P = ctx.saved_tensors
        dq = torch.empty_like(q_src)  # every column is Q, K or V: the kernel writes all of it
        dkv = dq if ctx.packed else torch.empty_like(kv)
        extension().attention_backward(grad.contiguous(), P, q_src, kv, *ctx.layout, ctx.scale, dq, dkv)
        return dq, None if ctx.packed else dkv, None, None, None, None


def native_attention(
    attn: MultiHeadAttention, q_src: Tensor, kv_src: Tensor | None, mask: Tensor | None, is_causal: bool
) -> Tensor:
    """``attn``'s heads attended and merged, (B, T_q, h·d_v), from its projections' output: q_src (B, T_q, ·) the
    fused Q, K, V of self-attention (kv_src None) or the queries, kv_src (B, T_k, ·) the fused K, V. The C++ kernel
    where it takes them (CPU, one dtype of fp32 or bf16, no dropout on the weights, scaled or plain dot-product
    scores, weights not recorded), else :meth:`~transduce.model.attention.MultiHeadAttention.mix`."""
    p = attn.dropout if attn.training else 0.0
    kv = q_src if kv_src is None else kv_src
    takes = (
        p == 0.0
        and attn.kind != "additive"
        and attn.record is None
        and q_src.device.type == "cpu"
        and q_src.dtype in (torch.float32, torch.bfloat16)
        and kv.dtype == q_src.dtype
        and q_src.is_contiguous()
        and kv.is_contiguous()
        and extension() is not None
    )
    h, d_k, d_v = attn.n_heads, attn.d_k, attn.d_v
    qk = h * d_k
    if not takes:
        if kv_src is None:
            q, k, v = (attn.split_heads(t) for t in q_src.split(attn.fused_rows["qkv_proj"], dim=-1))
        else:
            q = attn.split_heads(q_src)
            k, v = (attn.split_heads(t) for t in kv_src.split(attn.fused_rows["kv_proj"], dim=-1))
        return attn.mix(q, k, v, mask, is_causal)
    layout = (0, qk, 2 * qk, h, d_k, d_v) if kv_src is None else (0, 0, qk, h, d_k, d_v)  # Q, K, V column offsets
    if mask is not None:
        if is_causal:
            raise ValueError("native_attention: give a mask or is_causal, not both")
        mask = mask.expand(q_src.size(0), h, q_src.size(1), kv.size(1))  # (B, h, T_q, T_k), strides 0 where broadcast
    return _NativeAttention.apply(q_src, kv_src, layout, mask, is_causal, attn.scale)


def use_native_attention(model: nn.Module, on: bool = True) -> int:
    """Give every :class:`~transduce.model.attention.MultiHeadAttention` in ``model`` the C++ kernel (``on``) or
    take it away; return how many."""
    modules = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    for m in modules:
        m.fused = native_attention if on else None
    return len(modules)
