"""jemalloc for CPU training: the training commands re-run themselves with it preloaded, wherever it is found.

PyTorch on CPU allocates every activation and gradient with the C library's ``malloc``. glibc's slowed a
training process down as it ran: a two-model training under DDP (mutual learning, since removed from
transduce; measured at commit c2021c6 on a CPU with native bf16) started at 3.9k target tokens/s and fell to
2.6k by update 2,000; with jemalloc preloaded it held 4.2-4.6k; the same 100 batches timed four times in a row
ran 1.15-1.24x faster under jemalloc. With the options below it trains faster on a 2-core AVX2 AMD EPYC in
fp32 too (2026-12-07): the demo's update under DDP 1.12x, paper-base's 1.03-1.21x (docs/performance.md,
"The allocator").

``transduce train``, ``recipe`` and ``demo`` call :func:`reexec_with_jemalloc` first: if jemalloc is not
loaded yet, is wanted (:func:`choose`) and a ``libjemalloc.so.2`` is found (``make setup`` puts one in the
virtual environment's ``lib/`` on Debian-like systems; else the system's), the process replaces itself
(``os.execve``, same PID, same arguments and environment) with ``LD_PRELOAD`` naming it. Child processes
(torchrun's ranks) inherit it. ``TRANSDUCE_JEMALLOC=/path`` preloads that library on any CPU;
``TRANSDUCE_JEMALLOC=0`` turns jemalloc off everywhere.

jemalloc runs with ``MALLOC_CONF`` = :data:`MALLOC_CONF` unless the environment sets its own: freed pages
stay with the process. By default jemalloc hands pages it has not reused for 10 s back to the kernel
(``madvise``), and a training step, which frees and allocates the same activations every update, faulted them
in again: on a 2-core AMD EPYC with AVX-512-BF16, the demo's config under DDP spent 19.7 s of system time
in 300 updates with the default and 9.2 s without the decay, and an update took 274-290 against 254-258 ms
(one process: 204 against 176-183 ms; `bench/train_step.py` does not re-execute, so it runs jemalloc's
default unless MALLOC_CONF is set). Pages kept for good grew without bound where batch shapes vary more: at
``max_tokens`` 1,536 on the demo's data one process grew by ~8 MB per update (rank 0 reached 16 GB by update
1,000 and was killed for memory; at 1,024 it stayed flat). So a page unused for a second becomes "muzzy"
(``madvise(MADV_FREE)``: the kernel takes it back only when it needs the memory, and a page it has not taken
is reused without a fault) and is never purged harder: the same 500 updates at 1,536, validating every 100,
held 1.2 GB throughout (default decay 1.0 GB, no decay 1.3 GB rising to 4.9 GB).

Those options held only below 8 MiB: jemalloc serves each larger request from a dedicated arena that hands
its pages back as soon as they are freed, whatever the decay (its ``oversize_threshold``). paper-base's
activations at 4,000 tokens are 16-32 MB each, so a paper-base update under jemalloc faulted in ~890,000 pages
(3.5 GB) and ran at 0.70x glibc's speed; ``oversize_threshold:0`` puts every size under the same decay: 14,000
faults per update, glibc's speed, and the demo's ``small`` update 1.19x faster than before (Intel Xeon with
AMX, 2026-12-06).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

LIBRARY = "libjemalloc.so.2"
# jemalloc's options (its MALLOC_CONF variable) for a training process: a freed page stays for reuse, and after a
# second unused becomes lazily freeable (MADV_FREE), which the kernel reclaims only under memory pressure; at
# every size (oversize_threshold:0: no separate arena for requests over 8 MiB, which would return them at once)
MALLOC_CONF = "dirty_decay_ms:1000,muzzy_decay_ms:-1,oversize_threshold:0"
SYSTEM_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")


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


def choose(environ: dict[str, str] | None = None) -> tuple[Path | None, str]:
    """The jemalloc library to preload and "", or None and why not, in words for the run's log.

    ``TRANSDUCE_JEMALLOC=/path`` is always honoured and ``=0`` always refused; unset, jemalloc is looked for
    in the virtual environment and the system (:func:`find_jemalloc`).
    """
    env = os.environ if environ is None else environ
    named = env.get("TRANSDUCE_JEMALLOC", "")
    if named == "0":
        return None, "TRANSDUCE_JEMALLOC=0"
    library = find_jemalloc(env)
    if library is None:
        return None, (
            "no libjemalloc.so.2 found; training runs faster with it here: `make setup` fetches it "
            "on Debian-like systems, or install libjemalloc2, or set TRANSDUCE_JEMALLOC=/path"
        )
    return library, ""


def loaded() -> bool:
    """Whether jemalloc is mapped into this process (Linux; False where /proc cannot be read)."""
    try:
        return "libjemalloc" in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def preload_environment(library: Path, environ: dict[str, str]) -> dict[str, str]:
    """``environ`` with ``library`` preloaded and jemalloc's options: :data:`MALLOC_CONF`, unless the
    environment names its own (``MALLOC_CONF``, kept as it is)."""
    env = dict(environ)
    env["LD_PRELOAD"] = ":".join(filter(None, [str(library), env.get("LD_PRELOAD", "")]))
    env.setdefault("MALLOC_CONF", MALLOC_CONF)
    env["TRANSDUCE_JEMALLOC_TRIED"] = "1"  # if the preload fails, the second process goes on without it
    return env


def reexec_with_jemalloc() -> None:
    """Replace this process by the same command with jemalloc preloaded, when it is found and not loaded.

    Returns (doing nothing) when jemalloc is loaded, not wanted (:func:`choose`), not found, or was already
    tried once.
    """
    if loaded() or os.environ.get("TRANSDUCE_JEMALLOC_TRIED"):
        return
    library, _ = choose()
    if library is None:
        return
    env = preload_environment(library, os.environ)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def options() -> str:
    """jemalloc's options in this process, for the run's log: ``MALLOC_CONF='...'``."""
    return f"MALLOC_CONF={os.environ.get('MALLOC_CONF', '')!r}"


def describe() -> str:
    """One line for a run's log: which allocator this process uses."""
    if loaded():
        return f"allocator: jemalloc ({options()})"
    library, why = choose()
    if library is not None:
        why = (
            f"{library} could not be preloaded"
            if os.environ.get("TRANSDUCE_JEMALLOC_TRIED")
            else f"{library} is preloaded only when a training command runs as `transduce ...`"
        )
    return f"allocator: the C library's malloc ({why})"
