"""R-Drop (train.rdrop_alpha) and the training dtype "auto"."""

from __future__ import annotations

import pytest
import torch

from transduce.config import ConfigError
from transduce.model import ModelConfig, Transformer
from transduce.train import step as step_module
from transduce.train.config import load_config
from transduce.train.loss import ProjectedPairLoss, ProjectedSmoothedCrossEntropy, projected_rdrop_loss, rdrop_loss
from transduce.train.schedule import Schedule
from transduce.train.step import Stepper, resolve_dtype

from test_train_run import data_dir, train_in_process, write_config  # noqa: F401


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
    return model, Stepper(model, opt, Schedule("inverse_sqrt", 1, peak_lr=0.1), device=torch.device("cpu"),
                          rdrop_alpha=alpha)


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


def test_rdrop_from_takes_plain_updates_until_its_fraction_then_rdrop_ones():
    g = torch.Generator().manual_seed(4)
    src = torch.randint(4, 40, (3, 7), generator=g)
    tgt = torch.cat([torch.full((3, 1), 2), torch.randint(4, 40, (3, 6), generator=g)], 1)
    batch = _Batch(src, tgt)
    _, plain = _stepper(0.0, 0.3)
    rdrop_model, rdrop = _stepper(5.0, 0.3)
    held_model, held = _stepper(5.0, 0.3)
    held.rdrop_from = 0.5
    torch.manual_seed(7)
    want = plain.update([batch], 1, progress=0.2)
    torch.manual_seed(7)
    got = held.update([batch], 1, progress=0.2)
    assert held.loss.copies == 1 and (got.loss, got.nll, got.tokens) == (want.loss, want.nll, want.tokens)
    rdrop_model.load_state_dict(held_model.state_dict())  # SGD keeps no state: the same starting point
    torch.manual_seed(8)
    want = rdrop.update([batch], 2, progress=0.5)
    torch.manual_seed(8)
    got = held.update([batch], 2, progress=0.5)  # from 0.5 on: two copies and the KL term
    assert held.loss.copies == 2 and (got.loss, got.nll, got.tokens) == (want.loss, want.nll, want.tokens)
    held_model.eval()
    assert held.loss.copies == 1  # evaluation scores one copy either way


def test_rdrop_from_is_checked_and_its_switch_is_logged(data_dir, tmp_path, capsys):  # noqa: F811
    config = write_config(tmp_path / "c.toml", data_dir, tmp_path / "run", rdrop_alpha=1.0, rdrop_from=0.5)
    with pytest.raises(ConfigError, match=r"key 'rdrop_from': must be a fraction of the budget in \[0, 1\)"):
        load_config(config, ["rdrop_from=1.0"])
    with pytest.raises(ConfigError, match="key 'rdrop_from'.*set rdrop_alpha > 0"):
        load_config(config, ["rdrop_alpha=0.0"])
    train_in_process(config)
    out = capsys.readouterr().out
    assert "R-Drop waits until 50% of the budget" in out
    assert "update 5 (50.0% of the budget): R-Drop from here" in out  # 4 of 8 updates done


def test_cutoff_mask_spares_the_first_copy_and_padding():
    torch.manual_seed(0)
    ids = torch.randint(1, 40, (2 * 400, 30))
    ids[:, 25:] = 0  # padding
    torch.manual_seed(1)
    cut = step_module.cutoff_mask(ids, 400, 0.25, pad_id=0)
    assert cut.shape == ids.shape and cut.dtype == torch.bool
    assert not cut[:400].any() and not cut[:, 25:].any()
    rate = cut[400:, :25].float().mean().item()  # 10,000 draws: the standard error is 0.004
    assert rate == pytest.approx(0.25, abs=0.02)
    torch.manual_seed(1)
    assert torch.equal(step_module.cutoff_mask(ids, 400, 0.25, pad_id=0), cut)  # seeded: the same choice


def test_a_cut_token_keeps_its_position_encoding_alone():
    torch.manual_seed(0)
    model = Transformer(ModelConfig.preset("tiny", vocab_size=40, dropout=0.0)).eval()
    ids = torch.randint(4, 40, (2, 6))
    cut = torch.zeros(2, 6, dtype=torch.bool)
    cut[0, 2] = cut[1, 0] = True
    plain, cutoff = model.src_embed(ids), model.src_embed(ids, cut=cut)
    positions = model.src_embed.positions(6)  # (6, d_model)
    torch.testing.assert_close(cutoff[0, 2], positions[2])
    torch.testing.assert_close(cutoff[1, 0], positions[0])
    torch.testing.assert_close(cutoff[~cut], plain[~cut])  # every other position as before


def test_cutoff_makes_the_copies_differ_without_dropout():
    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, 40, (3, 7), generator=g)
    tgt = torch.cat([torch.full((3, 1), 2), torch.randint(4, 40, (3, 6), generator=g)], 1)
    batch = _Batch(src, tgt)
    _, rdrop = _stepper(5.0, 0.0)  # no dropout: identical copies, so no KL
    _, simcut = _stepper(5.0, 0.0)
    simcut.loss.cutoff = 0.3
    torch.manual_seed(5)
    same, cut = rdrop.update([batch], 1), simcut.update([batch], 1)
    assert cut.tokens == same.tokens
    assert cut.loss > same.loss  # the cut copy predicts otherwise: its loss and the KL term rise
    with pytest.raises(ValueError, match="needs rdrop_alpha > 0"):
        step_module.TrainingLoss(Transformer(ModelConfig.preset("tiny", vocab_size=40)), torch.device("cpu"),
                                 "fp32", 0.1, 0, cutoff=0.1)


def test_cutoff_is_checked_and_logged(data_dir, tmp_path, capsys):  # noqa: F811
    config = write_config(tmp_path / "c.toml", data_dir, tmp_path / "run", rdrop_alpha=1.0, cutoff=0.1, max_steps=2)
    with pytest.raises(ConfigError, match=r"key 'cutoff': must be a probability in \[0, 1\)"):
        load_config(config, ["cutoff=1.0"])
    with pytest.raises(ConfigError, match="key 'cutoff'.*set rdrop_alpha > 0"):
        load_config(config, ["rdrop_alpha=0.0"])
    train_in_process(config)
    assert "R-Drop's second copy loses 10% of its source and decoder-input token embeddings" in capsys.readouterr().out
