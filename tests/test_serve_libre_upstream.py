"""LibreTranslate's own API tests (libretranslate/tests/test_api/*.py in its repository), written again here:
the same requests, sent over HTTP to ``transduce serve``'s app on a real uvicorn, and the same assertions.
Its tests run on a server with en and es; this one has the tests' tiny en->fr model, so "es" is "fr".

Where a real client and these tests could disagree, the client was checked: ``GET /detect`` answers 405
here as there, because no client sends it (Nextcloud's PHP library POSTs ``/detect?q=...``,
libretranslatepy, Discourse and Crow Translate POST a form, deep-translator does not detect;
tests/test_serve_clients.py sends each of them).
"""

import pytest

httpx = pytest.importorskip("httpx", reason="these tests speak HTTP with httpx")
pytest.importorskip("fastapi", reason="server tests need fastapi (the serve extra)")
pytest.importorskip("py3langid", reason="language identification needs py3langid")

from live_server import Live  # noqa: E402

from transduce.serve.server import create_app  # noqa: E402


@pytest.fixture(scope="module")
def url(tiny_translator):
    live = Live(create_app(tiny_translator, name="tiny"))
    yield live.url
    live.stop()


def test_detect(url):
    r = httpx.post(url + "/detect", data={"q": "Hello"})
    assert r.status_code == 200
    assert len(r.json()) >= 1 and {"confidence", "language"} <= set(r.json()[0])


def test_detect_without_parameters_is_a_400_with_an_error(url):
    r = httpx.post(url + "/detect")
    assert r.status_code == 400 and "error" in r.json()


def test_detect_by_get_is_not_allowed(url):
    assert httpx.get(url + "/detect").status_code == 405
    assert httpx.get(url + "/detect", params={"q": "Hello"}).status_code == 405


def test_frontend_settings(url):
    assert httpx.get(url + "/frontend/settings").status_code == 200


def test_languages(url):
    r = httpx.get(url + "/languages")
    assert r.status_code == 200
    assert len(r.json()) >= 1 and {"code", "name"} <= set(r.json()[0])
    assert httpx.post(url + "/languages").status_code == 405


def test_health_is_exactly_status_ok(url):
    r = httpx.get(url + "/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    assert httpx.post(url + "/health").status_code == 405


def test_spec(url):
    assert httpx.get(url + "/spec").status_code == 200
    assert httpx.post(url + "/spec").status_code == 405


def test_translate(url):
    r = httpx.post(url + "/translate", data={"q": "Hello", "source": "en", "target": "fr", "format": "text"})
    assert r.status_code == 200 and "translatedText" in r.json()


def test_translate_a_batch(url):
    body = {"q": ["Hello", "World"], "source": "en", "target": "fr", "format": "text"}
    r = httpx.post(url + "/translate", json=body, timeout=60)
    assert r.status_code == 200
    assert isinstance(r.json()["translatedText"], list) and len(r.json()["translatedText"]) == 2


def test_translate_into_an_unsupported_language(url):
    r = httpx.post(url + "/translate", data={"q": "Hello", "source": "en", "target": "zz", "format": "text"})
    assert r.status_code == 400 and r.json()["error"] == "zz is not supported"
    r = httpx.post(url + "/translate", data={"q": "Hello", "source": "zz", "target": "fr"})
    assert r.status_code == 400 and r.json()["error"] == "zz is not supported"


def test_translate_without_q(url):
    r = httpx.post(url + "/translate", data={"source": "en", "target": "fr", "format": "text"})
    assert r.status_code == 400 and r.json()["error"] == "Invalid request: missing q parameter"
