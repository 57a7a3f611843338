"""Building transduce's C++ kernels on first use, with ``torch.utils.cpp_extension`` (cached under
``TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``; tens of seconds the first time).

The one build helper of the package: the C++ decoder step (``decode/native.py``), the training loss
(``train/native_loss.py``) and dropout (``train/dropout.py``) are all built here. Whether a built kernel is
used is chosen in :mod:`transduce.fastpaths`, not here.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import platform
import warnings
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def builder_lock(build_dir: Path) -> Iterator[None]:
    """Hold ``build_dir/transduce.lock`` (an OS file lock, released when the process dies) while building,
    and remove torch's own ``lock`` file if it is stale.

    torch marks a build in progress with a plain ``lock`` file and waits, without a message, for as long as
    it exists; a build killed part-way (Ctrl-C during the first compile) leaves it behind, and every later
    process would then hang. Every transduce build holds the OS lock, so a ``lock`` file found while we hold
    it belongs to no live transduce build: it is removed, with a warning that names it.
    """
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / "transduce.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # waits while another transduce process builds here
        stale = build_dir / "lock"
        if stale.exists():
            stale.unlink(missing_ok=True)
            warnings.warn(
                f"transduce: removed {stale}, left by a build that was stopped part-way; building again",
                RuntimeWarning,
                stacklevel=4,
            )
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


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
        with builder_lock(Path(cpp_extension._get_build_directory(name, verbose=False))):
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
