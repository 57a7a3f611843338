"""R-Drop (Liang et al., 2021): each batch twice under independent dropout masks, and the loss adds α times
the symmetric KL divergence between the two output distributions of every target position to both copies'
label-smoothed losses (``train.rdrop_alpha``). Beyond the paper; a regulariser for small corpora: the Multi30k
recipe uses α = 2.

:func:`rdrop_loss` is the readable reference, differentiated by autograd; training uses
:class:`ProjectedPairLoss`, the same function block by block with a closed-form gradient, so the (2N, V)
log-probabilities are never stored. :class:`RDrop` is the objective the step calls (the interface of
:class:`~transduce.train.loss.SmoothedLoss`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import native_loss
from .loss import gradient_rows, padded


class RDrop:
    """R-Drop as a training objective: ``copies`` = 2; ``states`` (2N, d) hold copy 1's positions, then copy 2's."""

    copies = 2

    def __init__(self, epsilon: float, alpha: float, pad_id: int = 0, native: bool = True):
        if alpha <= 0:
            raise ValueError(f"R-Drop's alpha must be positive, got {alpha}")
        self.epsilon, self.alpha, self.pad_id = float(epsilon), float(alpha), pad_id
        self.native = native  # the C++ loss blocks where they apply, else the tensor ops (transduce.train.kernels)

    def __call__(
        self, states: Tensor, weight: Tensor, labels: Tensor, dtype: torch.dtype, rows: int
    ) -> tuple[Tensor, Tensor]:
        # two copies per block: half the rows keep the block's two (r, V) matrices in cache
        return projected_rdrop_loss(
            states, weight, labels, self.epsilon, self.pad_id, self.alpha, dtype, max(rows // 2, 1), self.native
        )


def _rdrop_block(
    z1: Tensor, z2: Tensor, ys: Tensor, epsilon: float, pad_id: int, alpha: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """R-Drop loss of fp32 logit blocks ``z1``, ``z2`` (r, V), two dropout samples of the same rows with
    labels ``ys`` (r, 1). Returns (loss (r,), nll (r,) of both copies summed, ∂loss/∂z1, ∂loss/∂z2).

    With d = log p₁ − log p₂ and Δ = p₁ − p₂, the symmetric KL is Σ_v Δ_v d_v, and
    ∂/∂z₁ = p₁ ⊙ (d − ⟨p₁, d⟩) + Δ,  ∂/∂z₂ = p₂ ⊙ (⟨p₂, d⟩ − d) − Δ.
    """
    u = epsilon / (z1.size(-1) - 1)
    lp1, lp2 = torch.log_softmax(z1, -1), torch.log_softmax(z2, -1)  # (r, V)
    loss, nll = z1.new_zeros(z1.size(0)), z1.new_zeros(z1.size(0))
    for lp in (lp1, lp2):
        gold = lp.gather(-1, ys).squeeze(-1)  # (r,)
        loss -= (1 - epsilon) * gold + u * (lp.sum(-1) - lp[:, pad_id])
        nll -= gold
    p1, p2 = lp1.exp(), lp2.exp()
    d = lp1.sub_(lp2)  # (r, V); lp1 is not needed any more
    delta = p1 - p2
    loss += 0.5 * alpha * (delta * d).sum(-1)
    g1 = p1 * (d - (p1 * d).sum(-1, keepdim=True)) + delta  # ∂KL/∂z₁
    g2 = p2 * ((p2 * d).sum(-1, keepdim=True) - d) - delta  # ∂KL/∂z₂
    for g, p in ((g1, p1), (g2, p2)):  # scale the KL part and add the smoothed loss's softmax − q
        g.mul_(0.5 * alpha).add_(p)
        if epsilon > 0:
            g.sub_(u)
            g[:, pad_id] += u
        g.scatter_add_(-1, ys, g.new_full(ys.shape, -(1 - epsilon)))
    return loss, nll, g1, g2


class ProjectedPairLoss(torch.autograd.Function):
    """:func:`rdrop_loss` (the readable reference) fused with the pre-softmax projection as in
    :class:`ProjectedSmoothedCrossEntropy`, for two copies of the same N positions: hidden states ``h1``,
    ``h2`` (N, d), each with its own projection ``w1``, ``w2`` (V, d) (R-Drop passes the same one twice).
    Each block of ``rows`` positions makes both copies' logits, turns them
    into the loss and its closed-form gradient while in cache, and only the two (N, V) gradients are
    written out. Returns (loss_sum, nll_sum) over the 2N rows, as :func:`rdrop_loss`.
    """

    @staticmethod
    def forward(
        ctx,
        h1: Tensor,
        w1: Tensor,
        h2: Tensor,
        w2: Tensor,
        y: Tensor,
        epsilon: float,
        pad_id: int,
        alpha: float,
        dtype: torch.dtype,
        rows: int = 64,
        native: bool = True,
    ) -> tuple[Tensor, Tensor]:
        hc1, wc1 = h1.to(dtype), w1.to(dtype)  # (N, d), (V, d)
        hc2, wc2 = h2.to(dtype), (wc1 if w2 is w1 else w2.to(dtype))
        n, want_grad = y.size(0), any(ctx.needs_input_grad[:4])
        full1 = gradient_rows(hc1, w1.size(0)) if want_grad else None  # (P, V), zero rows after N
        full2 = gradient_rows(hc2, w2.size(0)) if want_grad else None
        g1 = full1[:n] if want_grad else None  # (N, V) ∂loss/∂logits of copy 1
        g2 = full2[:n] if want_grad else None  # (N, V) of copy 2
        loss_rows, nll_rows = h1.new_empty(n, dtype=torch.float32), h1.new_empty(n, dtype=torch.float32)  # (N,)
        native = native and native_loss.applies(hc1, hc2)
        for s in range(0, n, rows):
            e = min(s + rows, n)
            if native:  # the same in C++: the logits made in place in g1, g2 and turned into their gradients
                z1 = torch.mm(hc1[s:e], wc1.t(), out=g1[s:e]) if want_grad else hc1[s:e] @ wc1.t()  # (r, V)
                z2 = torch.mm(hc2[s:e], wc2.t(), out=g2[s:e]) if want_grad else hc2[s:e] @ wc2.t()  # (r, V)
                loss_rows[s:e], nll_rows[s:e] = native_loss.rdrop_block_(
                    z1, z2, y[s:e], epsilon, pad_id, alpha, want_grad
                )
                continue
            z1 = (hc1[s:e] @ wc1.t()).float()  # (r, V)
            z2 = (hc2[s:e] @ wc2.t()).float()  # (r, V)
            loss_rows[s:e], nll_rows[s:e], b1, b2 = _rdrop_block(z1, z2, y[s:e, None], epsilon, pad_id, alpha)
            if want_grad:
                g1[s:e].copy_(b1)
                g2[s:e].copy_(b2)
        if want_grad:
            ctx.save_for_backward(padded(hc1), wc1, full1, padded(hc2), wc2, full2)  # (P, d), (V, d), (P, V)
            ctx.rows = n
            ctx.dtypes = (h1.dtype, w1.dtype, h2.dtype, w2.dtype)
        return loss_rows.double().sum().float(), nll_rows.double().sum().float()

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        hc1, wc1, g1, hc2, wc2, g2 = ctx.saved_tensors  # N rows and P − N zero rows (loss.gradient_rows)
        scale, need, dt, n = grad_loss.float(), ctx.needs_input_grad, ctx.dtypes, ctx.rows
        out = []
        for i, (hc, wc, g) in enumerate(((hc1, wc1, g1), (hc2, wc2, g2))):
            out.append((g @ wc)[:n].float().mul_(scale).to(dt[2 * i]) if need[2 * i] else None)  # (N, d)
            out.append((g.t() @ hc).float().mul_(scale).to(dt[2 * i + 1]) if need[2 * i + 1] else None)  # (V, d)
        return (*out, None, None, None, None, None, None, None)


def projected_rdrop_loss(
    h: Tensor,
    weight: Tensor,
    y: Tensor,
    epsilon: float,
    pad_id: int,
    alpha: float,
    dtype: torch.dtype,
    rows: int = 64,
    native: bool = True,
) -> tuple[Tensor, Tensor]:
    """R-Drop through :class:`ProjectedPairLoss`: ``h`` (2N, d) holds copy 1's rows, then copy 2's, both
    projected by ``weight`` (V, d). Same arguments and results as :func:`rdrop_loss`, plus ``rows`` and
    ``native`` (the C++ loss blocks where they apply)."""
    n = y.size(0)
    return ProjectedPairLoss.apply(h[:n], weight, h[n:], weight, y, epsilon, pad_id, alpha, dtype, rows, native)


def rdrop_loss(
    h: Tensor, weight: Tensor, y: Tensor, epsilon: float, pad_id: int, alpha: float, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """R-Drop (Liang et al., 2021): two dropout samples of each position, their smoothed losses plus
    α times their symmetric KL divergence. Beyond the paper; a regulariser for small corpora.

    Args:
        h: (2N, d) hidden states; rows i and N + i are the same target position under two dropout masks.
        weight: (V, d) pre-softmax projection (§3.4); y: (N,) labels, none of them pad.
        dtype: the projection's matmul dtype; log-softmax, losses and KL are fp32.
    Returns:
        (loss_sum, nll_sum) over the 2N rows: Σ smoothed + α · Σ_N ½(KL(p₁‖p₂) + KL(p₂‖p₁)), and Σ NLL.
        Divided by 2N, the first is the R-Drop paper's per-token objective.

    This is the readable reference, differentiated by autograd, which keeps several (2N, V) fp32 tensors;
    training uses :class:`ProjectedPairLoss`, the same function block by block with a closed-form gradient.
    """
    n = y.size(0)
    logp = torch.log_softmax((h.to(dtype) @ weight.to(dtype).t()).float(), dim=-1)  # (2N, V)
    y2 = torch.cat([y, y]).unsqueeze(-1)  # (2N, 1)
    gold = logp.gather(-1, y2).squeeze(-1)  # (2N,)
    u = epsilon / (logp.size(-1) - 1)
    spread = logp.sum(-1) - logp[:, pad_id]  # (2N,) Σ_{v≠pad} log p_v
    smoothed = -(1 - epsilon) * gold - u * spread  # (2N,)
    p1, p2 = logp[:n], logp[n:]  # (N, V) each
    kl = 0.5 * ((p1.exp() * (p1 - p2)).sum() + (p2.exp() * (p2 - p1)).sum())
    return smoothed.sum() + alpha * kl, -gold.detach().sum()
