"""Real LibreTranslate clients, and the requests integrations send, against ``transduce serve`` in its own
process: libretranslatepy and deep-translator themselves, and for Mastodon, Discourse, Crow Translate,
Weblate, Nextcloud (through the PHP library its LibreTranslate app uses) and a browser extension exactly
the requests their code sends (the file is named in each test). Every answer is checked against offline translation of the same model.

Models: the trained ``tiny_model_dir`` (en->fr) and a randomly initialised de->en model of its shape, so
German reaches French through English.
"""

import json
import urllib.parse
import urllib.request

import pytest

httpx = pytest.importorskip("httpx", reason="client tests need httpx")
pytest.importorskip("fastapi", reason="server tests need fastapi (the serve extra)")
pytest.importorskip("py3langid", reason="language identification needs py3langid")

from conftest import serve_subprocess  # noqa: E402
from live_server import untrained_model  # noqa: E402

from transduce.api import load  # noqa: E402
from transduce.text.document import reassemble, sentences, split_text  # noqa: E402
from transduce.text.markup import translate_html_batch  # noqa: E402

pytestmark = pytest.mark.slow  # every test talks to one server process that starts in seconds
EN = ["A man rides a red bike.", "Two men are playing soccer."]
DE = "Ein Mann fährt mit einem roten Fahrrad durch die Stadt."


@pytest.fixture(scope="module")
def models(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("clients")
    de_en = untrained_model(tiny_model_dir, root / "de-en", "de", "en", seed=11)
    (root / "models.toml").write_text(
        f'[[model]]\npath = "{tiny_model_dir}"\nname = "en-fr"\n\n[[model]]\npath = "{de_en}"\n'
    )
    return root, {"en-fr": load(tiny_model_dir), "de-en": load(de_en)}


@pytest.fixture(scope="module")
def url(models):
    """``transduce serve --models models.toml`` in its own process on a free port; yields its URL."""
    with serve_subprocess(models[0], "--models", "models.toml") as base:
        yield base


def fr(models, texts):
    return models[1]["en-fr"].translate(texts)


def test_libretranslatepy(url, models):
    """libretranslatepy 2.1.4 (libretranslatepy/api.py): form POST /translate and /detect, GET /languages."""
    from libretranslatepy import LibreTranslateAPI

    lt = LibreTranslateAPI(url)
    codes = {lang["code"]: lang["targets"] for lang in lt.languages()}
    assert codes == {"de": ["de", "en", "fr"], "en": ["en", "fr"], "fr": ["fr"]}
    assert lt.translate(EN[0], "en", "fr") == fr(models, EN[:1])[0]
    assert lt.detect(DE)[0]["language"] == "de"


def test_deep_translator(url, models):
    """deep-translator 1.11.4 (deep_translator/libre.py): every field in the query string of a POST, always
    with an api_key, to a server that has no keys."""
    from deep_translator import LibreTranslator

    translator = LibreTranslator(source="en", target="fr", api_key="any-key", custom_url=url + "/")
    assert translator.translate(EN[1]) == fr(models, EN[1:])[0]


def test_mastodon(url, models):
    """Mastodon (app/lib/translation_service/libre_translate.rb): GET /languages, keeping each code's targets
    (its Translate button needs the post's two-letter code); then a JSON list of HTML posts, source "auto"
    for a post without a language, format html, "api_key": null."""
    headers = {"Content-Type": "application/json"}
    languages = {x["code"]: x["targets"] for x in httpx.get(url + "/languages", headers=headers).json()}
    assert "fr" in languages["en"] and "fr" in languages["de"]
    posts = [f"<p>{EN[0]}</p>", f'<p>{EN[1]} <a href="https://x.example/@a">@a</a></p>']
    body = {"q": posts, "source": "auto", "target": "fr", "format": "html", "api_key": None}
    r = httpx.post(url + "/translate", content=json.dumps(body), headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["translatedText"] == translate_html_batch(models[1]["en-fr"], posts, "en")
    assert [d["language"] for d in r.json()["detectedLanguage"]] == ["en", "en"]


def test_discourse(url, models):
    """Discourse's translator plugin (app/services/discourse_translator/libre_translate.rb): form POST /detect
    with the post's text (tags stripped) and api_key, GET /languages for both codes, form POST /translate
    with format html."""
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    r = httpx.post(url + "/detect", content="q=A+man+rides+a+red+bike.&api_key=", headers=form)
    detected = r.json()[0]["language"]
    assert detected == "en"
    codes = [x["code"] for x in httpx.get(url + "/languages").json()]
    assert detected in codes and "fr" in codes
    body = {"q": f"<p>{EN[0]}</p>", "source": detected, "target": "fr", "format": "html", "api_key": ""}
    r = httpx.post(url + "/translate", data=body, timeout=120)
    assert r.json() == {"translatedText": translate_html_batch(models[1]["en-fr"], [body["q"]], "en")[0]}


def test_crow_translate(url, models):
    """Crow Translate's QOnlineTranslator (src/qonlinetranslator.cpp, requestLibreLangDetection and
    requestLibreTranslate): form bodies starting with "&", an empty api_key, /detect before /translate."""
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    text = urllib.parse.quote(EN[1])
    source = httpx.post(url + "/detect", content=f"&q={text}&api_key=", headers=form).json()[0]["language"]
    assert source == "en"
    r = httpx.post(url + "/translate", content=f"&q={text}&source={source}&target=fr&api_key=", headers=form)
    assert r.json() == {"translatedText": fr(models, EN[1:])[0]}


def test_weblate(url, models):
    """Weblate (weblate/machinery/libretranslate.py): codes from GET /languages, then a JSON list with the
    configured key (empty when none)."""
    codes = [x["code"] for x in httpx.get(url + "/languages").json()]
    assert {"en", "fr"} <= set(codes)
    r = httpx.post(url + "/translate", json={"api_key": "", "q": EN, "source": "en", "target": "fr"}, timeout=120)
    assert r.json() == {"translatedText": fr(models, EN)}


def php_curl(method: str, url: str, fields: dict) -> httpx.Response:
    """A request as PHP's curl sends one with ``CURLOPT_CUSTOMREQUEST => method`` and ``CURLOPT_POSTFIELDS =>
    fields`` (an array): a multipart/form-data body, one part per field and only the closing boundary for
    an empty array, whatever the method."""
    boundary = "------------------------5f2c8a1e9b3d4c70"
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in fields.items()]
    body = ("".join(parts) + f"--{boundary}--\r\n").encode()
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}", "Accept": "*/*"}
    return httpx.request(method, url, content=body, headers=headers, timeout=120)


def test_nextcloud(url, models):
    """Nextcloud's LibreTranslate app, integration_libretranslate 1.1.1 (v1r0x/integration_libretranslate,
    lib/LibretranslateProvider.php; the app Nextcloud All-in-One configures, nextcloud/all-in-one
    community-containers/libretranslate/readme.md), which talks to the server through the PHP library its
    composer.lock pins, jefs42/libretranslate v1.1.2 (src/LibreTranslate.php, commit dce7d90). Every request
    of that file's _doRequest, in the order the provider makes them, with no key configured (the library's
    api_key is then "", and sent):

    new LibreTranslate(host, port, from_lang, to_lang): POST / (a connection test, answer ignored),
    GET /frontend/settings, GET /languages (from_lang and to_lang must be listed codes, else it throws);
    the provider's own Languages(): GET /languages again; detectLanguage(text): Detect(text), a POST to
    /detect?q=...&api_key= (http_build_query) whose first answer's language is taken; translate(from, to,
    text): Translate(text, from, to), a multipart POST /translate with q, format "html", source, target
    and api_key, whose translatedText is taken."""
    r = php_curl("POST", url + "/", {})
    assert r.status_code in (200, 405)  # the library only checks that the server answered
    settings = php_curl("GET", url + "/frontend/settings", {})
    assert settings.status_code == 200 and settings.json()["language"]["source"]["code"] == "auto"
    for _ in range(2):
        codes = [x["code"] for x in php_curl("GET", url + "/languages", {}).json()]
        assert {"en", "fr"} <= set(codes)  # from_lang en, to_lang fr configured
    query = urllib.parse.urlencode({"q": DE, "api_key": ""})
    detected = php_curl("POST", f"{url}/detect?{query}", {}).json()
    assert detected[0]["language"] == "de"
    fields = {"q": EN[0], "format": "html", "source": "en", "target": "fr", "api_key": ""}
    r = php_curl("POST", url + "/translate", fields)
    assert r.status_code == 200, r.text
    assert r.json() == {"translatedText": translate_html_batch(models[1]["en-fr"], [EN[0]], "en")[0]}


def test_browser_extension_cors_and_pivot(url, models):
    """A browser extension's cross-origin fetch (the Fetch standard's CORS preflight for a JSON POST), and
    German through English: the answer names the route."""
    origin = {"Origin": "chrome-extension://abcdefgh"}
    pre = httpx.options(
        url + "/translate",
        headers={**origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"},
    )
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "*"
    r = httpx.post(url + "/translate", json={"q": DE, "source": "de", "target": "fr"}, headers=origin, timeout=120)
    assert r.headers["access-control-allow-origin"] == "*"
    english = split_text(models[1]["de-en"].translate([DE])[0], "en")
    french = reassemble(english, fr(models, sentences(english)))
    assert r.json() == {"translatedText": french, "route": ["de-en", "en-fr"]}
