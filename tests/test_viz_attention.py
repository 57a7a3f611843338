"""transduce attention: weights equal the reference attention path; figures, HTML and weight files are written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from transduce.cli import main
from transduce.decode.search_options import SearchOptions
from transduce.model import ModelConfig, Transformer
from transduce.model.attention import attention_reference
from transduce.viz.attention import record_weights

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert len(data) > 5000, f"{path} is suspiciously small ({len(data)} bytes)"


def tiny_model(seed: int = 0, vocab_size: int = 40) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig.preset("tiny", vocab_size=vocab_size)).eval()


def test_weights_equal_reference_attention():
    """Recompute every head from each module's own inputs with attention_reference."""
    model = tiny_model()
    inputs: dict[torch.nn.Module, tuple] = {}
    hooks = [
        m.register_forward_pre_hook(lambda mod, a, kw: inputs.__setitem__(mod, (a, kw)), with_kwargs=True)
        for layer in [*model.encoder.layers, *model.decoder.layers]
        for m in [layer.self_attn, getattr(layer, "cross_attn", None)]
        if m is not None
    ]
    src_ids, out_ids = [5, 9, 11, 7, 20], [6, 30, 12]
    enc, dec, cross = record_weights(model, src_ids, out_ids)
    for h in hooks:
        h.remove()
    S, T = len(src_ids) + 1, len(out_ids) + 1
    assert enc.shape == (2, 4, S, S) and dec.shape == (2, 4, T, T) and cross.shape == (2, 4, T, S)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i, layer in enumerate(model.encoder.layers):
        (x,), kw = inputs[layer.self_attn]
        q, k, v = layer.self_attn.project_qkv(x)
        _, want = attention_reference(q, k, v, kw["mask"])
        np.testing.assert_allclose(enc[i], want[0].detach().numpy(), atol=1e-6)
    for i, layer in enumerate(model.decoder.layers):
        (x,), kw = inputs[layer.self_attn]
        q, k, v = layer.self_attn.project_qkv(x)
        _, want = attention_reference(q, k, v, causal)
        np.testing.assert_allclose(dec[i], want[0].detach().numpy(), atol=1e-6)
        (x,), kw = inputs[layer.cross_attn]
        q = layer.cross_attn.split_heads(layer.cross_attn.q_proj(x))
        k, v = layer.cross_attn.project_kv(kw["memory"])
        _, want = attention_reference(q, k, v, kw["mask"])
        np.testing.assert_allclose(cross[i], want[0].detach().numpy(), atol=1e-6)
    # rows are distributions; the decoder never looks ahead
    np.testing.assert_allclose(enc.sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(dec, k=1) == 0)
    # and recording is switched off again
    assert all(layer.self_attn.record is None for layer in model.encoder.layers)


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir) -> Path:
    return tiny_model_dir


@pytest.mark.slow
@pytest.mark.parametrize("select", [["--layer", "1", "--head", "2"], ["--layer", "2"]])
def test_cli_png(model_dir, tmp_path, select):
    out = tmp_path / "att.png"
    assert (
        main(["attention", "--model", str(model_dir), "A man rides a bike.", "--greedy", *select, "--out", str(out)])
        == 0
    )
    assert_png(out)


def test_cli_html_and_weights(model_dir, tmp_path):
    html, npz, js = tmp_path / "a.html", tmp_path / "w.npz", tmp_path / "w.json"
    assert (
        main(["attention", "--model", str(model_dir), "A dog runs.", "--out", str(html), "--save-weights", str(npz)])
        == 0
    )
    text = html.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and '<script id="data"' in text and "</html>" in text
    saved = np.load(npz)
    assert saved["encoder"].shape[:2] == (2, 4)
    assert list(saved["source"])[-1] == "</s>" and list(saved["target_in"])[0] == "<s>"
    assert saved["cross"].shape[-2:] == (len(saved["target_out"]), len(saved["source"]))
    assert (
        main(
            [
                "attention",
                "--model",
                str(model_dir),
                "A dog runs.",
                "--out",
                str(tmp_path / "a.png"),
                "--save-weights",
                str(js),
            ]
        )
        == 0
    )
    loaded = json.loads(js.read_text())
    np.testing.assert_allclose(np.array(loaded["encoder"]), saved["encoder"], atol=1e-5)


def test_sentence_attention_returns_attention_with_its_translation(model_dir):
    from transduce import load
    from transduce.viz.attention import sentence_attention

    translator = load(model_dir)
    maps = sentence_attention(translator, "A dog runs in the snow.")
    assert maps.translation == translator.translate(["A dog runs in the snow."])[0]
    assert maps.cross.shape[-2:] == (len(maps.target_out), len(maps.source))
    np.testing.assert_allclose(maps.cross.sum(-1), 1.0, atol=1e-5)


def test_cli_errors(model_dir, tmp_path, capsys):
    assert (
        main(["attention", "--model", str(model_dir), "A dog.", "--layer", "9", "--out", str(tmp_path / "x.png")]) == 2
    )
    assert "--layer 9" in capsys.readouterr().err
    assert main(["attention", "--model", str(model_dir), "A dog.", "--out", str(tmp_path / "x.jpg")]) == 2
    assert ".png or .html" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["fp32-native", "int8-native"])
def test_a_cpp_step_backend_draws_attention_and_places_tags(tiny_model_dir, backend):
    """What `auto` picks where backends.json vouches for int8: attention pages, the server's hover and HTML
    tag placement read the weights of the PyTorch model the C++ step steps for."""
    from transduce import load
    from transduce.text.markup import translate_html
    from transduce.viz.attention import sentence_attention

    translator = load(tiny_model_dir, backend=backend)
    assert translator.fast_paths.decoder.name == backend, translator.fast_paths.line()
    maps = sentence_attention(translator, "The king sent his servants.", search=SearchOptions(beam=2))
    assert maps.translation == translator.translate(["The king sent his servants."], search=SearchOptions(beam=2))[0]
    assert maps.cross.shape[-2:] == (len(maps.target_out), len(maps.source))
    html = translate_html(translator, "The <b>king</b> sent his servants.", search=SearchOptions(beam=2))
    assert html.count("<b>") == 1 and html.count("</b>") == 1
