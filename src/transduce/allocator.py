"""jemalloc for CPU training: the training commands re-run themselves with it preloaded, where it is found.

PyTorch on CPU allocates every activation and gradient with the C library's ``malloc``. Under glibc's, a
training process slows down as it runs: mutual learning under DDP started at 3.9k target tokens/s and fell
to 2.6k by update 2,000; with jemalloc preloaded it held 4.2-4.6k where nothing else ran; the same 100 batches
timed four times in a row ran 1.15-1.24x faster under jemalloc (README, "Which allocator trains").

``transduce train``, ``recipe`` and ``demo`` call :func:`reexec_with_jemalloc` first: if jemalloc is not
loaded yet and a ``libjemalloc.so.2`` is found (``TRANSDUCE_JEMALLOC`` names one; ``make setup`` puts one in
the virtual environment's ``lib/`` on Debian-like systems; else the system's), the process replaces itself
(``os.execve``, same PID, same arguments and environment) with ``LD_PRELOAD`` naming it. Child processes
(torchrun's ranks) inherit it. ``TRANSDUCE_JEMALLOC=0`` turns this off.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

LIBRARY = "libjemalloc.so.2"
SYSTEM_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
               "/usr/local/lib")


def find_jemalloc(environ: dict[str, str] | None = None) -> Path | None:
    """The jemalloc library to preload: ``TRANSDUCE_JEMALLOC`` if it names a file, else the virtual
    environment's ``lib/``, else a system directory; None if there is none (or ``TRANSDUCE_JEMALLOC=0``)."""
    env = os.environ if environ is None else environ
    named = env.get("TRANSDUCE_JEMALLOC", "")
    if named == "0":
        return None
    if named:
        if not Path(named).is_file():
            raise FileNotFoundError(f"TRANSDUCE_JEMALLOC={named}: no such file (unset it, or 0 to turn jemalloc off)")
        return Path(named)
    for directory in (Path(sys.prefix) / "lib", *map(Path, SYSTEM_DIRS)):
        if (directory / LIBRARY).is_file():
            return directory / LIBRARY
    return None


def loaded() -> bool:
    """Whether jemalloc is mapped into this process (Linux; False where /proc cannot be read)."""
    try:
        return "libjemalloc" in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def reexec_with_jemalloc() -> None:
    """Replace this process by the same command with jemalloc preloaded, when it is found and not loaded.

    Returns (doing nothing) when jemalloc is loaded, not found, turned off, or was already tried once.
    """
    if loaded() or os.environ.get("TRANSDUCE_JEMALLOC_TRIED"):
        return
    library = find_jemalloc()
    if library is None:
        return
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(filter(None, [str(library), env.get("LD_PRELOAD", "")]))
    env["TRANSDUCE_JEMALLOC_TRIED"] = "1"  # if the preload fails, the second process goes on without it
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def describe() -> str:
    """One line for a run's log: which allocator this process uses."""
    if loaded():
        return "allocator: jemalloc"
    return ("allocator: the C library's malloc (training runs faster with jemalloc: `make setup` fetches it on "
            "Debian-like systems, or install libjemalloc2, or set TRANSDUCE_JEMALLOC=/path/libjemalloc.so.2)")
