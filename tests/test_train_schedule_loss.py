"""Schedule (§5.3), label-smoothed loss (§5.4) and the fast dropout, against hand computations."""

from __future__ import annotations

import math

import pytest
import torch

from transduce.train.dropout import FastDropout, use_fast_dropout
from transduce.train.loss import label_smoothed_loss
from transduce.train.schedule import Schedule, inverse_sqrt_lr, linear_lr, rsqrt_lr, set_lr


@pytest.mark.parametrize("step", [1, 10, 3999, 4000, 4001, 20000, 100000])
def test_rsqrt_matches_the_paper_formula(step):
    expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
    assert rsqrt_lr(step, 512, 4000) == pytest.approx(expected, rel=1e-12)
    assert rsqrt_lr(step, 512, 4000, scale=2.0) == pytest.approx(2 * expected, rel=1e-12)


def test_rsqrt_peaks_at_warmup():
    values = [rsqrt_lr(s, 512, 4000) for s in range(1, 10001)]
    assert max(range(len(values)), key=values.__getitem__) + 1 == 4000
    assert values[3999] == pytest.approx(512**-0.5 * 4000**-0.5)  # ≈ 7.0e-4


def test_inverse_sqrt_warms_up_linearly_then_decays():
    assert inverse_sqrt_lr(1, 5e-3, 2000) == pytest.approx(5e-3 / 2000)
    assert inverse_sqrt_lr(1000, 5e-3, 2000) == pytest.approx(2.5e-3)
    assert inverse_sqrt_lr(2000, 5e-3, 2000) == pytest.approx(5e-3)
    assert inverse_sqrt_lr(8000, 5e-3, 2000) == pytest.approx(2.5e-3)
    assert inverse_sqrt_lr(1, 1.0, 10, init_lr=0.5) == pytest.approx(0.55)


def test_linear_warms_up_then_decays_to_zero_with_the_budget():
    assert linear_lr(5, 1e-3, 10, progress=0.0) == pytest.approx(5e-4)
    assert linear_lr(10, 1e-3, 10, progress=0.25) == pytest.approx(7.5e-4)
    assert linear_lr(4, 1e-3, 10, progress=0.5) == pytest.approx(2e-4)  # warm-up ramp × (1 − progress)
    assert linear_lr(500, 1e-3, 10, progress=1.0) == 0.0
    assert linear_lr(500, 1e-3, 10, progress=1.3) == 0.0  # never negative
    assert Schedule("linear", warmup=10, peak_lr=1e-3)(50, 0.5) == pytest.approx(5e-4)


def test_warmup_share_ends_the_warm_up_by_a_fraction_of_the_budget():
    """A wall-clock budget on a slow machine may hold fewer updates than ``warmup``: the ramp also ends
    once ``warmup_share`` of the budget is used, whichever comes first."""
    assert linear_lr(100, 1e-3, 600, progress=0.1, warmup_share=0.25) == pytest.approx(1e-3 * 0.4 * 0.9)
    assert linear_lr(100, 1e-3, 600, progress=0.1) == pytest.approx(1e-3 * 100 / 600 * 0.9)  # off: steps only
    assert linear_lr(300, 1e-3, 600, progress=0.5, warmup_share=0.25) == pytest.approx(5e-4)  # at peak, decaying
    assert linear_lr(600, 1e-3, 600, progress=0.05, warmup_share=0.25) == pytest.approx(9.5e-4)  # steps first
    sched = Schedule("linear", warmup=600, peak_lr=1e-3, warmup_share=0.25)
    assert not sched.warmed_up(100, 0.2) and sched.warmed_up(100, 0.25) and sched.warmed_up(600, 0.0)
    assert not Schedule("inverse_sqrt", warmup=600).warmed_up(100, 0.9)  # no budget: steps only


def test_schedule_object_and_set_lr():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.Adam([{"params": [model.weight]}, {"params": [model.bias]}])
    sched = Schedule("rsqrt", warmup=10, d_model=64, scale=0.5)
    set_lr(opt, sched(7))
    assert [g["lr"] for g in opt.param_groups] == [0.5 * 64**-0.5 * 7 * 10**-1.5] * 2
    assert Schedule("inverse_sqrt", warmup=4, peak_lr=1e-3)(16) == pytest.approx(5e-4)


def test_label_smoothing_matches_a_hand_computation():
    # V = 4 (pad = 0), one real token with label 2 and one padding position.
    logits = torch.tensor([[[1.0, 2.0, 0.5, -1.0], [9.0, 9.0, 9.0, 9.0]]])  # (1, 2, 4)
    target = torch.tensor([[2, 0]])
    eps = 0.1
    logp = [z - math.log(sum(math.exp(x) for x in [1.0, 2.0, 0.5, -1.0])) for z in [1.0, 2.0, 0.5, -1.0]]
    # q: 1 - eps on the gold label plus eps/3 on each of the 3 non-pad tokens (gold included), 0 on pad
    q = [0.0, eps / 3, 1 - eps + eps / 3, eps / 3]
    expected = -sum(qi * lp for qi, lp in zip(q, logp))
    loss, nll, n = label_smoothed_loss(logits, target, eps, pad_id=0)
    assert n == 1
    assert nll.item() == pytest.approx(-logp[2], rel=1e-6)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    plain, _, _ = label_smoothed_loss(logits, target, 0.0)
    assert plain.item() == pytest.approx(-logp[2], rel=1e-6)


def test_loss_sums_over_tokens_excludes_padding_and_runs_in_fp32():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 50)
    target = torch.randint(1, 50, (3, 5))
    target[0, 3:] = 0
    target[2, 1:] = 0
    loss, nll, n = label_smoothed_loss(logits, target, 0.1)
    assert n == int((target != 0).sum())
    keep = target != 0
    ref = torch.nn.functional.cross_entropy(logits[keep], target[keep], reduction="sum")
    assert nll.item() == pytest.approx(ref.item(), rel=1e-5)
    loss16, nll16, _ = label_smoothed_loss(logits.bfloat16(), target, 0.1)
    assert loss16.dtype == torch.float32
    assert loss16.item() == pytest.approx(
        label_smoothed_loss(logits.bfloat16().float(), target, 0.1)[0].item(), rel=1e-6
    )


def test_fast_dropout_keeps_1_minus_p_and_rescales():
    torch.manual_seed(0)
    drop = FastDropout(0.3).train()
    x = torch.ones(200_000, dtype=torch.bfloat16)
    y = drop(x)
    kept = (y != 0).float().mean().item()
    assert kept == pytest.approx(0.7, abs=0.005)
    assert torch.unique(y).tolist() == pytest.approx([0.0, 1 / 0.7], rel=1e-2)  # bf16 rounding of 1/0.7
    assert y.dtype == torch.bfloat16
    assert torch.equal(drop.eval()(x), x)


def test_use_fast_dropout_swaps_every_dropout_and_keeps_weights():
    from transduce.model import ModelConfig, Transformer

    model = Transformer(ModelConfig.preset("tiny", vocab_size=40))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    count = sum(isinstance(m, torch.nn.Dropout) for m in model.modules())
    assert use_fast_dropout(model) == count > 0
    assert not any(isinstance(m, torch.nn.Dropout) for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_closed_form_gradient_equals_autograd_of_the_definition(eps):
    torch.manual_seed(1)
    V = 37
    z = torch.randn(4, 6, V, requires_grad=True)
    y = torch.randint(1, V, (4, 6))
    y[0, 4:] = 0
    loss, nll, n = label_smoothed_loss(z, y, eps)
    (grad,) = torch.autograd.grad(loss * 3.0, z)
    keep = y != 0
    logp = torch.log_softmax(z[keep].double(), -1)  # the definition, written out
    q = torch.full_like(logp, eps / (V - 1))
    q[:, 0] = 0.0
    q[torch.arange(int(keep.sum())), y[keep]] += 1 - eps
    ref = -(q * logp).sum()
    (ref_grad,) = torch.autograd.grad(ref * 3.0, z)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    torch.testing.assert_close(grad, ref_grad.float(), rtol=1e-5, atol=1e-6)
    assert torch.all(grad[~keep] == 0)  # padding positions get no gradient


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blockwise_loss_does_not_depend_on_the_block_size(dtype):
    from transduce.train.loss import SmoothedCrossEntropy

    torch.manual_seed(2)
    z = (torch.randn(23, 41) * 4).to(dtype).requires_grad_()
    y = torch.randint(1, 41, (23,))
    results = []
    for rows in (1, 5, 23, 64):  # one row at a time, several blocks with a remainder, one block, bigger than N
        loss, nll = SmoothedCrossEntropy.apply(z, y, 0.1, 0, rows)
        (grad,) = torch.autograd.grad(loss * 2.0, z)
        assert grad.dtype == dtype
        results.append((loss.item(), nll.item(), grad))
    for loss, nll, grad in results[1:]:
        assert loss == pytest.approx(results[0][0], rel=1e-6) and nll == pytest.approx(results[0][1], rel=1e-6)
        assert torch.equal(grad, results[0][2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_projected_loss_equals_projection_then_loss(dtype):
    """The fused projection + loss gives the loss and the gradients of nn.Linear followed by the loss."""
    from transduce.train.loss import ProjectedSmoothedCrossEntropy

    torch.manual_seed(3)
    h = torch.randn(29, 16, requires_grad=True)
    w = torch.randn(43, 16, requires_grad=True)
    y = torch.randint(1, 43, (29,))
    loss, nll = ProjectedSmoothedCrossEntropy.apply(h, w, y, 0.1, 0, dtype, 8)  # 4 blocks, the last of 5 rows
    gh, gw = torch.autograd.grad(loss * 0.5, (h, w))
    ref_loss, ref_nll, _ = label_smoothed_loss(h.to(dtype) @ w.to(dtype).t(), y, 0.1)
    rh, rw = torch.autograd.grad(ref_loss * 0.5, (h, w))
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=tol["rtol"])
    assert nll.item() == pytest.approx(ref_nll.item(), rel=tol["rtol"])
    assert gh.dtype == gw.dtype == torch.float32
    torch.testing.assert_close(gh, rh, **tol)
    torch.testing.assert_close(gw, rw, **tol)


@pytest.mark.parametrize("n", [29, 64, 65])
def test_projected_loss_backward_takes_rounded_rows(n):
    """The backward's matmuls see the (N, V) gradient and the states with N rounded up to PAD_ROWS (zero rows
    after N), so that their shapes repeat from batch to batch; the gradients are those of the N rows."""
    from transduce.train.loss import PAD_ROWS, ProjectedSmoothedCrossEntropy, rounded_rows

    torch.manual_seed(5)
    h = torch.randn(n, 16, requires_grad=True)
    w = torch.randn(43, 16, requires_grad=True)
    y = torch.randint(1, 43, (n,))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        loss, _ = ProjectedSmoothedCrossEntropy.apply(h, w, y, 0.1, 0, torch.float32, 16)
    rounded = rounded_rows(n)
    assert rounded % PAD_ROWS == 0 and n <= rounded < n + PAD_ROWS
    assert [tuple(t.shape) for t in saved] == [(rounded, 16), (43, 16), (rounded, 43)]
    assert not saved[0][n:].any() and not saved[2][n:].any()
    gh, gw = torch.autograd.grad(loss, (h, w))
    ref_loss, _, _ = label_smoothed_loss(h @ w.t(), y, 0.1)
    rh, rw = torch.autograd.grad(ref_loss, (h, w))
    assert gh.shape == (n, 16)
    torch.testing.assert_close(gh, rh, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gw, rw, rtol=1e-5, atol=1e-5)


def test_weight_decay_is_decoupled_as_in_fairseq_and_zero_is_plain_adam():
    from transduce.train.config import TrainConfig
    from transduce.train.optim import build_optimizer

    def one_step(weight_decay: float, grad: float) -> torch.Tensor:
        p = torch.nn.Parameter(torch.ones(3))
        opt = build_optimizer([("w", p)], TrainConfig(data="d", out="o", weight_decay=weight_decay))
        for group in opt.param_groups:
            group["lr"] = 0.1
        p.grad = torch.full((3,), grad)
        opt.step()
        return p.detach()

    # a zero gradient: decoupled decay shrinks by lr * wd = 0.05; L2 added to the gradient would make Adam
    # step a whole lr (0.1), since its first step is lr * sign(grad)
    assert torch.allclose(one_step(0.5, 0.0), torch.full((3,), 0.95))
    assert torch.allclose(one_step(0.0, 0.0), torch.ones(3))
    reference = torch.nn.Parameter(torch.ones(3))  # weight_decay 0: torch's Adam with the paper's settings
    adam = torch.optim.Adam([reference], lr=0.1, betas=(0.9, 0.98), eps=1e-9)
    reference.grad = torch.full((3,), 0.3)
    adam.step()
    assert torch.equal(one_step(0.0, 0.3), reference.detach())
