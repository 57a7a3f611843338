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
    bf16 step with an 8k vocabulary: ``python bench/train_step.py DATA --threads 1 --profile``.)
    """

    @staticmethod
    def forward(ctx, z: Tensor, y: Tensor, epsilon: float, pad_id: int, rows: int = 32) -> tuple[Tensor, Tensor]:
        N = z.size(0)
        want_grad = ctx.needs_input_grad[0]
        grad = torch.empty_like(z) if want_grad else None  # (N, V)
        loss_rows, nll_rows = z.new_empty(N, dtype=torch.float32), z.new_empty(N, dtype=torch.float32)  # (N,)
        for s in range(0, N, rows):
            block = z[s : s + rows].to(torch.float32, copy=True)  # (r, V)
            loss_rows[s : s + rows], nll_rows[s : s + rows] = _block(
                block, y[s : s + rows, None], epsilon, pad_id, want_grad
            )
            if want_grad:
                grad[s : s + rows].copy_(block)
        if want_grad:
            ctx.save_for_backward(grad)
        return loss_rows.double().sum().float(), nll_rows.double().sum().float()

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        (grad,) = ctx.saved_tensors
        return grad * grad_loss.to(grad.dtype), None, None, None, None


# The backward's two matmuls take the (N, V) gradient with N, the batch's target tokens, rounded up to a
# multiple of this with zero rows. On a CPU with native bf16, PyTorch's matmuls are oneDNN primitives, built
# (JIT-compiled) for each new shape and kept in a cache: with N different in nearly every batch, building the
# (N, V) × (V, d) and (V, N) × (N, d) products took ~13 and ~5 ms at V = 8,000, d = 128 against ~2-3 ms to run
# them (one core of an Intel Xeon with AMX, ONEDNN_VERBOSE=all). Rounded, the demo's batches make 9 shapes, not
# 233, and the zero rows add under 4% to two matmuls.
PAD_ROWS = 64


def rounded_rows(n: int) -> int:
    """``n`` rounded up to a multiple of :data:`PAD_ROWS`."""
    return -(-n // PAD_ROWS) * PAD_ROWS


def gradient_rows(hc: Tensor, vocab: int) -> Tensor:
    """An (P, V) gradient for ``hc``'s N rows, P = :func:`rounded_rows` (N): rows N and on are zero, the first
    N uninitialised, for the forward to fill."""
    n = hc.size(0)
    full = hc.new_empty(rounded_rows(n), vocab)  # (P, V)
    full[n:].zero_()
    return full


def padded(t: Tensor) -> Tensor:
    """``t`` (N, k) with zero rows appended up to :func:`rounded_rows` (N) (P, k)."""
    extra = rounded_rows(t.size(0)) - t.size(0)
    return torch.cat([t, t.new_zeros(extra, t.size(1))]) if extra else t


class ProjectedSmoothedCrossEntropy(torch.autograd.Function):
    """The pre-softmax projection (§3.4) and the smoothed loss in one: hidden states ``h`` (N, d), the
    projection ``weight`` (V, d), labels ``y`` (N,), matmuls in ``dtype``.

    Each block of ``rows`` logits is made by one matmul and turned into its gradient in place, row by row, so
    the (N, V) logits are never kept; only their gradient is (in ``dtype``), for the two backward matmuls
    (``rows``: :func:`transduce.train.step.loss_block_rows`). The loss's scale (``grad_loss``) multiplies the small (N, d) and (V, d) results, not (N, V).
    """

    @staticmethod
    def forward(
        ctx,
        h: Tensor,
        weight: Tensor,
        y: Tensor,
        epsilon: float,
        pad_id: int,
        dtype: torch.dtype,
        rows: int = 64,
        native: bool = True,
    ) -> tuple[Tensor, Tensor]:
        hc, wc = h.to(dtype), weight.to(dtype)  # (N, d), (V, d)
        N, want_grad = h.size(0), any(ctx.needs_input_grad[:2])
        full = gradient_rows(hc, weight.size(0)) if want_grad else None  # (P, V), P ≥ N: zero rows after N
        grad = full[:N] if want_grad else None  # (N, V) ∂loss/∂logits
        loss_rows, nll_rows = h.new_empty(N, dtype=torch.float32), h.new_empty(N, dtype=torch.float32)  # (N,)
        if native and native_loss.applies(hc):  # the same per block in C++: logits made in place, turned into ∂loss/∂z
            for s in range(0, N, rows):
                e = min(s + rows, N)
                block = torch.mm(hc[s:e], wc.t(), out=grad[s:e]) if want_grad else hc[s:e] @ wc.t()  # (r, V)
                loss_rows[s:e], nll_rows[s:e] = native_loss.smoothed_block_(block, y[s:e], epsilon, pad_id, want_grad)
            return _project_save(ctx, h, weight, hc, wc, full, loss_rows, nll_rows)
        for s in range(0, N, rows):
            block = (hc[s : s + rows] @ wc.t()).float()  # (r, V)
            loss_rows[s : s + rows], nll_rows[s : s + rows] = _block(
                block, y[s : s + rows, None], epsilon, pad_id, want_grad
            )
            if want_grad:
                grad[s : s + rows].copy_(block)
        return _project_save(ctx, h, weight, hc, wc, full, loss_rows, nll_rows)

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        return (*_project_back(ctx, grad_loss), None, None, None, None, None, None)


def _project_save(ctx, h, weight, hc, wc, grad, loss_rows, nll_rows) -> tuple[Tensor, Tensor]:
    """Keep what :func:`_project_back` needs (``grad``, from :func:`gradient_rows`, is None without
    gradients); sum the rows' losses."""
    if grad is not None:
        ctx.save_for_backward(padded(hc), wc, grad)  # (P, d), (V, d), (P, V)
        ctx.rows = h.size(0)
        ctx.dtypes = (h.dtype, weight.dtype)
    return loss_rows.double().sum().float(), nll_rows.double().sum().float()


def _project_back(ctx, grad_loss: Tensor) -> tuple[Tensor | None, Tensor | None]:
    """∂/∂h and ∂/∂weight of a projected loss from its saved (N, V) gradient w.r.t. the logits."""
    hc, wc, grad = ctx.saved_tensors  # (P, d), (V, d), (P, V): N rows and P − N zero rows
    scale, n = grad_loss.float(), ctx.rows
    grad_h = (grad @ wc)[:n].float().mul_(scale).to(ctx.dtypes[0]) if ctx.needs_input_grad[0] else None  # (N, d)
    grad_w = (grad.t() @ hc).float().mul_(scale).to(ctx.dtypes[1]) if ctx.needs_input_grad[1] else None  # (V, d)
    return grad_h, grad_w


def label_smoothed_loss(logits: Tensor, target: Tensor, epsilon: float, pad_id: int = 0) -> tuple[Tensor, Tensor, int]:
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


class SmoothedLoss:
    """The paper's training objective (§5.4): label-smoothed cross-entropy of every non-pad position.

    This is the interface every training objective follows (:class:`~transduce.train.rdrop.RDrop` is the
    other one); :class:`~transduce.train.step.TrainingLoss` calls it once per batch:

    * ``copies``: how many times each sentence goes through the model, each under its own dropout masks
      (here 1). The step runs the batch ``copies`` times in one forward and counts each token that often.
    * ``__call__(states, weight, labels, dtype, rows)``: ``states`` (copies·N, d) the decoder's final states
      at the N non-pad positions, copy by copy; ``weight`` (V, d) the pre-softmax projection (§3.4);
      ``labels`` (N,); matmuls in ``dtype``, blocks of ``rows`` positions. Returns the summed loss (with a
      gradient) and the summed NLL over all copies.
    """

    copies = 1

    def __init__(self, epsilon: float, pad_id: int = 0, native: bool = True):
        # native: the C++ loss blocks where they apply, else the tensor ops (chosen in transduce.train.kernels)
        self.epsilon, self.pad_id, self.native = float(epsilon), pad_id, native

    def __call__(
        self, states: Tensor, weight: Tensor, labels: Tensor, dtype: torch.dtype, rows: int
    ) -> tuple[Tensor, Tensor]:
        return ProjectedSmoothedCrossEntropy.apply(
            states, weight, labels, self.epsilon, self.pad_id, dtype, rows, self.native
        )
