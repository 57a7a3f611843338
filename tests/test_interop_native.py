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
from transduce.decode.search_options import SearchOptions
from transduce.interop import marian
from transduce.interop.import_marian import import_model
from transduce.interop.marian_native import CONFIG_KEY, LAYER_NAMES
from transduce.model import ModelConfig, Transformer
from transduce.modeldir import load_model_dir
from transduce.safefiles import BadFileError

LANGS = [">>deu<<", ">>fra<<"]
D_MODEL, D_FF = 32, 48


def write_release(root, activation: str = "relu", logit_bias: float = 0.0):
    """(MarianMT directory, native release directory, Marian vocabulary order) of one random model under
    ``root``: feed-forward ``activation``, and an output bias drawn with standard deviation ``logit_bias``
    (0: all zeros, as models without one)."""
    vocab = Vocab.train(sentences(300), 80)
    hf_dir = root / "hf"
    hf, order, cfg = write_marianmt(hf_dir, vocab, LANGS, D_MODEL, D_FF, activation=activation, logit_bias=logit_bias)
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
    arrays["decoder_ff_logit_out_b"] = hf["final_logits_bias"][:, : V - 1].numpy()
    model_yml = (
        f"type: transformer\ndim-emb: {D_MODEL}\nenc-depth: {cfg.encoder_layers}\ndec-depth: "
        f"{cfg.decoder_layers}\ntransformer-heads: 4\ntransformer-dim-ffn: {D_FF}\n"
        f'transformer-ffn-activation: {activation}\ntransformer-preprocess: ""\ntransformer-postprocess: dan\n'
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


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """A random OPUS-MT model of the paper's kind (ReLU, no output bias) in both formats."""
    return write_release(tmp_path_factory.mktemp("opus"))


@pytest.mark.slow
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
    outs = [
        load(tmp_path / d).translate(lines, search=SearchOptions(beam=2), target_lang="deu")
        for d in ("from-hf", "from-npz")
    ]
    assert outs[0] == outs[1]


@pytest.mark.slow
def test_target_language_token_leads_the_source(release, tmp_path, capsys):
    _, native, _ = release
    assert main(["import", str(native), "--out", str(tmp_path / "m")]) == 0
    assert "--target-lang" in capsys.readouterr().out
    translator = load(tmp_path / "m")
    langs = translator.target_languages
    assert sorted(langs) == ["deu", "fra"] and translator.vocabs.src.sp.id_to_piece(langs["deu"]) == ">>deu<<"
    plain = translator.encode_sources(["the dog runs"])[0]
    assert translator.encode_sources(["the dog runs"], target_lang="fra")[0] == [langs["fra"]] + plain
    deu = translator.translate(sentences(10, 3), search=SearchOptions(beam=1), target_lang="deu", return_scores=True)
    fra = translator.translate(sentences(10, 3), search=SearchOptions(beam=1), target_lang="fra", return_scores=True)
    assert [t.score for t in deu] != [t.score for t in fra]  # the token changes what the model computes
    with pytest.raises(ValueError, match="target language 'spa': this model knows deu, fra"):
        translator.translate(["the dog"], target_lang="spa")
    src = tmp_path / "in.txt"
    src.write_text("the dog runs\nthe cat sleeps\n")
    assert main(["translate", "--model", str(tmp_path / "m"), "--beam", "1", "--target-lang", "fra", str(src)]) == 0
    assert capsys.readouterr().out.splitlines() == translator.translate(
        src.read_text().splitlines(), search=SearchOptions(beam=1), target_lang="fra"
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
        assert main(["import", source, "--cache-dir", str(cache), "--out", str(tmp_path / "m"), "--force"]) == 0
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
        assert main(["import", name, "--cache-dir", str(cache), "--out", str(tmp_path / "h"), "--force"]) == 0
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


def test_import_refuses_an_out_that_holds_something_before_reading_the_source(tmp_path, capsys):
    """A model directory is replaced only with --force; a folder holding anything else never is. The check comes
    before the source is read (here it does not exist, so passing the check gives the source's error)."""
    held = tmp_path / "model"
    held.mkdir()
    (held / "config.toml").write_text("[model]\n")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "keep.txt").write_text("mine")
    (tmp_path / "empty").mkdir()
    missing = str(tmp_path / "no-such-release")
    for out, force, message in [
        (held, [], "already holds a model; give --force"),
        (notes, ["--force"], "exists and is not a model directory"),
        (notes / "keep.txt", ["--force"], "exists and is not a model directory"),
        (held, ["--force"], "no-such-release: no such directory"),
        (tmp_path / "empty", [], "no-such-release: no such directory"),
    ]:
        capsys.readouterr()
        assert main(["import", missing, "--out", str(out), *force]) == 2
        assert message in capsys.readouterr().err, (out, force)
    assert (notes / "keep.txt").read_text() == "mine" and (held / "config.toml").read_text() == "[model]\n"


@pytest.fixture(scope="module")
def biased_release(tmp_path_factory):
    """The same kind of model with Swish feed-forwards and a non-zero output bias, as many OPUS-MT models have."""
    return write_release(tmp_path_factory.mktemp("opus-swish"), activation="swish", logit_bias=1.0)


def _padded(rows: list[list[int]]) -> torch.Tensor:
    width = max(map(len, rows))
    return torch.tensor([r + [0] * (width - len(r)) for r in rows])  # (B, width), our pad 0


def _pairs(vocabs, n: int = 4) -> tuple[list[list[int]], list[list[int]]]:
    """Sources (``>>deu<<``, pieces, eos) and decoder inputs (bos, pieces) in our ids."""
    deu = vocabs.src.sp.piece_to_id(">>deu<<")
    src = [[deu] + vocabs.src.encode(s) + [3] for s in sentences(n, seed=11)]
    return src, [[2] + vocabs.tgt.encode(s) for s in sentences(n, seed=12)]


def test_output_bias_and_swish_import_from_both_formats_as_marianmt_computes_them(biased_release):
    """Both formats give one model with ``output_bias`` and ``activation="swish"``, whose logits are those of
    transformers' own MarianMTModel on the MarianMT directory (an implementation independent of ours). The same
    model without its bias, or with ReLU, is far from them: the comparison sees both parts."""
    transformers = pytest.importorskip("transformers", reason="the reference forward is transformers' MarianMTModel")
    marian.offline()
    hf_dir, native, order = biased_release
    a, vocabs, _ = import_model(hf_dir)
    b, _, _ = import_model(native)
    assert a.config == b.config and a.config.output_bias and a.config.activation == "swish"
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)

    V = len(order)
    marian_id = torch.tensor([V - 1 if i == 2 else order.index(vocabs.src.sp.id_to_piece(i)) for i in range(V + 1)])
    src, tgt = _pairs(vocabs)
    hf_model = transformers.MarianMTModel.from_pretrained(hf_dir).eval()
    assert hf_model.config.activation_function == "swish" and hf_model.final_logits_bias.abs().max() > 0.5
    relu = Transformer(ModelConfig(**{**a.config.to_dict(), "activation": "relu"})).eval()
    relu.load_state_dict(a.state_dict())
    no_bias = Transformer(ModelConfig(**{**a.config.to_dict(), "output_bias": False})).eval()
    no_bias.load_state_dict({k: v for k, v in a.state_dict().items() if k != "generator.bias"})
    with torch.no_grad():
        theirs = hf_model(
            input_ids=marian_id[_padded(src)],
            attention_mask=(_padded(src) != 0).long(),
            decoder_input_ids=marian_id[_padded(tgt)],
        ).logits  # (B, T, V)
        got = {m: model(_padded(src), _padded(tgt)) for m, model in (("ours", a), ("relu", relu), ("none", no_bias))}
    for name, logits in got.items():  # (B, T, V + 1); our <s> column is Marian's start (pad) column
        error = max((logits[i, : len(t)] - theirs[i, : len(t)][:, marian_id]).abs().max() for i, t in enumerate(tgt))
        assert error < 1e-4 if name == "ours" else error > 0.05, (name, error)


@pytest.mark.slow
def test_output_bias_and_swish_translate_alike_on_every_backend_and_survive_exports(biased_release, tmp_path):
    """The imported model in a model directory: the C++ steps translate it as the Python steps do (fp32's loop
    step within rounding); exported to
    MarianMT and CTranslate2 it keeps its bias and activation, and CTranslate2 translates and scores as it."""
    hf_dir, _, _ = biased_release
    assert main(["import", str(hf_dir), "--out", str(tmp_path / "m")]) == 0
    model, vocabs, _ = load_model_dir(tmp_path / "m")
    imported = import_model(hf_dir)[0].state_dict()
    assert model.config.output_bias and model.config.activation == "swish"
    assert all(torch.equal(model.state_dict()[k], v) for k, v in imported.items())

    lines = sentences(12, seed=21)
    out = {}
    for name in ("fp32", "fp32-native", "bf16", "bf16-native"):  # int8's: tests/test_backends_conformance.py
        translator = load(tmp_path / "m", backend=name)
        assert translator.fast_paths.decoder.name == name, translator.fast_paths.line()
        out[name] = [
            (t.tokens, t.score)
            for t in translator.translate(lines, search=SearchOptions(beam=2), target_lang="deu", return_scores=True)
        ]
    assert len({tuple(tokens) for tokens, _ in out["fp32"]}) > 3  # outputs vary with the input
    assert out["bf16-native"] == out["bf16"]  # ATen's ops: bit for bit
    assert [t for t, _ in out["fp32-native"]] == [t for t, _ in out["fp32"]]  # the loop step: fp32 within rounding
    assert max(abs(a - b) for (_, a), (_, b) in zip(out["fp32-native"], out["fp32"])) < 1e-4

    assert main(["export", "--to", "hf", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["activation_function"] == "swish"
    back = import_model(tmp_path / "hf")[0]
    assert back.config == model.config
    assert all(torch.equal(back.state_dict()[k], v) for k, v in model.state_dict().items())

    ctranslate2 = pytest.importorskip("ctranslate2", reason="the CTranslate2 export needs ctranslate2")
    assert main(["export", "--to", "ct2", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "ct2")]) == 0
    ct2 = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    deu = vocabs.src.sp.id_to_piece(vocabs.src.sp.piece_to_id(">>deu<<"))
    greedy = load(tmp_path / "m", backend="fp32").translate(
        lines, search=SearchOptions(beam=1), target_lang="deu", return_scores=True
    )
    for line, ours in zip(lines, greedy):
        ids = vocabs.src.encode(line)
        limit = len(ids) + 2 + 50  # transduce's default: (>>deu<<, source, eos) + 50 tokens, its eos included
        res = ct2.translate_batch([[deu] + vocabs.src.pieces(ids)], beam_size=1, max_decoding_length=limit - 1)[0]
        assert [vocabs.tgt.sp.piece_to_id(p) for p in res.hypotheses[0]] == ours.tokens, line
    src, tgt = _pairs(vocabs)
    scored = ct2.score_batch([vocabs.src.pieces(s[:-1]) for s in src], [vocabs.tgt.pieces(t[1:]) for t in tgt])
    with torch.no_grad():
        logp = model(_padded(src), _padded(tgt)).log_softmax(-1)  # (B, T, V)
    for i, (t, res) in enumerate(zip(tgt, scored)):
        expect = logp[i, torch.arange(len(t)), torch.tensor(t[1:] + [3])]
        assert torch.allclose(torch.tensor(res.log_probs), expect, atol=1e-4)
