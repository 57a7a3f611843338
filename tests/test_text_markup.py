"""HTML translation: well-formed output, every tag exactly once, tags follow their words."""

from __future__ import annotations

import random
from collections import Counter
from html.parser import HTMLParser

import pytest

from transduce.decode.translator import Translation
from transduce.text.markup import parse, translate_html


class WordTranslator:
    """A stand-in model: maps each word through ``fn`` and optionally reverses the word order, with the
    exact word alignment, so where each tag must land is known."""

    meta = {"src_lang": "en"}

    def __init__(self, reverse: bool = False, fn=str.upper):
        self.reverse, self.fn = reverse, fn

    def translate(self, sentences, alignments=False, alignment_layer=None, **options):
        out = []
        for s in sentences:
            words = s.split()
            n = len(words)
            order = list(range(n))[::-1] if self.reverse else list(range(n))
            text = " ".join(self.fn(words[i]) for i in order)
            out.append(Translation(text, [], 0.0, 0.0, [(i, j) for j, i in enumerate(order)]))
        return out


class TagCounter(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.starts, self.ends, self.text = Counter(), Counter(), []

    def handle_starttag(self, tag, attrs):
        self.starts[self.get_starttag_text()] += 1

    handle_startendtag = handle_starttag

    def handle_endtag(self, tag):
        self.ends[tag] += 1

    def handle_data(self, data):
        self.text.append(data)


def tags(text: str) -> TagCounter:
    parse(text)  # raises on anything not well-formed (stray, mismatched or unclosed tags)
    c = TagCounter()
    c.feed(text)
    c.close()
    return c


INLINE = ["b", "i", "em", "strong", "span", "a"]
WORDS = ["the", "dog", "runs", "fast", "&amp;", "a", "cat", "sleeps", "&lt;3", "caf&eacute;", "big", "red"]


def random_snippet(rng: random.Random, depth: int = 0) -> str:
    parts = []
    for _ in range(rng.randint(1, 5)):
        r = rng.random()
        if r < 0.25 and depth < 3:
            tag = rng.choice(INLINE)
            attrs = (
                ' href="https://example.com/?a=1&amp;b=2" title="x y"'
                if tag == "a"
                else (' class="hl"' if rng.random() < 0.3 else "")
            )
            parts.append(f"<{tag}{attrs}>{random_snippet(rng, depth + 1)}</{tag}>")
        elif r < 0.3:
            parts.append(rng.choice(["<br>", "<br/>", '<img src="x.png" alt="a &amp; b"/>', "<!-- note -->"]))
        elif r < 0.35 and depth == 0:
            parts.append(f"<p>{random_snippet(rng, depth + 1)}</p>")
        elif r < 0.38:
            parts.append("<code>x &lt; y</code>")
        else:
            parts.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4))) + rng.choice([" ", ". ", ""]))
    return "".join(parts)


@pytest.mark.parametrize("seed", range(300))
@pytest.mark.parametrize("reverse", [False, True])
def test_random_snippets_stay_well_formed_with_every_tag_once(seed, reverse):
    snippet = random_snippet(random.Random(seed))
    out = translate_html(WordTranslator(reverse), snippet)
    before, after = tags(snippet), tags(out)
    assert after.starts == before.starts  # each start tag exactly once, attributes byte-identical
    assert after.ends == before.ends
    assert _letters(after) == _letters(before)  # no text lost or doubled


def _letters(c: TagCounter) -> Counter:
    return Counter("".join("".join(c.text).upper().split()))


def test_identity_translation_gives_the_input_back():
    snippet = (
        '<p>A <b>big</b> dog <a href="/x?a=1&amp;b=2">runs <i>very</i> fast</a>.</p>\n'
        '<p>Tom &amp; Jerry<br>sleep<img src="a.png"/> here.</p>'
    )
    assert translate_html(WordTranslator(fn=str), snippet) == snippet


def test_tags_follow_their_words_when_the_order_changes():
    out = translate_html(WordTranslator(reverse=True), 'the <b>red</b> <a href="/c">cat</a> sleeps')
    assert out == 'SLEEPS <a href="/c">CAT</a> <b>RED</b> THE'


def test_nested_tags_stay_nested_after_reordering():
    out = translate_html(WordTranslator(reverse=True), "<b>one <i>two</i></b> three")
    assert out == "THREE <b><i>TWO</i> ONE</b>"


def test_entities_are_decoded_for_the_model_and_escaped_again():
    seen = []

    class Recording(WordTranslator):
        def translate(self, sentences, **kw):
            seen.extend(sentences)
            return super().translate(sentences, **kw)

    out = translate_html(Recording(fn=str), "Fish &amp; chips &lt;b&gt; caf&eacute;")
    assert seen == ["Fish & chips <b> café"]
    assert out == "Fish &amp; chips &lt;b&gt; café"


def test_untranslatable_elements_are_kept_verbatim():
    snippet = '<p>Run <code>x &lt; y</code> now.</p><div translate="no">keep me</div><script>if (a<b) {}</script>'
    out = translate_html(WordTranslator(), snippet)
    assert "<code>x &lt; y</code>" in out and '<div translate="no">keep me</div>' in out
    assert "<script>if (a<b) {}</script>" in out and "RUN" in out and "NOW." in out


@pytest.mark.parametrize(
    "bad, where",
    [
        ("<b>open", "<b> is never closed"),
        ("a</i>", "</i> without a start tag"),
        ("<b><i>x</b></i>", "</b> does not close <i>"),
    ],
)
def test_malformed_markup_is_an_error_naming_the_tag(bad, where):
    with pytest.raises(ValueError, match=where):
        translate_html(WordTranslator(), bad)
