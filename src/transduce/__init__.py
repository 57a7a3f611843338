"""transduce: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

The public names load lazily, so command-line tools that do not need torch start fast.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

# Batch-invariant decoding (README, "Beam search does not depend on the batch") needs a GEMM whose row i
# does not depend on how many rows share the call. On Intel CPUs MKL's sgemm picks other kernels for a few
# rows (measured: rows 1-8 of a 256-wide input rounded differently from the same rows inside 64), which
# MKL's strict reproducibility mode stops. It must be set before the first MKL call, so here, on import;
# a value the user set is kept. Measured cost: none at batch 64, ~3 µs on a 4-row call.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

from .config import ConfigError

__version__ = "0.1.0"

_LAZY = {
    "ModelConfig": "transduce.model",
    "Transformer": "transduce.model",
    "load": "transduce.api",
}

__all__ = ["ConfigError", "ModelConfig", "Transformer", "load", "__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'transduce' has no attribute {name!r}")
