"""What the LibreTranslate API answers where a model would lose or mangle text: no sentence of a text lost to
an empty translation, text with nothing to translate kept as it is and never sent to the model.

Model: the trained ``tiny_translator`` (en->fr) behind :class:`Recorded`, which notes every sentence the server
sends it and answers chosen sentences with a chosen output (an empty one, as a model whose first token is
``</s>``).
"""

import argparse

import pytest

pytest.importorskip("fastapi", reason="server tests need fastapi (the serve extra)")

from fastapi.testclient import TestClient  # noqa: E402

from transduce.cli import main  # noqa: E402
from transduce.decode.search_options import SearchOptions
from transduce.serve.command import add_arguments, settings_from_args  # noqa: E402
from transduce.serve.server import create_app  # noqa: E402
from transduce.serve.service import Settings  # noqa: E402


class Recorded:
    """A translator that passes everything to ``real`` and notes the sentences translated; a sentence in
    ``forced`` gets that output (every hypothesis of it) instead of the model's."""

    def __init__(self, real, forced: dict[str, str] | None = None):
        self.real, self.forced, self.seen, self.searches = real, forced or {}, [], []

    def __getattr__(self, name):
        return getattr(self.real, name)

    def translate(self, sentences, search, **options):
        self.seen += sentences
        self.searches.append((search.beam, search.alpha))
        results = self.real.translate(sentences, search, **options)
        for sentence, result in zip(sentences, results):
            for hypothesis in result if isinstance(result, list) else [result]:
                hypothesis.text = self.forced.get(sentence, hypothesis.text)
        return results


def client(translator, **settings) -> TestClient:
    return TestClient(create_app(translator, Settings(**settings), name="tiny"))


def test_a_sentence_translated_to_nothing_comes_back_as_its_source(tiny_translator):
    """Rule: a sentence whose translation has no letter or digit (empty, or a lone mark) is answered with the
    source sentence, in the best translation and in every alternative; the other sentences are translated."""
    model = Recorded(tiny_translator, {"Yes.": "", "No.": "."})
    text = "Is it so? Yes. Really? No."
    first, third = (tiny_translator.translate([s])[0] for s in ("Is it so?", "Really?"))
    with client(model) as c:
        r = c.post("/translate", json={"q": text, "source": "en", "target": "fr", "alternatives": 1})
        assert r.status_code == 200, r.text
        assert r.json()["translatedText"] == f"{first} Yes. {third} No."
        (alternative,) = r.json()["alternatives"]
        assert " Yes. " in alternative and alternative.endswith(" No.")
    assert model.seen == ["Is it so?", "Yes.", "Really?", "No."]


def test_text_with_nothing_to_translate_is_kept_and_not_sent_to_the_model(tiny_translator):
    """Emoji, numbers, punctuation, a bare URL or e-mail address: no letter to translate (or an address), so
    the text comes back as sent and the model never sees it; in a text, only such sentences are kept."""
    model = Recorded(tiny_translator)
    kept = ["🙂👍", "12:30 – 14:00", "...!?", "https://example.org/a.html?b=1", "mail@example.org", "www.example.org"]
    with client(model) as c:
        r = c.post("/translate", json={"q": kept, "source": "en", "target": "fr"})
        assert r.status_code == 200 and r.json() == {"translatedText": kept}
        r = c.post("/translate", json={"q": "🙂", "source": "en", "target": "fr", "alternatives": 2})
        assert r.json() == {"translatedText": "🙂", "alternatives": []}
        assert model.seen == []
        r = c.post("/translate", json={"q": "A dog runs. 🙂 12. Two men talk.", "source": "en", "target": "fr"})
        dog, men = tiny_translator.translate(["A dog runs.", "Two men talk."])
        assert r.json() == {"translatedText": f"{dog} 🙂 12. {men}"}
    assert model.seen == ["A dog runs.", "Two men talk."]


def test_a_text_all_in_lower_or_upper_case_keeps_its_case(tiny_translator):
    """As LibreTranslate: the whole text's case (every cased letter lower, or every one upper) is its
    translation's, alternatives included; a text of mixed case is translated as the model writes it."""
    texts = ["a dog runs in the park. two men talk.", "A DOG RUNS IN THE PARK!", "A dog runs in the park."]
    with client(tiny_translator) as c:
        r = c.post("/translate", json={"q": texts, "source": "en", "target": "fr", "alternatives": 1})
        assert r.status_code == 200, r.text
        lower, upper, mixed = r.json()["translatedText"]
        assert lower == lower.lower() and lower != lower.upper()
        assert upper == upper.upper() and upper != upper.lower()
        assert mixed == tiny_translator.translate([texts[2]])[0] and mixed not in (mixed.lower(), mixed.upper())
        (low_alternative,), (up_alternative,), _ = r.json()["alternatives"]
        assert low_alternative == low_alternative.lower() and up_alternative == up_alternative.upper()


def test_a_text_into_its_own_language_comes_back_as_it_is(tiny_translator):
    """As LibreTranslate: every language lists itself among its targets, and a text asked into its own
    language (by any spelling of its code) is answered as sent, through no model; front ends are still
    offered a pair of two languages."""
    model = Recorded(tiny_translator)
    text = "A dog runs.  Two MEN talk!\n\nthird line"
    with client(model) as c:
        assert c.get("/languages").json() == [
            {"code": "en", "name": "English", "targets": ["en", "fr"]},
            {"code": "fr", "name": "French", "targets": ["fr"]},
        ]
        for source, target in (("en", "en"), ("eng", "en"), ("fr", "fr")):
            r = c.post("/translate", json={"q": [text, "🙂"], "source": source, "target": target, "alternatives": 1})
            assert r.status_code == 200 and r.json() == {"translatedText": [text, "🙂"], "alternatives": [[], []]}
        assert c.get("/frontend/settings").json()["language"]["target"] == {"code": "fr", "name": "French"}
    assert model.seen == []


def test_two_languages_no_route_joins_are_named_as_libretranslate_names_them(tiny_translator):
    with client(tiny_translator) as c:
        r = c.post("/translate", json={"q": "Un chien.", "source": "fr", "target": "en"})
        assert r.status_code == 400
        assert r.json() == {"error": "English (en) is not available as a target language from French (fr)"}


@pytest.mark.slow
def test_serve_alpha_and_a_requests_beam_reach_the_search(tiny_translator):
    """``--alpha`` is the length penalty of the LibreTranslate API (text and HTML) and of the page's
    /v1/attention; a request's ``beam`` field (default ``--beam``) is checked within ``--max-beam``."""
    model = Recorded(tiny_translator)
    text = "A dog runs in the park."
    with client(model, alpha=1.5, max_beam=8) as c:
        r = c.post("/translate", json={"q": text, "source": "en", "target": "fr"})
        assert r.json() == {
            "translatedText": tiny_translator.translate([text], search=SearchOptions(beam=4, alpha=1.5))[0]
        }
        r = c.post("/translate", data={"q": text, "source": "en", "target": "fr", "beam": "1"})
        assert r.json() == {
            "translatedText": tiny_translator.translate([text], search=SearchOptions(beam=1, alpha=1.5))[0]
        }
        r = c.post(
            "/translate", json={"q": f"<b>{text}</b>", "source": "en", "target": "fr", "format": "html", "beam": 2}
        )
        assert r.status_code == 200, r.text
        assert c.post("/v1/attention", json={"text": [text], "source": "en", "target": "fr"}).status_code == 200
        assert model.searches == [(4, 1.5), (1, 1.5), (2, 1.5), (4, 1.5)]
        for beam, error in ((9, "beam must be between 1 and 8, got 9"), (0, "beam must be between 1 and 8, got 0")):
            r = c.post("/translate", json={"q": text, "source": "en", "target": "fr", "beam": beam})
            assert r.status_code == 400 and r.json() == {"error": f"Invalid request: {error}"}
        r = c.post("/translate", json={"q": text, "source": "en", "target": "fr", "beam": "wide"})
        assert r.json() == {"error": "Invalid request: beam must be an integer, got 'wide'"}


def test_serve_alpha_option(capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert settings_from_args(parser.parse_args([])).alpha == 0.6  # the paper's
    assert settings_from_args(parser.parse_args(["--alpha", "0"])).alpha == 0.0  # no length penalty
    assert main(["serve", "--model", "unused", "--alpha", "11"]) == 2
    assert "--alpha must be between 0 and 10, got 11.0" in capsys.readouterr().err


def test_html_loses_no_sentence_and_keeps_what_has_nothing_to_translate(tiny_translator):
    """The same rules for ``format: html``: a sentence translated to nothing comes back as its source, inside
    its tags; a snippet or sentence with nothing to translate is kept and never sent to the model."""
    model = Recorded(tiny_translator, {"Yes.": ""})
    with client(model) as c:
        body = {"q": ["<p>Is it so? <b>Yes.</b> Really?</p>", "<p>🙂 <i>12:30</i></p>"], "format": "html"}
        r = c.post("/translate", json={**body, "source": "en", "target": "fr"})
        assert r.status_code == 200, r.text
        first, second = r.json()["translatedText"]
        assert "<b>Yes.</b>" in first and first.count("<b>") == 1
        assert second == "<p>🙂 <i>12:30</i></p>"
    assert model.seen == ["Is it so?", "Yes.", "Really?"]
