"""Attention (paper §3.2): scaled dot-product, multi-head, and the alternatives the paper compares.

Masks are boolean and mean "may attend" (True = keep). They broadcast to
``(B, h, T_q, T_k)``. A query row whose keys are all masked returns zeros.

Two paths compute scaled dot-product attention:

* :func:`attention_reference` — the formula written out, returns the weights too
  (used for visualisation, additive attention and as the test oracle);
* :func:`attention_fast` — ``torch.nn.functional.scaled_dot_product_attention``,
  the fused kernel used for training, encoding, and decoding on GPU;
* :func:`attention_written_out` — the formula with fp32 scores and :func:`softmax_last`, for training on CPU
  (a module's ``kernel = "written"``, set by :func:`use_kernel`; the trainer's ``attention_kernel = "auto"``
  there, chosen in :mod:`transduce.train.kernels`). At Multi30k's lengths (~17) SDPA's CPU math kernel upcasts
  and copies its bf16 inputs: paper-base shapes, 2 threads, forward + backward of one layer's attention took
  26 ms in it and 17 ms written out (`python bench/attention_train_cpu.py --threads 2`).

Incremental decoding on CPU uses the reference formula: with one query per row (self-attention) or
one per beam (encoder–decoder attention) the fused CPU kernel's set-up outweighs its work. Measured
on 2 threads, beam 4 at batch 64: encoder–decoder attention 440 → 130 µs per call in fp32 and
356 → 177 µs in bf16; self-attention about equal in fp32 and 567 → 356 µs in bf16.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def causal_mask(T_q: int, T_k: int, device) -> Tensor:
    """(T_q, T_k) bool: query i (the last T_q of T_k positions) may attend to keys j ≤ i + T_k − T_q."""
    return torch.ones(T_q, T_k, dtype=torch.bool, device=device).tril(T_k - T_q)


def _guard_empty_rows(mask: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """Let fully-masked rows attend everywhere (so no NaN), and return them to zero later.

    Returns ``(safe_mask, empty_rows)``; ``empty_rows`` is (…, T_q, 1) bool or None.
    """
    if mask is None:
        return None, None
    empty = ~mask.any(dim=-1, keepdim=True)  # (B, 1|h, T_q, 1)
    return mask | empty, empty


def attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    scale: float | None = None,
    dropout: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """softmax(Q Kᵀ · scale) V, written out (§3.2.1, Eq. 1).

    Args:
        q: (B, h, T_q, d_k); k: (B, h, T_k, d_k); v: (B, h, T_k, d_v)
        mask: bool, broadcastable to (B, h, T_q, T_k); True = may attend
        scale: defaults to 1/sqrt(d_k); 1.0 gives unscaled dot-product attention
    Returns:
        output (B, h, T_q, d_v) and weights (B, h, T_q, T_k)
    """
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale  # (B, h, T_q, T_k)
    return _softmax_and_mix(scores, v, mask, dropout)


class _ShortRowSoftmax(torch.autograd.Function):
    """softmax over the last dimension as whole-tensor ops: max, exp, sum, divide (backward:
    y ⊙ (g − Σ g ⊙ y)). See :func:`softmax_last`."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        y = (x - x.amax(dim=-1, keepdim=True)).exp_()
        y.div_(y.sum(dim=-1, keepdim=True))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        return y * (grad - (grad * y).sum(dim=-1, keepdim=True))


SHORT_ROW = 16  # below this many keys, softmax_last leaves torch's CPU kernel


def softmax_last(x: Tensor) -> Tensor:
    """``torch.softmax(x, dim=-1)``: the same values and gradient up to rounding, faster on CPU for short rows.

    torch's CPU softmax kernel vectorises along the row, and a row shorter than one AVX-512 vector
    (16 floats) takes a path 3–5× slower than four whole-tensor ops: forward + backward of
    (156, 4, 12, 12) fp32, 1 thread, beside a training run, took 2.3 ms against 0.5 ms; from 16 keys
    on, torch's is faster (``python bench/softmax_rows.py``). Multi30k's sentences are ~14 pieces
    long, so most of its batches have rows that short.
    """
    if x.device.type == "cpu" and x.size(-1) < SHORT_ROW:
        return _ShortRowSoftmax.apply(x)
    return torch.softmax(x, dim=-1)


def _softmax_and_mix(
    scores: Tensor, v: Tensor, mask: Tensor | None, dropout: float, short_rows: bool = False
) -> tuple[Tensor, Tensor]:
    """``short_rows``: :func:`softmax_last` (training), else ``torch.softmax``, whose rounding the C++
    decoder step reproduces bit for bit (``backends/native_step.cpp``)."""
    safe, empty = _guard_empty_rows(mask)
    if safe is not None:
        scores = scores.masked_fill(~safe, float("-inf"))
    softmax = softmax_last if short_rows else lambda x: torch.softmax(x, dim=-1)
    weights = softmax(scores.float()).to(v.dtype)  # (B, h, T_q, T_k)
    if empty is not None:
        weights = weights.masked_fill(empty, 0.0)
    if dropout > 0.0:
        weights = F.dropout(weights, p=dropout, training=True)
    return torch.matmul(weights, v), weights  # (B, h, T_q, d_v)


def attention_written_out(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    scale: float | None = None,
    dropout: float = 0.0,
    is_causal: bool = False,
) -> Tensor:
    """:func:`attention_reference`'s formula with the scores Q Kᵀ computed in fp32 (as SDPA's math
    kernel does) whatever the autocast dtype; softmax in fp32, the weights mix V in V's dtype.
    q (B, h, T_q, d_k), k/v (B, h, T_k, d_k) -> (B, h, T_q, d_k).

    The scale and the mask are part of the score product: one ``baddbmm`` starts from the mask as an additive
    bias (0 or −inf) and adds scale · Q Kᵀ, where the reference multiplies and masks in two more passes over
    the scores (forward and backward). The same scores up to the product's last bit; forward + backward of
    the demo's shapes (18 sentences × 4 heads × 54 × 54, bf16 autocast, one thread), best of 6: 2.27 against
    2.90 ms with a padding mask, 2.24 against 2.77 causal (``python bench/attention_masking.py``, AMD EPYC
    with AVX-512-BF16).

    ``is_causal=True`` (with ``mask=None``): query i sees keys j ≤ i + T_k − T_q; with T_k ≥ T_q no row is
    empty and the empty-row guard (a pass over the output, forward and backward) is left out."""
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    B, h, T_q, d_k = q.shape
    T_k = k.size(-2)
    with torch.autocast(q.device.type, enabled=False):
        # contiguous casts: a head-split view cast with the default (preserved) layout comes out in (B, T, h, d)
        # order, and the reshape then copies it a second time
        qf = q.float(memory_format=torch.contiguous_format).reshape(B * h, T_q, d_k)  # (B·h, T_q, d_k)
        kt = k.float(memory_format=torch.contiguous_format).reshape(B * h, T_k, d_k).transpose(1, 2)  # (B·h, d_k, T_k)
        if is_causal:
            if mask is not None:
                raise ValueError("attention_written_out: give a mask or is_causal, not both")
            mask = causal_mask(T_q, T_k, q.device)
        # a causal row keeps its diagonal when T_k ≥ T_q; with more queries the first T_q − T_k are guarded
        safe, empty = (mask, None) if is_causal and T_k >= T_q else _guard_empty_rows(mask)
        if safe is None:
            scores = torch.bmm(qf, kt).mul_(scale)  # (B·h, T_q, T_k)
        else:
            bias = torch.zeros(safe.shape, dtype=torch.float32, device=q.device).masked_fill_(~safe, float("-inf"))
            bias = bias.expand(B, h, T_q, T_k).reshape(B * h, T_q, T_k)  # the scores' starting value
            scores = torch.baddbmm(bias, qf, kt, alpha=scale)  # (B·h, T_q, T_k)
    out = _softmax_and_mix(scores.view(B, h, T_q, T_k), v, None, dropout, short_rows=True)[0]  # (B, h, T_q, d_v)
    # the mask is in the scores already; a row with nothing to attend to attended everywhere (safe): it is zeroed
    # in the output, which is what zeroing its weights gives, over d_v values instead of T_k and without a host read
    return out if empty is None else out.masked_fill(empty, 0.0)


def attention_fast(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    scale: float | None = None,
    dropout: float = 0.0,
    is_causal: bool = False,
) -> Tensor:
    """Same result as :func:`attention_reference` through the fused SDPA kernel.

    ``is_causal=True`` (with ``mask=None``) selects the kernel's own causal mask,
    which avoids materialising a (T, T) mask in training.
    """
    safe, empty = _guard_empty_rows(mask)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=safe, dropout_p=dropout, is_causal=is_causal, scale=scale
    )  # (B, h, T_q, d_v)
    if empty is not None:
        out = out.masked_fill(empty, 0.0)
    return out


class AdditiveScore(nn.Module):
    """Additive (Bahdanau) compatibility per head, the alternative named in §3.2.1.

    score(q, k) = wᵀ tanh(q + k), with q and k the head's projected query and key.
    Costs O(B·h·T_q·T_k·d_k) memory, so it is for study, not speed.
    """

    def __init__(self, n_heads: int, d_k: int):
        super().__init__()
        self.w = nn.Parameter(torch.empty(n_heads, d_k))
        nn.init.normal_(self.w, std=d_k**-0.5)

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        """q (B, h, T_q, d_k), k (B, h, T_k, d_k) -> scores (B, h, T_q, T_k)."""
        hidden = torch.tanh(q.unsqueeze(-2) + k.unsqueeze(-3))  # (B, h, T_q, T_k, d_k)
        return torch.einsum("bhqkd,hd->bhqk", hidden, self.w)


class MultiHeadAttention(nn.Module):
    """Multi-head attention (§3.2.2): h heads of d_k = d_v = d_model / h, concatenated, then W^O.

    ``d_k`` narrows the queries and keys alone (Table 3 row B); values keep d_v = d_model / h.

    Self-attention projects Q, K, V with one fused (d_model, 3·d_model) matrix;
    encoder–decoder attention projects Q from the decoder and K, V (fused) from the
    encoder output, which the decoding cache computes once per sentence.

    ``kind`` is ``"scaled_dot"`` (the paper), ``"dot"`` (no 1/√d_k, §3.2.1's
    comparison) or ``"additive"``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        self_attention: bool,
        kind: str = "scaled_dot",
        dropout: float = 0.0,
        d_k: int | None = None,
    ):
        super().__init__()
        assert d_model % n_heads == 0, "d_model must be divisible by n_heads"
        self.d_model, self.n_heads = d_model, n_heads
        self.d_v = d_model // n_heads
        self.d_k = self.d_v if d_k is None else d_k  # Table 3 row B narrows queries and keys only
        self.self_attention, self.kind, self.dropout = self_attention, kind, dropout
        qk = n_heads * self.d_k
        if self_attention:
            self.qkv_proj = nn.Linear(d_model, 2 * qk + d_model)
            self.fused_rows = {"qkv_proj": (qk, qk, d_model)}  # Q, K, V rows (each initialised alone)
        else:
            self.q_proj = nn.Linear(d_model, qk)
            self.kv_proj = nn.Linear(d_model, qk + d_model)
            self.fused_rows = {"kv_proj": (qk, d_model)}  # K, V rows
        self.out_proj = nn.Linear(d_model, d_model)
        self.additive = AdditiveScore(n_heads, self.d_k) if kind == "additive" else None
        self.scale = 1.0 if kind == "dot" else 1.0 / math.sqrt(self.d_k)
        self.record: list[Tensor] | None = None  # set by visualisation to collect weights
        self.kernel = "fused"  # full-sequence attention: "fused" (SDPA) or "written" (:func:`use_kernel`)
        # training's full-sequence attention from the packed projections, ``fused(self, q_src, kv_src, mask,
        # is_causal)`` -> merged heads (B, T_q, h·d_v), kv_src None in self-attention; None = :meth:`mix`.
        # Training on CPU sets it to a C++ kernel (transduce.train.attention)
        self.fused = None

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, T, h·d) -> (B, h, T, d), d = d_k for queries and keys, d_v for values."""
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, -1).transpose(1, 2)  # (B, h, T, d)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Encoder output (B, S, d_model) -> keys (B, h, S, d_k) and values (B, h, S, d_v)."""
        k, v = self.kv_proj(memory).split(self.fused_rows["kv_proj"], dim=-1)  # (B, S, h·d_k), (B, S, d_model)
        return self.split_heads(k), self.split_heads(v)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention input (B, T, d_model) -> q, k (B, h, T, d_k) and v (B, h, T, d_v)."""
        q, k, v = self.qkv_proj(x).split(self.fused_rows["qkv_proj"], dim=-1)  # (B, T, h·d_k) twice, (B, T, d_model)
        return self.split_heads(q), self.split_heads(k), self.split_heads(v)

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool = False, step: bool = False
    ) -> Tensor:
        """Heads in, W^O out: q (B, h, T_q, d_k), k/v (B, h, T_k, d_k) -> (B, T_q, d_model).

        ``step``: an incremental-decoding step, which takes the reference formula on CPU (module docstring).
        """
        return self.out_proj(self.mix(q, k, v, mask, is_causal, step))

    def mix(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool = False, step: bool = False
    ) -> Tensor:
        """The heads' attention, merged: q (B, h, T_q, d_k), k/v (B, h, T_k, d_k) -> (B, T_q, h·d_v)."""
        p = self.dropout if self.training else 0.0
        written = self.kernel == "written" and self.record is None and self.kind != "additive" and not step
        if is_causal and (self.record is not None or self.kind == "additive"):
            mask, is_causal = causal_mask(q.size(-2), k.size(-2), q.device), False
        if self.kind == "additive":
            out, weights = _softmax_and_mix(self.additive(q, k), v, mask, p)
        elif self.record is not None or (step and q.device.type == "cpu"):
            out, weights = attention_reference(q, k, v, mask, self.scale, p)
        elif written:
            out, weights = attention_written_out(q, k, v, mask, self.scale, p, is_causal), None
        else:
            out, weights = attention_fast(q, k, v, mask, self.scale, p, is_causal), None
        if self.record is not None:
            self.record.append(weights.detach())
        B, h, T, d_v = out.shape
        return out.transpose(1, 2).reshape(B, T, h * d_v)  # (B, T_q, h·d_v)

    def forward(
        self, x: Tensor, memory: Tensor | None = None, mask: Tensor | None = None, is_causal: bool = False
    ) -> Tensor:
        """Full-sequence attention (training, encoding).

        x: (B, T, d_model); memory: (B, S, d_model) for encoder–decoder attention.
        """
        if self.fused is not None:
            q_src, kv_src = (self.qkv_proj(x), None) if self.self_attention else (self.q_proj(x), self.kv_proj(memory))
            return self.out_proj(self.fused(self, q_src, kv_src, mask, is_causal))
        if self.self_attention:
            q, k, v = self.project_qkv(x)
        else:
            q = self.split_heads(self.q_proj(x))
            k, v = self.project_kv(memory)
        return self.attend(q, k, v, mask, is_causal)


def use_kernel(model: nn.Module, kernel: str) -> None:
    """Set the full-sequence attention of every :class:`MultiHeadAttention` in ``model``: "fused" (SDPA)
    or "written" (:func:`attention_written_out`). Steps of incremental decoding are not affected."""
    if kernel not in ("fused", "written"):
        raise ValueError(f"attention kernel must be 'fused' or 'written', got {kernel!r}")
    for m in model.modules():
        if isinstance(m, MultiHeadAttention):
            m.kernel = kernel
