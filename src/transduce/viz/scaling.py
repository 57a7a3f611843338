"""Why attention divides by √d_k (§3.2.1), measured.

For q, k with independent components of mean 0 and variance 1, q·k has variance d_k; without the
1/√d_k scale the softmax over such scores saturates: its entropy falls towards 0 and the norm of
its Jacobian (the gradient that flows back into the scores) vanishes. ``random_dot_stats`` measures
this on random vectors; ``model_dot_stats`` on a trained model's encoder queries and keys, captured
by a forward hook on each self-attention layer's fused Q/K/V projection.

Softmax Jacobian: J = diag(p) − p pᵀ, reported as its Frobenius norm averaged over queries.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from .figure import parse_ints, plt, save_png

SENTENCES = [
    "A man in a blue shirt is standing on a ladder cleaning windows.",
    "Two young girls are playing in the sand at the beach.",
    "A group of people are sitting at a table in a restaurant.",
    "A brown dog is running through the grass with a ball in its mouth.",
    "A woman rides a bicycle down a busy city street.",
]


def softmax_stats(scores: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[float, float]:
    """Mean entropy (nats) and mean Jacobian Frobenius norm of softmax over the last axis.

    scores (..., T_k); mask (..., T_k) bool True = key present (rows share T_k otherwise).
    """
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    p = torch.softmax(scores.double(), dim=-1)  # (..., T_k)
    entropy = -(p * torch.log(p.clamp_min(1e-300))).sum(-1)  # (...,)
    # ||diag(p) - p pᵀ||_F² = Σ p_i² − 2 Σ p_i³ + (Σ p_i²)²
    s2, s3 = (p**2).sum(-1), (p**3).sum(-1)
    jac = torch.sqrt((s2 - 2 * s3 + s2**2).clamp_min(0))
    return entropy.mean().item(), jac.mean().item()


def random_dot_stats(d_ks: list[int], n_keys: int = 32, samples: int = 2000, seed: int = 0) -> dict[str, np.ndarray]:
    """Per d_k: variance of q·k, and softmax entropy / Jacobian norm over n_keys keys, scaled and unscaled."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for d_k in d_ks:
        q = torch.randn(samples, 1, d_k, generator=gen, dtype=torch.float64)  # (N, 1, d_k)
        k = torch.randn(samples, n_keys, d_k, generator=gen, dtype=torch.float64)  # (N, n, d_k)
        dots = (q * k).sum(-1)  # (N, n)
        rows.append((dots.var().item(), *softmax_stats(dots), *softmax_stats(dots / math.sqrt(d_k))))
    cols = np.array(rows).T
    names = ["variance", "entropy_unscaled", "jacobian_unscaled", "entropy_scaled", "jacobian_scaled"]
    return {"d_k": np.array(d_ks, dtype=float), "n_keys": n_keys, **dict(zip(names, cols))}


@torch.no_grad()
def model_dot_stats(model, vocab, sentences: list[str]) -> list[dict[str, float]]:
    """Per encoder layer: var(q·k) over real query/key pairs, the independence prediction
    d_k·var(q_i)·var(k_i), and softmax entropy / Jacobian norm with and without 1/√d_k."""
    cfg = model.config
    ids = [vocab.encode(s) + [cfg.eos_id] for s in sentences]
    width = max(len(r) for r in ids)
    src = torch.tensor([r + [cfg.pad_id] * (width - len(r)) for r in ids])  # (B, S)
    captured = []
    hooks = [
        layer.self_attn.qkv_proj.register_forward_hook(lambda m, a, out: captured.append(out))
        for layer in model.encoder.layers
    ]
    try:
        model.encode(src)
    finally:
        for h in hooks:
            h.remove()
    real = src != cfg.pad_id  # (B, S)
    pair = (real[:, None, :, None] & real[:, None, None, :]).expand(-1, cfg.n_heads, -1, -1)  # (B, h, S, S)
    stats = []
    for qkv, layer in zip(captured, model.encoder.layers):
        attn = layer.self_attn
        q, k, _ = (attn.split_heads(t) for t in qkv.chunk(3, dim=-1))  # (B, h, S, d_k) each
        dots = (q @ k.transpose(-2, -1)).double()  # (B, h, S, S)
        key_mask = real[:, None, None, :].expand_as(dots)
        qr, kr = q.transpose(1, 2)[real], k.transpose(1, 2)[real]  # (tokens, h, d_k)
        e_u, j_u = softmax_stats(dots, key_mask)
        e_s, j_s = softmax_stats(dots / math.sqrt(attn.d_k), key_mask)
        stats.append(
            {
                "variance": dots[pair].var().item(),
                "predicted": attn.d_k * qr.var().item() * kr.var().item(),
                "entropy_unscaled": e_u,
                "jacobian_unscaled": j_u,
                "entropy_scaled": e_s,
                "jacobian_scaled": j_s,
                "max_entropy": torch.log(real.sum(-1).double()).mean().item(),
                "d_k": attn.d_k,
            }
        )
    return stats


def plot_scaling(random: dict, out: str | Path, model_stats: list[dict] | None = None, model_name: str = "") -> Path:
    rows = 2 if model_stats else 1
    fig, axes = plt.subplots(rows, 3, figsize=(15, 4.6 * rows), layout="constrained", squeeze=False)
    d_k, n = random["d_k"], random["n_keys"]
    a, b, c = axes[0]
    a.loglog(d_k, random["variance"], "o-", label="measured var(q·k)")
    a.loglog(d_k, d_k, "k--", label="d_k (theory)")
    a.loglog(d_k, random["variance"] / d_k, "s-", label="measured var(q·k/√d_k)")
    a.set(xlabel="d_k", ylabel="variance", title="q, k ~ N(0, I): var(q·k) grows as d_k")
    b.semilogx(d_k, random["entropy_scaled"], "o-", label="scaled (÷√d_k)")
    b.semilogx(d_k, random["entropy_unscaled"], "s-", label="unscaled")
    b.axhline(math.log(n), color="k", ls=":", label=f"uniform: log {n}")
    b.set(xlabel="d_k", ylabel="entropy (nats)", title=f"softmax over {n} keys: unscaled saturates")
    c.loglog(d_k, random["jacobian_scaled"], "o-", label="scaled (÷√d_k)")
    c.loglog(d_k, random["jacobian_unscaled"], "s-", label="unscaled")
    c.set(xlabel="d_k", ylabel="‖∂softmax/∂scores‖_F", title="gradient through the softmax vanishes unscaled")
    if model_stats:
        layers = np.arange(1, len(model_stats) + 1)
        get = lambda key: np.array([s[key] for s in model_stats])  # noqa: E731
        dk = model_stats[0]["d_k"]
        a, b, c = axes[1]
        a.bar(layers - 0.2, get("variance"), 0.4, label="measured var(q·k)")
        a.bar(layers + 0.2, get("predicted"), 0.4, label="d_k·var(q_i)·var(k_i)")
        a.axhline(dk, color="k", ls="--", label=f"d_k = {dk}")
        b.plot(layers, get("entropy_scaled"), "o-", label="scaled (÷√d_k, the paper)")
        b.plot(layers, get("entropy_unscaled"), "s-", label="same q, k unscaled")
        b.plot(layers, get("max_entropy"), "k:", label="uniform over the sentence")
        c.plot(layers, get("jacobian_scaled"), "o-", label="scaled (÷√d_k, the paper)")
        c.plot(layers, get("jacobian_unscaled"), "s-", label="same q, k unscaled")
        for ax, ylabel in ((a, "variance of q·k"), (b, "entropy (nats)"), (c, "‖∂softmax/∂scores‖_F")):
            ax.set(xlabel="encoder layer", ylabel=ylabel, xticks=layers)
        a.set_title(f"{model_name}: real encoder queries and keys", fontsize=10)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_png(fig, out)


def add_arguments(parser) -> None:
    parser.add_argument("--d-k", default="4,8,16,32,64,128,256,512,1024", help="comma-separated d_k values")
    parser.add_argument("--keys", type=int, default=32, help="keys per softmax (random vectors)")
    parser.add_argument("--samples", type=int, default=2000, help="random queries per d_k")
    parser.add_argument("--model", help="also measure a model directory's encoder queries and keys")
    parser.add_argument(
        "--sentences",
        help="source sentences for --model, one per line (default: 5 built-in English Multi30k-style sentences)",
    )


def run(args) -> int:
    random = random_dot_stats(parse_ints(args.d_k, "--d-k"), args.keys, args.samples)
    model_stats = None
    for d, v, e_u, e_s in zip(random["d_k"], random["variance"], random["entropy_unscaled"], random["entropy_scaled"]):
        print(f"d_k {int(d):5d}  var(q·k) {v:9.2f}  entropy unscaled {e_u:.3f}  scaled {e_s:.3f}")
    if args.model:
        from ..modeldir import load_model_dir

        model, vocabs, _ = load_model_dir(args.model)
        sentences = SENTENCES
        if args.sentences:
            sentences = [s for s in Path(args.sentences).read_text(encoding="utf-8").splitlines() if s.strip()]
            if not sentences:
                raise ValueError(f"{args.sentences}: no non-empty lines")
        model_stats = model_dot_stats(model, vocabs.src, sentences)
        for n, s in enumerate(model_stats, 1):
            print(
                f"encoder layer {n}: var(q·k) {s['variance']:.2f} (d_k·var q·var k {s['predicted']:.2f})  "
                f"entropy scaled {s['entropy_scaled']:.3f} unscaled {s['entropy_unscaled']:.3f}"
            )
    print(f"wrote {plot_scaling(random, args.out, model_stats, Path(args.model or '').name)}")
    return 0
