"""Many models behind one server: routing by pair, the memory budget, the LibreTranslate API, keys,
limits, metrics, and a loopback load test across two pairs (outputs equal offline translation).

Models: the trained ``tiny_model_dir`` (en->fr) and, for a second pair, a randomly initialised model
of the same shape and vocabulary registered as fr->en (its output is junk, but deterministic, and
different from the first model's, so a request answered by the wrong model is caught).
"""

import random
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

httpx = pytest.importorskip("httpx", reason="server tests need httpx")
uvicorn = pytest.importorskip("uvicorn", reason="server tests need uvicorn (the serve extra)")
pytest.importorskip("fastapi", reason="server tests need fastapi (the serve extra)")
pytest.importorskip("prometheus_client", reason="server tests need prometheus-client (the serve extra)")

from fastapi.testclient import TestClient  # noqa: E402
from live_server import Live, untrained_model  # noqa: E402

from transduce.api import load  # noqa: E402
from transduce.cli import main  # noqa: E402
from transduce.config import ConfigError  # noqa: E402
from transduce.decode.search_options import SearchOptions  # noqa: E402
from transduce.modeldir import load_model_dir, save_model_dir  # noqa: E402
from transduce.serve.keys import Access, RateLimiter, find_key, read_keys  # noqa: E402
from transduce.serve.registry import ModelPool, PoolFull, read_models, spec_from_dir  # noqa: E402
from transduce.serve.server import create_app  # noqa: E402
from transduce.serve.service import Settings  # noqa: E402

EN = [
    "A dog runs in the park.",
    "Two men are playing soccer.",
    "A woman is reading a book.",
    "A child eats an apple.",
    "People walk down the street.",
    "A man rides a red bike.",
]
DE = [
    "Ein Hund läuft im Park.",
    "Zwei Männer spielen Fußball.",
    "Eine Frau liest ein Buch.",
    "Ein Kind isst einen Apfel.",
]


@pytest.fixture(scope="module")
def de_en_dir(tiny_model_dir, tmp_path_factory):
    return untrained_model(tiny_model_dir, tmp_path_factory.mktemp("models") / "fr-en", "fr", "en")


@pytest.fixture(scope="module")
def specs(tiny_model_dir, de_en_dir):
    return [spec_from_dir(tiny_model_dir, name="en-fr"), spec_from_dir(de_en_dir)]


@pytest.fixture(scope="module")
def offline(tiny_model_dir, de_en_dir):
    return {("en", "fr"): load(tiny_model_dir), ("fr", "en"): load(de_en_dir)}


def loader(spec):
    return load(spec.path)


def test_models_file_and_directory(tiny_model_dir, de_en_dir, tmp_path):
    toml = tmp_path / "models.toml"
    toml.write_text(
        f'[[model]]\npath = "{tiny_model_dir}"\nname = "news"\n\n'
        f'[[model]]\npath = "{de_en_dir}"\nsource = "nl"\ntarget = "en"\ndtype = "int8"\n'
    )
    news, nl = read_models(toml)
    assert (news.name, news.pair, news.dtype) == ("news", "en-fr", None)
    assert (nl.name, nl.pair, nl.dtype) == ("fr-en", "nl-en", "int8")
    assert [s.pair for s in read_models(de_en_dir.parent)] == ["fr-en"]

    def fails(text, phrase):
        toml.write_text(text)
        with pytest.raises(ConfigError, match=phrase):
            read_models(toml)

    fails(f'[[model]]\npath = "{tiny_model_dir}"\nlanguage = "en"\n', r"#1: unknown key\(s\) language")
    fails('[[model]]\nsource = "en"\n', "#1: missing 'path'")
    fails(
        f'[[model]]\npath = "{tiny_model_dir}"\n[[model]]\npath = "{tiny_model_dir}"\nname = "b"\n',
        "two models with pair 'en-fr'",
    )
    fails(f'[[model]]\npath = "{tiny_model_dir}"\ndtype = "fp8"\n', "dtype must be one of")
    fails("[server]\nport = 1\n", r"unknown key\(s\) server")
    bare = save_model_dir(tmp_path / "bare", *load_model_dir(tiny_model_dir)[:2], {})
    fails(f'[[model]]\npath = "{bare}"\n', "no source language: give 'source' or put src_lang")
    with pytest.raises(FileNotFoundError, match="no such models file"):
        read_models(tmp_path / "missing.toml")


class FakeBatcher:
    def __init__(self):
        self.running, self.pending = False, 0

    def start(self):
        self.running = True

    def stop(self):
        self.running = False


def test_pool_unloads_least_recently_used_idle_models(specs, tmp_path):
    weights = (specs[0].path / "model.safetensors").stat().st_size
    pool = ModelPool(specs, loader, lambda spec, t: FakeBatcher(), budget_bytes=int(1.5 * weights))
    a = pool.acquire(specs[0])
    with pytest.raises(PoolFull, match="while the loaded models are in use"):
        pool.acquire(specs[1])  # the first is in use: it may not be unloaded
    assert list(pool.loaded) == ["en-fr"] and a.batcher.running
    pool.release(a)
    b = pool.acquire(specs[1])  # now it may
    assert list(pool.loaded) == ["fr-en"] and not a.batcher.running and b.batcher.running
    assert (pool.loads, pool.evictions) == (2, 1)
    pool.release(b)
    assert pool.acquire(specs[1]) is b and pool.loads == 2  # loaded once, reused
    small = ModelPool(specs, loader, lambda spec, t: FakeBatcher(), budget_bytes=weights // 2)
    with pytest.raises(PoolFull, match="more than the memory budget"):
        small.acquire(specs[0])
    roomy = ModelPool(specs, loader, lambda spec, t: FakeBatcher(), budget_bytes=0)
    for spec in specs + specs:
        roomy.release(roomy.acquire(spec))
    assert (roomy.loads, roomy.evictions, len(roomy.loaded)) == (2, 0, 2)


@pytest.mark.slow
def test_libretranslate_api(specs, offline):
    with TestClient(create_app(specs=specs, load=loader)) as c:
        assert c.get("/languages").json() == [
            {"code": "en", "name": "English", "targets": ["en", "fr"]},
            {"code": "fr", "name": "French", "targets": ["en", "fr"]},
        ]
        r = c.post("/translate", json={"q": EN[0], "source": "en", "target": "fr"})
        assert r.status_code == 200 and r.json() == {"translatedText": offline["en", "fr"].translate([EN[0]])[0]}
        r = c.post("/translate", data={"q": DE[0], "source": "fr", "target": "en"})  # form-encoded
        assert r.json() == {"translatedText": offline["fr", "en"].translate([DE[0]])[0]}
        r = c.post("/translate", json={"q": EN[:3], "source": "auto", "target": "fr", "alternatives": 2})
        nbest = offline["en", "fr"].translate(EN[:3], search=SearchOptions(beam=4, nbest=3))
        assert r.json() == {
            "translatedText": [h[0] for h in nbest],
            "alternatives": [h[1:] for h in nbest],
            "detectedLanguage": [{"language": "en", "confidence": 100.0}] * 3,
        }
        r = c.post("/translate", files={"q": (None, EN[1]), "source": (None, "en"), "target": (None, "fr")})
        assert r.json()["translatedText"] == offline["en", "fr"].translate([EN[1]])[0]  # multipart form
        cases = [
            (
                {"q": "x", "source": "en", "target": "de"},
                "de is not supported",
            ),
            ({"source": "en", "target": "fr"}, "missing q parameter"),
            ({"text": ["x"]}, "is at POST /v1/translate"),
            ({"q": "x", "source": "en", "target": "fr", "format": "pdf"}, "format must be 'text' or 'html'"),
            ({"q": "x", "source": "en", "target": "fr", "alternatives": "two"}, "alternatives must be an integer"),
            ({"q": "x", "source": "en", "target": "fr", "alternatives": 99}, "alternatives must be between 0 and 15"),
            ({"q": ["x", 3], "source": "en", "target": "fr"}, "q must be a string or a list of strings"),
        ]
        for body, phrase in cases:
            r = c.post("/translate", json=body)
            assert r.status_code == 400 and phrase in r.json()["error"], (body, r.json())
        r = c.post("/translate", content=b'{"q": ', headers={"content-type": "application/json"})
        assert r.status_code == 400 and "malformed JSON" in r.json()["error"]
        r = c.post("/translate", json={"q": "<b>A dog</b>", "source": "en", "target": "fr", "format": "html"})
        try:
            from transduce.text.markup import translate_html  # noqa: F401
        except ImportError:
            assert r.status_code == 400 and "not supported by this server build" in r.json()["error"]
        else:
            assert r.status_code == 200 and r.json()["translatedText"].startswith("<b>")
        r = c.post("/v1/translate", json={"text": ["x"]})
        assert r.status_code == 400 and "name both 'source' and 'target'" in r.json()["detail"]


def test_auto_source_without_a_route(specs, tiny_model_dir, tmp_path):
    model, vocabs, _ = load_model_dir(tiny_model_dir)
    de = spec_from_dir(save_model_dir(tmp_path / "de-fr", model, vocabs, {"src_lang": "de", "tgt_lang": "fr"}))
    with TestClient(create_app(specs=[specs[0], de], load=loader)) as c:
        r = c.post("/translate", json={"q": "x", "source": "auto", "target": "en"})  # listed, as a source only
        assert r.status_code == 400 and "no model here translates into 'en'" in r.json()["error"]
        r = c.post("/translate", json={"q": "x", "source": "auto", "target": "it"})
        assert r.status_code == 400 and r.json()["error"] == "it is not supported"


def test_api_keys_and_request_limits(specs, tmp_path):
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text("# team keys\nalpha-key-0001  2\nbeta-key-00002   # default limit\n\n")
    keys = read_keys(keys_file, default_limit=0)
    assert [(k.per_minute, k.line) for k in keys] == [(2, 2), (0, 3)]
    assert find_key(keys, "beta-key-00002").line == 3 and find_key(keys, "beta-key-00003") is None
    for text, phrase in [
        ("k1234567 x\n", r"keys.txt:1: expected 'KEY \[REQUESTS_PER_MINUTE \[CHAR_LIMIT\]\]'"),
        ("k1234567 1 2 3\n", r"keys.txt:1: expected .* got 4 fields"),
        ("short\n", "keys.txt:1: key shorter than 8"),
        ("k1234567\nk1234567\n", "keys.txt:2: the same"),
        ("# none\n", "no keys in the file"),
    ]:
        keys_file.write_text(text)
        with pytest.raises(ConfigError, match=phrase):
            read_keys(keys_file)

    access = Access(keys, require="remote")
    assert access.check(None, "127.0.0.1") == "anonymous" and access.check(None, "::1") == "anonymous"
    with TestClient(create_app(specs=specs, load=loader, access=access)) as c:  # TestClient's address is not loopback
        body = {"q": "A dog.", "source": "en", "target": "fr"}
        r = c.post("/translate", json=body)
        assert r.status_code == 403 and "API key is required" in r.json()["error"]
        r = c.post("/translate", json={**body, "api_key": "alpha-key-0002"})
        assert r.status_code == 403 and r.json() == {"error": "invalid API key"}
        assert c.post("/translate", json={**body, "api_key": "alpha-key-0001"}).status_code == 200
        assert c.post("/translate", data={**body, "api_key": "alpha-key-0001"}).status_code == 200
        r = c.post("/translate", json={**body, "api_key": "alpha-key-0001"})
        assert (
            r.status_code == 429 and "limit of 2 per minute" in r.json()["error"] and int(r.headers["retry-after"]) > 0
        )
        r = c.post(
            "/v1/translate",
            json={"text": ["A dog."], "source": "en", "target": "fr"},
            headers={"X-API-Key": "beta-key-00002"},
        )
        assert r.status_code == 200
        r = c.post(
            "/v1/translate",
            json={"text": ["A dog."], "source": "en", "target": "fr"},
            headers={"Authorization": "Bearer nope-nope-nope"},
        )
        assert r.status_code == 403
        assert c.get("/languages").status_code == 200  # no key needed to list languages

    now = [0.0]
    limiter = RateLimiter(clock=lambda: now[0])
    assert [limiter.allow("a", 60) for _ in range(60)] == [0.0] * 60
    assert limiter.allow("a", 60) == pytest.approx(1.0)
    now[0] = 1.0
    assert limiter.allow("a", 60) == 0.0 and limiter.allow("b", 60) == 0.0


@pytest.mark.slow
def test_metrics_count_requests_batches_and_models(specs):
    app = create_app(
        settings=Settings(workers=1), specs=specs, load=loader, budget_bytes=0
    )  # one worker: a batch per request
    with TestClient(app) as c:
        for _ in range(2):
            c.post("/translate", json={"q": EN[:2], "source": "en", "target": "fr"})
        c.post("/translate", json={"q": "x", "source": "en", "target": "xx"})
        c.post("/v1/translate", json={"text": DE[:3], "source": "fr", "target": "en"})
        text = c.get("/metrics").text
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert float(lines['transduce_requests_total{path="/translate",status="200"}']) == 2
    assert float(lines['transduce_requests_total{path="/translate",status="400"}']) == 1
    assert float(lines['transduce_request_seconds_count{path="/v1/translate"}']) == 1
    assert float(lines['transduce_sentences_total{pair="en-fr"}']) == 4
    assert float(lines['transduce_sentences_total{pair="fr-en"}']) == 3
    assert float(lines["transduce_batch_sentences_sum"]) == 7 and float(lines["transduce_batch_requests_count"]) == 3
    assert float(lines["transduce_models_loaded"]) == 2 and float(lines["transduce_model_loads"]) == 2
    assert float(lines["transduce_queue_depth"]) == 0


@pytest.mark.slow
def test_load_two_pairs_zero_errors_offline_outputs(specs, offline):
    """8 clients x 6 LibreTranslate requests on 127.0.0.1, pairs mixed: every answer 200 and equal offline."""
    app = create_app(settings=Settings(wait_ms=10), specs=specs, load=loader)
    live = Live(app)
    rng = random.Random(0)
    pairs = {("en", "fr"): EN, ("fr", "en"): DE}
    plan = [
        [(pair, rng.sample(pairs[pair], rng.randint(1, 2))) for pair in rng.choices(list(pairs), k=6)] for _ in range(8)
    ]

    def client(requests):
        with httpx.Client(base_url=live.url, timeout=120) as c:
            return [c.post("/translate", json={"q": q, "source": s, "target": t}) for (s, t), q in requests]

    try:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(client, plan))
        health = httpx.get(live.url + "/v1/health").json()
    finally:
        live.stop()
    for requests, replies in zip(plan, answers, strict=True):
        for (pair, q), r in zip(requests, replies, strict=True):
            assert r.status_code == 200, r.text
            assert r.json()["translatedText"] == offline[pair].translate(q)
    assert health["requests"] == 48 and health["loaded"] == 2
    assert health["max_requests_in_batch"] > 1  # concurrent requests for a pair shared batches


def test_cli_serves_a_models_file_and_checks_keys(specs, tmp_path, monkeypatch, capsys):
    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(kw, app=app))
    toml = tmp_path / "models.toml"
    toml.write_text("".join(f'[[model]]\npath = "{s.path}"\nname = "{s.name}"\n' for s in specs))
    assert main(["serve", "--models", str(toml), "--memory-budget-mb", "64", "--threads", "1"]) == 0
    pool = seen["app"].state.pool
    assert sorted(pool.specs) == ["en-fr", "fr-en"] and pool.budget == 64 * 2**20 and not pool.loaded  # lazy
    keys = tmp_path / "keys.txt"
    keys.write_text("abcdefgh 1 2 3\n")
    assert main(["serve", "--models", str(toml), "--api-keys", str(keys)]) == 2
    assert "keys.txt:1:" in capsys.readouterr().err
    assert main(["serve", "--models", str(tmp_path / "nope.toml")]) != 0
    torch.set_num_threads(1)


def test_page_and_attention_endpoint(specs, offline):
    with TestClient(create_app(specs=specs, load=loader)) as c:
        page = c.get("/")
        assert page.status_code == 200 and '<select id="pair">' in page.text and "/page.js" in page.text
        assert "/v1/attention" in c.get("/page.js").text
        r = c.post("/v1/attention", json={"text": [EN[0], ""], "source": "en", "target": "fr"})
        first, empty = r.json()["alignments"]
    assert first["translation"] == offline["en", "fr"].translate([EN[0]])[0]
    assert first["source_words"] == EN[0].split()
    assert " ".join(first["target_words"]) == first["translation"]
    weights = first["weights"]
    assert len(weights) == len(first["target_words"]) and all(len(row) == 6 for row in weights)
    assert all(0.0 <= sum(row) <= 1.0001 for row in weights) and max(map(max, weights)) > 0.2
    assert empty == {"translation": "", "source_words": [], "target_words": [], "weights": []}


def test_a_model_that_fails_to_load_names_itself_and_the_others_keep_working(specs, tmp_path):
    model, vocabs, _ = load_model_dir(specs[0].path)
    broken = save_model_dir(tmp_path / "de-fr", model, vocabs, {"src_lang": "de", "tgt_lang": "fr"})
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated
    with TestClient(create_app(specs=[specs[0], spec_from_dir(broken)], load=loader)) as c:
        r = c.post("/translate", json={"q": "Un chien.", "source": "de", "target": "fr"})
        assert r.status_code == 500 and r.json()["error"].startswith(f"model de-fr ({broken}) could not be loaded")
        r = c.post("/v1/translate", json={"text": ["Un chien."], "source": "de", "target": "fr"})
        assert r.status_code == 500 and "model de-fr" in r.json()["detail"]
        assert c.post("/translate", json={"q": EN[0], "source": "en", "target": "fr"}).status_code == 200


def test_one_model_without_languages_still_serves_v1(tiny_model_dir, tmp_path):
    bare = save_model_dir(tmp_path / "bare", *load_model_dir(tiny_model_dir)[:2], {})
    translator = load(bare)
    with TestClient(create_app(translator, name="bare")) as c:
        assert c.get("/languages").json() == []
        r = c.post("/v1/translate", json={"text": [EN[0]]})
        assert r.json() == {"translations": translator.translate([EN[0]])}
        r = c.post("/translate", json={"q": EN[0], "source": "en", "target": "fr"})
        assert r.status_code == 400 and r.json()["error"] == "en is not supported"  # no language is listed
