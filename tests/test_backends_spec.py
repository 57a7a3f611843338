"""The hand-off to the C++ decoder is a spec of named tensors, checked in one place that lists every problem."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

from transduce.backends.spec import UnsupportedModel, check, spec_of, unsupported, validated
from transduce.model import ModelConfig, Transformer


def _model(**overrides) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig.preset("tiny", vocab_size=60, **overrides)).eval()


@pytest.mark.parametrize(
    "overrides",
    [
        dict(),
        dict(norm="pre"),
        dict(activation="gelu", tie_embeddings="none"),
        dict(activation="swish", output_bias=True),
    ],
)
def test_a_model_reads_into_a_valid_spec(overrides):
    model = _model(**overrides)
    spec = validated(spec_of(model))
    assert spec.activation == model.config.activation
    assert (spec.generator.bias is None) == (not model.config.output_bias)
    assert len(spec.decoder) == model.config.decoder_layers and len(spec.cross_kv) == len(spec.decoder)
    assert torch.equal(spec.decoder[0].self_qkv.weight, model.decoder.layers[0].self_attn.qkv_proj.weight)
    assert (spec.decoder_norm is None) == (model.config.norm == "post")


def test_every_problem_is_named_at_once():
    spec = spec_of(_model())
    layer = spec.decoder[1]
    broken = dataclasses.replace(
        spec,
        n_heads=5,
        eps=0.0,
        activation="tanh",
        decoder=[
            spec.decoder[0],
            dataclasses.replace(
                layer,
                ff_out=dataclasses.replace(layer.ff_out, weight=layer.ff_out.weight[:, :3]),
                cross_norm=None,
                self_out=dataclasses.replace(layer.self_out, bias=layer.self_out.bias.long()),
            ),
        ],
        cross_kv=spec.cross_kv[:1],
    )
    problems = check(broken)
    text = "; ".join(problems)
    for name in (
        "decoder[1].ff_out.weight: shape",
        "decoder[1].cross_norm: missing",
        "decoder[1].self_out.bias: dtype torch.int64",
        "cross_kv: 1 maps for 2 decoder layers",
        "n_heads: 5",
        "eps: 0.0",
        "activation: 'tanh'",
    ):
        assert name in text, (name, problems)
    with pytest.raises(UnsupportedModel, match="ff_out.*cross_norm"):
        validated(broken)


def test_every_unsupported_part_of_a_model_is_named():
    model = _model(attention="additive", attention_window=2)
    assert "additive" in unsupported(model) and "attention_window" in unsupported(model)
    with pytest.raises(UnsupportedModel, match=r"additive attention; restricted self-attention \(attention_window\)"):
        spec_of(model)
    assert unsupported(_model()) is None


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")
def test_the_extension_takes_the_spec_by_name_only():
    from transduce.backends import native

    ext = native.extension()
    spec = spec_of(_model())
    decoder = native.decoder_of(ext, spec, native._float)  # by keyword: accepted
    assert decoder is not None
    with pytest.raises(TypeError):  # positional arguments are refused: no hand-off depends on an order
        ext.Decoder([], [], None, spec.tgt_embedding, 1.0, None, None, 4, 0.5, False, 1e-5, "relu")
    with pytest.raises(RuntimeError, match="unknown feed-forward activation 'tanh'"):
        native.decoder_of(ext, dataclasses.replace(spec, activation="tanh"), native._float)
