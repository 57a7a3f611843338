"""A cheaper dropout for training on CPU (§5.4's residual dropout, same distribution).

Profiling a ``small`` bf16 step showed ``nn.Dropout`` spending much of its time generating the mask.
:class:`FastDropout` draws the mask with one in-place ``bernoulli_`` in the activation's own dtype
(bf16 under autocast) and multiplies once; measured ≈ 2.5× faster than ``F.dropout`` on the mask
alone (see the report in issue 4). Same keep probability 1 − p and the same 1/(1 − p) rescaling.

:func:`use_fast_dropout` swaps every ``nn.Dropout`` of a model in place. Dropout modules hold no
parameters, so checkpoints and model directories are unchanged.
"""

from __future__ import annotations

from torch import Tensor, nn


class FastDropout(nn.Module):
    """Inverted dropout: x · Bernoulli(1 − p) / (1 − p) in training, identity in eval."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty(x.shape).bernoulli_(keep).mul_(1.0 / keep)  # same shape and dtype as x
        return x * mask

    def extra_repr(self) -> str:
        return f"p={self.p}"


def use_fast_dropout(model: nn.Module) -> int:
    """Replace each ``nn.Dropout`` in ``model`` by :class:`FastDropout`; return how many were swapped."""
    swapped = 0
    for parent in model.modules():
        for name, child in list(parent.named_children()):
            if type(child) is nn.Dropout:
                setattr(parent, name, FastDropout(child.p))
                swapped += 1
    return swapped
