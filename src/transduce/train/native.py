"""The training step's C++ kernels, one extension: ``native_train.cpp``, which holds the loss of a block of logit
rows (``native_loss.h``, used by :mod:`~transduce.train.native_loss`), dropout (``native_dropout.h``, used by
:mod:`~transduce.train.dropout`), the post-norm sub-layer connection (``native_residual.h``, used by
:mod:`~transduce.train.residual`) and attention over the packed projections (``native_attention.h``, used by
:mod:`~transduce.train.attention`). One build parses ATen's headers once for all (19 s on a 2-core AMD EPYC, where
two extensions that included ``torch/extension.h`` took 49 s each), then it is cached under
``TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``."""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

from ..cpp import build

HERE = Path(__file__).parent
SOURCE = HERE / "native_train.cpp"
HEADERS = (
    HERE / "native_attention.h",
    HERE / "native_loss.h",
    HERE / "native_dropout.h",
    HERE / "native_residual.h",
    HERE / "bf16.h",
)


FLAGS = ("-O3", "-ffast-math")
OPENMP = ("-fopenmp",)  # at::parallel_for runs on torch's threads only when the kernels are built with OpenMP


@functools.cache
def extension():
    """The compiled extension module, or None (with a warning saying why) if it cannot be built. With OpenMP where
    the compiler has it, else (Apple's clang) the same kernels on one thread."""
    args = (
        "transduce_native_train",
        SOURCE,
        "the C++ training kernels (loss, dropout, residual, attention)",
        "training uses the tensor-op loss, dropout, residual and attention",
    )
    with warnings.catch_warnings(record=True):  # a failure is told by the build without OpenMP, if that fails too
        warnings.simplefilter("always")
        built = build(*args, headers=HEADERS, flags=(*FLAGS, *OPENMP), ldflags=OPENMP)
    return built if built is not None else build(*args, headers=HEADERS, flags=FLAGS)
