"""Building transduce's C++ kernels on first use, with ``torch.utils.cpp_extension`` (cached under
``TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``; tens of seconds the first time).

The one build helper of the package: the C++ decoder step (``decode/native.py``), the training loss
(``train/native_loss.py``) and dropout (``train/dropout.py``) are all built here. Whether a built kernel is
used is chosen in :mod:`transduce.fastpaths`, not here.
"""

from __future__ import annotations

import hashlib
import platform
import warnings
from pathlib import Path


def build(
    name: str,
    source: Path,
    what: str,
    fallback: str,
    headers: tuple[Path, ...] = (),
    flags: tuple[str, ...] = ("-O3", "-ffast-math"),
    ldflags: tuple[str, ...] = (),
):
    """The extension ``name`` compiled from ``source`` (which includes ``headers``) with ``flags``, or None,
    with a warning naming ``what`` could not be built and the ``fallback`` that runs instead.

    ``-march=native`` is added on x86-64 (the int8 kernel then uses the CPU's AVX-512 VNNI or AVX2), and a
    define that changes with the headers: torch rebuilds when the source or the flags change, not a header.
    """
    from torch.utils import cpp_extension

    arch = ["-march=native"] if platform.machine() in ("x86_64", "AMD64") else []
    digest = hashlib.sha1(b"".join(h.read_bytes() for h in headers)).hexdigest()[:12]
    try:
        return cpp_extension.load(
            name=name,
            sources=[str(source)],
            extra_cflags=[*flags, *arch, f"-DTRANSDUCE_HEADERS={digest}"],
            extra_ldflags=list(ldflags) or None,
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
