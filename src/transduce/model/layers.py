"""Encoder and decoder layers (§3.1) with their residual sub-layer connections (§5.4)."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from .attention import MultiHeadAttention
from .cache import LayerCache
from .feedforward import FeedForward


class Residual(nn.Module):
    """A sub-layer connection.

    * post-norm (the paper, §3.1 and §5.4): ``LayerNorm(x + Dropout(Sublayer(x)))``
    * pre-norm (tensor2tensor's later default): ``x + Dropout(Sublayer(LayerNorm(x)))``;
      the stack then ends with a final LayerNorm (see :class:`~transduce.model.transformer.Encoder`).

    ``fused``: a function computing post-norm's ``norm(x + dropout(y))`` in training, given
    ``(x, y, norm, dropout)``; None = the modules. Training on CPU sets it to a C++ kernel
    (:func:`transduce.train.residual.use_native_residual`).
    """

    def __init__(self, d_model: int, dropout: float, norm: str, eps: float):
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.pre_norm = norm == "pre"
        self.fused: Callable[[Tensor, Tensor, nn.LayerNorm, nn.Module], Tensor] | None = None

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        """x: (B, T, d_model) -> (B, T, d_model)."""
        if self.pre_norm:
            return x + self.dropout(sublayer(self.norm(x)))
        if self.fused is not None and self.training:
            return self.fused(x, sublayer(x), self.norm, self.dropout)
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each wrapped in :class:`Residual` (§3.1)."""

    def __init__(self, cfg):
        super().__init__()
        self.self_attn = MultiHeadAttention(
            cfg.d_model,
            cfg.n_heads,
            self_attention=True,
            kind=cfg.attention,
            dropout=cfg.attention_dropout,
            d_k=cfg.d_k,
        )
        self.ff = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout, cfg.activation)
        self.res_attn = Residual(cfg.d_model, cfg.dropout, cfg.norm, cfg.layer_norm_eps)
        self.res_ff = Residual(cfg.d_model, cfg.dropout, cfg.norm, cfg.layer_norm_eps)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x (B, S, d_model); mask bool (B, 1, 1|S, S)."""
        x = self.res_attn(x, lambda h: self.self_attn(h, mask=mask))
        return self.res_ff(x, self.ff)


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder–decoder attention, feed-forward (§3.1)."""

    def __init__(self, cfg):
        super().__init__()
        self.self_attn = MultiHeadAttention(
            cfg.d_model,
            cfg.n_heads,
            self_attention=True,
            kind=cfg.attention,
            dropout=cfg.attention_dropout,
            d_k=cfg.d_k,
        )
        self.cross_attn = MultiHeadAttention(
            cfg.d_model,
            cfg.n_heads,
            self_attention=False,
            kind=cfg.attention,
            dropout=cfg.attention_dropout,
            d_k=cfg.d_k,
        )
        self.ff = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout, cfg.activation)
        self.res_self = Residual(cfg.d_model, cfg.dropout, cfg.norm, cfg.layer_norm_eps)
        self.res_cross = Residual(cfg.d_model, cfg.dropout, cfg.norm, cfg.layer_norm_eps)
        self.res_ff = Residual(cfg.d_model, cfg.dropout, cfg.norm, cfg.layer_norm_eps)

    def forward(self, x: Tensor, memory: Tensor, self_mask: Tensor | None, memory_mask: Tensor) -> Tensor:
        """Teacher-forced pass. x (B, T, d_model); memory (B, S, d_model).

        ``self_mask=None`` means plain causal masking (the fused kernel's own).
        """
        causal = self_mask is None
        x = self.res_self(x, lambda h: self.self_attn(h, mask=self_mask, is_causal=causal))
        x = self.res_cross(x, lambda h: self.cross_attn(h, memory=memory, mask=memory_mask))
        return self.res_ff(x, self.ff)

    def step(self, x: Tensor, cache: LayerCache, self_mask: Tensor | None, memory_mask: Tensor, beam: int) -> Tensor:
        """One incremental step. x: (N, 1, d_model) with N = B·beam rows, beams of a sentence adjacent.

        Self-attention appends this step's key/value to the cache, so the step costs O(t).
        Encoder–decoder attention reads keys/values computed once per *sentence*: the
        beams of a sentence are folded into the query axis instead of copying the encoder
        output per beam.
        """

        def self_attention(h: Tensor) -> Tensor:
            q, k, v = self.self_attn.project_qkv(h)  # (N, h, 1, d_k) each
            k, v = cache.append(k, v)  # (N, h, t+1, d_k)
            return self.self_attn.attend(q, k, v, self_mask, step=True)

        def cross_attention(h: Tensor) -> Tensor:
            attn = self.cross_attn
            N = h.size(0)
            q = attn.q_proj(h).view(N // beam, beam, attn.n_heads, attn.d_k)  # (B, beam, h, d_k)
            q = q.transpose(1, 2)  # (B, h, beam, d_k): beams act as query positions
            out = attn.attend(q, cache.memory_k, cache.memory_v, memory_mask, step=True)  # (B, beam, d_model)
            return out.reshape(N, 1, attn.d_model)  # (N, 1, d_model)

        x = self.res_self(x, self_attention)
        x = self.res_cross(x, cross_attention)
        return self.res_ff(x, self.ff)
