"""The C++ multi-head attention (train/native_attention.h, train/attention.py) against the formula in float64."""

from __future__ import annotations

import shutil

import pytest
import torch

from transduce.config import ConfigError
from transduce.model import ModelConfig, Transformer
from transduce.model.attention import MultiHeadAttention, attention_reference, use_kernel
from transduce.train import attention, kernels, native
from transduce.train.attention import use_native_attention
from transduce.train.kernels import attention_choice

needs_compiler = pytest.mark.skipif(
    shutil.which("c++") is None and shutil.which("g++") is None,
    reason="no C++ compiler: training uses the written formula",
)
CPU = torch.device("cpu")


def layer_reference(m: MultiHeadAttention, x, memory, mask, is_causal, grad):
    """The layer's output and the gradients of x, memory and every weight, in float64 autograd with the reference
    formula (its masked and empty rows as model/attention.py defines them)."""
    md = MultiHeadAttention(m.d_model, m.n_heads, self_attention=m.self_attention, d_k=m.d_k).double()
    md.load_state_dict(m.state_dict())
    xd = x.detach().double().requires_grad_()
    memd = None if memory is None else memory.detach().double().requires_grad_()
    if is_causal:
        mask = torch.ones(x.size(1), x.size(1), dtype=torch.bool).tril()
    out = md(xd, memd, mask=mask)
    out.backward(grad.double())
    grads = [xd.grad] + ([] if memd is None else [memd.grad]) + [p.grad for p in md.parameters()]
    return out.detach(), grads


def key_mask(B: int, S: int, lengths: list[int]):
    """(B, 1, 1, S) bool: the first lengths[b] keys of sentence b may be attended; a length 0 masks a whole row."""
    return (torch.arange(S) < torch.tensor(lengths)[:, None])[:, None, None, :]


@needs_compiler
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "kind, d_model, heads, d_k",
    [
        ("self", 64, 4, None),  # d 16: the any-width path
        ("causal", 128, 4, None),  # d 32: a compile-time width
        ("cross", 128, 2, None),  # d 64
        ("self", 48, 2, 8),  # Table 3 row B: d_k 8 < d_v 24
    ],
)
def test_kernel_is_the_formula_forward_and_backward(dtype, kind, d_model, heads, d_k):
    """Output and every gradient (input, memory, weights) against float64 autograd of the reference formula,
    with padded keys, a sentence whose keys are all masked (its rows give zeros), and odd lengths."""
    torch.manual_seed(0)
    m = MultiHeadAttention(d_model, heads, self_attention=kind != "cross", d_k=d_k)
    B, T, S = 4, 7, 9
    x = torch.randn(B, T, d_model, requires_grad=True)
    memory = torch.randn(B, S, d_model, requires_grad=True) if kind == "cross" else None
    mask = None if kind == "causal" else key_mask(B, S if kind == "cross" else T, [5, 7, 0, 3])
    grad = torch.randn(B, T, d_model)
    out_ref, grads_ref = layer_reference(m, x, memory, mask, kind == "causal", grad)
    assert use_native_attention(m) == 1
    m.to(dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        out = m(x.to(dtype) if dtype == torch.float32 else x, memory, mask=mask, is_causal=kind == "causal")
    out.backward(grad.to(out.dtype))
    grads = [x.grad] + ([] if memory is None else [memory.grad]) + [p.grad for p in m.parameters()]
    close(out, out_ref, dtype)
    if mask is not None and kind != "cross":
        assert torch.equal(out[2].float(), torch.zeros_like(out[2].float()) + m.out_proj.bias.float())  # no keys
    for g, g_ref in zip(grads, grads_ref, strict=True):
        close(g, g_ref, dtype)


def close(a: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """fp32: element by element; bf16 (8 bits of mantissa in the projections' inputs and outputs): within 1% of the
    reference's norm, the error of bf16 rounding in both products."""
    if dtype == torch.float32:
        torch.testing.assert_close(a.double(), ref, atol=1e-5, rtol=1e-4)
    else:
        assert (a.double() - ref).norm() <= 1e-2 * ref.norm()


@needs_compiler
def test_kernel_takes_a_broadcast_mask_and_matches_the_written_formula_bit_for_bit_in_fp32_rows():
    """A (T_q, T_k) window mask (Table 3's restricted attention) broadcasts over sentences and heads; the output
    equals the written formula's in fp32 up to rounding, and the weights of each row sum to 1."""
    torch.manual_seed(1)
    m = MultiHeadAttention(32, 2, self_attention=True)
    written = MultiHeadAttention(32, 2, self_attention=True)
    written.load_state_dict(m.state_dict())
    use_kernel(written, "written")
    use_native_attention(m)
    x = torch.randn(3, 6, 32)
    window = (torch.arange(6)[:, None] - torch.arange(6)[None]).abs() <= 1  # (T, T)
    torch.testing.assert_close(m(x, mask=window), written(x, mask=window), atol=1e-6, rtol=1e-5)
    qkv = m.qkv_proj(x)
    _, P = native.extension().attention(qkv, qkv, 0, 32, 64, 2, 16, 16, window.expand(3, 2, 6, 6), False, 0.25)
    torch.testing.assert_close(P.sum(-1), torch.ones(3, 2, 6))
    assert (P[..., ~window] == 0).all()


@needs_compiler
def test_thread_count_does_not_change_the_result():
    torch.manual_seed(2)
    m = MultiHeadAttention(64, 2, self_attention=True)
    use_native_attention(m)
    x = torch.randn(40, 11, 64, requires_grad=True)
    mask = key_mask(40, 11, [11 - i % 7 for i in range(40)])
    results = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            x.grad = None
            out = m(x, mask=mask)
            out.square().sum().backward()
            results.append((out.detach(), x.grad.clone()))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_falls_back_to_the_modules_where_the_kernel_does_not_take(monkeypatch):
    """Dropout on the weights, recorded weights and a missing extension run the module's own path, same result."""
    torch.manual_seed(3)
    m = MultiHeadAttention(16, 2, self_attention=False, dropout=0.0)
    plain = MultiHeadAttention(16, 2, self_attention=False)
    plain.load_state_dict(m.state_dict())
    use_native_attention(m)
    x, memory = torch.randn(2, 3, 16), torch.randn(2, 4, 16)
    monkeypatch.setattr(attention, "extension", lambda: None)
    assert torch.equal(m(x, memory), plain(x, memory))
    m.record, plain.record = [], []
    monkeypatch.undo()
    assert torch.equal(m(x, memory), plain(x, memory)) and len(m.record) == 1
    plain.record = None
    m.record, m.dropout = None, 0.5
    torch.manual_seed(4)
    a = m(x, memory)
    torch.manual_seed(4)
    plain.dropout = 0.5
    assert torch.equal(a, plain(x, memory))
    with pytest.raises(ValueError, match="mask or is_causal"):
        m.dropout = 0.0
        m(x, memory, mask=torch.ones(2, 1, 1, 4, dtype=torch.bool), is_causal=True)


def test_the_choice_and_the_model_settings(monkeypatch):
    """auto on CPU = written (native is asked for by name); native asked where it cannot run is an error naming the
    key; a whole model's attention modules get it and lose it again."""
    monkeypatch.setattr(native, "extension", lambda: object())
    assert attention_choice("auto", CPU).name == "written"
    assert attention_choice("native", CPU).name == "native"
    assert attention_choice("auto", torch.device("cuda")).name == "default"
    with pytest.raises(ConfigError, match="attention_kernel"):
        attention_choice("native", torch.device("cuda"))
    monkeypatch.setattr(native, "extension", lambda: None)
    assert attention_choice("auto", CPU).name == "written"
    with pytest.raises(ConfigError, match="attention_kernel"):
        attention_choice("native", CPU)
    assert kernels.attention_choice is attention_choice
    model = Transformer(ModelConfig.preset("tiny", vocab_size=50))
    n = use_native_attention(model)
    assert n == 2 + 2 * 2  # the encoder's self-attention, the decoder's self- and encoder–decoder attention
    mods = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert len(mods) == n and all(m.fused is not None for m in mods)
    use_native_attention(model, False)
    assert all(m.fused is None for m in mods)


@needs_compiler
def test_a_training_step_with_the_kernel_equals_the_written_formula():
    """A whole model's loss and gradients through TrainingLoss: native equals written in fp32, and in bf16 it is no
    further from that fp32 step than the written formula in bf16 is (its weights stay fp32 where the written
    formula rounds them to bf16)."""
    from transduce.train.loss import SmoothedLoss
    from transduce.train.step import TrainingLoss

    torch.manual_seed(5)
    cfg = ModelConfig.preset("tiny", vocab_size=40, dropout=0.0)  # the runs draw no different masks
    first = Transformer(cfg)
    src = torch.randint(4, 40, (3, 6))
    src[1, 4:] = cfg.pad_id
    tgt = torch.randint(4, 40, (3, 5))
    tgt[2, 3:] = cfg.pad_id
    runs = {}
    for kernel in ("native", "written"):
        for dtype in ("fp32", "bf16"):
            model = Transformer(cfg)
            model.load_state_dict(first.state_dict())
            step = TrainingLoss(model, SmoothedLoss(0.1, cfg.pad_id), CPU, dtype, kernel)
            fused = [m.fused is not None for m in model.modules() if isinstance(m, MultiHeadAttention)]
            assert all(fused) if kernel == "native" else not any(fused)
            loss, _, _ = step(src, tgt)
            loss.backward()
            runs[kernel, dtype] = (loss.detach(), [p.grad for p in model.parameters()])

    def error(run):  # the worst parameter's gradient error against the written fp32 step, relative to its norm
        return max(((g - r).norm() / r.norm()).item() for g, r in zip(run[1], runs["written", "fp32"][1], strict=True))

    torch.testing.assert_close(runs["native", "fp32"][0], runs["written", "fp32"][0])
    assert error(runs["native", "fp32"]) < 1e-4
    torch.testing.assert_close(runs["native", "bf16"][0], runs["written", "fp32"][0], atol=0.05, rtol=1e-3)
    assert error(runs["native", "bf16"]) <= error(runs["written", "bf16"])


def test_reference_oracle_is_the_paper_formula():
    """The oracle above is Eq. 1 (a guard that the comparison is against the paper, not against itself)."""
    q, k, v = torch.randn(1, 1, 2, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    out, w = attention_reference(q, k, v)
    torch.testing.assert_close(out, torch.softmax(q @ k.transpose(-1, -2) / 2, -1) @ v)
