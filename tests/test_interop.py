"""Export to HuggingFace MarianMT and CTranslate2, import from MarianMT: same numbers on both sides.

The model is conftest's ``tiny_model_dir`` (trained on Multi30k, so greedy outputs vary with
the input); separate-vocabulary cases use randomly initialised models.
"""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from conftest import read_corpus
from opus_models import opus_ids

from transduce.cli import main
from transduce.config import ConfigError
from transduce.data.vocab import Vocab, Vocabs
from transduce.decode.search_options import SearchOptions
from transduce.interop import marian
from transduce.interop.ctranslate2 import export_ctranslate2
from transduce.interop.marian import export_marian, import_marian
from transduce.model import ModelConfig, Transformer
from transduce.modeldir import load_model_dir

transformers = pytest.importorskip("transformers", reason="interop tests need transformers (the interop extra)")
ctranslate2 = pytest.importorskip("ctranslate2", reason="interop tests need ctranslate2 (the interop extra)")
marian.offline()


@pytest.fixture(scope="module")
def corpus():
    return read_corpus("train", "en", 400), read_corpus("train", "fr", 400), read_corpus("valid", "en", 24)


def pad(rows: list[list[int]]) -> torch.Tensor:
    width = max(map(len, rows))
    return torch.tensor([r + [0] * (width - len(r)) for r in rows])  # (B, width)


@pytest.fixture(scope="module")
def fitted(tiny_model_dir):
    """(model, vocabs, model_dir) of the trained tiny en->fr model (tests/conftest.py)."""
    model, vocabs, _ = load_model_dir(tiny_model_dir)
    return model, vocabs, tiny_model_dir


@torch.no_grad()
def greedy(model: Transformer, ids: list[int], max_len: int = 39) -> list[int]:
    """Reference greedy search: bos, argmax until eos (eos not returned)."""
    cache = model.init_cache(model.encode(torch.tensor([ids + [3]])), beam=1)
    token, out = torch.tensor([2]), []
    for _ in range(max_len):
        token = model.decode_step(token, cache).argmax(-1)  # (1,)
        if token.item() == 3:
            break
        out.append(token.item())
    return out


def load_hf(directory: Path):
    model, info = transformers.MarianMTModel.from_pretrained(directory, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    return model.eval()


def hf_logits(hf_model, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(input_ids=src, attention_mask=(src != 0).long(), decoder_input_ids=tgt_in).logits


@pytest.mark.slow
def test_hf_export_logits_and_greedy_match(fitted, corpus, tmp_path):
    model, vocabs, _ = fitted
    _, de, val = corpus
    export_marian(model, vocabs, tmp_path / "hf")
    hf_model = load_hf(tmp_path / "hf")
    src = pad([vocabs.src.encode(s) + [3] for s in val[:8]])  # padded rows included
    tgt = pad([[2] + vocabs.tgt.encode(s) for s in de[100:108]])
    with torch.no_grad():
        ours = model(src, tgt)
    assert (ours - hf_logits(hf_model, src, tgt)).abs().max() < 1e-4

    # greedy, fp32, sentence by sentence from the same ids; HF forces eos as its 40th token
    for sentence in val:
        ids = vocabs.src.encode(sentence)
        out = hf_model.generate(torch.tensor([ids + [3]]), num_beams=1, do_sample=False, max_new_tokens=40)
        hf_ids = [t for t in out[0].tolist()[1:] if t != 3]
        assert hf_ids == greedy(model, ids)


def test_hf_tokenizer_reproduces_our_ids(fitted, corpus, tmp_path):
    """MarianTokenizer over the exported files gives our ids + eos and decodes our outputs to our text.

    It also applies Moses punctuation normalisation before SentencePiece, which can differ from
    our NFC-only path on some punctuation; on these sentences the differences are counted and must be none.
    """
    model, vocabs, _ = fitted
    export_marian(model, vocabs, tmp_path / "hf")
    tok = transformers.MarianTokenizer.from_pretrained(tmp_path / "hf")
    val = corpus[2]
    differ = [s for s in val if tok(s)["input_ids"] != vocabs.src.encode(s) + [3]]
    assert differ == []
    outs = [greedy(model, vocabs.src.encode(s)) for s in val[:6]]
    assert tok.batch_decode(outs, skip_special_tokens=True) == [vocabs.tgt.decode(o) for o in outs]


def test_position_permutation_is_what_makes_them_equal(fitted, corpus, tmp_path, monkeypatch):
    """Without mapping our interleaved sinusoids onto HF's sin-half/cos-half layout the logits differ."""
    model, vocabs, _ = fitted
    monkeypatch.setattr(marian, "interleave_to_halves", lambda d: torch.arange(d))
    export_marian(model, vocabs, tmp_path / "hf")
    src = pad([vocabs.src.encode(s) + [3] for s in corpus[2][:4]])
    tgt = pad([[2] + vocabs.tgt.encode(s) for s in corpus[1][:4]])
    with torch.no_grad():
        ours = model(src, tgt)
    assert (ours - hf_logits(load_hf(tmp_path / "hf"), src, tgt)).abs().max() > 0.1


def test_round_trip_through_the_cli_is_exact(fitted, tmp_path, capsys):
    model, _, model_dir = fitted
    assert main(["export", "--to", "hf", "--model", str(model_dir), "--out", str(tmp_path / "hf")]) == 0
    assert main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "back")]) == 0
    back, vocabs, meta = load_model_dir(tmp_path / "back")
    assert back.config == model.config
    assert vocabs.shared and vocabs.src.proto == fitted[1].src.proto
    assert meta["src_lang"] == "en" and meta["tgt_lang"] == "fr"
    ours, theirs = model.state_dict(), back.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def opus_layout(hf_dir: Path, vocab: Vocab, out: Path) -> torch.Tensor:
    """Rewrite an export into OPUS-MT's conventions: </s>=0, <unk>=1, other pieces, <pad>=V-1 (zero row),
    decoder starts from <pad>. Returns ``new_of_old`` (Marian id of each of our ids, -1 for <s>)."""
    shutil.copytree(hf_dir, out)
    pieces = [vocab.sp.id_to_piece(i) for i in range(len(vocab))]
    order = ["</s>", "<unk>"] + pieces[4:] + ["<pad>"]  # no <s>: Marian has none
    mapping = {p: i for i, p in enumerate(order)}
    (out / "vocab.json").write_text(json.dumps(mapping))
    cfg = json.loads((out / "config.json").read_text())
    V = len(order)
    cfg.update(opus_ids(V))
    (out / "config.json").write_text(json.dumps(cfg))
    (out / "generation_config.json").unlink()
    from safetensors.torch import load_file, save_file

    state = load_file(str(out / "model.safetensors"))
    rows = torch.tensor([pieces.index(p) for p in order])
    shared = state["model.shared.weight"].index_select(0, rows).clone()  # (V, d)
    shared[V - 1] = 0.0  # Marian's pad row, the decoder's start, is zero
    state["model.shared.weight"] = shared
    state["final_logits_bias"] = torch.zeros(1, V)
    save_file(state, str(out / "model.safetensors"))
    return torch.tensor([mapping.get(p, -1) for p in pieces])


def test_import_of_an_opus_mt_layout(fitted, corpus, tmp_path):
    """Foreign special ids and a zero decoder-start row: the imported model scores like the MarianMT one."""
    model, vocabs, _ = fitted
    export_marian(model, vocabs, tmp_path / "hf")
    marian_of = opus_layout(tmp_path / "hf", vocabs.src, tmp_path / "opus")
    hf_model = load_hf(tmp_path / "opus")
    ours, ours_vocabs, _ = import_marian(tmp_path / "opus")
    V = hf_model.config.vocab_size
    assert ours.config.vocab_size == V + 1  # <s> added as a copy of the start row
    assert ours_vocabs.src.sp.id_to_piece(2) == "<s>" and ours_vocabs.src.sp.id_to_piece(3) == "</s>"
    de, val = corpus[1], corpus[2]
    our_src = [ours_vocabs.src.encode(s) + [3] for s in val[:6]]
    our_tgt = [[2] + ours_vocabs.tgt.encode(s) for s in de[:6]]
    assert our_src[0][:-1] == vocabs.src.encode(val[0])  # same pieces, same segmentation
    to_marian = {i: int(marian_of[i]) for i in range(len(marian_of)) if marian_of[i] >= 0}
    to_marian[2] = V - 1  # our <s> is Marian's start (pad)
    m_src = pad([[to_marian[t] for t in row] for row in our_src])
    m_src[m_src == 0] = 0  # no-op: Marian eos is 0, and padding is masked below
    mask = pad([[1] * len(row) for row in our_src])
    m_tgt = pad([[to_marian[t] for t in row] for row in our_tgt])
    with torch.no_grad():
        theirs = hf_model(input_ids=m_src, attention_mask=mask, decoder_input_ids=m_tgt).logits  # (B, T, V)
        mine = ours(pad(our_src), pad(our_tgt))  # (B, T, V+1)
    cols = torch.tensor([to_marian.get(i, -1) for i in range(V + 1)])
    real = cols >= 0
    lengths = [len(r) for r in our_tgt]
    for b, n in enumerate(lengths):
        assert (mine[b, :n][:, real] - theirs[b, :n][:, cols[real]]).abs().max() < 1e-4


def test_ctranslate2_export_scores_and_greedy_match(fitted, corpus, tmp_path):
    model, vocabs, model_dir = fitted
    assert main(["export", "--to", "ct2", "--model", str(model_dir), "--out", str(tmp_path / "ct2")]) == 0
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    val, de = corpus[2], corpus[1]
    src_tokens = [vocabs.src.pieces(vocabs.src.encode(s)) for s in val]
    results = translator.translate_batch(src_tokens, beam_size=1, max_decoding_length=39)
    for sentence, result in zip(val, results):
        assert vocabs.tgt.sp.piece_to_id(result.hypotheses[0]) == greedy(model, vocabs.src.encode(sentence))

    # teacher-forced log-probabilities of given targets, token by token
    tgt_ids = [vocabs.tgt.encode(s) for s in de[:6]]
    scored = translator.score_batch(src_tokens[:6], [vocabs.tgt.pieces(t) for t in tgt_ids])
    for i, (ids, res) in enumerate(zip(tgt_ids, scored)):
        with torch.no_grad():
            logp = model(torch.tensor([vocabs.src.encode(val[i]) + [3]]), torch.tensor([[2] + ids]))
        logp = logp.log_softmax(-1)[0]  # (T, V)
        expect = logp[torch.arange(len(ids) + 1), torch.tensor(ids + [3])]
        assert torch.allclose(torch.tensor(res.log_probs), expect, atol=1e-4)


def test_gelu_models_export_to_both_with_equal_scores(fitted, corpus, tmp_path):
    """A GELU feed-forward (model.activation) is MarianMT's "gelu" and CTranslate2's Activation.GELU: the same
    logits in all three and back through import. The fitted weights under GELU make a model that differs from
    the ReLU one, so a toolkit that kept ReLU would disagree."""
    relu, vocabs, _ = fitted
    model = Transformer(ModelConfig(**{**relu.config.to_dict(), "activation": "gelu"})).eval()
    model.load_state_dict(relu.state_dict())
    val, de = corpus[2], corpus[1]
    src = pad([vocabs.src.encode(s) + [3] for s in val[:6]])
    tgt = pad([[2] + vocabs.tgt.encode(s) for s in de[:6]])
    with torch.no_grad():
        ours, theirs_relu = model(src, tgt), relu(src, tgt)
    assert (ours - theirs_relu).abs().max() > 0.01

    export_marian(model, vocabs, tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["activation_function"] == "gelu"
    assert (ours - hf_logits(load_hf(tmp_path / "hf"), src, tgt)).abs().max() < 1e-4
    back, _, _ = import_marian(tmp_path / "hf")
    assert back.config.activation == "gelu"

    export_ctranslate2(model, vocabs, tmp_path / "ct2")
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    ids = [vocabs.tgt.encode(s) for s in de[:6]]
    scored = translator.score_batch(
        [vocabs.src.pieces(vocabs.src.encode(s)) for s in val[:6]], [vocabs.tgt.pieces(t) for t in ids]
    )
    for i, (t, res) in enumerate(zip(ids, scored)):
        logp = ours[i, : len(t) + 1].log_softmax(-1)  # (T, V)
        expect = logp[torch.arange(len(t) + 1), torch.tensor(t + [3])]
        assert torch.allclose(torch.tensor(res.log_probs), expect, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        dict(norm="pre"),
        dict(norm="pre", positions="learned", scale_embeddings=False, source_eos=False, layer_norm_eps=1e-6),
    ],
)
def test_ctranslate2_prenorm_export_scores_and_greedy_match(fitted, corpus, tmp_path, overrides):
    """Pre-norm models (CTranslate2's pre_norm=True, final norms as encoder/decoder layer_norm), also with a learned
    position table, unscaled embeddings and a source without </s>: CTranslate2 scores and greedy-decodes as we do.
    The final norms are moved off the identity, so an export that dropped them would disagree."""
    post, vocabs, _ = fitted
    model = Transformer(ModelConfig(**{**post.config.to_dict(), **overrides})).eval()
    model.load_state_dict(post.state_dict(), strict=False)
    with torch.no_grad():
        for norm in (model.encoder.final_norm, model.decoder.final_norm):
            norm.weight.mul_(1.5)
            norm.bias.add_(0.1)
        if model.config.positions == "learned":
            for embed in (model.src_embed, model.tgt_embed):
                embed.positions.weight.copy_(
                    post.src_embed.positions.table[
                        :, torch.randperm(post.config.d_model, generator=torch.Generator().manual_seed(0))
                    ]
                )
    export_ctranslate2(model, vocabs, tmp_path / "ct2")
    config = json.loads((tmp_path / "ct2" / "config.json").read_text())
    assert config["add_source_eos"] == model.config.source_eos
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    val, de = corpus[2], corpus[1]
    eos = [3] * model.config.source_eos
    src_tokens = [vocabs.src.pieces(vocabs.src.encode(s)) for s in val[:8]]
    results = translator.translate_batch(src_tokens, beam_size=1, max_decoding_length=39)
    for sentence, result in zip(val, results):
        ids = vocabs.src.encode(sentence)
        expect = []
        with torch.no_grad():
            cache = model.init_cache(model.encode(torch.tensor([ids + eos])), beam=1)
            token = torch.tensor([2])
            for _ in range(39):
                token = model.decode_step(token, cache).argmax(-1)
                if token.item() == 3:
                    break
                expect.append(token.item())
        assert vocabs.tgt.sp.piece_to_id(result.hypotheses[0]) == expect
    tgt_ids = [vocabs.tgt.encode(s) for s in de[:6]]
    scored = translator.score_batch(src_tokens[:6], [vocabs.tgt.pieces(t) for t in tgt_ids])
    for i, (ids, res) in enumerate(zip(tgt_ids, scored)):
        with torch.no_grad():
            logp = model(torch.tensor([vocabs.src.encode(val[i]) + eos]), torch.tensor([[2] + ids])).log_softmax(-1)[0]
        expect = logp[torch.arange(len(ids) + 1), torch.tensor(ids + [3])]
        assert torch.allclose(torch.tensor(res.log_probs), expect, atol=1e-4)


def test_ctranslate2_export_names_every_unsupported_key(fitted, tmp_path):
    model, vocabs, _ = fitted
    cfg = {**model.config.to_dict(), "attention": "additive", "attention_window": 3}
    with pytest.raises(ConfigError) as err:
        export_ctranslate2(Transformer(ModelConfig(**cfg)), vocabs, tmp_path / "ct2")
    assert "'attention'" in str(err.value) and "'attention_window'" in str(err.value)
    assert not (tmp_path / "ct2").exists()


def test_ctranslate2_int8_export_runs(fitted, corpus, tmp_path):
    _, vocabs, model_dir = fitted
    out = tmp_path / "ct2-int8"
    assert main(["export", "--to", "ct2", "--model", str(model_dir), "--out", str(out), "--quantization", "int8"]) == 0
    assert (out / "model.bin").stat().st_size < (Path(model_dir) / "model.safetensors").stat().st_size
    translator = ctranslate2.Translator(str(out), device="cpu", compute_type="int8", intra_threads=1)
    result = translator.translate_batch([vocabs.src.pieces(vocabs.src.encode(corpus[2][0]))], beam_size=2)
    assert result[0].hypotheses[0]


def test_bad_inputs_are_named(fitted, tmp_path, capsys):
    model, vocabs, model_dir = fitted
    export_marian(model, vocabs, tmp_path / "hf")
    (tmp_path / "hf" / "source.spm").unlink()
    with pytest.raises(FileNotFoundError, match="source.spm"):
        import_marian(tmp_path / "hf")

    export_marian(model, vocabs, tmp_path / "hf2")
    cfg = json.loads((tmp_path / "hf2" / "config.json").read_text())
    (tmp_path / "hf2" / "config.json").write_text(json.dumps({**cfg, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128}))
    with pytest.raises(ConfigError, match="model.safetensors.*shape"):
        import_marian(tmp_path / "hf2")
    (tmp_path / "hf2" / "config.json").write_text(json.dumps({**cfg, "vocab_size": cfg["vocab_size"] + 5}))
    with pytest.raises(ConfigError, match="model.safetensors.*vocab_size"):
        import_marian(tmp_path / "hf2")
    (tmp_path / "hf2" / "config.json").write_text(json.dumps(cfg))
    vocab = json.loads((tmp_path / "hf2" / "vocab.json").read_text())
    (tmp_path / "hf2" / "vocab.json").write_text(json.dumps({**vocab, "▁extra": len(vocab) + 10}))
    with pytest.raises(ConfigError, match="vocab.json and the weights do not match"):
        import_marian(tmp_path / "hf2")
    (tmp_path / "hf2" / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "hf2" / "config.json").write_text(json.dumps({**cfg, "activation_function": "tanh"}))
    with pytest.raises(ConfigError, match="activation_function"):
        import_marian(tmp_path / "hf2")
    (tmp_path / "hf2" / "config.json").write_text("{not json")
    assert main(["import", str(tmp_path / "hf2"), "--out", str(tmp_path / "x")]) == 2
    assert "config.json" in capsys.readouterr().err

    prenorm = Transformer(ModelConfig(**{**model.config.to_dict(), "norm": "pre"}))
    with pytest.raises(ConfigError, match="'norm'"):
        export_marian(prenorm, vocabs, tmp_path / "hf3")
    narrow = {**model.config.to_dict(), "norm": "pre", "d_k": model.config.d_model // model.config.n_heads // 2}
    with pytest.raises(ConfigError, match="'d_k'.*; key 'norm'"):  # every key MarianMT lacks, in one error
        export_marian(Transformer(ModelConfig(**narrow)), vocabs, tmp_path / "hf4")
    assert not any(p.suffix in (".bin", ".pt", ".pth", ".pkl") for p in (tmp_path / "hf").iterdir())
    assert os.environ["HF_HUB_OFFLINE"] == "1"


def test_fitted_model_is_not_degenerate(fitted, corpus):
    """Greedy outputs must differ between inputs, or the equality tests above would prove little."""
    model, vocabs, _ = fitted
    outs = {tuple(greedy(model, vocabs.src.encode(s))) for s in corpus[2][:12]}
    assert len(outs) >= 6


@pytest.mark.parametrize("tie", ["none", "target"])
def test_separate_vocabularies_export_and_round_trip(corpus, tmp_path, tie):
    """Separate source/target SentencePiece models (tie 'target' or 'none'): HF and CT2 agree, round trip exact."""
    en, de, val = corpus
    vocabs = Vocabs(Vocab.train(en, 300), Vocab.train(de, 350))
    torch.manual_seed(1)
    cfg = ModelConfig.preset(
        "tiny", vocab_size=len(vocabs.src), tgt_vocab_size=len(vocabs.tgt), dropout=0.0, tie_embeddings=tie
    )
    model = Transformer(cfg).eval()
    export_marian(model, vocabs, tmp_path / "hf")
    src = pad([vocabs.src.encode(s) + [3] for s in val[:4]])
    tgt = pad([[2] + vocabs.tgt.encode(s) for s in de[:4]])
    with torch.no_grad():
        ours = model(src, tgt)
    assert (ours - hf_logits(load_hf(tmp_path / "hf"), src, tgt)).abs().max() < 1e-4
    tok = transformers.MarianTokenizer.from_pretrained(tmp_path / "hf")
    assert tok(text_target=de[0])["input_ids"] == vocabs.tgt.encode(de[0]) + [3]

    back, back_vocabs, _ = import_marian(tmp_path / "hf")
    assert back.config == model.config and not back_vocabs.shared
    assert all(torch.equal(model.state_dict()[k], v) for k, v in back.state_dict().items())

    from transduce.interop.ctranslate2 import export_ctranslate2

    export_ctranslate2(model, vocabs, tmp_path / "ct2")
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    ids = vocabs.tgt.encode(de[0])
    res = translator.score_batch([vocabs.src.pieces(vocabs.src.encode(val[0]))], [vocabs.tgt.pieces(ids)])[0]
    logp = ours[0, : len(ids) + 1].log_softmax(-1)
    assert torch.allclose(
        torch.tensor(res.log_probs), logp[torch.arange(len(ids) + 1), torch.tensor(ids + [3])], atol=1e-4
    )


@pytest.mark.slow
def test_test_file_translations_identical_across_toolkits(tiny_model_dir, tmp_path):
    """Greedy fp32 translations of the test corpus's sentences by the trained tiny model: transduce's
    Translator, the CTranslate2 export and the HF export give the same text (differences are counted)."""
    from transduce.api import load

    lines = read_corpus("test", "en", 40)
    ours = load(tiny_model_dir).translate(lines, search=SearchOptions(beam=1))
    assert main(["export", "--to", "ct2", "--model", str(tiny_model_dir), "--out", str(tmp_path / "ct2")]) == 0
    assert main(["export", "--to", "hf", "--model", str(tiny_model_dir), "--out", str(tmp_path / "hf")]) == 0
    _, vocabs, _ = load_model_dir(tiny_model_dir)
    ct2 = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    hf_model, tok = load_hf(tmp_path / "hf"), transformers.MarianTokenizer.from_pretrained(tmp_path / "hf")
    ct2_text, hf_text = [], []
    for line in lines:
        ids = vocabs.src.encode(line)
        limit = len(ids) + 1 + 50  # transduce's default maximum: (source + eos) + 50 tokens, its eos included
        # CTranslate2's limit excludes eos; HF's max_new_tokens includes it (forced_eos_token_id)
        res = ct2.translate_batch([vocabs.src.pieces(ids)], beam_size=1, max_decoding_length=limit - 1)[0]
        ct2_text.append(vocabs.tgt.decode(vocabs.tgt.sp.piece_to_id(res.hypotheses[0])))
        out = hf_model.generate(
            **tok([line], return_tensors="pt"), num_beams=1, do_sample=False, max_length=limit + 1
        )  # + the decoder start token
        hf_text.append(tok.decode(out[0], skip_special_tokens=True))
    differ_ct2 = sum(a != b for a, b in zip(ours, ct2_text))
    differ_hf = sum(a != b for a, b in zip(ours, hf_text))
    assert (differ_ct2, differ_hf) == (0, 0), list(zip(ours, ct2_text, hf_text))
    assert len(set(ours)) > 30


def test_import_of_opus_mt_with_two_sentencepiece_models(corpus, tmp_path):
    """The usual OPUS-MT shape: source.spm and target.spm differ, one joint vocab.json, one shared matrix,
    </s>=0, <unk>=1, <pad>=V-1 starting the decoder. Import gives two equal tables tied on the target side,
    MarianTokenizer's ids, and MarianMT's logits."""
    en, de, val = corpus
    src_spm, tgt_spm = Vocab.train(en, 300), Vocab.train(de, 320)
    src_pieces = [src_spm.sp.id_to_piece(i) for i in range(4, len(src_spm))]
    tgt_pieces = [tgt_spm.sp.id_to_piece(i) for i in range(4, len(tgt_spm))]
    joint = ["</s>", "<unk>"] + src_pieces + [p for p in tgt_pieces if p not in set(src_pieces)] + ["<pad>"]
    V = len(joint)
    out = tmp_path / "opus"
    config = transformers.MarianConfig(
        vocab_size=V,
        decoder_vocab_size=V,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        activation_function="relu",
        scale_embedding=True,
        pad_token_id=V - 1,
        eos_token_id=0,
        decoder_start_token_id=V - 1,
        forced_eos_token_id=0,
        max_position_embeddings=256,
        dropout=0.0,
    )
    torch.manual_seed(0)
    hf_model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():
        hf_model.model.shared.weight[V - 1] = 0.0  # Marian's pad/start row is zero
    hf_model.save_pretrained(out)
    src_spm.save(out / "source.spm")
    tgt_spm.save(out / "target.spm")
    (out / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(joint)}))
    tok = transformers.MarianTokenizer(str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json"))

    model, vocabs, meta = import_marian(out)
    assert model.config.tie_embeddings == "target" and not vocabs.shared
    assert model.config.vocab_size == model.config.target_vocab_size == V + 1
    assert torch.equal(model.src_embed.token.weight, model.tgt_embed.token.weight)
    assert meta["spm_pieces_without_id"] == 0
    marian_id = {i: joint.index(vocabs.src.sp.id_to_piece(i)) if i != 2 else V - 1 for i in range(V + 1)}
    for sentence in val[:6]:
        ours_src = vocabs.src.encode(sentence) + [3]
        assert [marian_id[i] for i in ours_src] == tok(sentence)["input_ids"]
    targets = [vocabs.tgt.encode(s) for s in de[:4]]
    assert [[marian_id[i] for i in t] + [0] for t in targets] == tok(text_target=de[:4])["input_ids"]
    src = [vocabs.src.encode(s) + [3] for s in val[:4]]
    with torch.no_grad():
        theirs = hf_model(
            input_ids=pad([[marian_id[i] for i in r] for r in src]),
            attention_mask=pad([[1] * len(r) for r in src]),
            decoder_input_ids=pad([[V - 1] + [marian_id[i] for i in t] for t in targets]),
        ).logits
        mine = model(pad(src), pad([[2] + t for t in targets]))  # (B, T, V + 1)
    cols = torch.tensor([marian_id[i] for i in range(V + 1) if i != 2])
    keep = torch.tensor([i for i in range(V + 1) if i != 2])
    for b, t in enumerate(targets):
        n = len(t) + 1
        assert (mine[b, :n][:, keep] - theirs[b, :n][:, cols]).abs().max() < 1e-4


@pytest.mark.slow
def test_import_measures_the_backends_on_held_out_text(fitted, corpus, tmp_path, capsys):
    """`transduce import --check-backends SRC REF` writes the record `transduce.load`'s auto choice reads;
    without it the command says how to measure, and no record is written."""
    from transduce.backends.record import read_record

    _, _, model_dir = fitted
    assert main(["export", "--to", "hf", "--model", str(model_dir), "--out", str(tmp_path / "hf")]) == 0
    assert main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "plain")]) == 0
    assert "decoding backends: not measured" in capsys.readouterr().out
    assert read_record(tmp_path / "plain")[0] is None

    src, ref = tmp_path / "valid.en", tmp_path / "valid.fr"
    src.write_text("\n".join(read_corpus("valid", "en", 12)) + "\n", encoding="utf-8")
    ref.write_text("\n".join(read_corpus("valid", "fr", 12)) + "\n", encoding="utf-8")
    argv = ["import", str(tmp_path / "hf"), "--out", str(tmp_path / "m"), "--check-backends", str(src), str(ref)]
    assert main(argv + ["--check-count", "8"]) == 0
    record, why = read_record(tmp_path / "m")
    assert record is not None, why
    assert record["sentences"] == 8 and record["data"] == f"{src} (first 8)"
    assert set(next(iter(record["speed"].values()))["words_per_s"]) == {"fp32", "fp32-native", "int8-native"}
    assert "int8-native" in capsys.readouterr().out

    ref.write_text("one line\n", encoding="utf-8")  # a bad pair of files is refused before anything is written
    assert main(argv[:3] + [str(tmp_path / "bad")] + argv[4:]) == 2
    assert "has 12 lines but" in capsys.readouterr().err and not (tmp_path / "bad").exists()
