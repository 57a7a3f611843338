"""The loss of one block of logit rows in C++ (``native_loss.h``), for :mod:`~transduce.train.loss`.

The tensor-op version (``loss._block``, ``loss._rdrop_block``) stays as the readable reference and the
fallback. The extension (:mod:`~transduce.train.native`, shared with dropout) is compiled on first use;
:func:`extension` returns None when it cannot be built (no C++ compiler), and the loss then runs the tensor
ops. ``train.loss_kernel = "tensor"`` turns it off (chosen in :mod:`transduce.train.kernels`), for A/B
timing: ``python bench/train_step.py DATA --threads 1 --max-tokens 1024 --rdrop-alpha 2 --loss-kernel
native|tensor`` (whole steps) or ``python bench/loss_block.py`` (the loss alone; README, "Which loss kernel
trains").
"""

from __future__ import annotations

import torch
from torch import Tensor

from .native import extension


def applies(*blocks: Tensor) -> bool:
    """Whether the C++ loss takes these logit blocks: CPU, fp32 or bf16, and the extension built."""
    return (
        all(b.device.type == "cpu" and b.dtype in (torch.float32, torch.bfloat16) for b in blocks)
        and extension() is not None
    )


def smoothed_block_(z: Tensor, y: Tensor, epsilon: float, pad_id: int, grad: bool) -> tuple[Tensor, Tensor]:
    """Loss and NLL (r,) of each row of logits ``z`` (r, V) with labels ``y`` (r,); afterwards ``z`` holds
    ∂loss/∂z = softmax(z) − q (in its own dtype) when ``grad``. As ``loss._block``."""
    out = extension().smoothed_block_(z, y, epsilon, pad_id, grad)  # (r, 2)
    return out[:, 0], out[:, 1]


def rdrop_block_(
    z1: Tensor, z2: Tensor, y: Tensor, epsilon: float, pad_id: int, alpha: float, grad: bool
) -> tuple[Tensor, Tensor]:
    """R-Drop loss and the two copies' summed NLL (r,) of logit blocks ``z1``, ``z2`` (r, V) with labels
    ``y`` (r,); afterwards they hold their gradients when ``grad``. As ``loss._rdrop_block``."""
    out = extension().rdrop_block_(z1, z2, y, epsilon, pad_id, alpha, grad)  # (r, 2)
    return out[:, 0], out[:, 1]
