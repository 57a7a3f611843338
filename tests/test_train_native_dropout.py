"""The C++ dropout (train/native_dropout.h) against FastDropout's distribution and its own backward pass."""

from __future__ import annotations

import shutil

import pytest
import torch

from transduce.train import dropout
from transduce.train.dropout import FastDropout

pytestmark = pytest.mark.skipif(
    shutil.which("c++") is None and shutil.which("g++") is None,
    reason="no C++ compiler: training uses FastDropout's tensor ops",
)


@pytest.fixture(autouse=True)
def built():
    assert dropout.extension() is not None, "the C++ dropout did not build where a compiler exists"


@pytest.fixture
def native_calls(monkeypatch):
    """Counts the C++ kernel's calls."""
    calls = []
    ext = dropout.extension()

    class Counting:
        def dropout(self, *args):
            calls.append(args[0].shape)
            return ext.dropout(*args)

    monkeypatch.setattr(dropout, "extension", lambda: Counting())
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("p", [0.1, 0.3])
def test_keeps_1_minus_p_scales_survivors_and_backward_uses_the_same_mask(dtype, p, native_calls):
    torch.manual_seed(0)
    x = (torch.rand(1001, 999) + 0.5).to(dtype).requires_grad_()  # no zeros: a zero output means dropped
    y = FastDropout(p).train()(x)
    assert len(native_calls) == 1 and y.dtype == dtype and y.shape == x.shape
    kept = y != 0
    assert kept.float().mean().item() == pytest.approx(1 - p, abs=0.002)
    scale = 1.0 / (1.0 - p)
    expected = torch.where(kept, x.detach().float() * scale, 0.0).to(dtype)  # rounded once, as torch
    assert torch.equal(y, expected)
    y.backward(torch.full_like(y, 2.0))
    assert len(native_calls) == 2
    assert torch.equal(x.grad, torch.where(kept, torch.tensor(2.0 * scale).to(dtype), 0.0).to(dtype))


def test_masks_come_from_torchs_generator(native_calls):
    """Same seed, same mask (a resumed run repeats them); the next call draws a new one. Odd sizes cover the
    last partial 64-bit word and chunk."""
    drop = FastDropout(0.5).train()
    x = torch.ones(3, 1029)
    torch.manual_seed(7)
    a, b = drop(x), drop(x)
    torch.manual_seed(7)
    assert torch.equal(drop(x), a) and not torch.equal(a, b)
    for column in (0, 1, 2, 3):  # each 16-bit lane of a word decides its own element
        assert 0.3 < (a[:, column::4] != 0).float().mean().item() < 0.7


def test_non_contiguous_input_and_eval_mode(native_calls):
    drop = FastDropout(0.2).train()
    x = torch.randn(64, 48).t()  # a transposed view
    y = drop(x)
    assert torch.equal(y != 0, (y != 0) & (x != 0)) and ((y == 0) | torch.isclose(y, x / 0.8)).all()
    assert torch.equal(drop.eval()(x), x) and len(native_calls) == 1


def test_native_false_runs_the_tensor_ops(native_calls):
    """``FastDropout(p, native=False)`` (``train.dropout_kernel = "tensor"``): the tensor ops, same rate."""
    torch.manual_seed(0)
    y = FastDropout(0.3, native=False).train()(torch.ones(100_000))
    assert (y != 0).float().mean().item() == pytest.approx(0.7, abs=0.01) and not native_calls
    model = torch.nn.Sequential(torch.nn.Dropout(0.1), torch.nn.Linear(2, 2), torch.nn.Dropout(0.2))
    assert dropout.use_fast_dropout(model, native=False) == 2
    assert [m.native for m in model if isinstance(m, FastDropout)] == [False, False]
