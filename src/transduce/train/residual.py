"""The paper's sub-layer connection, ``LayerNorm(x + Dropout(Sublayer(x)))`` (§3.1, §5.4), as one C++ kernel for
training on CPU.

:class:`~transduce.model.layers.Residual` computes it with tensor ops: the dropout, the promotion of the bf16
sub-layer output to the fp32 stream (autocast), the add and the norm are a pass each over the activation, and
their backward passes as many again. ``native_residual.h`` makes one pass each way, with the C++ dropout's mask
(the same distribution as :class:`~transduce.train.dropout.FastDropout`, drawn from a seed of torch's generator,
so a resumed run repeats it) and the norm's statistics in fp32. Same arithmetic up to rounding; a step's speed:
``python bench/residual_kernel.py``.

:func:`use_native_residual` gives every post-norm :class:`~transduce.model.layers.Residual` of a model the kernel;
the choice is made in :mod:`transduce.train.kernels` (``train.residual_kernel``), with the C++ dropout. Pre-norm
connections, evaluation and tensors the kernel does not take (not CPU, not fp32 stream) keep the tensor ops.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from ..model.layers import Residual
from .dropout import FastDropout, draw_seed
from .native import extension


class _ResidualNorm(torch.autograd.Function):
    """z = LayerNorm(x + y · keep · scale), keep a function of (seed, index); backward recomputes keep."""

    @staticmethod
    def forward(ctx, x: Tensor, y: Tensor, weight: Tensor, bias: Tensor, eps: float, p: float) -> Tensor:
        ctx.args = (draw_seed() if p > 0 else 0, round(p * 32768), 1.0 / (1.0 - p))  # as FastDropout draws
        ctx.y_bf16 = y.dtype == torch.bfloat16
        d = x.size(-1)
        z, xhat, rstd = extension().residual_norm(
            x.reshape(-1, d), y.reshape(-1, d), weight, bias, eps, *ctx.args
        )  # (N, d), (N, d), (N,) with N = B·T
        ctx.save_for_backward(xhat, rstd, weight)
        return z.view(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        xhat, rstd, weight = ctx.saved_tensors
        d = grad.size(-1)
        dx, dy, dweight, dbias = extension().residual_norm_backward(
            grad.contiguous().view(-1, d), xhat, rstd, weight, *ctx.args, ctx.y_bf16
        )  # (N, d) each, then (d,) twice
        return dx.view(grad.shape), dy.view(grad.shape), dweight, dbias, None, None


def residual_norm(x: Tensor, y: Tensor, norm: nn.LayerNorm, dropout: nn.Module) -> Tensor:
    """``norm(x + dropout(y))``: x (B, T, d) the stream, y (B, T, d) the sub-layer's output. The C++ kernel where
    it takes the tensors (CPU, x fp32, y fp32 or bf16, an affine norm, training) and the dropout is the C++ one
    (:class:`~transduce.train.dropout.FastDropout` with ``native``), whose mask and draws it repeats; else those
    modules."""
    takes = (
        isinstance(dropout, FastDropout)
        and dropout.native
        and dropout.training
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and y.dtype in (torch.float32, torch.bfloat16)
        and x.shape == y.shape
        and x.is_contiguous()
        and y.is_contiguous()
        and norm.weight is not None
        and norm.bias is not None
        and extension() is not None
    )
    if not takes:
        return norm(x + dropout(y))
    return _ResidualNorm.apply(x, y, norm.weight, norm.bias, norm.eps, dropout.p)


def use_native_residual(model: nn.Module) -> int:
    """Give every post-norm :class:`~transduce.model.layers.Residual` in ``model`` the C++ kernel; return how many."""
    residuals = [m for m in model.modules() if isinstance(m, Residual) and not m.pre_norm]
    for m in residuals:
        m.fused = residual_norm
    return len(residuals)
