"""Learning-rate schedules (§5.3) as plain functions of the update number, and a way to apply them.

* ``rsqrt`` (the paper): lr = scale · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5) — linear warm-up
  for ``warmup`` steps, then decay with the inverse square root of the step. Peak at step = warmup.
* ``inverse_sqrt`` (fairseq): linear warm-up from ``init_lr`` to ``peak_lr`` over ``warmup`` steps, then
  peak_lr · sqrt(warmup / step). Same shape, but the peak is named directly.

Steps count optimizer updates from 1. No LambdaLR: :func:`set_lr` writes the value into every param group
before each update, so the schedule has no hidden state to checkpoint besides the step number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def rsqrt_lr(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """The paper's schedule (§5.3, Eq. 3) at update ``step`` (≥ 1)."""
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def inverse_sqrt_lr(step: int, peak_lr: float, warmup: int, init_lr: float = 0.0) -> float:
    """fairseq's ``inverse_sqrt``: linear warm-up init_lr → peak_lr, then peak_lr · √(warmup/step)."""
    step = max(step, 1)
    if step < warmup:
        return init_lr + (peak_lr - init_lr) * step / warmup
    return peak_lr * math.sqrt(warmup / step)


@dataclass(frozen=True)
class Schedule:
    """One of the two schedules, with its parameters; ``schedule(step)`` gives the learning rate."""

    kind: str  # "rsqrt" | "inverse_sqrt"
    warmup: int
    d_model: int = 512
    scale: float = 1.0
    peak_lr: float = 5e-4
    init_lr: float = 0.0

    def __call__(self, step: int) -> float:
        if self.kind == "rsqrt":
            return rsqrt_lr(step, self.d_model, self.warmup, self.scale)
        return inverse_sqrt_lr(step, self.peak_lr, self.warmup, self.init_lr)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Write ``lr`` into every parameter group (call before ``optimizer.step()``)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
