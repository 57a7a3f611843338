"""Scaled dot-product and multi-head attention (§3.2)."""

import math

import pytest
import torch

from transduce.model.attention import MultiHeadAttention, attention_fast, attention_reference


def qkv(B=2, h=3, T=5, S=7, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, h, T, d, generator=g),
        torch.randn(B, h, S, d, generator=g),
        torch.randn(B, h, S, d, generator=g),
    )


def test_reference_is_the_formula():
    q, k, v = qkv()
    out, w = attention_reference(q, k, v)
    expected_w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
    torch.testing.assert_close(w, expected_w)
    torch.testing.assert_close(out, expected_w @ v)


@pytest.mark.parametrize("scale", [None, 1.0])
def test_fast_equals_reference_with_padding_mask(scale):
    q, k, v = qkv()
    mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    mask[1, ..., 4:] = False  # second sentence: 3 padded keys
    ref, w = attention_reference(q, k, v, mask, scale)
    fast = attention_fast(q, k, v, mask, scale)
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    assert torch.all(w[1, ..., 4:] == 0)  # masked keys get exactly zero weight


def test_fast_causal_flag_equals_reference_causal_mask():
    q, k, v = qkv(T=6, S=6)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    ref, w = attention_reference(q, k, v, causal)
    torch.testing.assert_close(attention_fast(q, k, v, is_causal=True), ref, atol=1e-5, rtol=1e-5)
    assert torch.all(w.triu(1) == 0)


def test_fully_masked_row_gives_zeros_not_nan_forward_and_backward():
    q, k, v = (t.requires_grad_() for t in qkv())
    mask = torch.ones(2, 1, 5, 7, dtype=torch.bool)
    mask[0, :, 2, :] = False  # query 2 of sentence 0 may see nothing
    for fn in (lambda: attention_reference(q, k, v, mask)[0], lambda: attention_fast(q, k, v, mask)):
        out = fn()
        assert torch.all(out[0, :, 2] == 0)
        out.sum().backward()
        for t in (q, k, v):
            assert torch.isfinite(t.grad).all()
            t.grad = None


def test_unscaled_attention_differs_and_saturates():
    q, k, v = qkv(d=256)
    _, w_scaled = attention_reference(q, k, v)
    _, w_unscaled = attention_reference(q, k, v, scale=1.0)
    # without 1/sqrt(d_k) the softmax is much peakier (§3.2.1's argument)
    assert w_unscaled.max(-1).values.mean() > w_scaled.max(-1).values.mean() + 0.3


def test_multi_head_split_and_merge_shapes():
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, self_attention=True)
    x = torch.randn(3, 5, 32)
    assert mha.split_heads(x).shape == (3, 4, 5, 8)
    assert mha(x).shape == (3, 5, 32)


def test_multi_head_equals_per_head_computation():
    """Concat(head_1..head_h) W^O with head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V) (§3.2.2)."""
    torch.manual_seed(0)
    d, h = 16, 4
    mha = MultiHeadAttention(d, h, self_attention=True).eval()
    x = torch.randn(2, 5, d)
    Wq, Wk, Wv = mha.qkv_proj.weight.chunk(3, 0)
    bq, bk, bv = mha.qkv_proj.bias.chunk(3, 0)
    heads = []
    for i in range(h):
        sl = slice(i * d // h, (i + 1) * d // h)
        Q, K, V = x @ Wq[sl].T + bq[sl], x @ Wk[sl].T + bk[sl], x @ Wv[sl].T + bv[sl]
        heads.append(torch.softmax(Q @ K.transpose(-1, -2) / math.sqrt(d // h), -1) @ V)
    expected = mha.out_proj(torch.cat(heads, -1))
    torch.testing.assert_close(mha(x), expected, atol=1e-5, rtol=1e-5)


def test_record_returns_reference_weights_and_same_output():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, self_attention=True).eval()
    x = torch.randn(2, 4, 16)
    fast = mha(x, is_causal=True)
    mha.record = []
    recorded = mha(x, is_causal=True)
    torch.testing.assert_close(fast, recorded, atol=1e-5, rtol=1e-5)
    (w,) = mha.record
    assert w.shape == (2, 2, 4, 4) and torch.all(w.triu(1) == 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 4))


def test_attention_dropout_only_when_configured_and_training():
    torch.manual_seed(0)
    x = torch.randn(2, 6, 16)
    plain = MultiHeadAttention(16, 2, self_attention=True).train()
    assert torch.equal(plain(x), plain(x))  # no attention dropout by default (paper presets)
    dropped = MultiHeadAttention(16, 2, self_attention=True, dropout=0.5).train()
    assert not torch.equal(dropped(x), dropped(x))
    dropped.eval()
    assert torch.equal(dropped(x), dropped(x))


def test_additive_attention_masks_and_normalises():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, self_attention=False, kind="additive").eval()
    x, mem = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.bool)[:, None, None, :]
    mha.record = []
    out = mha(x, memory=mem, mask=mask)
    (w,) = mha.record
    assert out.shape == (2, 3, 16)
    assert torch.all(w[1, ..., 2:] == 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 3))


def test_written_out_training_attention_equals_the_kernels():
    """With ``kernel = "written"`` (training on CPU) a layer computes the formula with fp32 scores: equal to
    SDPA in fp32 (padding mask, causal flag, fully masked rows), and under bf16 autocast within bf16
    rounding of SDPA's math kernel, which also keeps its scores in fp32."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from transduce.model.attention import attention_written_out

    q, k, v = qkv(T=6, S=6)
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    mask[1, ..., 3:] = False
    torch.testing.assert_close(attention_written_out(q, k, v, mask), attention_fast(q, k, v, mask))
    torch.manual_seed(0)
    layer = MultiHeadAttention(24, 3, self_attention=True).eval()
    written = MultiHeadAttention(24, 3, self_attention=True).eval()
    written.load_state_dict(layer.state_dict())
    written.kernel = "written"
    x = torch.randn(2, 6, 24)
    for kw in (dict(mask=mask), dict(is_causal=True), dict(mask=torch.zeros(2, 1, 1, 6, dtype=torch.bool))):
        plain = layer(x, **kw)
        ours = written(x, **kw)
        torch.testing.assert_close(ours, plain, atol=1e-6, rtol=1e-5)
        with torch.autocast("cpu", dtype=torch.bfloat16), sdpa_kernel(SDPBackend.MATH):
            math_bf16 = layer(x, **kw).float()
            ours_bf16 = written(x, **kw).float()
        torch.testing.assert_close(ours_bf16, math_bf16, atol=2e-2, rtol=2e-2)
    q16, k16 = q.bfloat16(), k.bfloat16()  # the scores: fp32 from bf16 inputs, not bf16-rounded
    scores_fp32 = q16.float() @ k16.float().transpose(-2, -1) / math.sqrt(8)
    out = attention_written_out(q16, k16, v.bfloat16())
    expected = torch.softmax(scores_fp32, -1).bfloat16() @ v.bfloat16()
    assert torch.equal(out, expected)


def test_written_out_attention_masks_inside_the_score_product_as_the_reference_masks_after_it():
    """The written kernel starts its score product from the mask as a bias (``baddbmm``); the reference
    multiplies and masks after the product. Same output to fp32 rounding, for a padding mask, a causal mask
    and a mask with some rows empty (their output exactly 0, as the reference's zeroed weights give)."""
    from transduce.model.attention import attention_reference, attention_written_out

    q, k, v = qkv(T=5, S=6)
    padding = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    padding[1, ..., 4:] = False
    causal = torch.ones(5, 6, dtype=torch.bool).tril(1)
    rows = torch.ones(2, 1, 5, 6, dtype=torch.bool)
    rows[0, 0, 2] = False  # query 2 of sentence 0 may attend nowhere
    rows[1, 0, 4] = False
    for mask in (padding, causal, rows):
        ours, (reference, _) = attention_written_out(q, k, v, mask), attention_reference(q, k, v, mask)
        torch.testing.assert_close(ours, reference, atol=1e-6, rtol=1e-5)
    ours = attention_written_out(q, k, v, rows)
    assert torch.equal(ours[0, :, 2], torch.zeros_like(ours[0, :, 2])) and ours[0, :, 1].abs().sum() > 0
    # the causal flag builds the same mask without the empty-row guard: bit for bit the mask's result
    assert torch.equal(attention_written_out(q, k, v, is_causal=True), attention_written_out(q, k, v, causal))
    # more queries than keys: the first rows see no key and are guarded (zeros, as the reference)
    q7 = torch.randn(2, 3, 7, 8)
    ours, (reference, _) = (
        attention_written_out(q7, k, v, is_causal=True),
        attention_reference(q7, k, v, torch.ones(7, 6, dtype=torch.bool).tril(-1)),
    )
    assert torch.equal(ours[:, :, 0], torch.zeros_like(ours[:, :, 0]))
    torch.testing.assert_close(ours, reference, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="not both"):
        attention_written_out(q, k, v, causal, is_causal=True)


def test_the_written_kernel_is_a_module_setting_and_the_trainer_key_is_checked():
    """The kernel is set on the modules (``use_kernel``), not in process state: another model is unaffected,
    steps keep the reference formula, and ``train.attention_kernel`` names only kernels that exist."""
    from transduce.config import ConfigError, build
    from transduce.model.attention import use_kernel
    from transduce.train.config import TrainConfig

    torch.manual_seed(0)
    ours, other = (MultiHeadAttention(24, 3, self_attention=True).eval() for _ in range(2))
    other.load_state_dict(ours.state_dict())
    use_kernel(ours, "written")
    assert ours.kernel == "written" and other.kernel == "fused"
    x = torch.randn(2, 6, 24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        written, fused = ours(x, is_causal=True).float(), other(x, is_causal=True).float()
    assert not torch.equal(written, fused)  # two kernels ran: fp32 scores against SDPA's
    torch.testing.assert_close(written, fused, atol=2e-2, rtol=2e-2)
    with pytest.raises(ValueError, match="written-bf16"):
        use_kernel(ours, "written-bf16")
    with pytest.raises(ConfigError, match="attention_kernel"):
        build(TrainConfig, {"data": "d", "out": "o", "attention_kernel": "written-bf16"})


@pytest.mark.parametrize("T", [5, 12, 15, 16, 24])
def test_softmax_last_matches_torch_values_and_gradients_with_masked_keys(T):
    """Short rows take the whole-tensor path (below SHORT_ROW keys), long ones torch's kernel: both give
    torch.softmax's values and gradient, -inf keys included (fp64 reference)."""
    from transduce.model import attention

    g = torch.Generator().manual_seed(T)
    x = torch.randn(3, 2, 4, T, generator=g)
    x[0, :, :, 1] = float("-inf")  # a masked key
    x[2, 1, 3, : T // 2] = float("-inf")
    grad = torch.randn(3, 2, 4, T, generator=g)
    ref_x = x.double().requires_grad_()
    torch.softmax(ref_x, dim=-1).backward(grad.double())
    got_x = x.clone().requires_grad_()
    calls = []
    original = attention._ShortRowSoftmax.apply
    attention._ShortRowSoftmax.apply = lambda t: calls.append(t.shape) or original(t)
    try:
        got = attention.softmax_last(got_x)
    finally:
        attention._ShortRowSoftmax.apply = original
    got.backward(grad)
    assert bool(calls) == (T < attention.SHORT_ROW)
    assert got[0, :, :, 1].eq(0).all() and got[2, 1, 3, : T // 2].eq(0).all()
    torch.testing.assert_close(got.double(), torch.softmax(ref_x.detach(), dim=-1), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got_x.grad.double(), ref_x.grad, rtol=1e-5, atol=1e-6)
