"""The HTTP server: served output equals offline output under concurrency, limits, timeouts, shutdown.

Live tests bind uvicorn to 127.0.0.1 on a free port; limit tests use FastAPI's in-process client.
All use the trained ``tiny_model_dir`` fixture (tests/conftest.py).
"""

import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

httpx = pytest.importorskip("httpx", reason="server tests need httpx")
uvicorn = pytest.importorskip("uvicorn", reason="server tests need uvicorn (the serve extra)")
pytest.importorskip("fastapi", reason="server tests need fastapi (the serve extra)")

from conftest import read_corpus  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from live_server import Live  # noqa: E402

from transduce.api import load  # noqa: E402
from transduce.cli import main  # noqa: E402
from transduce.decode.search_options import SearchOptions  # noqa: E402
from transduce.serve import server as srv  # noqa: E402
from transduce.serve.server import Settings, create_app  # noqa: E402


@pytest.fixture(scope="module")
def sentences():
    return read_corpus("valid", "en", 40)


class Slow:
    """A translator that takes ``delay`` seconds longer per batch (for timeouts and shutdown)."""

    def __init__(self, inner, delay):
        self.inner, self.delay = inner, delay
        self.vocabs, self.config, self.meta = inner.vocabs, inner.config, inner.meta
        self.encode_sources = inner.encode_sources

    def translate(self, *args, **kwargs):
        time.sleep(self.delay)
        return self.inner.translate(*args, **kwargs)


@pytest.mark.slow
def test_concurrent_clients_get_offline_translations(translator, sentences):
    """6 clients × 5 requests of 1–3 sentences, beams 1 and 4 mixed: no errors, output = offline."""
    app = create_app(translator, Settings(wait_ms=20))
    live = Live(app)
    rng = random.Random(0)
    plan = [[(rng.sample(sentences, rng.randint(1, 3)), rng.choice([1, 4])) for _ in range(5)] for _ in range(6)]

    def client(requests):
        with httpx.Client(base_url=live.url, timeout=60) as c:
            out = []
            for text, beam in requests:
                r = c.post("/v1/translate", json={"text": text, "beam": beam})
                out.append((r.status_code, r.json()))
            return out

    try:
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(client, plan))
        health = httpx.get(live.url + "/v1/health").json()
    finally:
        live.stop()
    for requests, replies in zip(plan, answers):
        for (text, beam), (status, body) in zip(requests, replies):
            assert status == 200, body
            assert body["translations"] == translator.translate(text, search=SearchOptions(beam=beam))
    assert health["requests"] == 30
    assert health["batches"] < 30 and health["max_requests_in_batch"] > 1  # requests were batched together


@pytest.mark.slow
def test_scores_nbest_and_empty_lines(translator, sentences):
    with TestClient(create_app(translator)) as c:
        r = c.post("/v1/translate", json={"text": sentences[:3] + [""], "beam": 4, "nbest": 2, "return_scores": True})
        assert r.status_code == 200
        offline = translator.translate(sentences[:3] + [""], search=SearchOptions(beam=4, nbest=2), return_scores=True)
        got = r.json()["translations"]
        assert [[h["text"] for h in hyps] for hyps in got] == [[h.text for h in hyps] for hyps in offline]
        assert [[(h["score"], h["logprob"]) for h in hyps] for hyps in got] == [
            [(h.score, h.logprob) for h in hyps] for hyps in offline
        ]  # floats survive JSON exactly
        assert got[3][0]["text"] == ""
        assert c.post("/v1/translate", json={"text": []}).json() == {"translations": []}


def test_limits_answer_with_status_and_field(translator):
    settings = Settings(max_sentences=3, max_chars=50, max_body=2000, max_beam=8)
    with TestClient(create_app(translator, settings)) as c:

        def post(body, raw=None):
            if raw is not None:
                return c.post("/v1/translate", content=raw, headers={"content-type": "application/json"})
            return c.post("/v1/translate", json=body)

        cases = [
            ({"text": ["a"] * 4}, 413, "'text': 4 sentences exceed the limit of 3"),
            ({"text": ["ok", "x" * 51]}, 413, "'text.1': 51 characters exceed the limit of 50"),
            ({"text": ["a"], "beam": 9}, 422, "'beam': must be between 1 and 8"),
            ({"text": ["a"], "beam": 2, "nbest": 3}, 422, "'nbest'"),
            ({"text": ["a"], "beam": "4"}, 422, "'beam'"),
            ({"text": "a dog"}, 422, "'text'"),
            ({"text": ["a", 3]}, 422, "'text.1'"),
            ({"txt": ["a"]}, 422, "'txt'"),
            ({"text": ["a"], "alpha": -1.0}, 422, "'alpha'"),
        ]
        for body, status, phrase in cases:
            r = post(body)
            assert r.status_code == status and phrase in r.json()["detail"], (body, r.json())
        r = post(None, raw=b'{"text": ["a dog"')
        assert r.status_code == 400 and "malformed JSON" in r.json()["detail"]
        r = post(None, raw=json.dumps({"text": ["a" * 40] * 60}).encode())
        assert r.status_code == 413 and "2000 bytes" in r.json()["detail"]

        def chunks():  # no Content-Length: the streamed body is counted
            for _ in range(30):
                yield b" " * 100

        r = c.post("/v1/translate", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413

    long_settings = Settings(max_chars=10_000)
    with TestClient(create_app(translator, long_settings)) as c:
        too_long = " ".join(["dog"] * (translator.config.max_positions + 5))
        r = c.post("/v1/translate", json={"text": ["fine", too_long]})
        assert r.status_code == 413 and "'text.1'" in r.json()["detail"] and "max_positions" in r.json()["detail"]


@pytest.mark.slow
def test_each_sentence_is_tokenised_once(tiny_model_dir, monkeypatch):
    """The source ids the server counts (max_positions, the batch's token budget) are the ones it translates
    from: each sentence of a request goes through the tokenizer once, in every API and format."""
    translator = load(tiny_model_dir)
    vocab = translator.vocabs.src
    encoded = []
    encode, encode_batch = vocab.encode, vocab.encode_batch
    monkeypatch.setattr(vocab, "encode", lambda text: encoded.append(text) or encode(text))
    monkeypatch.setattr(vocab, "encode_batch", lambda texts: encoded.extend(texts) or encode_batch(texts))
    two = ["A dog runs in the park.", "Two men are playing soccer."]
    requests = [
        ("/v1/translate", {"text": two}, two),
        ("/v1/translate", {"text": two, "beam": 2, "nbest": 2}, two),
        ("/v1/attention", {"text": two}, two),
        ("/translate", {"q": " ".join(two), "source": "en", "target": "fr"}, two),
        (
            "/translate",
            {"q": "<p>A dog <b>runs</b> in the park.</p>", "source": "en", "target": "fr", "format": "html"},
            ["A dog runs in the park."],
        ),
    ]
    with TestClient(create_app(translator)) as c:
        for path, body, sentences in requests:
            encoded.clear()
            r = c.post(path, json=body)
            assert r.status_code == 200, r.text
            assert encoded == sentences, (path, body)
    assert translator.translate(two) == load(tiny_model_dir).translate(two)  # the counting changed nothing


@pytest.mark.slow
def test_timeout_is_504_and_the_server_keeps_working(translator, sentences):
    with TestClient(create_app(Slow(translator, 0.6), Settings(timeout=0.2))) as c:
        r = c.post("/v1/translate", json={"text": sentences[:1]})
        assert r.status_code == 504 and "0.2 s" in r.json()["detail"]
    with TestClient(create_app(Slow(translator, 0.05), Settings(timeout=30))) as c:
        assert c.post("/v1/translate", json={"text": sentences[:1]}).status_code == 200


@pytest.mark.slow
def test_graceful_shutdown_finishes_in_flight_requests(translator, sentences):
    app = create_app(Slow(translator, 1.0))
    live = Live(app)
    result = {}

    def request():
        result["r"] = httpx.post(live.url + "/v1/translate", json={"text": sentences[:2], "beam": 2}, timeout=30)

    t = threading.Thread(target=request)
    t.start()
    deadline = time.monotonic() + 10
    while app.state.pool.pending == 0:  # wait until the request is queued or running
        assert time.monotonic() < deadline
        time.sleep(0.01)
    live.stop()  # like SIGTERM: stop accepting, finish what is in flight
    t.join(10)
    assert result["r"].status_code == 200
    assert result["r"].json()["translations"] == translator.translate(sentences[:2], search=SearchOptions(beam=2))
    with pytest.raises(httpx.ConnectError):
        httpx.get(live.url + "/health", timeout=2)


def test_health_and_openapi(translator):
    with TestClient(create_app(translator, name="tiny")) as c:
        assert c.get("/health").json() == {"status": "ok"}  # LibreTranslate's answer, nothing more
        health = c.get("/v1/health").json()
        assert health["status"] == "ok" and health["model"] == "tiny" and health["src_lang"] == "en"
        spec = c.get("/openapi.json").json()
        schema = spec["components"]["schemas"]["TranslateRequest"]
        assert set(schema["properties"]) == {"text", "source", "target", "beam", "nbest", "alpha", "return_scores"}
        assert "413" in spec["paths"]["/v1/translate"]["post"]["responses"]


def test_cli_binds_localhost_by_default_and_checks_settings(tiny_model_dir, capsys, monkeypatch):
    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(kw))
    assert main(["serve", "--model", str(tiny_model_dir), "--threads", "1"]) == 0
    assert seen["host"] == "127.0.0.1" and seen["port"] == 8080
    assert seen["access_log"] is False and seen["ws"] == "none"  # no line per request unless asked
    assert main(["serve", "--model", str(tiny_model_dir), "--threads", "1", "--access-log"]) == 0
    assert seen["access_log"] is True
    torch.set_num_threads(1)
    assert main(["serve", "--model", str(tiny_model_dir), "--max-sentences", "0"]) == 2
    assert "--max-sentences" in capsys.readouterr().err
    assert srv.Settings().max_batch_requests > 1


def test_workers_default_to_one_per_usable_core(tiny_model_dir, capsys, monkeypatch):
    """By default one worker of one thread per core of the affinity mask; --threads 2 halves the workers."""
    from transduce.serve import service

    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: None)
    monkeypatch.setattr(service, "usable_cores", lambda: 4)
    assert service.worker_count(Settings()) == 4 and service.worker_count(Settings(threads=2)) == 2
    assert service.worker_count(Settings(workers=3, threads=2)) == 3
    assert main(["serve", "--model", str(tiny_model_dir)]) == 0
    assert "4 process worker(s) x 1 thread(s)" in capsys.readouterr().out  # processes from 3 workers
    assert torch.get_num_threads() == 1
    assert main(["serve", "--model", str(tiny_model_dir), "--workers", "-1"]) == 2
    assert "--workers must not be negative, got -1" in capsys.readouterr().err
