"""The training step's C++ kernels, one extension: ``native_train.cpp``, which holds the loss of a block of logit
rows (``native_loss.h``, used by :mod:`~transduce.train.native_loss`) and dropout (``native_dropout.h``, used by
:mod:`~transduce.train.dropout`). One build parses ATen's headers once for both (19 s on a 2-core AMD EPYC, where
two extensions that included ``torch/extension.h`` took 49 s each), then it is cached under
``TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``."""

from __future__ import annotations

import functools
from pathlib import Path

from ..cpp import build

HERE = Path(__file__).parent
SOURCE = HERE / "native_train.cpp"
HEADERS = (HERE / "native_loss.h", HERE / "native_dropout.h", HERE / "bf16.h")


@functools.cache
def extension():
    """The compiled extension module, or None (with a warning saying why) if it cannot be built."""
    return build(
        "transduce_native_train",
        SOURCE,
        "the C++ training kernels (loss and dropout)",
        "training uses the tensor-op loss and dropout",
        headers=HEADERS,
    )
