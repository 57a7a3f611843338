"""Building transduce's C++ kernels on first use, with ``torch.utils.cpp_extension`` (cached under
``TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``; tens of seconds the first time)."""

from __future__ import annotations

import hashlib
import os
import platform
import warnings
from pathlib import Path


def build(name: str, source: Path, switch: str, what: str, fallback: str, headers: tuple[Path, ...] = ()):
    """The extension ``name`` compiled from ``source`` (which includes ``headers``), or None, with a warning
    naming ``what`` could not be built and the ``fallback`` that runs instead. The environment variable
    ``switch`` = 0 turns it off."""
    if os.environ.get(switch, "1") == "0":
        return None
    from torch.utils import cpp_extension

    arch = ["-march=native"] if platform.machine() in ("x86_64", "AMD64") else []
    # torch rebuilds when the source or the flags change, not a header: a define that changes with them
    digest = hashlib.sha1(b"".join(h.read_bytes() for h in headers)).hexdigest()[:12]
    try:  # -ffast-math lets the exp loops vectorise (glibc's libmvec)
        return cpp_extension.load(
            name=name,
            sources=[str(source)],
            extra_cflags=["-O3", "-ffast-math", *arch, f"-DTRANSDUCE_HEADERS={digest}"],
            verbose=False,
        )
    except Exception as err:  # no compiler, no headers
        first = str(err).splitlines()[0] if str(err) else ""
        warnings.warn(
            f"transduce: {what} could not be built ({type(err).__name__}: {first}); {fallback}",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
