"""``transduce complexity``: Table 1 measured — cost per layer, sequential operations, maximum path length.

At one width d and across sequence lengths n, four layers process one sequence x (1, n, d):

* ``self_attention``: softmax(x xᵀ/√d) x — the attention mixing the paper's O(n²·d) counts
  (single head, d_k = d; the Q/K/V/output projections, 8·n·d² FLOPs, are position-wise like a
  feed-forward layer and are left out, as Table 1 leaves them out);
* ``restricted``: the same over each position's r neighbours, banded (see :mod:`.restricted`);
* ``recurrent``: ``nn.LSTM(d, d)``; its FLOPs are counted on an unrolled ``nn.LSTMCell`` with the same
  weights, since FlopCounterMode has no formula for the fused LSTM kernel;
* ``convolution``: ``nn.Conv1d(d, d, k, padding=k//2)``.

FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` (a multiply–add counts 2). Wall time: median of
``repeats`` forward passes after one warm-up, inference mode, one torch thread unless ``--threads``.
Peak memory: torch profiler allocation records (``profile_memory=True``): live CPU bytes summed in
order of each op's end, peak of that sum — the output and intermediates, not the weights or x.
Maximum path length and sequential operations come from each layer's connectivity (:mod:`.paths`);
the convolution row reports both a contiguous stack (O(n/k)) and the dilated stack the paper assumes
(O(log_k n)).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from .figure import parse_ints, plt, save_png
from .paths import max_path_length, sequential_operations
from .restricted import banded_attention

LAYERS = ("self_attention", "restricted", "recurrent", "convolution")
# the paper's Table 1 rows and the exponents of n and d they imply
PAPER = {
    "self_attention": ("O(n²·d)", "O(1)", "O(1)", 2, 1),
    "restricted": ("O(r·n·d)", "O(1)", "O(n/r)", 1, 1),
    "recurrent": ("O(n·d²)", "O(n)", "O(n)", 1, 2),
    "convolution": ("O(k·n·d²)", "O(1)", "O(log_k(n))", 1, 2),
}


def self_attention(x: torch.Tensor) -> torch.Tensor:
    """softmax(x xᵀ / √d) x for x (B, n, d)."""
    scores = x @ x.transpose(1, 2) / math.sqrt(x.size(-1))  # (B, n, n)
    return torch.softmax(scores, dim=-1) @ x  # (B, n, d)


class UnrolledLSTM(nn.Module):
    """nn.LSTM's computation step by step through nn.LSTMCell (same weights), for FLOP counting."""

    def __init__(self, lstm: nn.LSTM):
        super().__init__()
        self.cell = nn.LSTMCell(lstm.input_size, lstm.hidden_size)
        self.cell.load_state_dict(
            {
                "weight_ih": lstm.weight_ih_l0,
                "weight_hh": lstm.weight_hh_l0,
                "bias_ih": lstm.bias_ih_l0,
                "bias_hh": lstm.bias_hh_l0,
            }
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, n, d) -> hidden states (B, n, d)."""
        h = c = x.new_zeros(x.size(0), self.cell.hidden_size)
        outputs = []
        for t in range(x.size(1)):
            h, c = self.cell(x[:, t], (h, c))
            outputs.append(h)
        return torch.stack(outputs, dim=1)  # (B, n, d)


def build_layers(d: int, r: int, k: int, seed: int = 0) -> dict[str, tuple]:
    """name -> (function timed, function whose FLOPs are counted), each mapping x (1, n, d) -> (1, n, d)."""
    torch.manual_seed(seed)
    lstm = nn.LSTM(d, d, batch_first=True).eval()
    conv = nn.Conv1d(d, d, k, padding=k // 2).eval()
    run_lstm = lambda x: lstm(x)[0]  # noqa: E731
    run_conv = lambda x: conv(x.transpose(1, 2)).transpose(1, 2)  # noqa: E731  (B, d, n) inside
    run_restricted = lambda x: banded_attention(x, x, x, r)  # noqa: E731
    return {
        "self_attention": (self_attention, self_attention),
        "restricted": (run_restricted, run_restricted),
        "recurrent": (run_lstm, UnrolledLSTM(lstm)),
        "convolution": (run_conv, run_conv),
    }


def count_flops(fn, x: torch.Tensor) -> int:
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        fn(x)
    return counter.get_total_flops()


def wall_time(fn, x: torch.Tensor, repeats: int) -> float:
    """Median seconds of ``repeats`` calls after one warm-up."""
    times = []
    with torch.inference_mode():
        fn(x)
        for _ in range(repeats):
            start = time.perf_counter()
            fn(x)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


@contextlib.contextmanager
def _native_stderr_silenced():
    """The profiler's native library prints two lines per session to fd 2; keep the table readable."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_memory(fn, x: torch.Tensor) -> int:
    """Peak live bytes allocated during ``fn(x)`` from the profiler's allocation records."""
    from torch.profiler import ProfilerActivity, profile

    with (
        _native_stderr_silenced(),
        torch.inference_mode(),
        profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
    ):
        fn(x)
    live = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.end):
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def measure(d: int, lengths: list[int], r: int, k: int, repeats: int) -> dict[str, dict[str, list]]:
    """name -> {"n", "flops", "seconds", "bytes"} per length."""
    layers = build_layers(d, r, k)
    results = {name: {"n": [], "flops": [], "seconds": [], "bytes": []} for name in LAYERS}
    gen = torch.Generator().manual_seed(0)
    for n in lengths:
        x = torch.randn(1, n, d, generator=gen)
        for name, (timed, counted) in layers.items():
            row = results[name]
            row["n"].append(n)
            row["flops"].append(count_flops(counted, x))
            row["seconds"].append(wall_time(timed, x, repeats))
            row["bytes"].append(peak_memory(timed, x))
    return results


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y against log x."""
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def structure(lengths: list[int], r: int, k: int) -> dict[str, dict[str, list[int]]]:
    """Computed sequential operations and maximum path lengths per length (dilated conv included)."""
    kinds = {
        "self_attention": "self_attention",
        "restricted": "restricted",
        "recurrent": "recurrent",
        "convolution": "convolution",
        "convolution (dilated)": "dilated",
    }
    return {
        label: {
            "sequential": [sequential_operations(kind, n) for n in lengths],
            "path": [max_path_length(kind, n, r, k) for n in lengths],
        }
        for label, kind in kinds.items()
    }


def markdown_table(d: int, lengths: list[int], r: int, k: int, by_n: dict, by_d: dict | None, paths: dict) -> str:
    """Table 1 beside the measured orders. Slopes in n use all lengths for FLOPs and the longest half
    for time and memory (short sequences are dominated by fixed overheads)."""
    n_max, half = lengths[-1], max(2, len(lengths) // 2)
    head = (
        f"Table 1 measured at d = {d}, r = {r}, k = {k}, n = {', '.join(map(str, lengths))}\n\n"
        "| layer | paper: complexity | FLOPs at n = {0} | slope in n: FLOPs / time / memory (paper) | "
        "slope in d: FLOPs (paper) | paper: sequential | computed at n = {0} | "
        "paper: max path | computed at n = {0} |\n|---|---|---|---|---|---|---|---|---|\n"
    ).format(n_max)
    lines = []
    for name in LAYERS:
        m, (complexity, seq, path, n_exp, d_exp) = by_n[name], PAPER[name]
        n_slopes = (
            slope(m["n"], m["flops"]),
            slope(m["n"][-half:], m["seconds"][-half:]),
            slope(m["n"][-half:], m["bytes"][-half:]),
        )
        d_slope = f"{slope(by_d[name]['d'], by_d[name]['flops']):.2f} ({d_exp})" if by_d else "–"
        computed_path = str(paths[name]["path"][-1])
        if name == "convolution":
            computed_path += f" contiguous; {paths['convolution (dilated)']['path'][-1]} dilated"
        lines.append(
            f"| {name.replace('_', '-')} | {complexity} | {m['flops'][-1]:.3g} | "
            f"{' / '.join(f'{s:.2f}' for s in n_slopes)} ({n_exp}) | {d_slope} | {seq} | "
            f"{paths[name]['sequential'][-1]} | {path} | {computed_path} |"
        )
    notes = (
        "\nSelf-attention rows: the attention mixing only (single head, d_k = d), as Table 1 counts it; "
        "projections add 8·n·d² FLOPs to any layer. Recurrent: nn.LSTM timed, FLOPs counted on the same "
        "weights unrolled through nn.LSTMCell. Convolution: a contiguous kernel measured (path O(n/k)); the "
        "dilated stack the paper's O(log_k n) assumes is computed from connectivity only. Memory: peak live "
        "CPU bytes from torch.profiler allocation records. Slopes: least squares on log-log, FLOPs over all n, "
        "time and memory over the longest half.\n"
    )
    return head + "\n".join(lines) + "\n" + notes


def plot(by_n: dict, paths: dict, lengths: list[int], d: int, out: Path) -> Path:
    fig, axes = plt.subplots(2, 2, figsize=(12, 9), layout="constrained")
    half = max(2, len(lengths) // 2)
    for ax, key, label in (
        (axes[0, 0], "flops", "FLOPs (counted)"),
        (axes[0, 1], "seconds", "wall time (s, median)"),
        (axes[1, 0], "bytes", "peak memory (bytes, profiler)"),
    ):
        for name in LAYERS:
            m = by_n[name]
            fit = slope(m["n"], m[key]) if key == "flops" else slope(m["n"][-half:], m[key][-half:])
            ax.loglog(m["n"], m[key], "o-", label=f"{name.replace('_', '-')}: slope {fit:.2f} (paper {PAPER[name][3]})")
        ax.set(xlabel="sequence length n", ylabel=label, title=f"{label} per layer, d = {d}")
    ax = axes[1, 1]
    for name, values in paths.items():
        ax.loglog(lengths, values["path"], "o-", label=name.replace("_", "-"))
    ax.set(
        xlabel="sequence length n",
        ylabel="maximum path length (layers + recurrent steps)",
        title="maximum path length, from connectivity (BFS)",
    )
    for ax in axes.flat:
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.xaxis.set_minor_locator(plt.NullLocator())
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    return save_png(fig, out)


def add_arguments(parser) -> None:
    parser.add_argument("--d", type=int, default=256, help="model width d (default 256)")
    parser.add_argument("--lengths", default="16,32,64,128,256,512,1024", help="sequence lengths n")
    parser.add_argument(
        "--ds", default="64,128,256,512", help="widths for the slope in d (at n = --n-for-d); empty to skip"
    )
    parser.add_argument("--n-for-d", type=int, default=128)
    parser.add_argument("--r", type=int, default=16, help="restricted self-attention neighbourhood")
    parser.add_argument("--k", type=int, default=3, help="convolution kernel width (odd)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per point (median)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads while timing")
    parser.add_argument("--out", required=True, help="output directory: table.md, results.json, complexity.png")


def run(args) -> int:
    lengths = sorted(set(parse_ints(args.lengths, "--lengths")))
    if len(lengths) < 2:
        raise ValueError("--lengths needs at least two values to fit a slope")
    if args.k < 3 or args.k % 2 == 0:
        raise ValueError(f"--k must be odd and at least 3, got {args.k}")
    if args.r < 3:
        raise ValueError(f"--r must be at least 3, got {args.r}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        by_n = measure(args.d, lengths, args.r, args.k, args.repeats)
        by_d = None
        if args.ds.strip():
            ds = sorted(set(parse_ints(args.ds, "--ds")))
            by_d = {name: {"d": ds, "flops": []} for name in LAYERS}
            for d in ds:
                x = torch.randn(1, args.n_for_d, d)
                for name, (_timed, counted) in build_layers(d, args.r, args.k).items():
                    by_d[name]["flops"].append(count_flops(counted, x))
    finally:
        torch.set_num_threads(threads)
    paths = structure(lengths, args.r, args.k)
    table = markdown_table(args.d, lengths, args.r, args.k, by_n, by_d, paths)
    print(table)
    (out / "table.md").write_text(table, encoding="utf-8")
    (out / "results.json").write_text(
        json.dumps(
            {
                "d": args.d,
                "r": args.r,
                "k": args.k,
                "threads": args.threads,
                "by_n": by_n,
                "by_d": by_d,
                "paths": paths,
            },
            indent=1,
        )
        + "\n"
    )
    print(
        f"wrote {out / 'table.md'}, {out / 'results.json'}, {plot(by_n, paths, lengths, args.d, out / 'complexity.png')}"
    )
    return 0
