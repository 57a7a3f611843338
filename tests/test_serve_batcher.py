"""serve/batcher.py: several workers share the queue; no wait when idle; long texts split; exclusive jobs alone.

A fake translate function stands for the model: it records which sentences each call got, on which
thread, and when, so the scheduling is checked without a model (the server tests check the outputs).
"""

import threading
import time

import pytest

from transduce.serve.batcher import Batcher, Job


class Recorder:
    """``translate(sentences, sources, key)``: sleeps ``delay`` s per call and returns each sentence upper-cased."""

    def __init__(self, delay: float = 0.0):
        self.delay, self.calls, self.lock = delay, [], threading.Lock()
        self.running = self.most = 0

    def __call__(self, sentences, sources, key):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        start = time.monotonic()
        time.sleep(self.delay)
        with self.lock:
            self.running -= 1
            self.calls.append((threading.current_thread().name, list(sentences), key, start, time.monotonic()))
        return [s.upper() for s in sentences]


def job(sentences, key="search", exclusive=False):
    return Job(
        list(sentences),
        key,
        sum(len(s.split()) + 1 for s in sentences),
        [[1] * (len(s.split()) + 1) for s in sentences],
        exclusive=exclusive,
    )


def running(batcher):
    batcher.start()
    return batcher


def test_a_lone_request_does_not_wait_for_company():
    """The batching window (here 2 s) is for queued company only: a lone request starts at once."""
    b = running(Batcher(Recorder(), wait_s=2.0, workers=1))
    try:
        start = time.monotonic()
        assert b.submit(job(["a b"])).result(timeout=5) == ["A B"]
        assert time.monotonic() - start < 1.0
    finally:
        b.stop()


def test_one_long_text_is_split_among_idle_workers():
    """20 sentences of one request, two idle workers: two calls at once, each about half, answer in order."""
    rec = Recorder(delay=0.2)
    b = running(Batcher(rec, wait_s=0.0, workers=2))
    sentences = [f"sentence {i} has words" for i in range(20)]
    try:
        assert b.submit(job(sentences)).result(timeout=10) == [s.upper() for s in sentences]
    finally:
        b.stop()
    assert len(rec.calls) == 2 and rec.most == 2
    assert sorted(len(c[1]) for c in rec.calls) == [10, 10]
    assert {c[0] for c in rec.calls} == {"transduce-worker-0", "transduce-worker-1"}
    assert b.stats.requests == 1 and b.stats.sentences == 20 and b.stats.max_parallel == 2


def test_concurrent_requests_spread_over_workers_and_batch():
    rec = Recorder(delay=0.05)
    b = running(Batcher(rec, wait_s=0.0, workers=2))
    try:
        futures = [b.submit(job([f"request {i}"])) for i in range(16)]
        assert [f.result(timeout=10) for f in futures] == [[f"REQUEST {i}"] for i in range(16)]
    finally:
        b.stop()
    assert rec.most == 2  # both workers decoded at once
    assert len(rec.calls) < 16  # and requests shared calls
    assert b.stats.requests == 16


def test_a_worker_leaves_its_busy_peer_a_part_of_the_queue():
    """Worker 0 is on a long batch, worker 1 frees up with 6 requests queued: it takes an equal part of the
    work in hand, not all of it, so both stay busy (with the old rule, all 6 in one call)."""

    class Timed(Recorder):
        def __call__(self, sentences, sources, key):
            self.delay = 0.5 if sentences[0].startswith("slow") else 0.05
            return super().__call__(sentences, sources, key)

    rec = Timed()
    b = running(Batcher(rec, wait_s=0.0, workers=2))
    try:
        slow = b.submit(job(["slow a"]))
        while b.stats.max_parallel < 1:
            time.sleep(0.001)
        quick = b.submit(job(["b"]))
        while b.stats.max_parallel < 2:
            time.sleep(0.001)
        queued = [b.submit(job([f"c {i}"])) for i in range(6)]
        assert [f.result(timeout=10) for f in queued] == [[f"C {i}"] for i in range(6)]
        assert slow.result(timeout=10) == ["SLOW A"] and quick.result(timeout=10) == ["B"]
    finally:
        b.stop()
    first = next(c for c in rec.calls if c[1][0].startswith("c"))
    assert len(first[1]) == 3  # (6 x 3 queued + 3 being decoded) / 2 workers = 11 tokens: 3 requests of 3


def test_options_that_differ_never_share_a_call():
    rec = Recorder(delay=0.02)
    b = running(Batcher(rec, wait_s=0.01, workers=2))
    try:
        futures = [b.submit(job([f"s{i}"], key=("beam", i % 3))) for i in range(12)]
        for f in futures:
            f.result(timeout=10)
    finally:
        b.stop()
    for _, sentences, key, _, _ in rec.calls:
        assert {int(s[1:]) % 3 for s in sentences} == {key[1]}


def test_an_exclusive_job_runs_alone():
    """A job that records attention on the model never overlaps another batch."""
    rec = Recorder(delay=0.05)
    b = running(Batcher(rec, wait_s=0.0, workers=2))
    try:
        futures = []
        for i in range(6):
            futures.append(b.submit(job([f"plain {i}", f"plain {i}b"])))
            futures.append(b.submit(job([f"align {i}"], key="align", exclusive=True)))
        for f in futures:
            f.result(timeout=10)
    finally:
        b.stop()
    spans = [(c[3], c[4], c[2]) for c in rec.calls]
    for start, end, key in spans:
        if key == "align":
            overlapping = [s for s in spans if s[0] < end and start < s[1] and s != (start, end, key)]
            assert overlapping == []


def test_a_failing_batch_fails_its_requests_and_the_workers_go_on():
    def translate(sentences, sources, key):
        if "bad" in sentences:
            raise RuntimeError("broken sentence")
        return sentences

    b = running(Batcher(translate, wait_s=0.0, workers=2))
    try:
        with pytest.raises(RuntimeError, match="broken sentence"):
            b.submit(job(["bad"])).result(timeout=5)
        assert b.submit(job(["good"])).result(timeout=5) == ["good"]
    finally:
        b.stop()


def test_stop_finishes_queued_jobs_then_refuses():
    b = running(Batcher(Recorder(delay=0.02), wait_s=0.0, workers=2))
    futures = [b.submit(job([f"s{i}"])) for i in range(8)]
    b.stop()
    assert all(f.done() and not f.exception() for f in futures)
    with pytest.raises(RuntimeError, match="shutting down"):
        b.submit(job(["late"]))


def test_workers_must_be_positive():
    with pytest.raises(ValueError, match="workers must be at least 1"):
        Batcher(Recorder(), workers=0)


def test_a_worker_is_free_before_its_requests_are_answered():
    """A client that reads the queue depth (/metrics) after its answer sees its own request gone; on failure too."""
    seen = []
    for translate in (Recorder(), lambda *_: 1 / 0):
        b = running(Batcher(translate, workers=1))
        try:
            future = b.submit(job(["a b"]))
            future.add_done_callback(lambda _: seen.append(b.pending))  # runs where the answer is given
            future.exception(timeout=5)
        finally:
            b.stop()
    assert seen == [0, 0]


def test_a_lone_batch_gets_every_core_and_company_gets_one_each():
    """set_threads is called on the worker's own thread before each batch: lone_threads for a batch that starts
    with no other batch running or queued, threads otherwise; worker processes are never given it."""
    calls, lock = [], threading.Lock()

    def set_threads(n):
        with lock:
            calls.append((threading.current_thread().name, n))

    rec = Recorder(delay=0.3)
    b = running(Batcher(rec, wait_s=0.0, workers=2, threads=1, lone_threads=2, set_threads=set_threads))
    try:
        assert b.submit(job(["alone"])).result(timeout=5) == ["ALONE"]
        assert calls == [(rec.calls[0][0], 2)]  # the worker that decoded it, with both threads
        first = b.submit(job(["first"]))
        while b.stats.max_parallel < 1 or len(calls) < 2:
            time.sleep(0.001)
        second = b.submit(job(["second"]))  # the other worker is busy: one thread
        assert first.result(timeout=5) == ["FIRST"] and second.result(timeout=5) == ["SECOND"]
    finally:
        b.stop()
    assert [n for _, n in calls] == [2, 2, 1]
    assert {name for name, _ in calls[1:]} == {"transduce-worker-0", "transduce-worker-1"}
    assert b.stats.lone_batches == 2


class Process(Recorder):
    def stop(self):  # a worker process (serve/replicas.py) has start and stop
        pass

    def start(self):
        pass


def test_worker_processes_and_equal_thread_counts_never_set_threads():
    calls = []
    for runners, threads, lone in (([Process(), Process()], 1, 2), (Recorder(), 1, 1)):
        b = running(Batcher(runners, workers=2, threads=threads, lone_threads=lone, set_threads=calls.append))
        try:
            assert b.submit(job(["a"])).result(timeout=5) == ["A"]
        finally:
            b.stop()
    assert calls == []
    with pytest.raises(ValueError, match="lone_threads"):
        Batcher(Recorder(), lone_threads=0)


def test_lone_threads_every_core_for_wide_models_only():
    """service.lone_threads: --lone-threads when given; else all the workers' threads from d_model 512 on
    (measured faster there one sentence at a time), one worker's below (measured slower), and one worker's
    for the Python step, whose bits may depend on its threads."""
    from types import SimpleNamespace

    from transduce.fastpaths import Choice, FastPaths
    from transduce.serve.service import Settings, lone_threads

    def translator(width, decoder="int8-native"):
        return SimpleNamespace(config=SimpleNamespace(d_model=width), fast_paths=FastPaths(decoder=Choice(decoder, "")))

    assert lone_threads(Settings(), 2, translator(512)) == 2
    assert lone_threads(Settings(), 2, translator(512, "fp32-native")) == 2
    assert lone_threads(Settings(threads=2), 2, translator(1024)) == 4
    assert lone_threads(Settings(), 2, translator(128)) == 1
    assert lone_threads(Settings(), 2, translator(512, "fp32")) == 1
    assert lone_threads(Settings(), 2, object()) == 1  # nothing to read: no change
    assert lone_threads(Settings(lone_threads=3), 2, translator(128)) == 3
