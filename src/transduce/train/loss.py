"""Label-smoothed cross-entropy (§5.4), computed in fp32, padding excluded.

The smoothed target for a label y is q = (1 − ε)·onehot(y) + ε·u, where u is uniform over the V − 1
**non-pad** tokens (the gold token included). Padding is never a correct output, so it receives no
target mass; its logit still takes part in the softmax, so the model learns to give it none. (fairseq
spreads ε over all V tokens including pad; the difference is one class in thousands.)

With z the logits, lse = logsumexp(z) and −log p_v = lse − z_v, the loss of one position is

    −Σ_v q_v log p_v = lse − (1 − ε)·z_y − ε/(V − 1) · Σ_{v≠pad} z_v,     ∂/∂z = softmax(z) − q.

:class:`SmoothedCrossEntropy` uses that closed-form gradient: it computes softmax once in fp32, block by
block, and keeps only the gradient (in the logits' dtype), instead of autograd's chain of logsumexp, gather
and sum backwards over the (N, V) matrix.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import native_loss


def _block(block: Tensor, ys: Tensor, epsilon: float, pad_id: int, want_grad: bool) -> tuple[Tensor, Tensor]:
    """Loss and NLL of each row of an fp32 ``block`` (r, V) of logits with labels ``ys`` (r, 1).

    Works in place: afterwards ``block`` holds ∂loss/∂z = softmax(z) − q when ``want_grad``.
    """
    u = epsilon / (block.size(-1) - 1)  # target mass of each non-gold, non-pad token
    block.sub_(block.amax(-1, keepdim=True))  # max 0; the shift cancels below since the weights sum to 1
    total = block.sum(-1) - block[:, pad_id]  # (r,) Σ_{v≠pad} z_v
    gold = block.gather(-1, ys).squeeze(-1)  # (r,)
    block.exp_()
    norm = block.sum(-1, keepdim=True)  # (r, 1)
    lse = norm.log().squeeze(-1)  # (r,)
    if want_grad:
        block.div_(norm)  # softmax
        if epsilon > 0:
            block.sub_(u)
            block[:, pad_id] += u
        block.scatter_add_(-1, ys, block.new_full(ys.shape, -(1 - epsilon)))
    return lse - (1 - epsilon) * gold - u * total, lse - gold


class SmoothedCrossEntropy(torch.autograd.Function):
    """Summed smoothed loss and summed NLL of rows ``z`` (N, V) with labels ``y`` (N,), none of them pad.

    Works through ``rows`` rows at a time so that each fp32 block (rows × V) stays in the core's cache while
    it is shifted, exponentiated, normalised and turned into the gradient; the (N, V) matrix is read once
    and its gradient written once, in the logits' dtype. (The whole-matrix version was ~40% of a ``small``
    bf16 step with an 8k vocabulary: ``python -m transduce.train.bench DATA --threads 1 --profile``.)
    """

    @staticmethod
    def forward(ctx, z: Tensor, y: Tensor, epsilon: float, pad_id: int, rows: int = 32) -> tuple[Tensor, Tensor]:
        N = z.size(0)
        want_grad = ctx.needs_input_grad[0]
        grad = torch.empty_like(z) if want_grad else None  # (N, V)
        loss_rows, nll_rows = z.new_empty(N, dtype=torch.float32), z.new_empty(N, dtype=torch.float32)  # (N,)
        for s in range(0, N, rows):
            block = z[s:s + rows].to(torch.float32, copy=True)  # (r, V)
            loss_rows[s:s + rows], nll_rows[s:s + rows] = _block(block, y[s:s + rows, None], epsilon, pad_id,
                                                                 want_grad)
            if want_grad:
                grad[s:s + rows].copy_(block)
        if want_grad:
            ctx.save_for_backward(grad)
        return loss_rows.double().sum().float(), nll_rows.double().sum().float()

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        (grad,) = ctx.saved_tensors
        return grad * grad_loss.to(grad.dtype), None, None, None, None


class ProjectedSmoothedCrossEntropy(torch.autograd.Function):
    """The pre-softmax projection (§3.4) and the smoothed loss in one: hidden states ``h`` (N, d), the
    projection ``weight`` (V, d), labels ``y`` (N,), matmuls in ``dtype``.

    Each block of ``rows`` logits is made by a small matmul and turned into its gradient while in cache, so
    the (N, V) logits are never written out; only their gradient is (in ``dtype``), for the two backward
    matmuls. The loss's scale (``grad_loss``) multiplies the small (N, d) and (V, d) results, not (N, V).
    """

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, y: Tensor, epsilon: float, pad_id: int, dtype: torch.dtype,
                rows: int = 64, native: bool = True) -> tuple[Tensor, Tensor]:
        hc, wc = h.to(dtype), weight.to(dtype)  # (N, d), (V, d)
        N, want_grad = h.size(0), any(ctx.needs_input_grad[:2])
        grad = hc.new_empty(N, weight.size(0)) if want_grad else None  # (N, V) ∂loss/∂logits
        loss_rows, nll_rows = h.new_empty(N, dtype=torch.float32), h.new_empty(N, dtype=torch.float32)  # (N,)
        if native and native_loss.applies(hc):  # the same per block in C++: logits made in place, turned into ∂loss/∂z
            for s in range(0, N, rows):
                e = min(s + rows, N)
                block = torch.mm(hc[s:e], wc.t(), out=grad[s:e]) if want_grad else hc[s:e] @ wc.t()  # (r, V)
                loss_rows[s:e], nll_rows[s:e] = native_loss.smoothed_block_(block, y[s:e], epsilon, pad_id,
                                                                            want_grad)
            return _project_save(ctx, h, weight, hc, wc, grad, loss_rows, nll_rows)
        for s in range(0, N, rows):
            block = (hc[s:s + rows] @ wc.t()).float()  # (r, V)
            loss_rows[s:s + rows], nll_rows[s:s + rows] = _block(block, y[s:s + rows, None], epsilon, pad_id,
                                                                 want_grad)
            if want_grad:
                grad[s:s + rows].copy_(block)
        return _project_save(ctx, h, weight, hc, wc, grad, loss_rows, nll_rows)

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        return (*_project_back(ctx, grad_loss), None, None, None, None, None, None)


def _project_save(ctx, h, weight, hc, wc, grad, loss_rows, nll_rows) -> tuple[Tensor, Tensor]:
    """Keep what :func:`_project_back` needs (``grad`` is None without gradients); sum the rows' losses."""
    if grad is not None:
        ctx.save_for_backward(hc, wc, grad)
        ctx.dtypes = (h.dtype, weight.dtype)
    return loss_rows.double().sum().float(), nll_rows.double().sum().float()


def _project_back(ctx, grad_loss: Tensor) -> tuple[Tensor | None, Tensor | None]:
    """∂/∂h and ∂/∂weight of a projected loss from its saved (N, V) gradient w.r.t. the logits."""
    hc, wc, grad = ctx.saved_tensors
    scale = grad_loss.float()
    grad_h = (grad @ wc).float().mul_(scale).to(ctx.dtypes[0]) if ctx.needs_input_grad[0] else None  # (N, d)
    grad_w = (grad.t() @ hc).float().mul_(scale).to(ctx.dtypes[1]) if ctx.needs_input_grad[1] else None  # (V, d)
    return grad_h, grad_w


def label_smoothed_loss(logits: Tensor, target: Tensor, epsilon: float, pad_id: int = 0
                        ) -> tuple[Tensor, Tensor, int]:
    """Summed smoothed loss, summed NLL and the number of non-pad target tokens.

    Args:
        logits: (..., V), any float dtype (the loss is computed in fp32).
        target: (...) token ids; positions equal to ``pad_id`` are excluded.
        epsilon: ε_ls; 0 gives plain cross-entropy.
    Returns:
        (smoothed_sum, nll_sum) fp32 scalars (only the first carries a gradient) and the token count.
    """
    keep = target != pad_id  # (...)
    z, y = logits[keep], target[keep]  # (N, V), (N,) real tokens only
    loss, nll = SmoothedCrossEntropy.apply(z, y, float(epsilon), pad_id)
    return loss, nll.detach(), int(y.numel())


def _rdrop_block(z1: Tensor, z2: Tensor, ys: Tensor, epsilon: float, pad_id: int, alpha: float
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
    ``h2`` (N, d), each with its own projection ``w1``, ``w2`` (V, d) (R-Drop passes the same one twice;
    mutual learning, each peer's). Each block of ``rows`` positions makes both copies' logits, turns them
    into the loss and its closed-form gradient while in cache, and only the two (N, V) gradients are
    written out. Returns (loss_sum, nll_sum) over the 2N rows, as :func:`rdrop_loss`.
    """

    @staticmethod
    def forward(ctx, h1: Tensor, w1: Tensor, h2: Tensor, w2: Tensor, y: Tensor, epsilon: float, pad_id: int,
                alpha: float, dtype: torch.dtype, rows: int = 64, native: bool = True) -> tuple[Tensor, Tensor]:
        hc1, wc1 = h1.to(dtype), w1.to(dtype)  # (N, d), (V, d)
        hc2, wc2 = h2.to(dtype), (wc1 if w2 is w1 else w2.to(dtype))
        n, want_grad = y.size(0), any(ctx.needs_input_grad[:4])
        g1 = hc1.new_empty(n, w1.size(0)) if want_grad else None  # (N, V) ∂loss/∂logits of copy 1
        g2 = hc2.new_empty(n, w2.size(0)) if want_grad else None  # (N, V) of copy 2
        loss_rows, nll_rows = h1.new_empty(n, dtype=torch.float32), h1.new_empty(n, dtype=torch.float32)  # (N,)
        native = native and native_loss.applies(hc1, hc2)
        for s in range(0, n, rows):
            e = min(s + rows, n)
            if native:  # the same in C++: the logits made in place in g1, g2 and turned into their gradients
                z1 = torch.mm(hc1[s:e], wc1.t(), out=g1[s:e]) if want_grad else hc1[s:e] @ wc1.t()  # (r, V)
                z2 = torch.mm(hc2[s:e], wc2.t(), out=g2[s:e]) if want_grad else hc2[s:e] @ wc2.t()  # (r, V)
                loss_rows[s:e], nll_rows[s:e] = native_loss.rdrop_block_(z1, z2, y[s:e], epsilon, pad_id, alpha,
                                                                         want_grad)
                continue
            z1 = (hc1[s:e] @ wc1.t()).float()  # (r, V)
            z2 = (hc2[s:e] @ wc2.t()).float()  # (r, V)
            loss_rows[s:e], nll_rows[s:e], b1, b2 = _rdrop_block(z1, z2, y[s:e, None], epsilon, pad_id, alpha)
            if want_grad:
                g1[s:e].copy_(b1)
                g2[s:e].copy_(b2)
        if want_grad:
            ctx.save_for_backward(hc1, wc1, g1, hc2, wc2, g2)
            ctx.dtypes = (h1.dtype, w1.dtype, h2.dtype, w2.dtype)
        return loss_rows.double().sum().float(), nll_rows.double().sum().float()

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        hc1, wc1, g1, hc2, wc2, g2 = ctx.saved_tensors
        scale, need, dt = grad_loss.float(), ctx.needs_input_grad, ctx.dtypes
        out = []
        for i, (hc, wc, g) in enumerate(((hc1, wc1, g1), (hc2, wc2, g2))):
            out.append((g @ wc).float().mul_(scale).to(dt[2 * i]) if need[2 * i] else None)  # (N, d)
            out.append((g.t() @ hc).float().mul_(scale).to(dt[2 * i + 1]) if need[2 * i + 1] else None)  # (V, d)
        return (*out, None, None, None, None, None, None, None)


def projected_rdrop_loss(h: Tensor, weight: Tensor, y: Tensor, epsilon: float, pad_id: int, alpha: float,
                         dtype: torch.dtype, rows: int = 64, native: bool = True) -> tuple[Tensor, Tensor]:
    """R-Drop through :class:`ProjectedPairLoss`: ``h`` (2N, d) holds copy 1's rows, then copy 2's, both
    projected by ``weight`` (V, d). Same arguments and results as :func:`rdrop_loss`, plus ``rows``."""
    n = y.size(0)
    return ProjectedPairLoss.apply(h[:n], weight, h[n:], weight, y, epsilon, pad_id, alpha, dtype, rows, native)


def rdrop_loss(h: Tensor, weight: Tensor, y: Tensor, epsilon: float, pad_id: int, alpha: float,
               dtype: torch.dtype) -> tuple[Tensor, Tensor]:
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
