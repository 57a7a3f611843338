"""Dynamic batching on every core: concurrent requests share calls of the translator, run by several workers.

``workers`` threads share one translator (one copy of the weights), or each hands its batches to a worker
process with its own copy (:mod:`~transduce.serve.replicas`). Requests wait in a queue. A free worker
takes the oldest request's sentences, with those of later requests that have the same decoding options,
up to its share: the queued source tokens divided among the workers that are free, but no more than an
equal part of all the work in hand (queued and being decoded) among all the workers, at most
``batch_tokens``, and at most ``max_requests`` requests. So a lone long text is split among the idle
workers and decoded on all cores at once; under load each worker's batch grows with the queue, and a worker
that frees up while the other is on a short batch leaves that one its part of the queue instead of taking
it all and leaving it idle. A request is answered when the last of its sentences is done.

No idle wait: a worker that finds the queue holding only the request it takes starts at once. A batching
window ``wait_s`` (none by default) applies only when other requests are queued, to let a batch gather company.

No idle core: a thread worker that starts a batch while no other worker is decoding and nothing else is
queued decodes it with ``lone_threads`` intra-op threads (``service.lone_threads`` chooses them: every core
for wide models) through ``set_threads``, and any other batch with ``threads``. The thread count is set on
the worker's own thread before each batch (OpenMP's thread count belongs to the thread that sets it), and
the C++ step's results do not depend on it, so a lone sentence is answered sooner with the same words.
Worker processes keep theirs.

Decoding releases Python's GIL in the C++ step (``backends/native_step.cpp``), so thread workers run in
parallel between the Python parts of a step, and process workers wholly; each runs torch with the intra-op
threads the server was given (one by default, one worker per core). Jobs that record attention (``exclusive``: word alignments for HTML, the page's attention) set state
on the model's modules, so one of them runs alone on the model, with no other batch beside it.

The translator pads every sentence to a length that depends only on itself and batches sentences of one
padded length (see :mod:`transduce.decode.translator`), so a sentence's translation does not depend on what
it was batched with, nor on which worker decoded it: served output equals offline output.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

REPLICAS_AFTER_S = 2.0  # worker processes start after the first batch, or this long after the batcher


@dataclass(eq=False)
class Job:
    """One request: its sentences, the options that must match to share a batch, its size."""

    sentences: list[str]
    key: Hashable  # the job's options (service.Translate, service.Attention): batched together only when equal
    tokens: int  # source tokens incl. eos, for the token budget
    sources: list = field(default_factory=list)  # the sentences encoded (source ids), one per sentence
    future: Future = field(default_factory=Future)
    exclusive: bool = False  # runs alone on the model (it records attention on the model's modules)
    taken: int = 0  # sentences handed to workers so far
    done: int = 0  # sentences translated so far
    results: list = field(default_factory=list)
    failed: bool = False

    def size(self, i: int) -> int:
        """Source tokens of sentence ``i`` (at least 1, so an empty line still counts)."""
        ids = self.sources[i] if i < len(self.sources) else None
        return max(1, len(ids)) if ids is not None else 1


@dataclass
class Slice:
    """Sentences ``start:end`` of a job, handed to one worker."""

    job: Job
    start: int
    end: int


@dataclass
class Stats:
    requests: int = 0
    sentences: int = 0
    batches: int = 0
    max_requests_in_batch: int = 0
    max_parallel: int = 0  # the most workers that decoded at once
    lone_batches: int = 0  # batches decoded with ``lone_threads`` threads


class Batcher:
    """``submit`` jobs from any thread; ``translate(sentences, sources, key) -> list`` runs on the workers
    (``sources``: the jobs' encoded sentences, concatenated as the sentences are). ``translate`` is one
    function all workers call, or a list of them, one per worker (then ``workers`` is its length): worker
    processes (:class:`~transduce.serve.replicas.Replica`), which ``start`` and ``stop`` start and stop.
    ``set_threads(n)`` sets the calling thread's intra-op threads (``torch.set_num_threads``); with it, a thread
    worker decodes a lone batch with ``lone_threads`` and the others with ``threads``."""

    def __init__(
        self,
        translate,
        wait_s: float = 0.0,
        batch_tokens: int = 4096,
        max_requests: int = 64,
        on_batch=None,
        workers: int = 1,
        threads: int = 1,
        lone_threads: int = 1,
        set_threads=None,
    ):
        if isinstance(translate, (list, tuple)):
            self.runners, workers = list(translate), len(translate)
        else:
            self.runners = [translate] * workers
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.wait_s, self.on_batch = wait_s, on_batch  # on_batch(requests, sentences)
        self.batch_tokens, self.max_requests, self.workers = batch_tokens, max_requests, workers
        if threads < 1 or lone_threads < 1:
            raise ValueError(f"threads and lone_threads must be at least 1, got {threads} and {lone_threads}")
        self.threads, self.lone_threads, self.set_threads = threads, lone_threads, set_threads
        self.stats = Stats()
        self._jobs: deque[Job] = deque()
        self._cv = threading.Condition()
        self._stopping = False
        self._busy = 0  # workers decoding now
        self._busy_tokens = 0  # source tokens of the batches being decoded
        self._exclusive = False  # an exclusive job is running
        self._first_batch = threading.Event()
        self._threads = [
            threading.Thread(target=self._work, args=(i,), name=f"transduce-worker-{i}", daemon=True)
            for i in range(workers)
        ]

    @property
    def replicas(self) -> list:
        """The workers that are processes of their own (they have ``start`` and ``stop``)."""
        return [r for r in self.runners if hasattr(r, "stop")]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()
        if self.replicas:
            threading.Thread(target=self._start_replicas, name="transduce-replicas", daemon=True).start()

    def _start_replicas(self) -> None:
        """Start the worker processes after the first batch is answered (or ``REPLICAS_AFTER_S``): their start-up
        (PyTorch imported on every core) does not slow the server's first answers, which the server process
        gives meanwhile."""
        self._first_batch.wait(REPLICAS_AFTER_S)
        with self._cv:
            if self._stopping:
                return
            for replica in self.replicas:
                replica.start()

    def stop(self, timeout: float | None = None) -> None:
        """Finish every queued job, then end the workers."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        self._first_batch.set()  # replicas not started yet never start
        for thread in self._threads:
            thread.join(timeout)
        for replica in self.replicas:
            replica.stop()

    def submit(self, job: Job) -> Future:
        with self._cv:
            if self._stopping:
                raise RuntimeError("the server is shutting down")
            job.results = [None] * len(job.sentences)
            if not job.sentences:
                job.future.set_result([])
                return job.future
            self._jobs.append(job)
            self._cv.notify_all()
        return job.future

    @property
    def pending(self) -> int:
        """Jobs queued or being translated."""
        with self._cv:
            return len(self._jobs) + self._busy

    # ------------------------------------------------------------------ workers
    def _ready(self) -> bool:
        """Whether a free worker may take the oldest job now."""
        if not self._jobs or self._exclusive:
            return False
        return not self._jobs[0].exclusive or self._busy == 0

    def _share(self) -> int:
        """The source tokens a free worker takes: what is queued with the oldest job's options, divided
        among the free workers, and at most an equal part of that and the batches being decoded among all
        workers, within ``batch_tokens`` (all of it for an exclusive job)."""
        first = self._jobs[0]
        if first.exclusive:  # it runs alone: split, its parts would wait for each other
            return self.batch_tokens
        same = (job for job in self._jobs if job.key == first.key)
        queued = sum(job.size(i) for job in same for i in range(job.taken, len(job.sentences)))
        free = max(1, self.workers - self._busy)
        fair = -(-(queued + self._busy_tokens) // self.workers)  # all the work in hand, in equal parts
        return max(1, min(self.batch_tokens, -(-queued // free), fair))

    def _take(self) -> tuple[list[Slice], int]:
        """Sentences of the oldest job and of later ones with the same options, up to :meth:`_share`, and
        their source tokens."""
        first = self._jobs[0]
        budget, tokens, slices = self._share(), 0, []
        for job in list(self._jobs):
            if job.failed:  # another batch of it failed: its answer is given
                self._jobs.remove(job)
                continue
            if job.key != first.key or job.exclusive != first.exclusive or len(slices) == self.max_requests:
                continue
            if not job.future.running() and not job.future.set_running_or_notify_cancel():  # timed out in queue
                self._jobs.remove(job)
                continue
            start = end = job.taken
            while end < len(job.sentences) and (end == start and not slices or tokens + job.size(end) <= budget):
                tokens += job.size(end)
                end += 1
            if end > start:
                slices.append(Slice(job, start, end))
                job.taken = end
            if job.taken == len(job.sentences):
                self._jobs.remove(job)
            if tokens >= budget:
                break
        return slices, tokens

    def _next(self) -> tuple[list[Slice], int, bool] | None:
        """The next batch, its source tokens (counted as being decoded until :meth:`_work` frees them) and
        whether it is alone (no other batch being decoded, nothing else queued); None once stopped with
        nothing queued."""
        with self._cv:
            while True:
                while not self._ready():
                    if self._stopping and not self._jobs:
                        return None
                    self._cv.wait()
                if len(self._jobs) > 1 and self.wait_s > 0:  # company is queued: let the batch gather more
                    self._gather()
                if not self._ready():
                    continue
                slices, tokens = self._take()
                if not slices:
                    continue
                alone = self._busy == 0 and not self._jobs
                self._busy += 1
                self._busy_tokens += tokens
                self._exclusive = slices[0].job.exclusive
                self.stats.max_parallel = max(self.stats.max_parallel, self._busy)
                if self._jobs:
                    self._cv.notify_all()  # another free worker may take the rest
                return slices, tokens, alone

    def _gather(self) -> None:
        """Wait up to ``wait_s`` while the oldest job's batch is under its budget (the lock is held)."""
        deadline = time.monotonic() + self.wait_s
        while not self._stopping:
            first = self._jobs[0]
            same = [job for job in self._jobs if job.key == first.key]
            queued = sum(job.tokens for job in same)
            left = deadline - time.monotonic()
            if len(same) >= self.max_requests or queued >= self.batch_tokens or left <= 0:
                return
            self._cv.wait(left)
            if not self._jobs:
                return

    def _work(self, worker: int) -> None:
        runner = self.runners[worker]
        spread = self.set_threads is not None and self.lone_threads != self.threads and not hasattr(runner, "stop")
        while (batch := self._next()) is not None:
            slices, tokens, alone = batch
            answers: list[tuple[Job, Any]] = []
            try:
                if spread:  # a worker process keeps its threads; a thread worker sets its own before each batch
                    self.set_threads(self.lone_threads if alone else self.threads)
                    if alone:
                        with self._cv:
                            self.stats.lone_batches += 1
                answers = self._run(runner, slices)
            finally:  # the worker is free before its requests are answered: a client never sees it busy after
                with self._cv:
                    self._busy -= 1
                    self._busy_tokens -= tokens
                    self._exclusive = False
                    self._cv.notify_all()
            for job, answer in answers:
                if isinstance(answer, BaseException):
                    job.future.set_exception(answer)
                else:
                    job.future.set_result(answer)

    def _run(self, translate, slices: list[Slice]) -> list[tuple[Job, Any]]:
        """Translate one batch; returns each request it finished (or failed) with its results (or error)."""
        live = [s for s in slices if not s.job.failed]
        sentences = [x for s in live for x in s.job.sentences[s.start : s.end]]
        sources = [x for s in live for x in s.job.sources[s.start : s.end]]
        if not live:
            return []
        try:
            results: list[Any] = translate(sentences, sources, live[0].job.key)
        except BaseException as e:  # every request of the batch learns of it
            with self._cv:
                failed = list(dict.fromkeys(s.job for s in live if not s.job.failed))
                for job in failed:
                    job.failed = True
            return [(job, e) for job in failed]
        finished = []
        with self._cv:
            at = 0
            for s in live:
                n = s.end - s.start
                s.job.results[s.start : s.end] = results[at : at + n]
                at += n
                s.job.done += n
                if s.job.done == len(s.job.sentences) and not s.job.failed:
                    finished.append(s.job)
            self.stats.requests += len(finished)
            self.stats.sentences += len(sentences)
            self.stats.batches += 1
            self.stats.max_requests_in_batch = max(self.stats.max_requests_in_batch, len(live))
        self._first_batch.set()
        if self.on_batch is not None:
            self.on_batch(len(live), len(sentences))
        return [(job, job.results) for job in finished]
