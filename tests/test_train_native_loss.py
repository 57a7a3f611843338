"""The C++ loss of a block of logit rows (train/native_loss.h) against the tensor-op reference in loss.py."""

from __future__ import annotations

import shutil

import pytest
import torch

from transduce.train import native_loss
from transduce.train.loss import ProjectedSmoothedCrossEntropy
from transduce.train.rdrop import projected_rdrop_loss, rdrop_loss

pytestmark = pytest.mark.skipif(
    shutil.which("c++") is None and shutil.which("g++") is None,
    reason="no C++ compiler: training uses the tensor-op loss",
)


@pytest.fixture(autouse=True)
def built():
    assert native_loss.extension() is not None, "the C++ loss did not build where a compiler exists"


def _inputs(seed=0, n=37, d=16, v=50, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(2 * n, d, generator=g, dtype=dtype)
    w = torch.randn(v, d, generator=g, dtype=dtype)
    y = torch.randint(0, v, (n,), generator=g)
    return h, w, y


def _run(fn, h, w, *args):
    h, w = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss, nll = fn(h, w, *args)
    g_h, g_w = torch.autograd.grad(1.7 * loss, (h, w))
    return loss.item(), nll.item(), g_h, g_w


def _tensor_ops(monkeypatch):
    monkeypatch.setattr(native_loss, "applies", lambda *blocks: False)


@pytest.mark.parametrize("eps,alpha,rows,pad", [(0.1, 2.0, 8, 0), (0.0, 5.0, 64, 3), (0.1, 0.0, 5, 49)])
def test_rdrop_block_equals_the_fp64_autograd_reference(eps, alpha, rows, pad, monkeypatch):
    h, w, y = _inputs()
    y[0], y[1] = 0, 49  # gold at the first and last column
    y[y == pad] = (pad + 1) % 50  # labels are never pad
    ref = _run(lambda a, b: rdrop_loss(a, b, y, eps, pad, alpha, torch.float64), h.double(), w.double())
    calls, real = [], native_loss.rdrop_block_
    monkeypatch.setattr(native_loss, "rdrop_block_", lambda *args: calls.append(1) or real(*args))
    got = _run(lambda a, b: projected_rdrop_loss(a, b, y, eps, pad, alpha, torch.float32, rows), h, w)
    assert len(calls) == -(-y.numel() // rows), "the fp32 CPU loss did not go through the C++ block"
    assert got[0] == pytest.approx(ref[0], rel=1e-5)
    assert got[1] == pytest.approx(ref[1], rel=1e-5)
    for mine, theirs in zip(got[2:], ref[2:]):
        torch.testing.assert_close(mine.double(), theirs, rtol=1e-4, atol=1e-5 * theirs.abs().max().item())


@pytest.mark.parametrize("eps,pad", [(0.1, 0), (0.0, 7), (0.2, 49)])
def test_smoothed_block_equals_the_tensor_ops(eps, pad, monkeypatch):
    h, w, y = _inputs(1)
    y = torch.cat([y, y])
    y[y == pad] = (pad + 1) % 50
    args = (y, eps, pad, torch.float32, 16)
    got = _run(ProjectedSmoothedCrossEntropy.apply, h, w, *args)
    _tensor_ops(monkeypatch)
    ref = _run(ProjectedSmoothedCrossEntropy.apply, h.double(), w.double(), y, eps, pad, torch.float64, 16)
    assert got[0] == pytest.approx(ref[0], rel=1e-5)
    assert got[1] == pytest.approx(ref[1], rel=1e-5)
    for mine, theirs in zip(got[2:], ref[2:]):
        torch.testing.assert_close(mine.double(), theirs, rtol=1e-4, atol=1e-5 * theirs.abs().max().item())


def test_bf16_matches_the_tensor_ops_in_bf16(monkeypatch):
    """Training's case: bf16 logits, fp32 arithmetic, bf16 gradients; a realistic vocabulary size."""
    h, w, y = _inputs(2, n=70, d=32, v=3000)
    w = w * 0.3
    got = _run(lambda a, b: projected_rdrop_loss(a, b, y, 0.1, 0, 2.0, torch.bfloat16, 32), h, w)
    _tensor_ops(monkeypatch)
    ref = _run(lambda a, b: projected_rdrop_loss(a, b, y, 0.1, 0, 2.0, torch.bfloat16, 32), h, w)
    assert got[0] == pytest.approx(ref[0], rel=1e-5)
    assert got[1] == pytest.approx(ref[1], rel=1e-5)
    for mine, theirs in zip(got[2:], ref[2:]):  # the (N, V) gradients are bf16: a rounding step apart at most
        torch.testing.assert_close(mine, theirs, rtol=2e-2, atol=1e-2 * theirs.abs().max().item())


def test_without_gradients_the_loss_is_the_same():
    h, w, y = _inputs(3)
    with_grad = _run(lambda a, b: projected_rdrop_loss(a, b, y, 0.1, 0, 2.0, torch.float32, 8), h, w)
    with torch.no_grad():
        loss, nll = projected_rdrop_loss(h, w, y, 0.1, 0, 2.0, torch.float32, 8)
    assert loss.item() == pytest.approx(with_grad[0], rel=1e-6)
    assert nll.item() == pytest.approx(with_grad[1], rel=1e-6)


def test_a_nan_logit_makes_the_loss_non_finite():
    """The trainer skips an update whose loss is not finite; the kernel must not hide a NaN."""
    h, w, y = _inputs(4)
    h[5, 3] = float("nan")
    loss, nll = projected_rdrop_loss(h, w, y, 0.1, 0, 2.0, torch.float32, 8)
    assert not torch.isfinite(loss)
    plain, _ = ProjectedSmoothedCrossEntropy.apply(h, w, torch.cat([y, y]), 0.1, 0, torch.float32, 8)
    assert not torch.isfinite(plain)


def test_bad_blocks_are_refused():
    ext = native_loss.extension()
    y = torch.zeros(4, dtype=torch.long)
    with pytest.raises(RuntimeError, match="fp32 or bf16"):
        ext.smoothed_block_(torch.zeros(4, 10, dtype=torch.float64), y, 0.1, 0, True)
    with pytest.raises(RuntimeError, match="contiguous"):
        ext.smoothed_block_(torch.zeros(10, 4).t(), y, 0.1, 0, True)
    with pytest.raises(RuntimeError, match="labels"):
        ext.rdrop_block_(torch.zeros(4, 10), torch.zeros(4, 10), y[:3], 0.1, 0, 1.0, True)


def test_the_tensor_loss_is_chosen_by_argument_not_by_process_state():
    """``native=False`` (``train.loss_kernel = "tensor"``) runs the tensor ops; the result is the same."""
    torch.manual_seed(0)
    h, w, y = torch.randn(50, 8), torch.randn(30, 8), torch.randint(1, 30, (50,))
    calls = []
    real = native_loss.smoothed_block_
    try:
        native_loss.smoothed_block_ = lambda *a: calls.append(1) or real(*a)
        ours = ProjectedSmoothedCrossEntropy.apply(h, w, y, 0.1, 0, torch.float32, 16, True)
        assert calls
        calls.clear()
        tensor = ProjectedSmoothedCrossEntropy.apply(h, w, y, 0.1, 0, torch.float32, 16, False)
        assert not calls
    finally:
        native_loss.smoothed_block_ = real
    torch.testing.assert_close(ours, tensor)
