"""The C++ decoder step gives the Python step's outputs bit for bit, and steps aside where it cannot run."""

from __future__ import annotations

import shutil
import warnings

import pytest
import torch

from conftest import read_multi30k
from transduce.api import load
from transduce.decode import native
from transduce.decode.search import beam_search, greedy
from transduce.model import ModelConfig, Transformer

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the extension")


def _random_model(**overrides) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", vocab_size=60, dropout=0.0, **overrides)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # far from initialisation: sharp, varied distributions
            p.normal_(0.0, 0.3)
    return model


def _sources() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 60, (6, 9), generator=g)
    src[:, -1] = 3
    src[2, 4], src[2, 5:] = 3, 0  # one short sentence, right-padded
    return src


@pytest.mark.parametrize("overrides", [dict(), dict(norm="pre"), dict(positions="learned", tie_embeddings="none"),
                                       dict(attention="dot")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_step_equals_python_step(overrides, dtype):
    model = _random_model(**overrides).to(dtype)
    fast = native.native_step(model)
    assert fast is not None
    src = _sources()
    for beam in (1, 4, 5):
        want = beam_search(model, src, beam=beam, nbest=beam)
        got = beam_search(fast, src, beam=beam, nbest=beam)
        assert [[(h.tokens, h.logprob, h.score) for h in hs] for hs in got] == \
               [[(h.tokens, h.logprob, h.score) for h in hs] for hs in want], beam
    assert [(h.tokens, h.logprob) for h in greedy(fast, src)] == [(h.tokens, h.logprob) for h in greedy(model, src)]


def test_native_step_logits_and_cache(tiny_model_dir):
    """One step at a time on a trained model: the same logits and the same grown cache."""
    model = load(tiny_model_dir).model
    fast = native.native_step(model)
    src = torch.tensor([[5, 6, 7, 8, 3, 0, 0, 0], [9, 10, 11, 12, 13, 14, 15, 3]])
    ref_cache, cache = (model.init_cache(model.encode(src), 2) for _ in range(2))
    tokens = torch.tensor([2, 2, 2, 2])
    for _ in range(4):
        want, got = model.decode_step(tokens, ref_cache), fast.decode_step(tokens, cache)
        assert torch.equal(got, want)
        assert cache.position == ref_cache.position
        for a, b in zip(cache.layers, ref_cache.layers):
            assert torch.equal(a.self_k, b.self_k) and torch.equal(a.self_v, b.self_v)
        tokens = want.argmax(-1)


def test_translator_native_flag_same_output(tiny_model_dir):
    lines = read_multi30k("test_2016_flickr", "en", 24)
    plain, fast = load(tiny_model_dir), load(tiny_model_dir, native=True)
    assert isinstance(fast.model, native.NativeStep)
    run = lambda t: [(x.tokens, x.score) for x in t.translate(lines, beam=4, batch_size=5, return_scores=True)]
    assert run(fast) == run(plain)


def test_cli_native_flag(tiny_model_dir, tmp_path, capsys):
    from transduce.cli import main

    src = tmp_path / "in.en"
    src.write_text("\n".join(read_multi30k("test_2016_flickr", "en", 6)) + "\n", encoding="utf-8")
    outputs = []
    for extra in ([], ["--native"]):
        assert main(["translate", "--model", str(tiny_model_dir), "--beam", "4", *extra, str(src)]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[1] == outputs[0] and outputs[0].count("\n") == 6


@pytest.mark.parametrize("overrides, reason", [(dict(attention="additive"), "additive"),
                                               (dict(attention_window=3), "attention_window")])
def test_unsupported_configs_are_named(overrides, reason):
    model = _random_model(**overrides)
    assert reason in native.supports(model)
    assert native.native_step(model) is None


def test_int8_and_recording_are_not_covered(tiny_model_dir):
    assert "quantis" in native.supports(load(tiny_model_dir, dtype="int8").model)
    model = load(tiny_model_dir).model
    model.decoder.layers[0].cross_attn.record = []
    assert "recorded" in native.supports(model)
    with pytest.warns(RuntimeWarning, match="int8"):  # asked for, not available: the user is told why
        translator = load(tiny_model_dir, dtype="int8", native=True)
    assert not isinstance(translator.model, native.NativeStep)


def test_build_failure_falls_back_with_a_warning(monkeypatch):
    from torch.utils import cpp_extension

    def broken(**kwargs):
        raise OSError("no compiler here")

    monkeypatch.setattr(cpp_extension, "load", broken)
    native.extension.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="no compiler here"):
            assert native.native_step(_random_model()) is None
    finally:
        monkeypatch.undo()
        native.extension.cache_clear()
    with warnings.catch_warnings():  # and with a compiler it builds (or loads) without a word
        warnings.simplefilter("error")
        assert native.extension() is not None
