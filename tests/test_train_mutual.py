"""Mutual learning (train.mutual_alpha): two models trained side by side on each batch, each with its
smoothed loss plus α times their symmetric KL; checkpoints, resume, averaging and the recipe's ensembles."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file

from test_recipe import raw, write_recipe  # noqa: F401  (the module-scoped fixture)
from test_train_rdrop import _Batch
from test_train_run import data_dir, metrics, train_in_process, write_config  # noqa: F401
from transduce.config import ConfigError
from transduce.model import ModelConfig, Transformer
from transduce.recipe import load_recipe, run_recipe
from transduce.train.average import average
from transduce.train.config import load_config
from transduce.train.loss import ProjectedPairLoss
from transduce.train.schedule import Schedule
from transduce.train.step import Stepper


def _pair_reference(h1, w1, h2, w2, y, eps, alpha):
    """The pair loss written with autograd over full log-probabilities (fp64)."""
    u = eps / (w1.size(0) - 1)
    loss = h1.new_zeros(())
    logps = [torch.log_softmax(h @ w.t(), -1) for h, w in ((h1, w1), (h2, w2))]  # (N, V) each
    for lp in logps:
        loss = loss - ((1 - eps) * lp.gather(-1, y[:, None]).squeeze(-1) + u * (lp.sum(-1) - lp[:, 0])).sum()
    p1, p2 = logps
    kl = 0.5 * ((p1.exp() * (p1 - p2)).sum() + (p2.exp() * (p2 - p1)).sum())
    return loss + alpha * kl


@pytest.mark.parametrize("eps,alpha,rows", [(0.1, 2.0, 8), (0.0, 1.0, 64)])
def test_pair_loss_with_two_projections_equals_the_autograd_reference(eps, alpha, rows):
    g = torch.Generator().manual_seed(5)
    n, d, v = 29, 12, 40
    inputs = [torch.randn(*shape, generator=g, dtype=torch.float64) for shape in ((n, d), (v, d), (n, d), (v, d))]
    y = torch.randint(1, v, (n,), generator=g)
    ref_in = [t.clone().requires_grad_() for t in inputs]
    ref_grads = torch.autograd.grad(0.3 * _pair_reference(*ref_in, y, eps, alpha), ref_in)
    got_in = [t.clone().requires_grad_() for t in inputs]
    loss, _ = ProjectedPairLoss.apply(*got_in, y, eps, 0, alpha, torch.float64, rows)
    got_grads = torch.autograd.grad(0.3 * loss, got_in)
    assert loss.item() == pytest.approx(_pair_reference(*inputs, y, eps, alpha).item(), rel=1e-5)
    for got, ref in zip(got_grads, ref_grads):  # fp32 blocks against the fp64 reference
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())


def _batch():
    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, 40, (3, 7), generator=g)
    tgt = torch.cat([torch.full((3, 1), 2), torch.randint(4, 40, (3, 6), generator=g)], 1)
    tgt[1, 4:] = 0  # padding
    return _Batch(src, tgt)


def _models(same_peer: bool):
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", vocab_size=40, dropout=0.0)
    model = Transformer(cfg).train()
    peer = copy.deepcopy(model) if same_peer else Transformer(cfg).train()
    return model, peer


def test_a_peer_equal_to_the_model_takes_the_plain_update_and_tokens_count_once():
    batch = _batch()
    plain_model, _ = _models(True)
    plain = Stepper(plain_model, torch.optim.SGD(plain_model.parameters(), lr=0.1),
                    Schedule("inverse_sqrt", 1, peak_lr=0.1), device=torch.device("cpu"))
    model, peer = _models(True)
    params = list(model.parameters()) + list(peer.parameters())
    mutual = Stepper(model, torch.optim.SGD(params, lr=0.1), Schedule("inverse_sqrt", 1, peak_lr=0.1),
                     device=torch.device("cpu"), peer=peer, mutual_alpha=3.0)
    a, b = plain.update([batch], 1), mutual.update([batch], 1)
    assert b.tokens == a.tokens == batch.tgt_tokens
    assert b.loss == pytest.approx(a.loss, rel=1e-5)  # no KL between equal models, and the mean of two equals
    for p, q, r in zip(plain_model.parameters(), model.parameters(), peer.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(r, p, rtol=1e-5, atol=1e-6)
    # two differently initialised peers disagree: the KL term raises the loss above α = 0's
    losses = []
    for alpha in (0.0, 3.0):
        model, peer = _models(False)
        params = list(model.parameters()) + list(peer.parameters())
        stepper = Stepper(model, torch.optim.SGD(params, lr=0.1), Schedule("inverse_sqrt", 1, peak_lr=0.1),
                          device=torch.device("cpu"), peer=peer, mutual_alpha=alpha)
        losses.append(stepper.update([batch], 1).loss)
    assert losses[1] > losses[0]


def test_config_rejects_mutual_learning_with_rdrop_or_a_dropout_ramp(data_dir, tmp_path):  # noqa: F811
    config = write_config(tmp_path / "c.toml", data_dir, tmp_path / "run", mutual_alpha=1.0)
    with pytest.raises(ConfigError, match="mutual_alpha.*rdrop_alpha"):
        load_config(config, ["rdrop_alpha=1.0"])
    with pytest.raises(ConfigError, match="mutual_alpha.*dropout_ramp"):
        load_config(config, ["dropout_ramp=[0.1, 0.2]"])
    with pytest.raises(ConfigError, match="mutual_alpha"):
        load_config(config, ["mutual_alpha=-1.0"])


def test_a_mutual_run_saves_both_models_resumes_bit_identically_and_averages_the_peer(data_dir, tmp_path):  # noqa: F811
    ref = train_in_process(write_config(tmp_path / "ref.toml", data_dir, tmp_path / "ref", mutual_alpha=1.0,
                                        validate_every=4))
    step4 = tmp_path / "ref/checkpoints/step_00000004"
    model, peer = load_file(str(step4 / "model.safetensors")), load_file(str(step4 / "peer.safetensors"))
    assert model.keys() == peer.keys() and not all(torch.equal(model[k], peer[k]) for k in model)
    assert (tmp_path / "ref/peer-model/model.safetensors").is_file()
    assert all("peer_valid_ppl" in r for r in metrics(tmp_path / "ref", "valid"))
    # four updates, then --resume to eight: the same weights, both models, and the same optimizer state
    half = write_config(tmp_path / "half.toml", data_dir, tmp_path / "half", mutual_alpha=1.0, validate_every=4,
                        max_steps=4)
    train_in_process(half)
    train_in_process(half, resume=True, overrides=["max_steps=8"])
    for name in ("model.safetensors", "peer.safetensors", "optimizer.safetensors"):
        want = load_file(str(tmp_path / "ref/checkpoints/step_00000008" / name))
        got = load_file(str(tmp_path / "half/checkpoints/step_00000008" / name))
        assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want), name
    out = average(tmp_path / "ref", 3, tmp_path / "avg-peer", peer=True)
    found = [tmp_path / "ref/checkpoints" / f"step_0000000{i}" for i in (4, 6, 8)]
    tensors = [load_file(str(p / "peer.safetensors")) for p in found]
    averaged = load_file(str(out / "model.safetensors"))
    for name, value in tensors[0].items():
        assert torch.equal(averaged[name], torch.stack([t[name].double() for t in tensors]).mean(0).float()), name
    assert ref.peer is not None


def test_a_mutual_recipe_under_torchrun_scores_both_ensembles_and_keeps_the_chosen_pair(raw, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    path = write_recipe(tmp_path / "r.toml", raw, out, 2)
    results = run_recipe(load_recipe(path, ["train.mutual_alpha=1.0", "train.subword_dropout=0.0"]))
    saved = json.loads((out / "results.json").read_text())
    assert set(saved["scores"]) == {"final", "averaged", "final pair", "averaged pair"}
    valid = {name: s["valid"]["bleu"] for name, s in saved["scores"].items()}
    chosen = saved["chosen"]
    assert valid[chosen] == max(valid.values()) and results["chosen"] == chosen
    assert list((out / "run/checkpoints").glob("step_*/peer.safetensors"))
    assert (out / "peer-model").is_dir() == chosen.endswith("pair") == ("ensemble" in saved)
    assert (out / "averaged-peer" / "model.safetensors").is_file()
