"""Worker processes, each with its own copy of a model: batches decode on every core at once.

Threads sharing one model (:mod:`~transduce.serve.batcher`) run in parallel only while the C++ step holds
no GIL; beam search's bookkeeping between steps, the HTTP side and the garbage collector all take Python's
one GIL, so offline two threads decode 1.69x one thread on 2 cores, two processes 2.05x. A :class:`Replica` is a process that loads the model
directory again (same backend, same intra-op threads, hence the same bits: served output equals offline
output) and runs the batcher's jobs that one worker thread hands it over a pipe. The server process keeps
its own copy for encoding and for jobs a replica cannot take yet: until a replica has loaded (the first
seconds after a start) or after it died, its worker thread decodes in the server process, so no request
waits for a replica and none is lost with one. A replica that dies (killed, crashed) fails the batch it
held and starts again. The cost is memory: each replica holds the model and its own PyTorch runtime
(``worker_process_mib`` in ``/v1/health``; about 290 MiB each for the demo's model).

:func:`worker_kind` chooses between processes and threads, in one place, from ``--worker-kind``.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..api import Origin

KINDS = ("auto", "process", "thread")
# auto's threshold. Offline, two processes decode 2.05x one on 2 cores, two threads 1.69x: Python's part of a
# step holds the GIL, a share that grows with every thread. Served on 2 cores beside their clients, threads
# and processes were within noise of each other (docs/serving.md) for 2.7x the memory: processes from 3 workers.
PROCESSES_FROM = 3


def worker_kind(kind: str, workers: int, origin: Origin | None) -> tuple[str, str]:
    """``("process" | "thread", why)``: processes when asked or, for ``auto``, when ``PROCESSES_FROM`` or more
    workers decode on the CPU a model loaded from a directory."""
    if kind not in KINDS:
        raise ValueError(f"--worker-kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if kind == "thread":
        return "thread", "--worker-kind thread"
    if origin is None:
        if kind == "process":
            raise ValueError("--worker-kind process needs a model loaded from a directory (transduce.load)")
        return "thread", "the model was handed over in memory, with no directory to load again"
    if origin.device != "cpu" and kind == "auto":
        return "thread", f"one {origin.device} device: its copies would share it"
    if kind == "process":
        return "process", "--worker-kind process"
    if workers < PROCESSES_FROM:
        return "thread", f"{workers} worker(s): threads share one copy of the model (processes from {PROCESSES_FROM})"
    return "process", f"{workers} workers on the CPU: processes, so Python's GIL is not shared"


def _child(conn, origin: Origin, threads: int, run_job: Callable) -> None:  # pragma: no cover - a worker process
    """The worker process: load the model, say ready, then ``run_job(translator, sentences, sources, job)``
    until the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the server shuts us down
    import torch

    from ..api import load

    torch.set_num_threads(threads)
    try:
        translator = load(origin.model_dir, device=origin.device, backend=origin.backend)
    except BaseException as e:  # noqa: BLE001 - the server learns why, and keeps decoding in its own process
        conn.send(("failed", f"{type(e).__name__}: {e}"))
        return
    gc.freeze()  # the model and the libraries are never garbage: the collector stops walking them
    try:
        conn.send(("ready", os.getpid()))
        while (message := conn.recv()) is not None:
            sentences, sources, job = message
            try:
                answer = ("ok", run_job(translator, sentences, sources, job))
            except Exception as e:  # noqa: BLE001 - the batch's requests get the error, the replica goes on
                answer = ("error", e)
            try:
                conn.send(answer)
            except (EOFError, OSError):
                raise
            except Exception as e:  # noqa: BLE001 - an answer that does not pickle
                conn.send(("error", RuntimeError(f"{type(e).__name__}: {e}")))
    except (EOFError, OSError):  # the server is gone
        return


class ReplicaDied(RuntimeError):
    """The worker process exited while it held a batch (the batch fails; the replica starts again)."""


class Replica:
    """One worker process; called as the batcher's ``translate(sentences, sources, job)`` by one worker thread.

    ``run_job(translator, sentences, sources, job)`` is what the process does with a batch
    (:func:`transduce.serve.service.run_job`); ``fallback(sentences, sources, job)`` runs a job in the server
    process: while the replica loads, after it died, or if it cannot load at all (the reason is in :attr:`error`)."""

    def __init__(self, origin: Origin, threads: int, run_job: Callable, fallback: Callable, index: int = 0):
        self.origin, self.threads, self.run_job, self.fallback, self.index = origin, threads, run_job, fallback, index
        self.process: multiprocessing.process.BaseProcess | None = None
        self.pid = 0
        self.error = ""
        self.starts = 0  # processes started
        self.batches = 0  # batches the processes decoded
        self._conn = None
        self._ready = threading.Event()
        self._stopping = False
        self._lock = threading.Lock()  # one batch at a time on the pipe

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def start(self) -> None:
        """Start the process; it loads in the background (jobs run in the server process meanwhile)."""
        threading.Thread(target=self._launch, name=f"transduce-replica-{self.index}", daemon=True).start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self._ready.wait(timeout)

    def _launch(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # no fork of a threaded process holding PyTorch
        parent, child = ctx.Pipe()
        process = ctx.Process(
            target=_child,
            args=(child, self.origin, self.threads, self.run_job),
            name=f"transduce-replica-{self.index}",
            daemon=True,
        )
        with self._lock:
            if self._stopping:
                return
            process.start()
            self.process, self.starts = process, self.starts + 1
        child.close()
        try:
            status, detail = parent.recv()
        except (EOFError, OSError):
            process.join(5)
            status, detail = "failed", f"exited with code {process.exitcode} while loading"
        with self._lock:
            if status == "ready" and not self._stopping:
                self._conn, self.pid, self.error = parent, int(detail), ""
                self._ready.set()
                return
            self.error = "" if status == "ready" else str(detail)
            self.process = None
        parent.close()
        process.join(5)
        if process.is_alive():
            process.kill()

    def __call__(self, sentences: list[str], sources: list, job) -> Any:
        if not self._ready.is_set():
            return self.fallback(sentences, sources, job)
        with self._lock:
            if self._conn is None:  # it died since: its restart is under way
                return self.fallback(sentences, sources, job)
            try:
                self._conn.send((sentences, sources, job))
            except OSError:  # it died while idle: this batch runs here while another starts
                self._died()
                return self.fallback(sentences, sources, job)
            try:
                status, value = self._conn.recv()
            except (EOFError, OSError) as e:  # it died on this batch, which might be why: not run again here
                code = self._died()
                raise ReplicaDied(f"worker process {self.index} exited (code {code}) during a batch") from e
        if status == "error":
            raise value
        self.batches += 1
        return value

    def _died(self) -> int | None:
        """The process is gone: forget it and start another unless the server is stopping."""
        self._ready.clear()
        process, self.process = self.process, None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        code = None
        if process is not None:
            process.join(5)
            code = process.exitcode
        if not self._stopping:
            self.start()
        return code

    def stop(self, timeout: float = 10.0) -> None:
        """End the process (one still loading is killed); later jobs run in the server process."""
        self._stopping = True
        self._ready.clear()
        with self._lock:
            conn, process = self._conn, self.process
            self._conn = self.process = None
        if conn is not None:
            try:
                conn.send(None)
            except OSError:
                pass
            conn.close()
        if process is not None:
            process.join(timeout if conn is not None else 0)
            if process.is_alive():
                process.kill()
                process.join()

    def rss_mib(self) -> float:
        """Resident memory of the worker process (0 while none runs, or off Linux)."""
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except (OSError, ValueError):
            pass
        return 0.0
