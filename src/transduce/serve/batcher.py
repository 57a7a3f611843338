"""Dynamic batching: concurrent requests share one call of the translator.

One worker thread owns the translator. Requests wait in a queue; when the worker is free it
takes the oldest request and, for at most ``wait_s`` more, gathers later requests with the
same decoding options until ``batch_tokens`` source tokens or ``max_requests`` requests are
reached. Under load the queue fills while the worker translates, so batches form without
waiting at all; an idle server adds at most ``wait_s`` of latency.

The translator pads every sentence to a length that depends only on itself and batches
sentences of one padded length (see :mod:`transduce.decode.translator`), so a sentence's
translation does not depend on what it was batched with: served output equals offline output.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Job:
    """One request: its sentences, the options that must match to share a batch, its size."""

    sentences: list[str]
    key: Hashable  # the job's options (service.Search, service.Attention): batched together only when equal
    tokens: int  # source tokens incl. eos, for the token budget
    sources: list = field(default_factory=list)  # the sentences encoded (source ids), one per sentence
    future: Future = field(default_factory=Future)


@dataclass
class Stats:
    requests: int = 0
    sentences: int = 0
    batches: int = 0
    max_requests_in_batch: int = 0


class Batcher:
    """``submit`` jobs from any thread; ``translate(sentences, sources, key) -> list`` runs on the worker
    (``sources``: the jobs' encoded sentences, concatenated as the sentences are)."""

    def __init__(
        self, translate, wait_s: float = 0.005, batch_tokens: int = 4096, max_requests: int = 64, on_batch=None
    ):
        self.translate, self.wait_s, self.on_batch = translate, wait_s, on_batch  # on_batch(requests, sentences)
        self.batch_tokens, self.max_requests = batch_tokens, max_requests
        self.stats = Stats()
        self._jobs: deque[Job] = deque()
        self._cv = threading.Condition()
        self._stopping = False
        self._busy = 0  # jobs taken by the worker and not yet answered
        self._thread = threading.Thread(target=self._work, name="transduce-batcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Finish every queued job, then end the worker."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        self._thread.join(timeout)

    def submit(self, job: Job) -> Future:
        with self._cv:
            if self._stopping:
                raise RuntimeError("the server is shutting down")
            self._jobs.append(job)
            self._cv.notify_all()
        return job.future

    @property
    def pending(self) -> int:
        """Jobs queued or being translated."""
        with self._cv:
            return len(self._jobs) + self._busy

    # ------------------------------------------------------------------ worker
    def _select(self) -> list[Job]:
        """The oldest job and the later ones that may join it (same options, within budget)."""
        first, group, tokens = self._jobs[0], [], 0
        for job in self._jobs:
            if len(group) == self.max_requests:
                break
            if job.key == first.key and (not group or tokens + job.tokens <= self.batch_tokens):
                group.append(job)
                tokens += job.tokens
        return group

    def _next_group(self) -> list[Job] | None:
        with self._cv:
            while not self._jobs:
                if self._stopping:
                    return None
                self._cv.wait()
            deadline = time.monotonic() + self.wait_s
            while True:
                group = self._select()
                full = len(group) == self.max_requests or sum(j.tokens for j in group) >= self.batch_tokens
                left = deadline - time.monotonic()
                if full or left <= 0 or self._stopping:
                    break
                self._cv.wait(left)
            for job in group:
                self._jobs.remove(job)
            self._busy = len(group)
            return group

    def _work(self) -> None:
        while (group := self._next_group()) is not None:
            live = [job for job in group if job.future.set_running_or_notify_cancel()]  # drops timed-out jobs
            try:
                if live:
                    self._run(live)
            finally:
                with self._cv:
                    self._busy = 0

    def _run(self, jobs: list[Job]) -> None:
        sentences = [s for job in jobs for s in job.sentences]
        sources = [ids for job in jobs for ids in job.sources]
        try:
            results: list[Any] = self.translate(sentences, sources, jobs[0].key)
        except BaseException as e:  # every waiting request learns of it
            for job in jobs:
                job.future.set_exception(e)
            return
        self.stats.requests += len(jobs)
        self.stats.sentences += len(sentences)
        self.stats.batches += 1
        self.stats.max_requests_in_batch = max(self.stats.max_requests_in_batch, len(jobs))
        if self.on_batch is not None:
            self.on_batch(len(jobs), len(sentences))
        start = 0
        for job in jobs:
            job.future.set_result(results[start : start + len(job.sentences)])
            start += len(job.sentences)
