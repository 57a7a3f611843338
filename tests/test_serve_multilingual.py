"""A multilingual model (``>>xx<<`` target-language tokens, as imported multilingual OPUS-MT models have)
behind the server: every target it has is a pair in /languages, requests for ``target=xx`` decode with
``>>xx<<`` exactly as ``transduce translate --target-lang xx``, and a pair two models could serve goes
to a one-language model first, then to the model listed first.

The models are random (tests/opus_models.py): junk output, but deterministic and different per target
and per model, so a request decoded with the wrong token or by the wrong model is caught.
"""

import pytest
import torch

httpx = pytest.importorskip("httpx", reason="server tests need httpx")
pytest.importorskip("uvicorn", reason="server tests need uvicorn (the serve extra)")
pytest.importorskip("fastapi", reason="server tests need fastapi (the serve extra)")
pytest.importorskip("prometheus_client", reason="server tests need prometheus-client (the serve extra)")

from fastapi.testclient import TestClient  # noqa: E402
from opus_models import sentences, write_marianmt  # noqa: E402

from transduce.api import load  # noqa: E402
from transduce.cli import main  # noqa: E402
from transduce.config import ConfigError  # noqa: E402
from transduce.data.vocab import Vocab, Vocabs  # noqa: E402
from transduce.decode.search_options import SearchOptions  # noqa: E402
from transduce.model import ModelConfig, Transformer  # noqa: E402
from transduce.modeldir import save_model_dir  # noqa: E402
from transduce.serve.registry import read_models, routes  # noqa: E402
from transduce.serve.server import create_app  # noqa: E402
from transduce.text.markup import translate_html  # noqa: E402

LANGS = [">>deu<<", ">>fra<<"]
TEXTS = sentences(4, seed=11)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{name: model directory}: two multilingual en -> deu/fra models (imported), one bilingual en -> fr."""
    root = tmp_path_factory.mktemp("multilingual")
    vocab = Vocab.train(sentences(300), 80)
    out = {}
    for name, seed in (("en-mul", 0), ("en-mul-b", 1)):
        write_marianmt(root / f"{name}-hf", vocab, LANGS, seed=seed, source_lang="en", target_lang="mul")
        assert main(["import", str(root / f"{name}-hf"), "--out", str(root / name)]) == 0
        out[name] = root / name
    plain = Vocab.train(sentences(300, seed=1), 60)  # no >>xx<< tokens: a one-language model
    torch.manual_seed(3)
    model = Transformer(ModelConfig.preset("tiny", vocab_size=len(plain), max_positions=64)).eval()
    out["en-fr"] = save_model_dir(root / "en-fr", model, Vocabs(plain, plain), {"src_lang": "en", "tgt_lang": "fr"})
    return out


def toml(path, entries: list[str]):
    path.write_text("\n".join(f"[[model]]\n{e}\n" for e in entries))
    return path


@pytest.mark.slow
def test_every_target_is_served_as_offline(models, tmp_path, capsys):
    specs = read_models(toml(tmp_path / "models.toml", [f'path = "{models["en-mul"]}"', f'path = "{models["en-fr"]}"']))
    assert [(s.name, s.target, s.languages) for s in specs] == [("en-mul", "mul", ("deu", "fra")), ("en-fr", "fr", ())]
    offline = load(models["en-mul"])
    with TestClient(create_app(specs=specs, load=lambda spec: load(spec.path))) as c:
        # two-letter codes that clients match (Mastodon: ``include?("fr")``); "fr" is the en-fr model's,
        # so >>fra<< keeps its own code
        assert c.get("/languages").json() == [
            {"code": "de", "name": "German", "targets": ["de"]},
            {"code": "en", "name": "English", "targets": ["de", "en", "fr", "fra"]},
            {"code": "fr", "name": "French", "targets": ["fr"]},
            {"code": "fra", "name": "French (fra)", "targets": ["fra"]},
        ]
        got = {}
        for target in ("deu", "fra"):
            expected = offline.translate(TEXTS, target_lang=target)
            r = c.post("/translate", json={"q": TEXTS, "source": "en", "target": target})
            assert r.status_code == 200 and r.json() == {"translatedText": expected}, target
            r = c.post("/v1/translate", json={"text": TEXTS[:2], "source": "en", "target": target, "beam": 2})
            assert r.json() == {
                "translations": offline.translate(TEXTS[:2], search=SearchOptions(beam=2), target_lang=target)
            }
            r = c.post("/v1/attention", json={"text": TEXTS[:1], "source": "en", "target": target})
            alignment = r.json()["alignments"][0]
            assert alignment["translation"] == expected[0]
            assert alignment["source_words"] == [f">>{target}<<"] + TEXTS[0].split()  # what the model attended to
            got[target] = expected
        assert got["deu"] != got["fra"]  # the token was used: the two targets differ
        r = c.post("/translate", json={"q": TEXTS[0], "source": "en", "target": "fr"})
        assert r.json() == {"translatedText": load(models["en-fr"]).translate(TEXTS[:1])[0]}
        html = f"<p>{TEXTS[0]} <b>{TEXTS[1]}</b></p>"
        r = c.post("/translate", json={"q": html, "source": "en", "target": "fra", "format": "html"})
        assert r.json() == {"translatedText": translate_html(offline, html, target_lang="fra")}
        # a LibreTranslate client's two-letter codes (and three-letter ones) reach the model by standard form;
        # a pair served as written stays first: "fr" is the one-language en-fr model, not >>fra<<
        r = c.post("/translate", json={"q": TEXTS, "source": "eng", "target": "de"})
        assert r.json() == {"translatedText": got["deu"]}
        r = c.post("/v1/translate", json={"text": TEXTS[:2], "source": "en", "target": "de", "beam": 2})
        assert r.json() == {
            "translations": offline.translate(TEXTS[:2], search=SearchOptions(beam=2), target_lang="deu")
        }
        r = c.post("/translate", json={"q": "the dog", "source": "en", "target": "spa"})
        assert r.status_code == 400
        assert r.json() == {"error": "spa is not supported"}
        models_info = {m["name"]: m["targets"] for m in c.get("/v1/models").json()}
        assert models_info == {"en-mul": ["deu", "fra"], "en-fr": []}
    src = tmp_path / "in.en"
    src.write_text("\n".join(TEXTS) + "\n")
    capsys.readouterr()
    assert main(["translate", "--model", str(models["en-mul"]), "--target-lang", "deu", str(src)]) == 0
    assert capsys.readouterr().out.splitlines() == got["deu"]  # the server answered what the CLI writes


def test_one_language_models_first_then_the_order_listed(models, tmp_path):
    path = toml(
        tmp_path / "models.toml",
        [
            f'path = "{models["en-mul-b"]}"\ntarget = "deu"\nname = "b-deu"',
            f'path = "{models["en-mul"]}"',
            f'path = "{models["en-fr"]}"\ntarget = "fra"',
        ],
    )
    specs = read_models(path)
    assert [s.languages for s in specs] == [("deu",), ("deu", "fra"), ()]
    chosen = {pair: spec.name for pair, spec in routes(specs).items()}
    assert chosen == {("en", "fra"): "en-fr", ("en", "deu"): "b-deu"}  # one-language first; then listed first
    specs.reverse()
    assert {pair: spec.name for pair, spec in routes(specs).items()} == {
        ("en", "fra"): "en-fr",
        ("en", "deu"): "en-mul",
    }
    toml(path, [f'path = "{models["en-mul"]}"\ntarget = "spa"'])
    with pytest.raises(ConfigError, match=r"#1: target 'spa': .* has no >>spa<< token \(it has: deu, fra\)"):
        read_models(path)


def test_one_multilingual_model_asks_for_a_target(models):
    translator = load(models["en-mul"])
    with TestClient(create_app(translator, name="en-mul")) as c:
        r = c.post("/v1/translate", json={"text": TEXTS[:1]})
        assert (
            r.status_code == 400 and "translates into several languages (deu, fra): name 'target'" in r.json()["detail"]
        )
        r = c.post("/v1/translate", json={"text": TEXTS[:1], "source": "en", "target": "fra"})
        assert r.json() == {"translations": translator.translate(TEXTS[:1], target_lang="fra")}


def test_alignments_skip_the_language_token(models):
    """Source word i of an alignment is the sentence's word i, not shifted by the >>xx<< token before it."""
    translator = load(models["en-mul"])
    (result,) = translator.translate(TEXTS[:1], search=SearchOptions(beam=1), target_lang="deu", alignments="cover")
    assert {i for i, _ in result.alignment} == set(range(len(TEXTS[0].split())))  # every word, none beyond


def test_codes_match_by_standard_form_and_pairs_as_written_win():
    from transduce.serve.registry import aliases, language_key

    assert [language_key(c) for c in ("fra", "fr", "deu", "zho_Hans", "pt_BR", "mul", "xx-!")] == [
        "fr",
        "fr",
        "de",
        "zh-hans",
        "pt-br",
        "mul",
        "xx-!",
    ]
    served = {("en", "fr"): "en-fr", ("en", "fra"): "en-mul", ("en", "deu"): "en-mul"}
    assert aliases(served) == {("en", "fr"): ("en", "fr"), ("en", "de"): ("en", "deu")}
