"""serve/replicas.py: worker processes with a model each; the choice of processes or threads in one place.

One test starts a server whose two workers are processes, and checks what a user relies on: the
answers are those of the model decoding offline, requests are answered while the processes load, a
process killed between requests costs no request and comes back, /v1/health says what they cost.
"""

import os
import signal
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from transduce.api import Origin
from transduce.decode.search_options import SearchOptions
from transduce.serve.replicas import Replica, ReplicaDied, worker_kind
from transduce.serve.server import create_app
from transduce.serve.service import Settings, Translate, run_job

SENTENCES = ["the cat sits on the mat .", "a man rides a horse .", "two dogs play in the snow .", "hello ."]


def test_worker_kind_auto_takes_processes_for_several_cpu_workers_of_a_model_directory():
    origin = Origin(Path("m"), "fp32")
    assert worker_kind("auto", 3, origin)[0] == "process"
    assert worker_kind("auto", 2, origin)[0] == "thread"  # within noise of processes on 2 cores, for less memory
    assert worker_kind("auto", 1, origin)[0] == "thread"
    assert worker_kind("auto", 4, None)[0] == "thread"  # a translator handed over in memory: nothing to reload
    assert worker_kind("auto", 4, Origin(Path("m"), "fp32", "cuda"))[0] == "thread"  # one GPU
    assert worker_kind("thread", 8, origin)[0] == "thread"
    assert worker_kind("process", 1, origin)[0] == "process"
    with pytest.raises(ValueError, match="needs a model loaded from a directory"):
        worker_kind("process", 2, None)
    with pytest.raises(ValueError, match="--worker-kind must be one of auto, process, thread, got 'fork'"):
        worker_kind("fork", 2, origin)


def test_load_records_where_a_translator_comes_from(tiny_model_dir, translator):
    assert translator.origin == Origin(Path(tiny_model_dir), translator.fast_paths.decoder.name, "cpu")


def test_a_replica_that_cannot_load_leaves_its_jobs_to_the_server_process(tmp_path):
    here = []
    replica = Replica(Origin(tmp_path / "missing", "fp32"), 1, run_job, lambda *job: here.append(job) or ["here"])
    replica.start()
    deadline = time.monotonic() + 120
    while not replica.error and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        assert "missing" in replica.error and not replica.ready
        assert replica(["x"], [[1]], "key") == ["here"] and len(here) == 1
    finally:
        replica.stop()


@pytest.mark.slow
def test_worker_processes_answer_as_offline_and_survive_a_kill(translator):
    search = SearchOptions(beam=4)
    offline = translator.translate(SENTENCES, search)
    settings = Settings(worker_kind="process", workers=2)
    with TestClient(create_app(translator, settings)) as client:
        # answered at once, by the server process, while the workers load
        first = client.post("/v1/translate", json={"text": SENTENCES[:1]})
        assert first.status_code == 200 and first.json()["translations"][0] == offline[0]
        replicas = client.app.state.pool.loaded["model"].batcher.replicas
        assert len(replicas) == 2
        assert all(r.wait_ready(120) for r in replicas), [r.error for r in replicas]
        assert all(r.pid != os.getpid() for r in replicas)

        answers = [client.post("/v1/translate", json={"text": SENTENCES}) for _ in range(4)]
        assert all(a.json()["translations"] == offline for a in answers)
        assert sum(r.batches for r in replicas) >= 4  # decoded in the worker processes
        health = client.get("/v1/health").json()
        assert health["worker_processes"] == 2 and health["worker_process_mib"] > 10

        victim = replicas[0]
        old = victim.pid
        os.kill(old, signal.SIGKILL)
        time.sleep(0.5)
        for _ in range(3):  # the dead one's batches run in the server process: every request is answered
            r = client.post("/v1/translate", json={"text": SENTENCES})
            assert r.status_code == 200 and r.json()["translations"] == offline
        assert victim.wait_ready(120), victim.error
        assert victim.pid != old and victim.starts == 2
    assert all(r.process is None for r in replicas)  # stopped with the server


@pytest.mark.slow
def test_a_replica_dying_during_a_batch_fails_that_batch_only(translator, tiny_model_dir):
    """A process that dies while it holds a batch may have died of it: the batch fails (it is not run again
    in the server process), and the replica starts again for the next."""
    replica = Replica(translator.origin, 1, run_job, lambda *job: ["here"])
    replica.start()
    try:
        assert replica.wait_ready(120), replica.error
        job = Translate(SearchOptions(beam=4))
        sources = translator.encode_sources(SENTENCES[:1], truncate=False)
        texts = [t.text for t in replica(SENTENCES[:1], sources, job)]
        assert texts == translator.translate(SENTENCES[:1], SearchOptions(beam=4))

        class Dying:
            def __reduce__(self):  # unpickled in the worker process: it exits there
                return os._exit, (3,)

        with pytest.raises(ReplicaDied, match="exited \\(code 3\\) during a batch"):
            replica(SENTENCES[:1], sources, Dying())
        assert replica.wait_ready(120), replica.error
        assert [t.text for t in replica(SENTENCES[:1], sources, job)] == texts
    finally:
        replica.stop()
