"""Label-smoothed cross-entropy (§5.4), computed in fp32, padding excluded.

The smoothed target for a label y is q = (1 − ε)·onehot(y) + ε·u, where u is uniform over the V − 1
**non-pad** tokens (the gold token included). Padding is never a correct output, so it receives no
target mass; its logit still takes part in the softmax, so the model learns to give it none. (fairseq
spreads ε over all V tokens including pad; the difference is one class in thousands.)

    loss = −Σ_v q_v log p_v = (1 − ε)·NLL + ε/(V − 1) · Σ_{v ≠ pad} −log p_v

With z the logits and lse = logsumexp(z): −log p_v = lse − z_v, so the smoothing sum is
(V − 1)·lse − Σ_{v≠pad} z_v and the full log-probability matrix is never materialised.
"""

from __future__ import annotations

import torch
from torch import Tensor


def label_smoothed_loss(logits: Tensor, target: Tensor, epsilon: float, pad_id: int = 0
                        ) -> tuple[Tensor, Tensor, int]:
    """Summed smoothed loss, summed NLL and the number of non-pad target tokens.

    Args:
        logits: (..., V), any float dtype (cast to fp32 here).
        target: (...) token ids; positions equal to ``pad_id`` are excluded.
        epsilon: ε_ls; 0 gives plain cross-entropy.
    Returns:
        (smoothed_sum, nll_sum) fp32 scalars and the token count (int).
    """
    V = logits.size(-1)
    keep = target != pad_id  # (...)
    z = logits[keep].float()  # (N, V) only real tokens
    y = target[keep]  # (N,)
    lse = torch.logsumexp(z, dim=-1)  # (N,)
    nll = lse - z.gather(-1, y.unsqueeze(-1)).squeeze(-1)  # (N,)
    nll_sum = nll.sum()
    if epsilon == 0.0:
        return nll_sum, nll_sum.detach(), int(y.numel())
    smooth = (V - 1) * lse - (z.sum(-1) - z[:, pad_id])  # (N,) Σ_{v≠pad} −log p_v
    loss = (1.0 - epsilon) * nll_sum + epsilon / (V - 1) * smooth.sum()
    return loss, nll_sum.detach(), int(y.numel())
