"""transduce plot: every figure is written; the numbers behind them are the model's and the loss's own."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from transduce.cli import main
from transduce.train.loss import label_smoothed_loss
from transduce.viz.plots import metric_series, model_masks, read_metrics, smoothed_target
from transduce.viz.scaling import random_dot_stats

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def plot(tmp_path, *args: str) -> bytes:
    out = tmp_path / f"{args[0]}.png"
    assert main(["plot", *args, "--out", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 10000, f"plot {args[0]} wrote no real PNG"
    return data


@pytest.mark.parametrize(
    "args",
    [
        ["positions", "--d-model", "64", "--length", "50"],
        ["schedule", "--steps", "2000"],
        ["smoothing"],
        ["masks", "--window", "3"],
    ],
)
def test_plots_are_written(tmp_path, args):
    plot(tmp_path, *args)


def test_schedule_from_a_training_config(tmp_path):
    config = tmp_path / "train.toml"
    config.write_text('[train]\ndata = "d"\nout = "o"\nschedule = "rsqrt"\nwarmup = 100\n[model]\npreset = "tiny"\n')
    plot(tmp_path, "schedule", "--config", str(config), "--steps", "500")
    config.write_text('[train]\ndata = "d"\nout = "o"\nwarmpu = 100\n')
    assert main(["plot", "schedule", "--config", str(config), "--out", str(tmp_path / "x.png")]) == 2


def test_smoothed_target_is_the_training_loss_target():
    """−Σ q log softmax(z) with the plotted q equals the loss the trainer minimises."""
    torch.manual_seed(0)
    V, eps, gold = 11, 0.1, 7
    z = torch.randn(1, V, dtype=torch.float64)
    q = torch.from_numpy(smoothed_target(V, gold, eps))
    loss, _, _ = label_smoothed_loss(z, torch.tensor([gold]), eps, pad_id=0)
    assert float(-(q * torch.log_softmax(z, -1)).sum()) == pytest.approx(float(loss), rel=1e-6)  # the loss runs in fp32
    assert q.sum().item() == pytest.approx(1.0) and q[0] == 0.0
    with pytest.raises(ValueError, match="--gold"):
        smoothed_target(V, 0, eps)


def test_masks_are_the_models():
    masks = model_masks([5, 3, 1], 4, window=3)
    padding, causal, enc_window, dec_window = masks.values()
    assert padding.sum(1).tolist() == [5, 3, 1] and padding[1, 3:].sum() == 0
    assert np.array_equal(causal, np.tril(np.ones((4, 4), bool)))
    assert enc_window.sum(1).tolist() == [2, 3, 3, 3, 2] and dec_window.sum(1).tolist() == [1, 2, 3, 3]


def test_curves_from_trainer_metrics(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    records = [
        {"kind": "train", "step": s, "time": 1000.0 + 2 * s, "loss": 9 - s / 100, "lr": 1e-3}
        for s in range(50, 501, 50)
    ]
    records += [
        {
            "kind": "valid",
            "step": s,
            "time": 1000.0 + 2 * s + 1,
            "valid_loss": 8 - s / 200,
            "valid_ppl": math.exp(7 - s / 200),
            "valid_bleu": s / 50,
        }
        for s in (250, 500)
    ]
    records.append({"kind": "end", "step": 500, "time": 2100.0, "reason": "max_steps"})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    series = metric_series(read_metrics(run))
    assert series["train loss"][0].tolist() == list(range(50, 501, 50))
    assert series["valid BLEU"][2].tolist() == [5.0, 10.0]
    assert series["train loss"][1][0] == 0.0 and series["valid loss"][1][-1] == 901.0  # seconds since the first record
    plot(tmp_path, "curves", str(run))
    # another writer's keys, some missing: only what is there is drawn
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "elapsed_s": 3.0, "train_loss": 5.0}) + "\n")
    assert set(metric_series(read_metrics(run))) == {"train loss"}
    plot(tmp_path, "curves", str(run / "metrics.jsonl"))
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2}\nnot json\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2"):
        read_metrics(run)


def test_random_dot_products_grow_as_d_k():
    stats = random_dot_stats([4, 16, 64, 256], n_keys=16, samples=500)
    np.testing.assert_allclose(stats["variance"], stats["d_k"], rtol=0.1)
    assert np.all(np.diff(stats["entropy_unscaled"]) < 0) and stats["entropy_unscaled"][-1] < 0.5
    assert np.ptp(stats["entropy_scaled"]) < 0.1  # the scale keeps the softmax where it was
    assert stats["jacobian_unscaled"][-1] < 0.5 * stats["jacobian_scaled"][-1]


@pytest.mark.slow
def test_scaling_plot_on_a_trained_model(tmp_path, tiny_model_dir, capsys):
    plot(tmp_path, "scaling", "--d-k", "4,16,64", "--samples", "200", "--model", str(tiny_model_dir))
    assert "encoder layer 2: var(q·k)" in capsys.readouterr().out
