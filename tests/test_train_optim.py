"""train/optim.py: which parameters Muon takes, one step against torch's own optimisers, checkpoint resume."""

from __future__ import annotations

import pytest
import torch

from transduce.config import ConfigError, build
from transduce.model import ModelConfig, Transformer
from transduce.train import checkpoint as ckpt
from transduce.train.config import TrainConfig
from transduce.train.distributed import Dist
from transduce.train.muon import MuonAdamW, muon_parameter, orthogonalize, orthogonalize_shared
from transduce.train.optim import build_optimizer
from transduce.train.schedule import set_lr


def tiny_model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig.preset("small", vocab_size=50, encoder_layers=2, decoder_layers=1))


def fake_grads(model: Transformer, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)


def test_muon_takes_the_layers_matrices_and_adamw_the_rest():
    model = tiny_model()
    muon = {n for n, p in model.named_parameters() if muon_parameter(n, p)}
    # per encoder layer: qkv, out, w1, w2; per decoder layer: qkv, out, q, kv, out, w1, w2
    assert len(muon) == 2 * 4 + 1 * 7
    assert "encoder.layers.0.self_attn.qkv_proj.weight" in muon
    assert "decoder.layers.0.cross_attn.kv_proj.weight" in muon
    assert not any("embed" in n or n.endswith(".bias") or ".norm." in n for n in muon)
    assert "src_embed.token.weight" not in muon  # the shared embedding is the output projection too


@pytest.mark.slow
def test_one_step_is_torch_muon_on_matrices_and_adamw_elsewhere():
    model, reference = tiny_model(), tiny_model()
    cfg = TrainConfig(data="d", out="o", optimizer="muon", weight_decay=0.01)
    opt = build_optimizer(model.named_parameters(), cfg)
    assert isinstance(opt, MuonAdamW)
    named = list(reference.named_parameters())
    ref_muon = torch.optim.Muon(
        [p for n, p in named if muon_parameter(n, p)],
        lr=0.004,
        weight_decay=0.01,
        momentum=0.95,
        nesterov=True,
        adjust_lr_fn="match_rms_adamw",
    )
    ref_adam = torch.optim.AdamW(
        [p for n, p in named if not muon_parameter(n, p)], lr=0.004, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.01
    )
    for step in range(2):
        fake_grads(model, step)
        fake_grads(reference, step)
        set_lr(opt, 0.004)  # the schedule writes one rate into both halves
        opt.step()
        ref_muon.step()
        ref_adam.step()
    for (name, p), q, p0 in zip(model.named_parameters(), reference.parameters(), tiny_model().parameters()):
        if muon_parameter(name, p):  # torch orthogonalizes in bf16, this module in fp32: within bf16's error
            ours, torchs = p - p0, q - p0
            assert (ours - torchs).norm() < 0.03 * torchs.norm(), name
        else:
            torch.testing.assert_close(p, q, msg=name)
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), tiny_model().parameters()))


@pytest.mark.parametrize("host", [True, False], ids=["read-on-host", "masked-on-device"])
def test_a_flagged_update_changes_nothing_and_an_unflagged_one_is_a_plain_step(monkeypatch, host):
    """found_inf = 1 (the loss was not finite): weights and momentum stay bit for bit, NaN gradients and all;
    found_inf = 0: the same step as without the flag. Both ways: the flag read on the host (a CPU's) and the
    update masked on the device (a GPU's, here forced on the CPU)."""
    monkeypatch.setattr(MuonAdamW, "reads_flag_on_host", staticmethod(lambda flag: host))
    cfg = TrainConfig(data="d", out="o", optimizer="muon", weight_decay=0.1)
    flagged, plain = tiny_model(), tiny_model()
    opts = [build_optimizer(m.named_parameters(), cfg) for m in (flagged, plain)]
    for step in range(2):  # momentum buffers exist after the first
        for m, opt, flag in zip((flagged, plain), opts, (0.0, None)):
            fake_grads(m, step)
            set_lr(opt, 0.004)
            if flag is not None:
                opt.found_inf = torch.tensor(flag)
            opt.step()
            opt.__dict__.pop("found_inf", None)
    for p, q in zip(flagged.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-7)
    before = [p.detach().clone() for p in flagged.parameters()]
    buffers = {k: v["momentum_buffer"].clone() for k, v in opts[0].state.items() if "momentum_buffer" in v}
    for p in flagged.parameters():
        p.grad = torch.full_like(p, float("nan"))
    opts[0].found_inf = torch.tensor(1.0)
    opts[0].step()
    assert all(torch.equal(p, b) for p, b in zip(flagged.parameters(), before))
    assert all(torch.equal(opts[0].state[k]["momentum_buffer"], v) for k, v in buffers.items())


def test_orthogonalize_flattens_the_singular_values_in_fp32():
    g = torch.randn(384, 128, generator=torch.Generator().manual_seed(0))
    g[:, 0] *= 100  # one dominant direction, which plain momentum would follow
    out = orthogonalize(g)
    assert out.dtype == torch.float32 and out.shape == g.shape
    s = torch.linalg.svdvals(out)
    assert s.min() > 0.5 and s.max() < 1.3, s
    # the same directions: U V^T from the SVD lies close to the iteration's result
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    assert torch.nn.functional.cosine_similarity((u @ vh).flatten(), out.flatten(), dim=0) > 0.95


def test_orthogonalize_in_bf16_is_the_fp32_result_within_bf16s_error():
    g = torch.Generator().manual_seed(2)
    stack = torch.randn(3, 384, 128, generator=g)  # tall: iterated on the transpose
    exact, fast = orthogonalize(stack), orthogonalize(stack, dtype=torch.bfloat16)
    assert fast.dtype == torch.float32 and fast.shape == stack.shape
    assert (fast - exact).norm() < 0.03 * exact.norm()
    assert not torch.equal(fast, exact)  # bf16 arithmetic ran, not fp32


def test_muon_runs_its_iterations_in_the_dtype_it_is_given(monkeypatch):
    from transduce.train import muon

    seen, real = [], muon.orthogonalize
    monkeypatch.setattr(muon, "orthogonalize", lambda u, dtype: seen.append(dtype) or real(u, dtype=dtype))
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        model = tiny_model()
        fake_grads(model, 0)
        opt = build_optimizer(model.named_parameters(), TrainConfig(data="d", out="o", optimizer="muon"), None, name)
        set_lr(opt, 0.003)
        opt.step()
        assert seen and set(seen) == {dtype}, name
        seen.clear()


def test_stacks_by_shape_give_each_matrix_its_own_result():
    g = torch.Generator().manual_seed(1)
    updates = [torch.randn(shape, generator=g) for shape in [(384, 128), (128, 128), (384, 128), (128, 256)]]
    for u, got in zip(updates, orthogonalize_shared(updates, Dist())):
        torch.testing.assert_close(got, orthogonalize(u), rtol=1e-5, atol=1e-6)


def steps(model: Transformer, opt: torch.optim.Optimizer, first: int, last: int) -> None:
    for step in range(first, last):
        fake_grads(model, step)
        set_lr(opt, 0.003)
        opt.step()


@pytest.mark.parametrize("optimizer", ["adam", "muon"])
def test_decay_scope_matrices_leaves_biases_and_norm_gains_alone(optimizer):
    """With zero gradients only weight decay moves a parameter: under "matrices" every matrix and the
    embedding shrinks and no bias or norm gain moves; under "all" they all shrink."""
    for scope in ("all", "matrices"):
        model = tiny_model()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        cfg = build(
            TrainConfig,
            {"data": "d", "out": "o", "optimizer": optimizer, "weight_decay": 0.5, "weight_decay_scope": scope},
        )
        opt = build_optimizer(model.named_parameters(), cfg)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        set_lr(opt, 0.1)
        opt.step()
        for n, p in model.named_parameters():
            shrunk = before[n] * (1 - 0.1 * 0.5)
            if p.ndim >= 2 or scope == "all":
                torch.testing.assert_close(p, shrunk, msg=f"{scope} {n}")
            else:
                assert torch.equal(p, before[n]), f"{scope} {n}"
        assert any(p.ndim == 1 and ".norm" in n for n, p in model.named_parameters())


@pytest.mark.parametrize("scope", ["all", "matrices"])
def test_checkpoint_resume_continues_exactly(tmp_path, scope):
    cfg = TrainConfig(data="d", out="o", optimizer="muon", weight_decay=0.1, weight_decay_scope=scope)
    straight = tiny_model()
    steps(straight, build_optimizer(straight.named_parameters(), cfg), 0, 3)

    first = tiny_model()
    opt1 = build_optimizer(first.named_parameters(), cfg)
    steps(first, opt1, 0, 2)
    ckpt.save_checkpoint(tmp_path / "c", first, opt1, {"step": 2})
    resumed = tiny_model(seed=5)  # other weights: the checkpoint must restore all of them
    opt2 = build_optimizer(resumed.named_parameters(), cfg)
    ckpt.load_checkpoint(tmp_path / "c", resumed, opt2, restore_rng=False)
    steps(resumed, opt2, 2, 3)
    for (name, p), q in zip(straight.named_parameters(), resumed.parameters()):
        torch.testing.assert_close(p, q, msg=name)


def test_an_unknown_optimizer_is_refused_by_name():
    with pytest.raises(ConfigError, match="optimizer"):
        build(TrainConfig, {"data": "d", "out": "o", "optimizer": "sgd"}, "[train]")
