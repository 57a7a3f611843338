"""``transduce plot KIND``: the paper's arguments as figures.

* ``positions`` — the sinusoidal encodings (§3.5) by position and dimension;
* ``schedule``  — the learning rate against the update number (§5.3), for a training config or d/warmup;
* ``smoothing`` — the label-smoothed target distribution (§5.4) as the training loss defines it;
* ``masks``     — padding, causal and restricted (window r) masks as the model builds them (§3.2.3, Table 1);
* ``curves``    — a run's RUN_DIR/metrics.jsonl: losses, perplexity, BLEU against updates and wall-clock;
* ``scaling``   — scaled vs unscaled dot products (§3.2.1), see :mod:`transduce.viz.scaling`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from .figure import parse_ints, plt, save_png


# ----------------------------------------------------------------- §3.5 positions
def plot_positions(d_model: int, length: int, out: str | Path, dims: list[int] | None = None) -> Path:
    """Heatmap of PE (length, d_model) and a few dimensions as curves over position."""
    from ..model.embeddings import sinusoid_table

    if d_model % 2:
        raise ValueError(f"--d-model must be even for sinusoidal positions, got {d_model}")
    table = sinusoid_table(length, d_model).numpy()  # (length, d_model)
    dims = [d for d in (dims or [0, 1, d_model // 8, d_model // 4, d_model // 2]) if d < d_model]
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(10, 8), layout="constrained", gridspec_kw={"height_ratios": [3, 2]}
    )
    image = top.imshow(table, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    top.set(
        title=f"sinusoidal positional encoding (§3.5), d_model = {d_model}", xlabel="dimension i", ylabel="position"
    )
    fig.colorbar(image, ax=top, label="PE(pos, i)")
    for d in dims:
        kind = "sin" if d % 2 == 0 else "cos"
        wavelength = 2 * math.pi * 10000 ** ((d - d % 2) / d_model)
        bottom.plot(table[:, d], label=f"i = {d} ({kind}, wavelength {wavelength:.3g})")
    bottom.set(xlabel="position", ylabel="PE(pos, i)", title="wavelengths grow geometrically from 2π to 10000·2π")
    bottom.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
    return save_png(fig, out)


# ----------------------------------------------------------------- §5.3 schedule
def schedule_curves(config: str | None, d_models: list[int], warmup: int, steps: int) -> list[tuple[str, np.ndarray]]:
    """(label, lr per step 1..steps) for a training config, or for each d_model at ``warmup`` (paper's formula)."""
    from ..train.schedule import Schedule

    if config is not None:
        from ..model.config import ModelConfig
        from ..train.config import load_config

        cfg, model_table = load_config(config)
        # vocabulary sizes come from the data at training time; a placeholder lets the table be validated
        d_model = ModelConfig.from_dict({"vocab_size": 8, **model_table}, where=f"{config} [model]").d_model
        schedules = [
            (
                f"{Path(config).name}: {cfg.schedule}, d_model {d_model}, warmup {cfg.warmup}",
                Schedule(cfg.schedule, cfg.warmup, d_model, cfg.lr_scale, cfg.peak_lr, cfg.init_lr, cfg.warmup_share),
            )
        ]
    else:
        schedules = [(f"d_model {d}, warmup {warmup}", Schedule("rsqrt", warmup, d)) for d in d_models]
    step = np.arange(1, steps + 1)
    return [(label, np.array([s(int(t)) for t in step])) for label, s in schedules]


def plot_schedule(curves: list[tuple[str, np.ndarray]], out: str | Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4.5), layout="constrained")
    for label, lr in curves:
        peak = int(lr.argmax()) + 1
        ax.plot(np.arange(1, lr.size + 1), lr, label=f"{label} (peak {lr.max():.2e} at step {peak})")
    ax.set(
        xlabel="update (step)",
        ylabel="learning rate",
        title="learning-rate schedule (§5.3; rsqrt: d_model^-0.5 · min(step^-0.5, step · warmup^-1.5))",
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_png(fig, out)


# ----------------------------------------------------------------- §5.4 label smoothing
def smoothed_target(vocab: int, gold: int, epsilon: float, pad_id: int = 0) -> np.ndarray:
    """The target q the training loss uses: (1 − ε)·onehot(gold) + ε·uniform over the V − 1 non-pad tokens."""
    if not 0 <= gold < vocab or gold == pad_id:
        raise ValueError(f"--gold must be a non-pad token id below --vocab {vocab}, got {gold}")
    q = np.full(vocab, epsilon / (vocab - 1))
    q[pad_id] = 0.0
    q[gold] += 1.0 - epsilon
    return q


def plot_smoothing(vocab: int, gold: int, epsilons: list[float], out: str | Path) -> Path:
    fig, ax = plt.subplots(figsize=(9, 4.5), layout="constrained")
    width = 0.8 / len(epsilons)
    for n, eps in enumerate(epsilons):
        q = smoothed_target(vocab, gold, eps)
        ax.bar(
            np.arange(vocab) + (n - (len(epsilons) - 1) / 2) * width,
            q,
            width,
            label=f"ε = {eps}: gold {q[gold]:.3f}, each other {q[(gold + 1) % vocab or 1]:.4f}, pad 0",
        )
    ax.set_yscale("log")
    ax.set_xticks(range(vocab))
    ax.set(
        xlabel="token id (0 = pad)",
        ylabel="target probability (log scale)",
        title=f"label-smoothed target (§5.4), V = {vocab}, gold token {gold}",
    )
    ax.legend(fontsize=8)
    return save_png(fig, out)


# ----------------------------------------------------------------- §3.2.3 masks
def model_masks(src_lengths: list[int], tgt_length: int, window: int | None) -> dict[str, np.ndarray]:
    """The boolean masks (True = may attend) the Transformer builds for a padded batch."""
    import torch

    from ..model import ModelConfig, Transformer
    from ..model.transformer import window_mask

    model = Transformer(ModelConfig.preset("tiny", vocab_size=8, max_positions=max(src_lengths + [tgt_length])))
    S = max(src_lengths)
    src = torch.tensor([[4] * n + [0] * (S - n) for n in src_lengths])  # (B, S) right-padded
    masks = {
        "source padding mask (B × S)": model.source_mask(src)[:, 0, 0].numpy(),
        f"decoder causal mask (T × T), T = {tgt_length}": torch.ones(tgt_length, tgt_length, dtype=torch.bool)
        .tril()
        .numpy(),
    }
    if window is not None:
        masks[f"encoder window r = {window} (S × S)"] = window_mask(S, S, window, causal=False).numpy()
        masks[f"decoder window r = {window} (T × T)"] = window_mask(tgt_length, tgt_length, window, causal=True).numpy()
    return masks


def plot_masks(masks: dict[str, np.ndarray], out: str | Path) -> Path:
    fig, axes = plt.subplots(1, len(masks), figsize=(3.6 * len(masks), 3.8), layout="constrained", squeeze=False)
    for ax, (title, mask) in zip(axes[0], masks.items()):
        ax.imshow(mask, cmap="Greens", vmin=0, vmax=1.4, interpolation="nearest")
        ax.set_title(title, fontsize=9)
        for (i, j), keep in np.ndenumerate(mask):
            ax.text(j, i, "1" if keep else "0", ha="center", va="center", fontsize=7, color="black" if keep else "0.6")
        batch = "padding" in title
        ax.set(xlabel="key position", ylabel="sentence" if batch else "query position")
        ax.set_xticks(range(mask.shape[1]))
        ax.set_yticks(range(mask.shape[0]))
    fig.suptitle("attention masks as the model builds them (1 = may attend)", fontsize=11)
    return save_png(fig, out)


# ----------------------------------------------------------------- training curves
def read_metrics(path: str | Path) -> list[dict]:
    """Records of a metrics.jsonl; a line that is not a JSON object raises, naming the line."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics file (expected RUN_DIR/metrics.jsonl)")
    records = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
        if not isinstance(record, dict) or "step" not in record:
            raise ValueError(f"{path}:{n}: expected an object with a 'step' key")
        records.append(record)
    if not records:
        raise ValueError(f"{path}: no records")
    return records


# series name -> keys that carry it (trainer: kind "train" + "loss"; other writers: "train_loss")
SERIES = {
    "train loss": ("train_loss", "loss"),
    "valid loss": ("valid_loss",),
    "valid perplexity": ("valid_ppl",),
    "valid BLEU": ("valid_bleu",),
}


def metric_series(records: list[dict]) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """name -> (steps, elapsed seconds, values). Elapsed is ``elapsed_s`` or ``time`` minus the first time."""
    times = [r["time"] for r in records if "time" in r]
    t0 = min(times) if times else 0.0
    out = {}
    for name, keys in SERIES.items():
        rows = []
        for r in records:
            if keys[-1] == "loss" and r.get("kind", "train") != "train" and "train_loss" not in r:
                continue
            key = next((k for k in keys if isinstance(r.get(k), (int, float))), None)
            if key is None:
                continue
            elapsed = r.get("elapsed_s", r["time"] - t0 if "time" in r else math.nan)
            rows.append((r["step"], elapsed, r[key]))
        if rows:
            out[name] = tuple(np.array(col, dtype=float) for col in zip(*rows))
    return out


def plot_curves(series: dict, out: str | Path, title: str) -> Path:
    panels = [
        ("loss", ["train loss", "valid loss"]),
        ("valid perplexity", ["valid perplexity"]),
        ("valid BLEU", ["valid BLEU"]),
    ]
    panels = [(label, [n for n in names if n in series]) for label, names in panels]
    panels = [p for p in panels if p[1]]
    if not panels:
        raise ValueError(f"{title}: no train_loss/loss, valid_loss, valid_ppl or valid_bleu values to plot")
    fig, axes = plt.subplots(2, len(panels), figsize=(4.6 * len(panels), 7), layout="constrained", squeeze=False)
    for col, (label, names) in enumerate(panels):
        for row, (x_index, x_label) in enumerate([(0, "update (step)"), (1, "wall-clock (minutes)")]):
            ax = axes[row, col]
            for name in names:
                x = series[name][x_index] / (60.0 if x_index else 1.0)
                ax.plot(x, series[name][2], marker="." if name != "train loss" else None, label=name)
            ax.set(xlabel=x_label, ylabel=label)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    return save_png(fig, out)


# ----------------------------------------------------------------- command line
def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="kind", metavar="KIND", required=True)
    p = sub.add_parser("positions", help="sinusoidal positional encodings (§3.5)")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--length", type=int, default=100, help="positions to draw")
    p = sub.add_parser("schedule", help="learning-rate schedule (§5.3)")
    p.add_argument("--config", help="a training TOML ([train] schedule/warmup, [model] d_model or preset)")
    p.add_argument("--d-model", default="512,1024", help="comma-separated d_model values (without --config)")
    p.add_argument("--warmup", type=int, default=4000)
    p.add_argument("--steps", type=int, default=40000)
    p = sub.add_parser("smoothing", help="label-smoothed target distribution (§5.4)")
    p.add_argument("--vocab", type=int, default=20, help="vocabulary size to draw")
    p.add_argument("--gold", type=int, default=7, help="the correct token id")
    p.add_argument("--epsilon", default="0.1,0.3", help="comma-separated ε_ls values")
    p = sub.add_parser("masks", help="padding, causal and window masks")
    p.add_argument("--src-lengths", default="6,4,2", help="source lengths of a padded batch")
    p.add_argument("--tgt-length", type=int, default=6)
    p.add_argument("--window", type=int, help="restricted self-attention neighbourhood r")
    p = sub.add_parser("curves", help="training curves from RUN_DIR/metrics.jsonl")
    p.add_argument("run", help="run directory (or a metrics.jsonl file)")
    p = sub.add_parser("scaling", help="scaled vs unscaled dot products (§3.2.1)")
    from .scaling import add_arguments as scaling_arguments

    scaling_arguments(p)
    for p in sub.choices.values():
        p.add_argument("--out", required=True, help="FILE.png")


def run(args) -> int:
    if args.kind == "positions":
        path = plot_positions(args.d_model, args.length, args.out)
    elif args.kind == "schedule":
        curves = schedule_curves(args.config, parse_ints(args.d_model, "--d-model"), args.warmup, args.steps)
        path = plot_schedule(curves, args.out)
    elif args.kind == "smoothing":
        epsilons = [float(e) for e in args.epsilon.split(",")]
        if not all(0 <= e < 1 for e in epsilons):
            raise ValueError(f"--epsilon values must be in [0, 1), got {args.epsilon}")
        path = plot_smoothing(args.vocab, args.gold, epsilons, args.out)
    elif args.kind == "masks":
        path = plot_masks(
            model_masks(parse_ints(args.src_lengths, "--src-lengths"), args.tgt_length, args.window), args.out
        )
    elif args.kind == "curves":
        path = plot_curves(metric_series(read_metrics(args.run)), args.out, f"training curves: {args.run}")
    else:
        from .scaling import run as scaling_run

        return scaling_run(args)
    print(f"wrote {path}")
    return 0
