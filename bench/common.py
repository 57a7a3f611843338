"""Shared pieces of the benchmark harness: machine description, threads, alternating timing, GEMM peak.

Not part of the package and not collected by pytest (``testpaths = ["tests"]``).
"""

from __future__ import annotations

import os
import platform
import socket
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"


def machine() -> str:
    """lscpu's model name and the core count, e.g. ``AMD EPYC (2 cores)``."""
    name = platform.processor() or platform.machine()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                name = line.split(":", 1)[1].strip()
                break
    except (OSError, subprocess.CalledProcessError):
        pass
    return f"{name} ({os.cpu_count()} cores)"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a server the benchmark starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def revision() -> str:
    """The commit measured, and the package files that differed from it (others edit the tree meanwhile)."""
    git = ["git", "-C", str(ROOT)]
    try:
        head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(git + ["status", "--porcelain", "--", "src"], capture_output=True, text=True).stdout
    except OSError:
        return "unknown revision"
    changed = [line[3:] for line in dirty.splitlines()]
    return f"`{head}`" + (f" + uncommitted changes to {len(changed)} file(s) under src/" if changed else "")


def load_average() -> str:
    """The 1-minute load average: a shared machine shows it here."""
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "n/a"


def set_threads(n: int) -> None:
    torch.set_num_threads(n)


@dataclass
class Timings:
    """Seconds of each timed run, per contender name, in the order they ran."""

    runs: dict[str, list[float]] = field(default_factory=dict)

    def median(self, name: str) -> float:
        return statistics.median(self.runs[name])

    def spread(self, name: str) -> float:
        """(max - min) / median: how noisy the runs of one contender were."""
        r = self.runs[name]
        return (max(r) - min(r)) / statistics.median(r)


def alternate(contenders: dict[str, Callable[[], None]], repeats: int, warmup: int = 1) -> Timings:
    """Time each contender ``repeats`` times, interleaved A B A B ... after ``warmup`` untimed calls each.

    Interleaving spreads the load of other processes on a shared machine over all contenders alike.
    """
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    timings = Timings({name: [] for name in contenders})
    for _ in range(repeats):
        for name, fn in contenders.items():
            t0 = time.perf_counter()
            fn()
            timings.runs[name].append(time.perf_counter() - t0)
    return timings


def best_ms(fn: Callable[[], None], calls: int = 30, repeats: int = 3, warmup: int = 3) -> float:
    """Milliseconds per call of ``fn``: the best of ``repeats`` runs of ``calls`` calls, after ``warmup``."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1000)
    return best


PEAK_SIZES = (1024, 2048)


def gemm_peak(dtype: torch.dtype, sizes: tuple[int, ...] = PEAK_SIZES, seconds: float = 1.0) -> float:
    """FLOP/s of the fastest (n, n) @ (n, n) matmul in ``dtype`` on the current threads, n in ``sizes``: best of
    ~``seconds`` each. More than one size because one alone can miss the peak: on 2 threads of an Intel Xeon with
    AMX, 1024³ in bf16 ran at 1.10 TFLOP/s and 2048³ at 2.28 (one thread: 1.23 and 1.10), so a 1024³ peak is one
    core's, and an MFU against it double what it is against both cores' (2026-12-06)."""
    best_rate = 0.0
    for n in sizes:
        a = torch.randn(n, n).to(dtype)
        b = torch.randn(n, n).to(dtype)
        for _ in range(3):
            torch.mm(a, b)
        best, deadline = float("inf"), time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - t0)
        best_rate = max(best_rate, 2 * n**3 / best)
    return best_rate


def human(x: float, unit: str = "") -> str:
    """3 significant figures with k/M/G/T."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{prefix}{unit}"
    return f"{x:.3g}{unit}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
