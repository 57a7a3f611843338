"""Building transduce's C++ kernels on first use, with ``torch.utils.cpp_extension`` (cached under
``TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``; tens of seconds the first time).

The one build helper of the package: the C++ decoder step (``backends/native.py``), the training loss
(``train/native_loss.py``) and dropout (``train/dropout.py``) are all built here. Whether a built kernel is
used is chosen in :mod:`transduce.backends.policy` (decoding) and :mod:`transduce.train.kernels` (training), not here.

Instruction sets. Each kernel is compiled for one SIMD level (:data:`ISAS`: ``scalar``, ``avx2``,
``avx512``, ``avx512vnni`` on x86-64; ``scalar`` elsewhere, which the compiler vectorises for the
platform's baseline, NEON on aarch64), never with ``-march=native``. The level is part of the extension's
name, so a build cache keeps one build per level and a cache carried to another CPU (a shared home, a
container image) is never run where its instructions are missing. :func:`chosen_isa` picks the highest
level the CPU reports, or the lower one that ``TRANSDUCE_CPU_ISA`` names (as CTranslate2's
``CT2_FORCE_CPU_ISA``); the decoder's kernels return the same bits on every level (``backends/vecmath.h``).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import os
import platform
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ISA_VARIABLE = "TRANSDUCE_CPU_ISA"


@dataclass(frozen=True)
class Isa:
    """A SIMD level: its ``name``, the CPU flags it ``needs`` (as /proc/cpuinfo names them), the
    compiler ``flags`` that target it and the files those flags force-include (``includes``: part of the
    build's key, as the kernel's own headers are)."""

    name: str
    needs: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    includes: tuple[Path, ...] = ()


_AVX2 = Isa("avx2", ("avx2", "fma"), ("-mavx2", "-mfma"))
_AVX512 = Isa(
    "avx512",
    (*_AVX2.needs, "avx512f", "avx512bw", "avx512vl", "avx512dq"),
    (*_AVX2.flags, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"),
)
_VNNI = Isa("avx512vnni", (*_AVX512.needs, "avx512_vnni"), (*_AVX512.flags, "-mavx512vnni"))
X86 = platform.machine() in ("x86_64", "AMD64")
ISAS: tuple[Isa, ...] = (Isa("scalar"), _AVX2, _AVX512, _VNNI) if X86 else (Isa("scalar"),)


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags: /proc/cpuinfo's ``flags`` on Linux, else what torch detected."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    import torch

    capability = torch.backends.cpu.get_cpu_capability()  # "DEFAULT", "AVX2", "AVX512", ...
    return frozenset({"AVX2": _AVX2.needs, "AVX512": _AVX512.needs}.get(capability, ()))


def runnable_isas() -> tuple[Isa, ...]:
    """The levels this CPU can run, lowest first (``scalar`` always)."""
    return tuple(isa for isa in ISAS if set(isa.needs) <= cpu_flags())


def chosen_isa() -> tuple[Isa, str]:
    """The level the kernels are built for and why: the highest this CPU runs, or the one
    ``TRANSDUCE_CPU_ISA`` names (an error if the CPU cannot run it)."""
    runnable = runnable_isas()
    asked = os.environ.get(ISA_VARIABLE)
    if asked:
        names = [isa.name for isa in runnable]
        if asked not in names:
            known = [isa.name for isa in ISAS]
            raise ValueError(
                f"{ISA_VARIABLE}={asked!r}: "
                + (
                    f"this CPU runs only {', '.join(names)}"
                    if asked in known
                    else f"expected one of {', '.join(known)}"
                )
            )
        return runnable[names.index(asked)], f"{ISA_VARIABLE}={asked}"
    top = runnable[-1]
    missing = next((isa for isa in ISAS if isa not in runnable), None)
    why = "the CPU's best" + (f"; no {', '.join(sorted(set(missing.needs) - cpu_flags()))}" if missing else "")
    return top, why


def isa_named(name: str | Isa | None) -> Isa:
    """The level called ``name`` (None: :func:`chosen_isa`'s); an error if this CPU cannot run it. An
    :class:`Isa` is taken as it is (the tests' emulated levels: ``tests/test_backends_cpu_paths.py``)."""
    if name is None:
        return chosen_isa()[0]
    if isinstance(name, Isa):
        return name
    for isa in runnable_isas():
        if isa.name == name:
            return isa
    raise ValueError(f"SIMD level {name!r} cannot run here; this CPU runs {', '.join(i.name for i in runnable_isas())}")


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


def build_root() -> Path:
    """The folder ``torch.utils.cpp_extension`` builds extensions in (its ``_get_build_directory``'s root),
    found without importing that module, which imports setuptools and runs ninja: a quarter of a second
    of every start that loads a built kernel (``tests/test_cpp_build.py`` checks the two agree)."""
    import torch

    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is not None:
        return Path(root)
    if torch.version.hip is not None:
        accelerator = f"rocm{torch.version.hip.replace('.', '')}"
    elif torch.version.cuda is not None:
        accelerator = f"cu{torch.version.cuda.replace('.', '')}"
    else:
        accelerator = "cpu"
    python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    from torch._appdirs import user_cache_dir

    return Path(os.path.realpath(user_cache_dir(appname="torch_extensions"))) / f"{python}_{accelerator}"


STAMP = "transduce.built"  # written in a build's folder once torch has built and loaded it


def stamp_of(module: str) -> str:
    """What :data:`STAMP` holds for ``module``: its name and the torch it was built against (an upgraded
    torch goes through torch's checks again, which rebuild against its headers)."""
    import torch

    return f"{module} torch {torch.__version__}\n"


def load_built(build_dir: Path, module: str):
    """The module built before in ``build_dir`` (its :data:`STAMP` says so), imported directly; None if
    there is none or it does not import (then torch's loader checks and builds as usual)."""
    library = build_dir / f"{module}.so"
    try:
        if (build_dir / STAMP).read_text() != stamp_of(module) or not library.is_file():
            return None
        spec = importlib.util.spec_from_file_location(module, library)
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
        return loaded
    except (OSError, ImportError):
        return None


def build(
    name: str,
    source: Path,
    what: str,
    fallback: str,
    headers: tuple[Path, ...] = (),
    flags: tuple[str, ...] = ("-O3", "-ffast-math"),
    ldflags: tuple[str, ...] = (),
    isa: str | Isa | None = None,
):
    """The extension ``name`` compiled from ``source`` (which includes ``headers``) with ``flags`` for the
    SIMD level ``isa`` (:func:`isa_named`), or None, with a warning naming ``what`` could not be
    built and the ``fallback`` that runs instead.

    The module is named ``{name}_{isa}_{version}``: one build per level and per version of the code (the
    source, its headers, the flags and the source's folder) in the cache. A define changes with the
    headers, since torch rebuilds when the source or the flags change, not a header. The default flags
    (``-ffast-math``, so that the exp loops vectorise) suit the training kernels, whose inputs are finite
    logits and activations; the decoder step masks with -inf and passes its own flags, without it.
    """
    level = isa_named(isa)
    digest = hashlib.sha1(b"".join(h.read_bytes() for h in (*headers, *level.includes))).hexdigest()[:12]
    # the source, headers, flags and the source's folder name the build: two versions of the code (two checkouts,
    # an upgrade, a rollback) keep a build each in the cache, where one shared name rebuilt it at every switch (~40 s
    # a start). The folder too, because torch's build file names the source's path: two checkouts of the same code
    # under one name rebuilt it each time a command of the other one ran.
    version = hashlib.sha1(
        b"\0".join(
            [
                source.read_bytes() if source.is_file() else b"",
                digest.encode(),
                str(source.resolve().parent).encode(),
                *map(str.encode, flags),
            ]
        )
    ).hexdigest()[:8]
    module = f"{name}_{level.name}_{version}"
    build_dir = build_root() / module
    if (built := load_built(build_dir, module)) is not None:
        return built
    from torch.utils import cpp_extension

    try:
        with builder_lock(build_dir):
            loaded = cpp_extension.load(
                name=module,
                sources=[str(source)],
                extra_cflags=[*flags, *level.flags, f"-DTRANSDUCE_HEADERS={digest}"],
                extra_ldflags=list(ldflags) or None,
                verbose=False,
            )
            (build_dir / STAMP).write_text(stamp_of(module))
            return loaded
    except Exception as err:  # no compiler, no headers
        first = str(err).splitlines()[0] if str(err) else ""
        warnings.warn(
            f"transduce: {what} could not be built ({type(err).__name__}: {first}); {fallback}",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
