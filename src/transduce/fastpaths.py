"""What runs each hot part, and why: the record a command logs in one line.

A :class:`FastPaths` is built once at the start of a command: by the trainer from ``[train]``'s kernel keys
(:func:`transduce.train.kernels.for_training`), and by ``transduce.load`` (so ``translate``, ``evaluate`` and
``serve``) from the decoding backend that :mod:`transduce.backends.policy` chose. It is frozen, each choice
carries the reason for it, and :meth:`FastPaths.line` is the one log line that says what runs. Nothing here
is module-level state: the model and loss read the choice they are given.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields

log = logging.getLogger("transduce")


@dataclass(frozen=True)
class Choice:
    """One choice: the implementation's ``name`` and ``why`` it was chosen."""

    name: str
    why: str

    def __str__(self) -> str:
        return f"{self.name} ({self.why})"


@dataclass(frozen=True)
class FastPaths:
    """The implementations a command runs; a part it does not use is None.

    attention: training's full-sequence attention ("native" = the C++ kernel over the packed projections,
    "written" = the formula with fp32 scores, or an SDPA kernel: "default", "math", "flash", "efficient"); loss: "native" (C++ block kernel) or "tensor";
    dropout: "native", "tensor" (FastDropout's tensor ops) or "torch" (``nn.Dropout``); residual: post-norm's
    sub-layer connection, "native" (one C++ kernel) or "tensor" (the modules); muon: the
    dtype of Muon's Newton-Schulz iterations ("fp32" or "bf16"), in a run that uses Muon; allocator: "jemalloc"
    or "malloc"; decoder: one of :data:`transduce.backends.BACKENDS`; simd: the SIMD level the C++ kernels
    are built for (:func:`simd_choice`), where one runs; onednn_cache: how many oneDNN primitives (PyTorch's bf16
    matmuls on CPU, one per shape) a training process keeps built.
    """

    attention: Choice | None = None
    loss: Choice | None = None
    dropout: Choice | None = None
    residual: Choice | None = None
    muon: Choice | None = None
    allocator: Choice | None = None
    decoder: Choice | None = None
    simd: Choice | None = None
    onednn_cache: Choice | None = None

    def line(self) -> str:
        """The one log line: ``fast paths: part=name (why); ...``."""
        return "fast paths: " + "; ".join(
            f"{f.name}={getattr(self, f.name)}" for f in fields(self) if getattr(self, f.name) is not None
        )


def simd_choice() -> Choice:
    """The SIMD level of the C++ kernels (:func:`transduce.cpp.chosen_isa`): the CPU's best, or the one
    ``TRANSDUCE_CPU_ISA`` names."""
    from .cpp import chosen_isa

    isa, why = chosen_isa()
    return Choice(isa.name, why)
