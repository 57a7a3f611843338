"""Serving straight through: HTML goes through the model's batcher sentence by sentence, like text (its
sentences counted, checked and batched), and the page's attention job does not load a plotting library."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="server tests need fastapi (the serve extra)")

from fastapi.testclient import TestClient  # noqa: E402

from transduce.serve.server import create_app  # noqa: E402
from transduce.serve.service import Settings  # noqa: E402
from transduce.text.markup import translate_html_batch  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src"
SNIPPETS = ["<p>A man rides a <b>red</b> bike. Two men talk.</p>", "<ul><li>A dog runs.</li></ul>"]


def metric(text: str, name: str) -> float:
    return float(dict(line.rsplit(" ", 1) for line in text.splitlines() if line and line[0] != "#")[name])


def test_html_sentences_go_through_the_batcher_like_text(translator):
    with TestClient(create_app(translator, Settings(max_chars=40), name="en-fr")) as c:
        r = c.post("/translate", json={"q": SNIPPETS, "source": "en", "target": "fr", "format": "html"})
        assert r.status_code == 200, r.text  # the first snippet is longer than --max-chars, its sentences are not
        assert r.json()["translatedText"] == translate_html_batch(translator, SNIPPETS, "en")
        text = c.get("/metrics").text
        assert metric(text, 'transduce_sentences_total{pair="en-fr"}') == 3  # sentences, not snippets
        assert metric(text, "transduce_batch_requests_count") == 1  # one job for the request's sentences
        long = "<p>" + "A man rides a red bike on a long road in the city" + "</p>"
        r = c.post("/translate", json={"q": long, "source": "en", "target": "fr", "format": "html"})
        assert r.status_code == 413 and r.json()["error"].endswith("49 characters exceed the limit of 40")


@pytest.mark.slow
def test_the_attention_job_loads_no_plotting_library(tiny_model_dir):
    script = f"""
import sys
from fastapi.testclient import TestClient
from transduce.api import load
from transduce.serve.server import create_app
with TestClient(create_app(load({str(tiny_model_dir)!r}))) as c:
    r = c.post("/v1/attention", json={{"text": ["A dog runs.", ""]}})
    assert r.status_code == 200, r.text
    first, empty = r.json()["alignments"]
    assert first["source_words"] == ["A", "dog", "runs."] and empty["source_words"] == []
print("matplotlib" in sys.modules)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], env={"PYTHONPATH": str(SRC), "PATH": ""}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
