"""The LibreTranslate API as lenient as LibreTranslate: fields anywhere, keys ignored when off, unknown
fields ignored, malformed HTML repaired, CORS, language identification, whole texts, pivot routes.

Models: the trained ``tiny_model_dir`` (en->fr) and randomly initialised models of its shape registered
for other pairs (their output is junk but deterministic, so a request routed wrongly is caught).
"""

import io
import logging

import pytest

pytest.importorskip("fastapi", reason="server tests need fastapi (the serve extra)")
pytest.importorskip("py3langid", reason="language identification needs py3langid")

from fastapi.testclient import TestClient  # noqa: E402
from live_server import untrained_model  # noqa: E402

from transduce.api import load  # noqa: E402
from transduce.cli import main  # noqa: E402
from transduce.decode.search_options import SearchOptions
from transduce.serve.keys import Access, read_keys  # noqa: E402
from transduce.serve.registry import spec_from_dir  # noqa: E402
from transduce.serve.server import create_app  # noqa: E402
from transduce.serve.service import Settings  # noqa: E402
from transduce.text.document import reassemble, sentences, split_text  # noqa: E402

EN = "A dog runs in the park."
DOC = (
    "A man rides a red bike. Two men are playing soccer.\n"
    "A woman is reading a book.\n"
    "\n"
    "  A child eats an apple. People walk down the street.\r\n"
    "\n\n"
    "The dog sleeps.\n"
)


@pytest.fixture(scope="module")
def models(tiny_model_dir, tmp_path_factory):
    base = tmp_path_factory.mktemp("libre")
    return {
        ("en", "fr"): tiny_model_dir,
        ("fr", "en"): untrained_model(tiny_model_dir, base / "fr-en", "fr", "en", seed=3),
        ("de", "en"): untrained_model(tiny_model_dir, base / "de-en", "de", "en", seed=5),
        ("de", "fr"): untrained_model(tiny_model_dir, base / "de-fr", "de", "fr", seed=9),
    }


@pytest.fixture(scope="module")
def offline(models):
    return {pair: load(path) for pair, path in models.items()}


def app_for(models, pairs, **kw):
    return create_app(
        specs=[spec_from_dir(models[p], name="-".join(p)) for p in pairs], load=lambda s: load(s.path), **kw
    )


def document(translator, text):
    pieces = split_text(text, "en")
    return reassemble(pieces, translator.translate(sentences(pieces)))


def test_fields_from_the_query_string_keys_ignored_when_off_unknown_fields_ignored(models, offline, caplog):
    """deep-translator's LibreTranslator sends every field in the query string, always with api_key
    (deep_translator/libre.py: ``requests.post(self._base_url, params=params)``)."""
    want = offline["en", "fr"].translate([EN])[0]
    with TestClient(app_for(models, [("en", "fr")])) as c:
        params = {"q": EN, "source": "en", "target": "fr", "format": "text", "api_key": "its-own-key"}
        r = c.post("/translate", params=params)
        assert r.status_code == 200 and r.json() == {"translatedText": want}, r.text
        with caplog.at_level(logging.WARNING, logger="transduce.serve"):
            for _ in range(2):
                r = c.post("/translate", json={"q": EN, "source": "en", "target": "fr", "colour": 1, "api_key": None})
                assert r.status_code == 200 and r.json() == {"translatedText": want}
        assert [m for m in caplog.messages if "'colour'" in m] == [
            "/translate: ignoring unknown field 'colour' (logged once)"
        ]
        r = c.post("/translate?source=en&target=fr", data={"q": EN})  # the body's fields join the query's
        assert r.json() == {"translatedText": want}


def test_a_server_with_keys_answers_a_wrong_key_with_a_clear_403(models, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("right-key-001 0 12\n")
    assert read_keys(keys)[0].char_limit == 12
    with TestClient(app_for(models, [("en", "fr")], access=Access(read_keys(keys), require="always"))) as c:
        r = c.post("/translate", params={"q": EN, "source": "en", "target": "fr", "api_key": "wrong-key-01"})
        assert r.status_code == 403 and r.json() == {"error": "invalid API key"}
        r = c.post("/translate", params={"q": EN, "source": "en", "target": "fr", "api_key": "right-key-001"})
        assert r.status_code == 413 and "exceeds the text limit of 12" in r.json()["error"]  # the key's own limit
        r = c.post("/translate", params={"q": "A dog.", "source": "en", "target": "fr", "api_key": "right-key-001"})
        assert r.status_code == 200


def test_html_alternatives_are_empty_and_malformed_html_is_repaired(models):
    with TestClient(app_for(models, [("en", "fr")])) as c:
        body = {"q": ["<p>A dog runs.", "<b>Two men</b> talk."], "source": "en", "target": "fr", "format": "html"}
        r = c.post("/translate", json={**body, "alternatives": 2})
        assert r.status_code == 200, r.text
        first, second = r.json()["translatedText"]
        assert first.startswith("<p>") and first.endswith("</p>")  # the unclosed <p> was closed
        assert second.count("<b>") == 1 and second.count("</b>") == 1
        assert r.json()["alternatives"] == [[], []]


def test_cors_on_answers_and_preflight(models):
    """A browser extension's cross-origin fetch: preflight OPTIONS, then the POST."""
    with TestClient(app_for(models, [("en", "fr")], settings=Settings(max_body=200))) as c:
        pre = c.options(
            "/translate",
            headers={
                "Origin": "moz-extension://abc",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type",
            },
        )
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "*"
        assert "POST" in pre.headers["access-control-allow-methods"]
        r = c.post("/translate", json={"q": EN, "source": "en", "target": "fr"}, headers={"Origin": "https://x.org"})
        assert r.headers["access-control-allow-origin"] == "*"
        r = c.post(
            "/translate", json={"q": "x" * 300, "source": "en", "target": "fr"}, headers={"Origin": "https://x.org"}
        )
        assert r.status_code == 413 and r.headers["access-control-allow-origin"] == "*"
    with TestClient(app_for(models, [("en", "fr")], cors_origins=("https://ok.example",))) as c:
        assert (
            c.get("/languages", headers={"Origin": "https://evil.example"}).headers.get("access-control-allow-origin")
            is None
        )
        ok = c.get("/languages", headers={"Origin": "https://ok.example"})
        assert ok.headers["access-control-allow-origin"] == "https://ok.example"
    with TestClient(app_for(models, [("en", "fr")], cors_origins=())) as c:  # --cors-origins ''
        assert "access-control-allow-origin" not in c.get("/languages", headers={"Origin": "https://a.org"}).headers


@pytest.mark.slow
def test_detect_and_auto_source_choose_among_served_languages(models, offline):
    fr, en, de = (
        "Un homme lit un livre dans le jardin.",
        "A man reads a book in the garden.",
        "Ein Mann liest ein Buch.",
    )
    with TestClient(app_for(models, [("en", "fr"), ("de", "fr"), ("fr", "en")])) as c:
        r = c.post("/detect", data={"q": fr})
        ranked = r.json()
        assert r.status_code == 200 and [x["language"] for x in ranked][0] == "fr" and len(ranked) == 3
        assert ranked[0]["confidence"] > 90 and sum(x["confidence"] for x in ranked) == pytest.approx(100, abs=0.2)
        assert c.post("/detect", params={"q": de}).json()[0]["language"] == "de"  # Nextcloud: POST /detect?q=
        r = c.post("/translate", json={"q": [en, de], "source": "auto", "target": "fr"})
        body = r.json()
        assert r.status_code == 200, body
        assert [d["language"] for d in body["detectedLanguage"]] == ["en", "de"]
        assert body["translatedText"] == [
            offline["en", "fr"].translate([en])[0],
            offline["de", "fr"].translate([de])[0],
        ]


def test_detect_command(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("Ein Hund läuft im Park.\nA dog runs in the park.\n"))
    assert main(["detect", "--languages", "en,deu,fr"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in lines] == ["deu", "en"]
    assert main(["detect", "--languages", "en,xx"]) == 2
    assert "does not know xx" in capsys.readouterr().err


def test_whole_texts_keep_their_layout_and_share_one_batch(models, offline):
    with TestClient(app_for(models, [("en", "fr")], settings=Settings(wait_ms=0, workers=1))) as c:
        r = c.post("/translate", json={"q": [DOC, "", EN], "source": "en", "target": "fr"})
        assert r.status_code == 200, r.text
        got = r.json()["translatedText"]
        assert got == [document(offline["en", "fr"], DOC), "", offline["en", "fr"].translate([EN])[0]]
        assert got[0].count("\n") == DOC.count("\n") and "\r\n\n\n" in got[0] and "\n  " in got[0]
        health = c.get("/v1/health").json()
        assert health["requests"] == 1 and health["batches"] == 1  # 7 sentences of 2 texts, one worker: one batch
    with TestClient(app_for(models, [("en", "fr")], settings=Settings(max_chars=20))) as c:
        r = c.post("/translate", json={"q": DOC, "source": "en", "target": "fr"})
        assert r.status_code == 413 and r.json()["error"] == (
            "field 'q': sentence 1 has 23 characters, over the limit of 20 (--max-chars)"
        )
    with TestClient(app_for(models, [("en", "fr")], settings=Settings(char_limit=100))) as c:
        r = c.post("/translate", json={"q": [DOC[:60], DOC[60:]], "source": "en", "target": "fr"})
        assert r.status_code == 413 and r.json()["error"].endswith(
            f"request ({len(DOC)} characters) exceeds the text limit of 100"
        )


@pytest.mark.slow
def test_languages_use_standard_codes_and_pivot_through_english(models, offline, tmp_path):
    with TestClient(app_for(models, [("en", "fr"), ("de", "en")])) as c:
        assert c.get("/languages").json() == [
            {"code": "de", "name": "German", "targets": ["de", "en", "fr"]},
            {"code": "en", "name": "English", "targets": ["en", "fr"]},
            {"code": "fr", "name": "French", "targets": ["fr"]},
        ]
        text = "Ein Mann liest. Ein Hund schläft."
        r = c.post("/translate", json={"q": text, "source": "de", "target": "fr", "alternatives": 1})
        english = document(offline["de", "en"], text)
        pieces = split_text(english, "en")
        nbest = offline["en", "fr"].translate(sentences(pieces), search=SearchOptions(beam=4, nbest=2))
        assert r.json() == {
            "translatedText": reassemble(pieces, [h[0] for h in nbest]),
            "alternatives": [reassemble(pieces, [h[1] for h in nbest])],
            "route": ["de-en", "en-fr"],
        }


def test_html_neither_parser_reads_is_a_400_naming_the_problem(models, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "lxml.html", None)  # as where lxml is not installed
    with TestClient(app_for(models, [("en", "fr")])) as c:
        r = c.post(
            "/translate", json={"q": ["<b>ok</b>", "<p>A dog"], "source": "en", "target": "fr", "format": "html"}
        )
        assert r.status_code == 400
        assert r.json() == {"error": "Invalid request: q.1 is not well-formed HTML: line 1:1: <p> is never closed"}


@pytest.mark.slow
def test_the_pages_api_pivots_through_english_and_identifies_the_source(models, offline):
    """POST /v1/attention (the page's API) routes as /translate does: a pivot through English where no model
    serves the pair, ``source: "auto"`` among the sources that reach the target; the answer names the route."""
    from transduce.serve.alignment import word_alignments

    de = ["Ein Mann liest ein Buch.", "Ein Hund schläft."]
    fr = ["Un homme lit un livre dans le jardin."]

    def same(got, want):
        assert [{k: v for k, v in a.items() if k != "weights"} for a in got] == [
            {k: v for k, v in a.items() if k != "weights"} for a in want
        ]
        for a, b in zip(got, want):
            assert a["weights"] == [pytest.approx(row, abs=1e-4) for row in b["weights"]]

    with TestClient(app_for(models, [("en", "fr"), ("de", "en"), ("fr", "en")])) as c:
        r = c.post("/v1/attention", json={"text": de, "source": "de", "target": "fr"})
        assert r.status_code == 200, r.text
        english = offline["de", "en"].translate(de)
        assert r.json()["route"] == ["de-en", "en-fr"] and "detected" not in r.json()
        same(r.json()["alignments"], word_alignments(offline["en", "fr"], english))
        assert [a["source_words"] for a in r.json()["alignments"]] == [e.split() for e in english]

        r = c.post("/v1/attention", json={"text": fr, "source": "auto", "target": "en"})
        assert r.status_code == 200, r.text
        assert r.json()["route"] == ["fr-en"] and r.json()["detected"]["language"] == "fr"
        same(r.json()["alignments"], word_alignments(offline["fr", "en"], fr))

        r = c.post("/v1/attention", json={"text": de, "source": "auto", "target": "fr"})  # auto, then a pivot
        assert r.json()["detected"]["language"] == "de" and r.json()["route"] == ["de-en", "en-fr"]
        assert r.json()["detected"]["confidence"] > 50

        r = c.post("/v1/attention", json={"text": [EN], "source": "en", "target": "fr"})
        assert r.json()["route"] == ["en-fr"] and "detected" not in r.json()
        same(r.json()["alignments"], word_alignments(offline["en", "fr"], [EN]))

        r = c.post("/v1/attention", json={"text": [EN], "source": "auto", "target": "xx"})
        assert r.status_code == 400 and r.json()["detail"] == "source 'auto': no model here translates into 'xx'"
        r = c.post("/v1/attention", json={"text": [EN], "source": "fr", "target": "de"})
        assert r.status_code == 400 and "no model translates" in r.json()["detail"]
