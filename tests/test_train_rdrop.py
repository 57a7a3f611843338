"""R-Drop (train.rdrop_alpha, train/rdrop.py) and the training dtype "auto"."""

from __future__ import annotations

import pytest
import torch

from transduce.model import ModelConfig, Transformer
from transduce.train import step as step_module
from transduce.train.loss import ProjectedSmoothedCrossEntropy, SmoothedLoss
from transduce.train.rdrop import RDrop, projected_rdrop_loss, rdrop_loss
from transduce.train.schedule import Schedule
from transduce.train.step import Stepper, resolve_dtype


def _inputs(seed=0, n=37, d=16, v=50):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(2 * n, d, generator=g, dtype=torch.float64)
    w = torch.randn(v, d, generator=g, dtype=torch.float64)
    y = torch.randint(1, v, (n,), generator=g)
    return h, w, y


@pytest.mark.parametrize("eps,alpha,rows", [(0.1, 2.0, 8), (0.0, 5.0, 64), (0.1, 0.0, 5)])
def test_fused_rdrop_equals_the_autograd_reference(eps, alpha, rows):
    h, w, y = _inputs()
    h1, w1 = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss, nll = rdrop_loss(h1, w1, y, eps, 0, alpha, torch.float64)
    g_h, g_w = torch.autograd.grad(1.7 * loss, (h1, w1))
    h2, w2 = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss2, nll2 = projected_rdrop_loss(h2, w2, y, eps, 0, alpha, torch.float64, rows)
    g_h2, g_w2 = torch.autograd.grad(1.7 * loss2, (h2, w2))
    # the fused blocks are fp32 (as in training); the reference is fp64
    assert loss2.item() == pytest.approx(loss.item(), rel=1e-5)
    assert nll2.item() == pytest.approx(nll.item(), rel=1e-5)
    torch.testing.assert_close(g_h2, g_h, rtol=1e-4, atol=1e-4 * g_h.abs().max().item())
    torch.testing.assert_close(g_w2, g_w, rtol=1e-4, atol=1e-4 * g_w.abs().max().item())


def test_identical_copies_have_no_kl_and_twice_the_plain_loss():
    h, w, y = _inputs(1)
    n = y.size(0)
    same = torch.cat([h[:n], h[:n]])
    loss, nll = projected_rdrop_loss(same, w, y, 0.1, 0, 5.0, torch.float64, 16)
    plain, plain_nll = ProjectedSmoothedCrossEntropy.apply(h[:n], w, y, 0.1, 0, torch.float64, 16)
    assert loss.item() == pytest.approx(2 * plain.item(), rel=1e-6)
    assert nll.item() == pytest.approx(2 * plain_nll.item(), rel=1e-6)
    different, _ = projected_rdrop_loss(h, w, y, 0.1, 0, 5.0, torch.float64, 16)
    without_kl, _ = projected_rdrop_loss(h, w, y, 0.1, 0, 0.0, torch.float64, 16)
    assert different.item() > without_kl.item()  # the symmetric KL of two different copies is positive


def _stepper(alpha: float, dropout: float):
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", vocab_size=40, dropout=dropout)
    model = Transformer(cfg).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, Stepper(
        model,
        opt,
        Schedule("inverse_sqrt", 1, peak_lr=0.1),
        device=torch.device("cpu"),
        objective=RDrop(0.1, alpha) if alpha > 0 else SmoothedLoss(0.1),
    )


class _Batch:
    def __init__(self, src, tgt):
        self.src, self.tgt = src, tgt
        self.tgt_tokens, self.src_tokens = int((tgt[:, 1:] != 0).sum()), int((src != 0).sum())


def test_rdrop_without_dropout_takes_the_plain_update_and_counts_tokens_once():
    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, 40, (3, 7), generator=g)
    tgt = torch.cat([torch.full((3, 1), 2), torch.randint(4, 40, (3, 6), generator=g)], 1)
    tgt[0, 5:] = 0  # padding
    batch = _Batch(src, tgt)
    plain_model, plain = _stepper(0.0, 0.0)
    rdrop_model, rdrop = _stepper(5.0, 0.0)
    a, b = plain.update([batch], 1), rdrop.update([batch], 1)
    assert b.tokens == a.tokens == batch.tgt_tokens  # shown throughput counts each sentence once
    assert b.loss == pytest.approx(a.loss, rel=1e-5) and b.nll == pytest.approx(a.nll, rel=1e-5)
    for p, q in zip(plain_model.parameters(), rdrop_model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)
    # with dropout the two copies differ, and the KL term makes the loss larger than the NLL part alone
    _, noisy = _stepper(5.0, 0.3)
    _, noisy_plain = _stepper(0.0, 0.3)
    assert noisy.update([batch], 1).loss > noisy_plain.update([batch], 1).loss


def test_dtype_auto_picks_bf16_only_where_it_is_native(monkeypatch):
    assert resolve_dtype("fp32", "cpu")[0] == "fp32" and resolve_dtype("bf16", "cpu")[0] == "bf16"
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    dtype, why = resolve_dtype("auto", "cpu")
    assert dtype == "fp32" and "no native bf16" in why
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert resolve_dtype("auto", "cpu")[0] == "bf16"
    assert step_module.native_bf16("cpu")[0]
