"""transduce: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

The public names load lazily, so command-line tools that do not need torch start fast. Importing the package
has no process-wide effect: the settings a command needs (MKL's reproducibility mode, jemalloc for training)
are made by that command (cli.py, api.load).
"""

from __future__ import annotations

import importlib
from typing import Any

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
