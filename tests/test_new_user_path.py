"""The path a new user takes, end to end, through the command line and real HTTP: import a published MarianMT
model, fine-tune it on a few hundred pairs of their own, serve it next to a second (multilingual) model from a
models.toml, translate with curl (urllib where curl is missing) through the LibreTranslate API, and in a
browser through the page (skipped loudly without one, as tests/test_serve_page.py).

The published model is a random OPUS-MT-shaped MarianMT directory (tests/opus_models.py) whose vocabulary
is trained on the shipped Bible corpus; the user's pairs are 300 lines of that corpus. Every answer must
equal offline translation by the model that should have served it.
"""

import json
import shutil
import subprocess
import urllib.request

import pytest
import torch
from conftest import read_corpus, serve_subprocess
from opus_models import sentences, write_marianmt

pytest.importorskip("uvicorn", reason="server tests need uvicorn (the serve extra)")
pytest.importorskip("fastapi", reason="server tests need fastapi (the serve extra)")
pytest.importorskip("prometheus_client", reason="server tests need prometheus-client (the serve extra)")

from transduce.api import load  # noqa: E402
from transduce.cli import main  # noqa: E402
from transduce.data.vocab import Vocab  # noqa: E402
from transduce.modeldir import load_model_dir  # noqa: E402

pytestmark = pytest.mark.slow  # an import, a fine-tuning and a server process before the first request
QUERIES = ["In the beginning God created the heavens and the earth.", "And God said, Let there be light."]


def cli(*argv: str) -> None:
    assert main([str(a) for a in argv]) == 0, argv


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """The user's directory after import, prepare and fine-tune: (root, fine-tuned model, second model)."""
    root = tmp_path_factory.mktemp("user")
    en, fr = read_corpus("train", "en"), read_corpus("train", "fr")
    vocab = Vocab.train(en + fr, 400)
    write_marianmt(root / "opus-mt-en-fr", vocab, source_lang="en", target_lang="fr")  # "downloaded"
    cli("import", root / "opus-mt-en-fr", "--out", root / "models/en-fr")

    (root / "mine.en").write_text("\n".join(en[:300]) + "\n")  # a few hundred pairs of their own
    (root / "mine.fr").write_text("\n".join(fr[:300]) + "\n")
    (root / "dev.en").write_text("\n".join(read_corpus("valid", "en")[:40]) + "\n")
    (root / "dev.fr").write_text("\n".join(read_corpus("valid", "fr")[:40]) + "\n")
    cli(
        *("prepare", "files", "--src-file", root / "mine.en", "--tgt-file", root / "mine.fr"),
        *("--valid-src-file", root / "dev.en", "--valid-tgt-file", root / "dev.fr"),
        *("--src-lang", "en", "--tgt-lang", "fr", "--vocab-from", root / "models/en-fr", "--out", root / "data/mine"),
    )
    (root / "finetune.toml").write_text(
        f'[train]\ndata = "{root / "data/mine"}"\nout = "{root / "runs/mine"}"\ninit_from = "{root / "models/en-fr"}"\n'
        'schedule = "linear"\npeak_lr = 1e-3\nwarmup = 2\nmax_steps = 6\nmax_tokens = 1024\nthreads = 1\n'
        "validate_every = 100\nbleu_sentences = 0\nsave_every_steps = 100\ntensorboard = false\nlog_every = 2\n"
    )
    cli("train", root / "finetune.toml")
    tuned = root / "runs/mine/model"
    before, after = load_model_dir(root / "models/en-fr")[0].state_dict(), load_model_dir(tuned)[0].state_dict()
    assert not torch.equal(before["encoder.layers.0.ff.w1.weight"], after["encoder.layers.0.ff.w1.weight"])

    words = Vocab.train(sentences(300), 80)  # the second model: multilingual, en -> >>deu<< / >>fra<<
    write_marianmt(root / "opus-mt-en-mul", words, [">>deu<<", ">>fra<<"], source_lang="en", target_lang="mul")
    cli("import", root / "opus-mt-en-mul", "--out", root / "models/en-mul")
    (root / "models.toml").write_text(
        '[[model]]\npath = "runs/mine/model"\n\n[[model]]\npath = "models/en-mul"\nname = "en-mul"\n'
    )
    return root, tuned, root / "models/en-mul"


@pytest.fixture(scope="module")
def server(user):
    """``transduce serve --models models.toml`` in its own process on a free port; yields its URL."""
    with serve_subprocess(user[0], "--models", "models.toml") as url:
        yield url


def post(url: str, body: dict) -> dict:
    """POST ``body`` as JSON with curl, as the docs show it, or with urllib where curl is missing."""
    data = json.dumps(body)
    if shutil.which("curl"):
        done = subprocess.run(
            ["curl", "-s", "--max-time", "600", url, "-H", "Content-Type: application/json", "-d", data],
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(done.stdout)
    request = urllib.request.Request(url, data.encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.loads(r.read())


def test_fine_tuned_model_served_next_to_a_second_one(user, server):
    _, tuned, second = user
    languages = json.loads(urllib.request.urlopen(server + "/languages", timeout=30).read())
    assert {c["code"]: c["targets"] for c in languages}["en"] == ["de", "en", "fr", "fra"]
    mine = load(tuned)
    assert post(server + "/translate", {"q": QUERIES, "source": "en", "target": "fr"}) == {
        "translatedText": mine.translate(QUERIES)
    }
    assert post(server + "/translate", {"q": QUERIES[0], "source": "en", "target": "deu"}) == {
        "translatedText": load(second).translate(QUERIES[:1], target_lang="deu")[0]
    }
    answer = post(server + "/translate", {"q": QUERIES[0], "source": "en", "target": "es"})
    assert answer == {"error": "es is not supported"}


def test_fine_tuned_model_in_the_page(user, server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    _, tuned, second = user
    browser.get(server + "/")
    wait = WebDriverWait(browser, 120)
    wait.until(lambda d: len(Select(d.find_element(By.ID, "pair")).options) == 6)  # 3 pairs, 3 "Detect language"
    pairs = Select(browser.find_element(By.ID, "pair"))
    values = [o.get_attribute("value") for o in pairs.options]
    assert sorted(values) == ["auto|de", "auto|fr", "auto|fra", "en|de", "en|fr", "en|fra"]
    assert sorted(o.text for o in pairs.options if not o.get_attribute("value").startswith("auto|")) == [
        "English \u2192 French",
        "English \u2192 French (fra)",
        "English \u2192 German",
    ]
    for value, expected in (
        ("en|fr", load(tuned).translate(QUERIES)),
        ("en|de", load(second).translate(QUERIES, target_lang="deu")),
    ):
        pairs.select_by_value(value)
        source = browser.find_element(By.ID, "source")
        source.clear()
        source.send_keys("\n".join(QUERIES))
        browser.find_element(By.ID, "translate").click()  # the page says "translating…" until the answer
        wait.until(lambda d: not d.find_element(By.ID, "status").text.startswith("translating"))
        assert browser.find_element(By.ID, "status").text == ""
        assert browser.find_element(By.ID, "plain").get_attribute("textContent") == "\n".join(expected), value
