"""``output_bias`` (a bias on the pre-softmax projection) and Swish feed-forwards in the model and training.

The paper's projection has no bias (§3.4) and its feed-forward is ReLU (§3.3); Marian / OPUS-MT models
often have both a logit bias and Swish. Decoding backends and interop are checked in
tests/test_backends_conformance.py and tests/test_interop_native.py.
"""

from __future__ import annotations

import pytest
import torch

from transduce.data.vocab import Vocab, Vocabs
from transduce.model import ModelConfig, Transformer
from transduce.modeldir import load_model_dir, save_model_dir
from transduce.train.init import frozen_parameters
from transduce.train.loss import SmoothedLoss, label_smoothed_loss
from transduce.train.rdrop import RDrop
from transduce.train.step import TrainingLoss


def _model(**overrides) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", vocab_size=40, dropout=0.0, output_bias=True, activation="swish", **overrides)
    model = Transformer(cfg)
    with torch.no_grad():
        model.generator.bias.normal_(0.0, 1.0)  # initialised to zeros: make it matter
    return model


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    src, tgt = torch.randint(4, 40, (3, 7), generator=g), torch.randint(4, 40, (3, 6), generator=g)
    src[:, -1], tgt[:, 0] = 3, 2
    tgt[1, 4:] = 0  # a shorter target, right-padded
    return src, tgt


def test_the_default_is_the_papers_bias_free_relu_projection():
    cfg = ModelConfig()
    assert cfg.output_bias is False and cfg.activation == "relu"
    assert Transformer(ModelConfig.preset("tiny", vocab_size=40)).generator.bias is None
    model = _model()
    assert model.generator.bias.shape == (40,) and isinstance(model.decoder.layers[0].ff.act, torch.nn.SiLU)
    assert "generator.bias" in model.state_dict()


def test_the_logits_add_the_bias_in_every_pass():
    model, (src, tgt) = _model().eval(), _batch()
    with torch.no_grad():
        logits = model(src, tgt)  # (B, T, V)
        hidden = model.hidden(src, tgt)  # (B, T, d)
        assert torch.allclose(logits, hidden @ model.generator.weight.t() + model.generator.bias, atol=1e-5)
        cache = model.init_cache(model.encode(src), beam=1)
        steps = [model.decode_step(tgt[:, t], cache) for t in range(tgt.size(1))]  # each (B, V)
    assert torch.allclose(torch.stack(steps, 1), logits, atol=1e-5)


@pytest.mark.parametrize("objective", [SmoothedLoss(0.1), RDrop(0.1, alpha=1.0)], ids=["smoothed", "r-drop"])
def test_training_learns_the_bias_with_the_loss_of_the_models_own_logits(objective):
    """The fused training objectives take a bias-free projection; the bias joins as an input feature that is
    always 1. Loss and gradients (bias, tied weight) equal those of label smoothing over ``model(src, tgt)``."""
    src, tgt = _batch()
    model = _model()
    loss, _, tokens = TrainingLoss(model, objective, torch.device("cpu"), "fp32")(src, tgt)
    loss.backward()
    got = (model.generator.bias.grad.clone(), model.generator.weight.grad.clone())

    reference = _model()
    want, _, count = label_smoothed_loss(reference(src, tgt[:, :-1]), tgt[:, 1:], 0.1)
    (want * objective.copies).backward()  # no dropout: R-Drop's two copies agree, twice the plain loss
    assert tokens == objective.copies * count
    assert torch.allclose(loss, want * objective.copies, rtol=1e-5)
    assert got[0].abs().max() > 0
    assert torch.allclose(got[0], reference.generator.bias.grad, atol=1e-5)
    assert torch.allclose(got[1], reference.generator.weight.grad, atol=1e-5)


def test_model_directories_keep_the_bias_and_freezing_embeddings_freezes_it(tmp_path):
    model = _model()
    vocab = Vocab.train([f"w{i} w{i + 1} w{i + 2}" for i in range(200)], 40)
    save_model_dir(tmp_path / "m", model, Vocabs(vocab, vocab))
    loaded, _, _ = load_model_dir(tmp_path / "m")
    assert loaded.config.output_bias and loaded.config.activation == "swish"
    assert torch.equal(loaded.generator.bias, model.generator.bias)
    assert any(p is model.generator.bias for p in frozen_parameters(model, "embeddings"))
    untied = _model(tie_embeddings="none")
    assert all(p is not untied.generator.bias for p in frozen_parameters(untied, "embeddings"))
