"""Training throughput: transduce against torch.nn.Transformer wired the paper's way.

One training step = transduce's trainer update (:class:`transduce.train.step.Stepper`: forward,
label-smoothed cross-entropy ε = 0.1 on the non-pad positions, backward, Adam β = (0.9, 0.98),
ε = 1e-9, the paper's schedule) for BOTH models, so only the model differs. Both start from the same
weights (:func:`peer.copy_weights`) and see the same Multi30k batches; transduce runs with its trainer's
default CPU kernels (``fast_dropout``, the C++ residual connection), the peer keeps ``nn.Dropout`` as a user would. Timed runs alternate A B A B ... and the medians
are compared. Model FLOPs per target token are counted once with FlopCounterMode (attention through
the math kernel so that its matmuls are seen; dense attention, masked positions included).

    python bench/bench_train.py --configs small --dtypes bf16 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

import torch
from common import alternate, gemm_peak, human, markdown_table
from peer import PeerTransformer, copy_weights
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from transduce.data.batching import Batch
from transduce.model import ModelConfig, Transformer
from transduce.train.dropout import use_fast_dropout
from transduce.train.residual import use_native_residual
from transduce.train.schedule import Schedule
from transduce.train.step import Stepper

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CPU = torch.device("cpu")


def build_models(preset: str, vocab_size: int, seed: int = 1) -> dict[str, torch.nn.Module]:
    """transduce (as its trainer runs it) and the nn.Transformer peer, with identical weights."""
    cfg = ModelConfig.preset(preset, vocab_size=vocab_size)
    torch.manual_seed(seed)
    ours = Transformer(cfg)
    peer = PeerTransformer(cfg)
    copy_weights(peer, ours)
    use_fast_dropout(ours)
    use_native_residual(ours)  # the trainer's CPU kernels: C++ dropout and LayerNorm(x + Dropout(y))
    return {"transduce": ours.train(), "nn.Transformer": peer.train()}


class Trainer:
    """A model with its own Adam (β = (0.9, 0.98), ε = 1e-9) driven by transduce's Stepper."""

    def __init__(self, model: torch.nn.Module, dtype: str, warmup: int = 4000):
        self.step_no = 0
        d_model = model.config.d_model if hasattr(model, "config") else model.cfg.d_model
        opt = torch.optim.Adam(model.parameters(), betas=(0.9, 0.98), eps=1e-9)
        self.stepper = Stepper(model, opt, Schedule("rsqrt", warmup, d_model), device=CPU, dtype=dtype)  # ε_ls 0.1

    def __call__(self, batch: Batch) -> float:
        """One update on ``batch``; returns the smoothed loss per target token."""
        self.step_no += 1
        return self.stepper.update([batch], self.step_no).loss


def flops_per_token(model: torch.nn.Module, batch: Batch, dtype: str) -> float:
    """Forward + backward FLOPs of one update on ``batch``, per target token."""
    step = Trainer(model, dtype)
    with sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as counter:
        step(batch)
    return counter.get_total_flops() / batch.tgt_tokens


@dataclass
class ThroughputResult:
    preset: str
    dtype: str
    params: int
    tokens_per_run: int
    batches: int
    flops_per_token: float
    peak: float  # GEMM FLOP/s in this dtype, measured in this run
    tok_s: dict[str, float]  # median target tokens/s per contender
    spread: dict[str, float]
    repeats: int

    def mfu(self, name: str) -> float:
        return self.tok_s[name] * self.flops_per_token / self.peak

    @property
    def ratio(self) -> float:
        return self.tok_s["transduce"] / self.tok_s["nn.Transformer"]


def throughput(
    preset: str, dtype: str, batches: list[Batch], vocab_size: int, repeats: int, peak: float
) -> ThroughputResult:
    """Median tokens/s of each contender over ``repeats`` alternating passes over ``batches``."""
    models = build_models(preset, vocab_size)
    fpt = flops_per_token(models["transduce"], batches[0], dtype)
    steps = {name: Trainer(m, dtype) for name, m in models.items()}

    def runner(name: str):
        return lambda: [steps[name](b) for b in batches]

    timings = alternate({name: runner(name) for name in models}, repeats=repeats, warmup=1)
    peak = max(peak, gemm_peak(DTYPES[dtype]))  # again after the runs: a VM's speed can move between them
    tokens = sum(b.tgt_tokens for b in batches)
    return ThroughputResult(
        preset,
        dtype,
        models["transduce"].num_parameters(),
        tokens,
        len(batches),
        fpt,
        peak,
        {n: tokens / timings.median(n) for n in models},
        {n: timings.spread(n) for n in models},
        repeats,
    )


def throughput_table(results: list[ThroughputResult]) -> str:
    rows = []
    for r in results:
        for name in ("transduce", "nn.Transformer"):
            rows.append(
                [
                    r.preset,
                    f"{r.params / 1e6:.1f}M",
                    r.dtype,
                    name,
                    f"{r.tok_s[name]:,.0f}",
                    f"±{r.spread[name] * 50:.0f}%",
                    human(r.flops_per_token, "FLOP"),
                    human(r.peak, "FLOP/s"),
                    f"{r.mfu(name):.0%}",
                    f"**{r.ratio:.2f}×**" if name == "transduce" else "",
                ]
            )
    return markdown_table(
        [
            "config",
            "params",
            "dtype",
            "model",
            "target tok/s (median)",
            "spread",
            "FLOPs/token",
            "GEMM peak",
            "MFU",
            "transduce / peer",
        ],
        rows,
    )


def top_ops(preset: str, dtype: str, batches: list[Batch], vocab_size: int, rows: int = 15) -> str:
    """torch.profiler's ops of transduce's training step, by self CPU time (after one warm-up step)."""
    step = Trainer(build_models(preset, vocab_size)["transduce"], dtype)
    step(batches[0])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for b in batches:
            step(b)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=45)


@dataclass
class CurveResult:
    preset: str
    dtype: str
    steps: int
    warmup: int
    curves: dict[str, list[float]]  # smoothed loss per target token, per step

    def tail_gap(self, a: str, b: str, last: int = 20) -> float:
        """Mean |loss_a − loss_b| over the last ``last`` steps."""
        pairs = list(zip(self.curves[a], self.curves[b]))[-last:]
        return statistics.mean(abs(x - y) for x, y in pairs)


def curves(preset: str, dtype: str, batches: list[Batch], vocab_size: int, warmup: int) -> CurveResult:
    """Loss per token over len(batches) identical steps: transduce (dropout seeds 1 and 2) and the peer.

    All three start from the same weights and follow the paper's schedule (§5.3) with a short warm-up;
    the gap between the two transduce seeds is the noise that dropout alone makes.
    """
    runs = {
        "transduce": ("transduce", 1),
        "transduce seed 2": ("transduce", 2),
        "nn.Transformer": ("nn.Transformer", 1),
    }
    out = {}
    for label, (name, seed) in runs.items():
        step = Trainer(build_models(preset, vocab_size)[name], dtype, warmup)
        torch.manual_seed(seed)  # dropout masks
        out[label] = [step(b) for b in batches]
    return CurveResult(preset, dtype, len(batches), warmup, out)


def curve_table(r: CurveResult, every: int = 10) -> str:
    names = list(r.curves)
    rows = [[str(s)] + [f"{r.curves[n][s - 1]:.3f}" for n in names] for s in range(every, r.steps + 1, every)]
    return markdown_table(["step"] + names, rows)


def main(argv: list[str] | None = None) -> None:
    from common import machine, set_threads
    from data import prepared, train_batches

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="small,medium,paper-base")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--batches", type=int, default=2, help="batches per timed run")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per contender (alternating)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    set_threads(args.threads)
    data = prepared()
    batches = train_batches(data, args.batches)
    print(f"machine {machine()}, threads {torch.get_num_threads()}")
    peaks = {d: gemm_peak(DTYPES[d]) for d in args.dtypes.split(",")}
    results = [
        throughput(c, d, batches, len(data.vocabs.src), args.repeats, peaks[d])
        for c in args.configs.split(",")
        for d in args.dtypes.split(",")
    ]
    print(throughput_table(results))


if __name__ == "__main__":
    main()
