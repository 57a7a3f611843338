"""Building transduce's C++ kernels on first use, with ``torch.utils.cpp_extension`` (cached under
``TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``; tens of seconds the first time)."""

from __future__ import annotations

import os
import platform
import warnings
from pathlib import Path


def build(name: str, source: Path, switch: str, what: str, fallback: str):
    """The extension ``name`` compiled from ``source``, or None, with a warning naming ``what`` could not be
    built and the ``fallback`` that runs instead. The environment variable ``switch`` = 0 turns it off."""
    if os.environ.get(switch, "1") == "0":
        return None
    from torch.utils import cpp_extension

    arch = ["-march=native"] if platform.machine() in ("x86_64", "AMD64") else []
    try:  # -ffast-math lets the exp loops vectorise (glibc's libmvec)
        return cpp_extension.load(name=name, sources=[str(source)], extra_cflags=["-O3", "-ffast-math", *arch],
                                  verbose=False)
    except Exception as err:  # no compiler, no headers
        first = str(err).splitlines()[0] if str(err) else ""
        warnings.warn(f"transduce: {what} could not be built ({type(err).__name__}: {first}); {fallback}",
                      RuntimeWarning, stacklevel=3)
        return None
