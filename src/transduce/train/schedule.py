"""Learning-rate schedules (§5.3) as plain functions of the update number, and a way to apply them.

* ``rsqrt`` (the paper): lr = scale · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5) — linear warm-up
  for ``warmup`` steps, then decay with the inverse square root of the step. Peak at step = warmup.
* ``inverse_sqrt`` (fairseq): linear warm-up from ``init_lr`` to ``peak_lr`` over ``warmup`` steps, then
  peak_lr · sqrt(warmup / step). Same shape, but the peak is named directly.
* ``linear`` (budgeted training): linear warm-up to ``peak_lr``, then linear decay to zero at the end of the
  run's budget. The budget is whichever of ``max_steps`` and ``max_minutes`` runs out first, so the caller
  passes ``progress`` ∈ [0, 1], the larger of the two fractions used so far. With a wall-clock budget the
  learning rate depends on elapsed time, so a resumed run is not bit-identical to an uninterrupted one.
  ``warmup_share`` > 0 also ends the warm-up once that fraction of the budget is used: a wall-clock budget
  holds as many updates as the machine makes, and on a slow one ``warmup`` updates could be all of them.

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


def warmed(step: int, warmup: int, progress: float, warmup_share: float = 0.0) -> float:
    """How far the warm-up is, 0 to 1: ``step / warmup``, or ``progress / warmup_share`` if that is further."""
    done = max(step, 1) / warmup
    if warmup_share > 0:
        done = max(done, progress / warmup_share)
    return min(done, 1.0)


def linear_lr(
    step: int, peak_lr: float, warmup: int, progress: float, init_lr: float = 0.0, warmup_share: float = 0.0
) -> float:
    """Linear warm-up init_lr → peak_lr over ``warmup`` steps (or ``warmup_share`` of the budget, whichever
    ends first), times (1 − progress) of the budget."""
    ramp = init_lr + (peak_lr - init_lr) * warmed(step, warmup, progress, warmup_share)
    return ramp * max(0.0, 1.0 - progress)


@dataclass(frozen=True)
class Schedule:
    """One of the schedules, with its parameters; ``schedule(step, progress)`` gives the learning rate.

    ``progress`` (the fraction of the run's budget used, 0 to 1) matters only to ``linear``.
    """

    kind: str  # "rsqrt" | "inverse_sqrt" | "linear"
    warmup: int
    d_model: int = 512
    scale: float = 1.0
    peak_lr: float = 5e-4
    init_lr: float = 0.0
    warmup_share: float = 0.0  # linear: the warm-up ends by this fraction of the budget at the latest (0 = off)

    def __call__(self, step: int, progress: float = 0.0) -> float:
        if self.kind == "rsqrt":
            return rsqrt_lr(step, self.d_model, self.warmup, self.scale)
        if self.kind == "linear":
            return linear_lr(step, self.peak_lr, self.warmup, progress, self.init_lr, self.warmup_share)
        return inverse_sqrt_lr(step, self.peak_lr, self.warmup, self.init_lr)

    def warmed_up(self, step: int, progress: float = 0.0) -> bool:
        """Whether the warm-up is over after update ``step`` at ``progress`` of the budget."""
        share = self.warmup_share if self.kind == "linear" else 0.0
        return warmed(step, self.warmup, progress, share) >= 1.0


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Write ``lr`` into every parameter group (call before ``optimizer.step()``)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
