"""A cheaper dropout for training on CPU (§5.4's residual dropout, same distribution).

Profiling a ``small`` bf16 step showed ``nn.Dropout`` spending much of its time generating the mask:
one Bernoulli draw (a 32-bit random number and a float compare) per element. :class:`FastDropout`
draws 64-bit random integers instead (``random_``, one generator call each) and reads each as four
16-bit chunks, of which the low 15 bits are uniform: an element is kept when u15 ≥ round(p·32768).
The drop probability is p rounded to a multiple of 1/32768 (|error| < 1.6e-5); survivors are scaled
by 1/(1 − p) as in ``F.dropout``. Measured on one thread, forward + backward of a (180, 22, 128) bf16
activation: ≈ 2.5 ms instead of ≈ 5.7 ms for ``F.dropout`` (``python bench/dropout_kernel.py``). The generator is
torch's CPU generator, so checkpoints that save its state resume the same masks.

On CPU, fp32 and bf16 activations take a C++ version of the same distribution (``native_dropout.h``):
one pass, no stored mask (the backward pass recomputes it from a seed drawn from torch's generator).
Forward + backward of a (156, 12, 128) bf16 activation, 1 thread: see ``python bench/dropout_kernel.py``.
The tensor ops stay as the reference and the fallback (no compiler, or ``train.dropout_kernel = "tensor"``,
chosen in :mod:`transduce.train.kernels`).

:func:`use_fast_dropout` swaps every ``nn.Dropout`` of a model in place. Dropout modules hold no
parameters, so checkpoints and model directories are unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..model.attention import MultiHeadAttention
from .native import extension


def draw_seed() -> int:
    """A C++ mask's seed, one draw from torch's CPU generator (so a checkpoint that saves its state resumes the
    same masks)."""
    return int(torch.empty((), dtype=torch.int64).random_())


class _NativeDropout(torch.autograd.Function):
    """x · keep · scale in C++, keep a function of (seed, index); the backward pass applies the same mask."""

    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:
        ctx.args = (draw_seed(), round(p * 32768), 1.0 / (1.0 - p))
        return extension().dropout(x.contiguous(), *ctx.args)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return extension().dropout(grad.contiguous(), *ctx.args), None


class FastDropout(nn.Module):
    """Inverted dropout: x · Bernoulli(1 − p) / (1 − p) in training, identity in eval. ``native``: the C++
    kernel for fp32/bf16 CPU activations where it is built, else the tensor ops."""

    def __init__(self, p: float, native: bool = True):
        super().__init__()
        self.p, self.native = p, native

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, training=True)  # GPU dropout is already cheap
        if self.native and x.dtype in (torch.float32, torch.bfloat16) and extension() is not None:
            return _NativeDropout.apply(x, self.p)
        keep = self.keep_mask(x.numel()).view(x.shape)  # bool, like x
        return (x * keep).mul_(1.0 / (1.0 - self.p))

    def keep_mask(self, n: int) -> Tensor:
        """(n,) bool, each False with probability round(p·32768)/32768, from ⌈n/4⌉ 64-bit draws."""
        words = torch.empty((n + 3) // 4, dtype=torch.int64).random_()  # 63 random bits each
        u15 = words.view(torch.int16)[:n] & 0x7FFF  # (n,) uniform in [0, 32767]
        return u15 >= round(self.p * 32768)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class LateDropout:
    """The model's dropout off for the first ``start`` share of the budget, then at its configured rates: late
    dropout (Liu et al., 2023, "Dropout Reduces Underfitting"), for a model that learns fastest without dropout
    and over-fits only late (on the demo's 15 minutes it lost: docs/multi30k.md). Sets ``p`` of every dropout
    module (:class:`FastDropout` or ``nn.Dropout``: residual, embedding, activation) and the attention modules'
    ``dropout`` rate; a function of the budget's progress, so a resumed run switches at the same update."""

    def __init__(self, model: nn.Module, start: float):
        self.start, self.on = start, None
        self.rates = [(m, "p", m.p) for m in model.modules() if isinstance(m, (nn.Dropout, FastDropout))]
        self.rates += [(m, "dropout", m.dropout) for m in model.modules() if isinstance(m, MultiHeadAttention)]
        if not any(rate > 0 for *_, rate in self.rates):
            raise ValueError("key 'dropout_from': the model has no dropout to turn on (set model.dropout > 0)")

    def __call__(self, progress: float) -> bool:
        """Set the rates for ``progress`` (0-1, the share of the budget used); True when this call turned
        dropout on."""
        on = progress >= self.start
        if on == self.on:
            return False
        for module, name, rate in self.rates:
            setattr(module, name, rate if on else 0.0)
        self.on = on
        return on


def use_fast_dropout(model: nn.Module, native: bool = True) -> int:
    """Replace each ``nn.Dropout`` in ``model`` by :class:`FastDropout` (C++ kernel if ``native``); return how
    many were swapped."""
    swapped = 0
    for parent in model.modules():
        for name, child in list(parent.named_children()):
            if type(child) is nn.Dropout:
                setattr(parent, name, FastDropout(child.p, native))
                swapped += 1
    return swapped
