"""OPUS-MT's native Marian release (.npz, *.vocab.yml, decoder.yml, SentencePiece models), multilingual
``>>xx<<`` target languages, and ``transduce import`` by directory, .zip, URL and hub name (all local).

A small random model is written in both OPUS-MT formats from the same weights: the MarianMT directory
(whose import tests/test_interop.py checks against transformers) and the native release. Both imports
must give the same transduce model, and so the same logits and translations.
"""

import json
import shutil
import zipfile

import numpy as np
import pytest
import torch
from opus_models import sentences, write_marianmt

from transduce.api import load
from transduce.cli import main
from transduce.config import ConfigError
from transduce.data.vocab import Vocab
from transduce.interop.import_marian import import_model
from transduce.interop.marian_native import CONFIG_KEY, LAYER_NAMES
from transduce.model import ModelConfig, Transformer
from transduce.modeldir import load_model_dir
from transduce.safefiles import BadFileError

LANGS = [">>deu<<", ">>fra<<"]
D_MODEL, D_FF = 32, 48


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """(MarianMT directory, native release directory, Marian vocabulary order) of one random model."""
    root = tmp_path_factory.mktemp("opus")
    vocab = Vocab.train(sentences(300), 80)
    hf_dir = root / "hf"
    hf, order, cfg = write_marianmt(hf_dir, vocab, LANGS, D_MODEL, D_FF)
    V, table = len(order), hf["model.shared.weight"]

    native = root / "native"
    native.mkdir()
    arrays = {}
    for side, depth in (("encoder", cfg.encoder_layers), ("decoder", cfg.decoder_layers)):
        for layer in range(depth):
            for suffix, name in LAYER_NAMES.items():
                key = f"model.{side}.layers.{layer}.{name}"
                if key in hf:
                    t = hf[key].numpy()
                    arrays[f"{side}_l{layer + 1}_{suffix}"] = (
                        t.T if t.ndim == 2 and "layer_norm" not in name else t.reshape(1, -1)
                    )  # Marian: x·W with W (in, out); vectors (1, n)
    arrays["Wemb"] = table[: V - 1].numpy()  # Marian has no <pad> row
    arrays["decoder_ff_logit_out_b"] = np.zeros((1, V - 1), np.float32)
    model_yml = (
        f"type: transformer\ndim-emb: {D_MODEL}\nenc-depth: {cfg.encoder_layers}\ndec-depth: "
        f"{cfg.decoder_layers}\ntransformer-heads: 4\ntransformer-dim-ffn: {D_FF}\n"
        'transformer-ffn-activation: relu\ntransformer-preprocess: ""\ntransformer-postprocess: dan\n'
        "transformer-postprocess-emb: d\ntied-embeddings-all: true\nright-left: false\n"
        f"dim-vocabs:\n  - {V - 1}\n  - {V - 1}\n"
    )
    arrays[CONFIG_KEY] = np.frombuffer(model_yml.encode() + b"\x00", dtype=np.int8)
    np.savez(native / "opus.spm80-spm80.transformer.model1.npz.best-perplexity.npz", **arrays)
    vocab_yml = "".join(f"{json.dumps(p)}: {i}\n" for i, p in enumerate(order[:-1]))
    (native / "opus.spm80-spm80.vocab.yml").write_text(vocab_yml)
    (native / "decoder.yml").write_text(
        "models:\n  - /home/opus/work/opus.spm80-spm80.transformer.model1.npz.best-perplexity.npz\n"
        "vocabs:\n  - opus.spm80-spm80.vocab.yml\n  - opus.spm80-spm80.vocab.yml\nbeam-size: 6\n"
    )
    vocab.save(native / "source.spm")
    vocab.save(native / "target.spm")
    return hf_dir, native, order


def test_native_and_marianmt_imports_are_the_same_model(release, tmp_path):
    hf_dir, native, order = release
    npz = np.load(next(native.glob("*.npz")), allow_pickle=False)
    assert npz["encoder_l1_ffn_W1"].shape == (D_MODEL, D_FF)  # Marian's (in, out) layout really is transposed
    a, va, meta_a = import_model(hf_dir)
    b, vb, meta_b = import_model(native)
    assert (meta_a["import_format"], meta_b["import_format"]) == ("marianmt", "marian-npz")
    assert a.config == b.config and a.config.vocab_size == len(order) + 1  # + our <s>
    assert va.src.proto == vb.src.proto and va.tgt.proto == vb.tgt.proto
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert meta_b["target_langs"] == ["deu", "fra"]

    src = torch.tensor([va.src.encode(s) + [3] for s in sentences(3, seed=5)[:1]])
    tgt = torch.tensor([[2] + va.tgt.encode("the red house")])
    with torch.no_grad():
        assert torch.equal(a(src, tgt), b(src, tgt))
    assert main(["import", str(hf_dir), "--out", str(tmp_path / "from-hf")]) == 0
    assert main(["import", str(native), "--out", str(tmp_path / "from-npz")]) == 0
    lines = sentences(12, seed=7)
    outs = [load(tmp_path / d).translate(lines, beam=2, target_lang="deu") for d in ("from-hf", "from-npz")]
    assert outs[0] == outs[1]


def test_target_language_token_leads_the_source(release, tmp_path, capsys):
    _, native, _ = release
    assert main(["import", str(native), "--out", str(tmp_path / "m")]) == 0
    assert "--target-lang" in capsys.readouterr().out
    translator = load(tmp_path / "m")
    langs = translator.target_languages
    assert sorted(langs) == ["deu", "fra"] and translator.vocabs.src.sp.id_to_piece(langs["deu"]) == ">>deu<<"
    plain = translator.encode_sources(["the dog runs"])[0]
    assert translator.encode_sources(["the dog runs"], target_lang="fra")[0] == [langs["fra"]] + plain
    deu = translator.translate(sentences(10, 3), beam=1, target_lang="deu", return_scores=True)
    fra = translator.translate(sentences(10, 3), beam=1, target_lang="fra", return_scores=True)
    assert [t.score for t in deu] != [t.score for t in fra]  # the token changes what the model computes
    with pytest.raises(ValueError, match="target language 'spa': this model knows deu, fra"):
        translator.translate(["the dog"], target_lang="spa")
    src = tmp_path / "in.txt"
    src.write_text("the dog runs\nthe cat sleeps\n")
    assert main(["translate", "--model", str(tmp_path / "m"), "--beam", "1", "--target-lang", "fra", str(src)]) == 0
    assert capsys.readouterr().out.splitlines() == translator.translate(
        src.read_text().splitlines(), beam=1, target_lang="fra"
    )
    assert main(["translate", "--model", str(tmp_path / "m"), "--target-lang", "xx", str(src)]) == 2
    assert "target language 'xx'" in capsys.readouterr().err


def test_a_model_without_language_tokens_refuses_target_lang():
    vocab = Vocab.train(sentences(200), 60)
    model = Transformer(ModelConfig.preset("tiny", vocab_size=len(vocab), max_positions=32))
    from transduce.api import Translator
    from transduce.data.vocab import Vocabs

    with pytest.raises(ValueError, match="no >>xx<< target-language tokens"):
        Translator(model, Vocabs(vocab, vocab)).translate(["the dog"], target_lang="deu")


def test_bad_native_releases_are_named(release, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where an executed "touch PWNED" would leave its file
    _, native, _ = release
    npz = next(native.glob("*.npz")).name

    def broken(edit):
        d = tmp_path / f"bad{len(list(tmp_path.iterdir()))}"
        shutil.copytree(native, d)
        edit(d)
        return d

    def objects(d):
        np.savez(d / npz, Wemb=np.array([{"x": 1}], dtype=object))

    with pytest.raises(BadFileError, match=f"{npz}: holds pickled Python objects"):
        import_model(broken(objects))
    with pytest.raises(BadFileError, match=f"{npz}: truncated or corrupted"):
        import_model(broken(lambda d: (d / npz).write_bytes((d / npz).read_bytes()[:3000])))

    def rename(d):
        arrays = dict(np.load(d / npz))
        arrays["encoder_l1_self_Wz"] = arrays.pop("encoder_l1_self_Wq")
        np.savez(d / npz, **arrays)

    with pytest.raises(ConfigError, match=f"{npz}: missing tensor 'encoder_l1_self_Wq'"):
        import_model(broken(rename))

    def prenorm(d):
        arrays = dict(np.load(d / npz))
        text = arrays[CONFIG_KEY].tobytes().decode().replace('transformer-preprocess: ""', "transformer-preprocess: n")
        arrays[CONFIG_KEY] = np.frombuffer(text.encode(), dtype=np.int8)
        np.savez(d / npz, **arrays)

    with pytest.raises(ConfigError, match="'transformer-preprocess' is 'n'"):
        import_model(broken(prenorm))
    with pytest.raises(FileNotFoundError, match="vocab.yml: missing"):
        import_model(broken(lambda d: (d / "opus.spm80-spm80.vocab.yml").unlink()))
    with pytest.raises(ConfigError, match="vocab.yml: not valid YAML"):
        import_model(broken(lambda d: (d / "opus.spm80-spm80.vocab.yml").write_text("a: [1\n")))
    with pytest.raises(ConfigError, match="vocab.yml: expected a YAML mapping"):
        import_model(broken(lambda d: (d / "opus.spm80-spm80.vocab.yml").write_text("- a\n- b\n")))
    code = "models: !!python/object/apply:os.system ['touch PWNED']\n"
    with pytest.raises(ConfigError, match="decoder.yml: not valid YAML"):
        import_model(broken(lambda d: (d / "decoder.yml").write_text(code)))
    assert not (tmp_path / "PWNED").exists()


def test_import_by_zip_url_and_hub_name_without_network(release, tmp_path, monkeypatch, capsys):
    hf_dir, native, _ = release
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    expected = import_model(native)[0].state_dict()
    archive = tmp_path / "opus-2020-02-26.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for p in native.iterdir():
            z.write(p, p.name)
    cache = tmp_path / "cache"
    for source in (str(archive), archive.as_uri()):
        assert main(["import", source, "--cache-dir", str(cache), "--out", str(tmp_path / "m")]) == 0
        got, _, meta = load_model_dir(tmp_path / "m")
        assert all(torch.equal(got.state_dict()[k], v) for k, v in expected.items())
    assert (cache / "downloads" / archive.name).is_file()

    # a hub cache as huggingface_hub lays it out; offline, snapshot_download resolves it
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "hub" / "models--Helsinki-NLP--opus-mt-xx-yy"
    shutil.copytree(hf_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for name in ("Helsinki-NLP/opus-mt-xx-yy", "opus-mt-xx-yy"):
        assert main(["import", name, "--cache-dir", str(cache), "--out", str(tmp_path / "h")]) == 0
        hub_model, _, meta = load_model_dir(tmp_path / "h")
        assert meta["imported_from"] == name
        assert all(torch.equal(hub_model.state_dict()[k], v) for k, v in expected.items())
    capsys.readouterr()
    assert main(["import", "Helsinki-NLP/opus-mt-zz-qq", "--cache-dir", str(cache), "--out", str(tmp_path / "q")]) == 2
    err = capsys.readouterr().err
    assert "opus-mt-zz-qq" in err and err.count("\n") == 1

    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("../../escaped.txt", "x")
    with pytest.raises(ValueError, match="outside its directory"):
        import_model(evil, cache)
    assert not (tmp_path / "escaped.txt").exists()
