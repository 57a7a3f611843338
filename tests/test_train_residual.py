"""The C++ sub-layer connection (train/native_residual.h, train/residual.py) against LayerNorm(x + Dropout(y))."""

from __future__ import annotations

import shutil
import warnings

import pytest
import torch
import torch.nn.functional as F

from transduce.config import ConfigError
from transduce.fastpaths import Choice
from transduce.model import ModelConfig, Transformer
from transduce.model.layers import Residual
from transduce.train import residual
from transduce.train.dropout import FastDropout, use_fast_dropout
from transduce.train.kernels import residual_choice
from transduce.train.native import extension
from transduce.train.residual import use_native_residual

needs_compiler = pytest.mark.skipif(
    shutil.which("c++") is None and shutil.which("g++") is None,
    reason="no C++ compiler: training uses the modules",
)


def reference(x, y, weight, bias, factors, grad):
    """z and the four gradients in float64 autograd: LayerNorm(x + y · factors)."""
    leaves = [t.detach().double().requires_grad_() for t in (x, y, weight, bias)]
    xd, yd, wd, bd = leaves
    z = F.layer_norm(xd + yd * factors.double(), (x.size(-1),), wd, bd, 1e-6)
    z.backward(grad.double())
    return z.detach(), [t.grad for t in leaves]


@needs_compiler
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_kernel_is_layer_norm_of_x_plus_dropped_y(dtype, p):
    """Odd sizes: rows not a multiple of the 64-row blocks, d not a multiple of the 4 lanes of a random word."""
    torch.manual_seed(0)
    rows, d = 131, 46
    x, y = torch.randn(rows, d), torch.randn(rows, d).to(dtype)
    weight, bias, grad = torch.rand(d) + 0.5, torch.randn(d), torch.randn(rows, d)
    seed, threshold, scale = 12345, round(p * 32768), 1 / (1 - p)
    z, xhat, rstd = extension().residual_norm(x, y, weight, bias, 1e-6, seed, threshold, scale)
    factors = extension().dropout(torch.ones(rows, d), seed, threshold, scale)  # the C++ dropout's mask · scale
    if p > 0:
        assert (factors == 0).float().mean().item() == pytest.approx(p, abs=0.02)
    z_ref, grads_ref = reference(x, y, weight, bias, factors, grad)
    torch.testing.assert_close(z.double(), z_ref, atol=2e-5, rtol=1e-5)
    dx, dy, dweight, dbias = extension().residual_norm_backward(
        grad, xhat, rstd, weight, seed, threshold, scale, dtype == torch.bfloat16
    )
    assert dy.dtype == dtype and dx.dtype == torch.float32
    tolerance = dict(atol=1e-2, rtol=1e-2) if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dx.double(), grads_ref[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dy.double(), grads_ref[1], **tolerance)
    torch.testing.assert_close(dweight.double(), grads_ref[2], atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(dbias.double(), grads_ref[3], atol=1e-3, rtol=1e-4)
    assert torch.equal(dy == 0, (factors == 0) | (dx == 0))  # dropped elements get no gradient


@needs_compiler
def test_column_sums_do_not_depend_on_the_thread_count():
    torch.manual_seed(1)
    rows, d = 1000, 64
    g, xhat, rstd, weight = torch.randn(rows, d), torch.randn(rows, d), torch.rand(rows) + 0.5, torch.randn(d)
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2):
            torch.set_num_threads(n)
            results.append(extension().residual_norm_backward(g, xhat, rstd, weight, 7, 3277, 1 / 0.9, False))
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*results):
        assert torch.equal(a, b)


def pair(norm: str = "post", d: int = 32):
    """Two identical connections with the C++ dropout, the second given the fused kernel."""
    torch.manual_seed(0)
    a, b = Residual(d, 0.3, norm, 1e-6), Residual(d, 0.3, norm, 1e-6)
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        a.norm.weight.uniform_(0.5, 1.5)
        a.norm.bias.normal_()
    b.load_state_dict(a.state_dict())
    for m in (a, b):
        use_fast_dropout(m)
    return a, b


@needs_compiler
@pytest.mark.parametrize("autocast", [False, True])
def test_a_connection_with_the_kernel_matches_the_modules_and_draws_the_same_masks(autocast):
    """With the C++ dropout on both sides, one seed from torch's generator per call on both: the same masks.
    Under bf16 autocast the sub-layer's output is bf16, as in a training step."""
    a, b = pair()
    use_native_residual(b)
    w = torch.randn(32, 32)
    outs, grads, states = [], [], []
    for m in (a, b):
        torch.manual_seed(5)
        x = torch.randn(4, 7, 32, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            z = m(x, lambda h: h @ w)  # a sub-layer: bf16 under autocast
        states.append(torch.get_rng_state())  # as many draws from torch's generator: a resumed run repeats them
        z.backward(torch.linspace(-1, 1, z.numel()).view_as(z))
        outs.append(z)
        grads.append([x.grad, m.norm.weight.grad, m.norm.bias.grad])
    assert outs[1].dtype == outs[0].dtype == torch.float32 and torch.equal(states[0], states[1])
    # the modules round the dropped-and-scaled bf16 output to bf16 once more; the kernel scales in fp32
    tolerance = dict(atol=3e-2, rtol=3e-2) if autocast else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[1], outs[0], **tolerance)
    for got, want in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, want, **tolerance)


@needs_compiler
def test_the_kernel_runs_in_training_only_and_follows_the_dropout_rate(monkeypatch):
    calls = []
    kernel = residual._ResidualNorm.apply
    monkeypatch.setattr(residual._ResidualNorm, "apply", lambda *args: calls.append(args[-1]) or kernel(*args))
    _, b = pair()
    use_native_residual(b)
    x = torch.randn(2, 3, 32)
    b.eval()(x, lambda h: h)
    assert calls == []
    b.train()
    b.dropout.p = 0.0  # late dropout (train/dropout.py) sets the rate on the module
    z = b(x, lambda h: h)
    assert calls == [0.0]
    torch.testing.assert_close(z, F.layer_norm(2 * x, (32,), b.norm.weight, b.norm.bias, 1e-6))


def test_only_post_norm_connections_take_the_kernel():
    tiny = dict(vocab_size=50, encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, n_heads=2)
    assert use_native_residual(Transformer(ModelConfig(**tiny))) == 5  # 2 in the encoder layer, 3 in the decoder's
    assert use_native_residual(Transformer(ModelConfig(**tiny, norm="pre"))) == 0


def test_what_the_kernel_does_not_take_goes_through_the_modules(monkeypatch):
    """In training, each of: an fp64 stream, an fp16 or strided sub-layer output, a dropout that is not the C++ one
    (its mask and draws differ), a norm without an affine part."""
    monkeypatch.setattr(residual, "extension", lambda: pytest.fail("the kernel was called"))
    a, _ = pair()
    norm, drop = a.norm, a.dropout.train()
    x = torch.randn(2, 3, 32)
    cases = [
        (x.double(), x.double(), torch.nn.LayerNorm(32).double(), drop),
        (x, x.half(), norm, drop),
        (x, torch.randn(2, 32, 3).transpose(1, 2), norm, drop),
        (x, x, norm, torch.nn.Dropout(0.3)),
        (x, x, norm, FastDropout(0.3, native=False)),
        (x, x, torch.nn.LayerNorm(32, elementwise_affine=False), drop),
    ]
    for stream, y, n, d in cases:
        assert residual.residual_norm(stream, y, n, d.train()).shape == stream.shape
    drop.p = 0.0  # the modules' result, exactly
    torch.testing.assert_close(residual.residual_norm(x, x.half(), norm, drop), norm(x + x.half()))


def test_the_choice_follows_the_dropout():
    native, tensor = Choice("native", "C++"), Choice("tensor", "asked")
    assert residual_choice("auto", native).name == "native"
    assert residual_choice("tensor", native).name == "tensor"
    assert residual_choice("auto", tensor).name == "tensor"
    with pytest.raises(ConfigError, match="residual_kernel"):
        residual_choice("native", tensor)


def test_a_compiler_without_openmp_still_builds_the_kernels(monkeypatch):
    """Apple's clang has no -fopenmp: the training kernels are built without it, with no warning about the first try."""
    from transduce.train import native

    def build(name, source, what, fallback, headers, flags, ldflags=()):
        if "-fopenmp" in flags:
            warnings.warn("no OpenMP", RuntimeWarning)
            return None
        return "built"

    monkeypatch.setattr(native, "build", build)
    native.extension.cache_clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert native.extension() == "built"
    finally:
        native.extension.cache_clear()
