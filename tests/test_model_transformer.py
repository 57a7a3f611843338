"""The encoder–decoder (§3): causality, padding, incremental decoding, tying, norms, positions."""

import math

import pytest
import torch
import torch.nn.functional as F

from transduce import ModelConfig, Transformer
from transduce.model.embeddings import sinusoid_table
from transduce.model.layers import Residual
from transduce.model.transformer import window_mask

V = 50


def make(seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = ModelConfig.preset("tiny", vocab_size=V, **overrides)
    return Transformer(cfg).eval()


def batch(B=3, S=9, T=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (B, S), generator=g)
    tgt = torch.randint(4, V, (B, T), generator=g)
    tgt[:, 0] = 2  # bos
    if B > 1:
        src[1, 6:] = 0  # padded source
    return src, tgt


VARIANTS = [
    dict(),
    dict(norm="pre"),
    dict(positions="learned"),
    dict(attention="dot"),
    dict(attention="additive"),
    dict(attention_window=3),
    dict(tie_embeddings="none"),
    dict(activation="gelu"),
    dict(d_k=4),  # queries and keys narrower than values (Table 3 row B)
]


@pytest.mark.parametrize("paper, vocab, expected", [("paper-base", 37000, 65e6), ("paper-big", 37000, 213e6)])
def test_parameter_counts_match_table_3(paper, vocab, expected):
    with torch.device("meta"):
        model = Transformer(ModelConfig.preset(paper, vocab_size=vocab))
    assert abs(model.num_parameters() - expected) / expected < 0.03, model.num_parameters()


@pytest.mark.parametrize("overrides", VARIANTS)
def test_future_target_tokens_never_change_earlier_logits(overrides):
    model = make(**overrides)
    src, tgt = batch()
    base = model(src, tgt)
    for j in range(1, tgt.size(1)):
        changed = tgt.clone()
        changed[:, j] = (changed[:, j] + 7) % (V - 4) + 4
        out = model(src, changed)
        torch.testing.assert_close(out[:, :j], base[:, :j], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(out[:, j:], base[:, j:])


@pytest.mark.parametrize("overrides", VARIANTS)
def test_appending_padding_never_changes_real_logits(overrides):
    model = make(**overrides)
    src, tgt = batch()
    base = model(src, tgt)
    padded = model(F.pad(src, (0, 4), value=0), F.pad(tgt, (0, 3), value=0))
    torch.testing.assert_close(padded[:, : tgt.size(1)], base, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("overrides", VARIANTS)
def test_incremental_decoding_equals_full_decoding(overrides):
    model = make(**overrides)
    src, tgt = batch()
    full = model(src, tgt)
    cache = model.init_cache(model.encode(src))
    steps = torch.stack([model.decode_step(tgt[:, t], cache) for t in range(tgt.size(1))], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


def test_incremental_decoding_with_shared_encoder_keys_across_beams():
    """Beams of a sentence share one copy of the encoder keys/values; results match copying them."""
    model = make()
    src, tgt = batch()
    beam = 3
    copied = model(src.repeat_interleave(beam, 0), tgt.repeat_interleave(beam, 0))
    cache = model.init_cache(model.encode(src), beam=beam)
    assert cache.layers[0].memory_k.size(0) == src.size(0)  # one row per sentence, not per beam
    rows = tgt.repeat_interleave(beam, 0)
    steps = torch.stack([model.decode_step(rows[:, t], cache) for t in range(tgt.size(1))], dim=1)
    torch.testing.assert_close(steps, copied, atol=1e-5, rtol=1e-5)


def test_cache_reorder_drops_sentences():
    model = make()
    src, tgt = batch()
    full = model(src, tgt)
    cache = model.init_cache(model.encode(src))
    model.decode_step(tgt[:, 0], cache)
    keep = torch.tensor([2, 0])
    cache.reorder(keep, sentences=keep)
    out = torch.stack([model.decode_step(tgt[keep, t], cache) for t in range(1, tgt.size(1))], dim=1)
    torch.testing.assert_close(out, full[keep, 1:], atol=1e-5, rtol=1e-5)


def test_window_covering_everything_equals_full_attention():
    src, tgt = batch()
    full = make()(src, tgt)
    windowed = make(attention_window=2 * src.size(1) + 1)(src, tgt)
    torch.testing.assert_close(windowed, full, atol=1e-5, rtol=1e-5)


def test_window_mask_shapes_the_neighbourhood():
    enc = window_mask(7, 7, r=3, causal=False)
    assert enc[3].nonzero().flatten().tolist() == [2, 3, 4]  # r positions centred on i
    dec = window_mask(7, 7, r=3, causal=True)
    assert dec[5].nonzero().flatten().tolist() == [3, 4, 5]  # the r most recent positions
    step = window_mask(1, 6, r=3, causal=True, offset=5)
    assert step[0].nonzero().flatten().tolist() == [3, 4, 5]


def test_restricted_encoder_position_never_sees_outside_its_window():
    """Gradient test: with one restricted encoder layer, output i depends only on inputs within r//2."""
    model = make(attention_window=3, encoder_layers=1)
    src, _ = batch(B=1, S=9)
    x = model.src_embed(src).detach().requires_grad_()
    out = model.encoder(x, model._encoder_self_mask(model.source_mask(src)))
    (out[0, 4] * torch.randn(64)).sum().backward()  # a plain sum of a LayerNorm output has no gradient
    touched = (x.grad[0].abs().sum(-1) > 0).nonzero().flatten().tolist()
    assert touched == [3, 4, 5]


def test_restricted_decoder_position_never_sees_older_than_r():
    model = make(attention_window=2, decoder_layers=1)
    src, tgt = batch(B=1, T=7)
    enc = model.encode(src)
    x = model.tgt_embed(tgt).detach().requires_grad_()
    self_mask = model._decoder_self_mask(7, 7, 0, None)
    out = model.decoder(x, enc.memory, self_mask, enc.mask)
    (out[0, 5] * torch.randn(64)).sum().backward()
    touched = (x.grad[0].abs().sum(-1) > 0).nonzero().flatten().tolist()
    assert touched == [4, 5]


def test_sinusoids_equal_the_paper_formula():
    d, L = 16, 50
    table = sinusoid_table(L, d)
    for pos in (0, 1, 17, 49):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_embeddings_are_scaled_by_sqrt_d_model_and_positions_added():
    model = make(dropout=0.0)
    ids = torch.tensor([[5, 6, 7]])
    expected = model.src_embed.token.weight[ids] * math.sqrt(64) + sinusoid_table(3, 64)
    torch.testing.assert_close(model.src_embed(ids), expected)


def test_three_way_tying_is_one_tensor_and_switchable():
    model = make()
    w = model.src_embed.token.weight
    assert model.tgt_embed.token.weight is w and model.generator.weight is w
    assert model.num_parameters() == sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    target_only = make(tie_embeddings="target")
    assert target_only.generator.weight is target_only.tgt_embed.token.weight
    assert target_only.src_embed.token.weight is not target_only.tgt_embed.token.weight
    untied = make(tie_embeddings="none")
    assert len({id(untied.src_embed.token.weight), id(untied.tgt_embed.token.weight), id(untied.generator.weight)}) == 3
    # a gradient step through the tied output layer moves the source embedding too
    src, tgt = batch()
    model.train()
    model(src, tgt).sum().backward()
    assert w.grad is not None and w.grad.abs().sum() > 0


def test_residual_norm_placement_by_computation():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8)
    f = torch.nn.Linear(8, 8)
    post, pre = Residual(8, 0.0, "post", 1e-5), Residual(8, 0.0, "pre", 1e-5)
    torch.testing.assert_close(post(x, f), F.layer_norm(x + f(x), (8,), eps=1e-5))
    torch.testing.assert_close(pre(x, f), x + f(F.layer_norm(x, (8,), eps=1e-5)))


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_encoder_layer_computes_what_its_norm_claims(norm):
    model = make(norm=norm)
    layer = model.encoder.layers[0]
    x = torch.randn(2, 5, 64)
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    ln1, ln2 = layer.res_attn.norm, layer.res_ff.norm
    if norm == "post":  # LayerNorm(x + Sublayer(x)), §5.4
        h = ln1(x + layer.self_attn(x, mask=mask))
        expected = ln2(h + layer.ff(h))
    else:  # x + Sublayer(LayerNorm(x))
        h = x + layer.self_attn(ln1(x), mask=mask)
        expected = h + layer.ff(ln2(h))
    torch.testing.assert_close(layer(x, mask), expected)
    assert (model.encoder.final_norm is None) == (norm == "post")


@pytest.mark.parametrize("activation, act", [("relu", F.relu), ("gelu", F.gelu)])
def test_feed_forward_applies_the_configured_activation(activation, act):
    """FFN(x) = act(x W1 + b1) W2 + b2 (§3.3 with ReLU; model.activation = "gelu" swaps in exact GELU)."""
    ff = make(activation=activation).decoder.layers[1].ff
    x = torch.randn(2, 5, 64)
    torch.testing.assert_close(ff(x), F.linear(act(F.linear(x, ff.w1.weight, ff.w1.bias)), ff.w2.weight, ff.w2.bias))


def test_dropout_on_embedding_sums_in_training_only():
    model = make(dropout=0.5)
    ids = torch.tensor([[5, 6, 7, 8]])
    model.train()
    assert (model.src_embed(ids) == 0).any()
    model.eval()
    assert not (model.src_embed(ids) == 0).any()


def test_initialisation_is_documented_one():
    model = make()
    qkv = model.encoder.layers[0].self_attn.qkv_proj
    bound = math.sqrt(6 / (64 + 64))  # Xavier-uniform per Q/K/V matrix
    assert qkv.weight.abs().max() <= bound and qkv.weight.abs().max() > 0.9 * bound
    assert torch.all(qkv.bias == 0)
    assert torch.all(model.src_embed.token.weight[0] == 0)  # padding row
    assert model.src_embed.token.weight[4:].std().item() == pytest.approx(64**-0.5, rel=0.05)


def test_golden_logits_fixed_seed():
    """Regression guard: a change in the computation shows up here first."""
    model = make(seed=1234)
    src, tgt = batch(seed=42)
    out = model(src, tgt)
    assert out.shape == (3, 7, V)
    assert out[0, 0, 0].item() == 0.0  # the tied, zero padding row scores exactly 0
    assert out[0, 0, 1:4].tolist() == pytest.approx([0.6752, 3.7047, 0.2051], abs=2e-4)
    assert out.sum().item() == pytest.approx(-37.74, abs=2e-2)
