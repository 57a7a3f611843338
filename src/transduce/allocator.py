"""jemalloc for CPU training: the training commands re-run themselves with it preloaded, on CPUs where it wins.

PyTorch on CPU allocates every activation and gradient with the C library's ``malloc``. On the CPUs with
native bf16 (AVX-512-BF16 or AMX) glibc's slowed a training process down as it ran: a two-model training
under DDP (mutual learning, since removed from transduce; measured at commit c2021c6) started at 3.9k target
tokens/s and fell to 2.6k by update 2,000; with jemalloc preloaded it held 4.2-4.6k;
the same 100 batches timed four times in a row ran 1.15-1.24x faster under jemalloc. On a 2-core AVX2 host
training in fp32 it was the other way round, in a one-process bench, in 3-minute DDP runs and in an hour-long
recipe run (README, "Which allocator trains"). So by default jemalloc is preloaded only where the CPU has
native bf16.

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
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

LIBRARY = "libjemalloc.so.2"
# jemalloc's options (its MALLOC_CONF variable) for a training process: a freed page stays for reuse, and after a
# second unused becomes lazily freeable (MADV_FREE), which the kernel reclaims only under memory pressure
MALLOC_CONF = "dirty_decay_ms:1000,muzzy_decay_ms:-1"
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


def native_bf16_cpu(cpuinfo: str | None = None) -> bool:
    """Whether the CPU computes bf16 natively (AVX-512-BF16 or AMX-BF16), from /proc/cpuinfo's flags. Read
    without importing torch, because this runs before the process re-executes itself. False where /proc
    cannot be read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def choose(environ: dict[str, str] | None = None, cpuinfo: str | None = None) -> tuple[Path | None, str]:
    """The jemalloc library to preload and "", or None and why not, in words for the run's log.

    ``TRANSDUCE_JEMALLOC=/path`` is always honoured and ``=0`` always refused; unset, jemalloc is looked for
    only on a CPU with native bf16, the hosts where it was measured to train faster.
    """
    env = os.environ if environ is None else environ
    named = env.get("TRANSDUCE_JEMALLOC", "")
    if named == "0":
        return None, "TRANSDUCE_JEMALLOC=0"
    if not named and not native_bf16_cpu(cpuinfo):
        return None, (
            "the CPU has no native bf16, where glibc's malloc trained faster than jemalloc; "
            "TRANSDUCE_JEMALLOC=/path/libjemalloc.so.2 preloads one anyway"
        )
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
