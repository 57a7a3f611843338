"""Training speed on real batches: ``python bench/train_step.py DATA_DIR --preset small --dtype bf16``.

Times ``--steps`` updates after ``--warmup`` untimed ones and prints target tokens per wall-clock second
and per ``threads`` CPU-seconds (the process's CPU time, a steadier figure on a shared machine);
``--profile`` prints torch.profiler's table of one update instead (of a batch already run once, so that
oneDNN's one-time builds of its matmul shapes are left out); ``--gemm-shapes`` the update's matrix
products grouped by shape, each with its GFLOP/s against the best 1024³ or 2048³ product in the same process (where an
update's GEMM time goes, and which shapes run below the peak).
"""

from __future__ import annotations

import argparse
import time

import torch

from transduce.config import parse_override
from transduce.data import PreparedData
from transduce.data.batching import TokenBatches
from transduce.model import ModelConfig, Transformer
from transduce.train.dropout import use_fast_dropout
from transduce.train.loss import SmoothedLoss
from transduce.train.rdrop import RDrop
from transduce.train.residual import use_native_residual
from transduce.train.schedule import Schedule
from transduce.train.step import Stepper


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("--preset", default="small")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="model_set",
        help="a [model] key over the preset, e.g. --set d_model=256 (repeatable)",
    )
    p.add_argument("--dtype", default="bf16", choices=["fp32", "bf16"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--plain-dropout", action="store_true", help="keep nn.Dropout (compare with FastDropout)")
    p.add_argument("--adam", default="fused", choices=["fused", "foreach", "loop"])
    p.add_argument("--sdpa", default="auto", choices=["auto", "native", "written", "default", "math"])
    p.add_argument("--loss-kernel", default="native", choices=["native", "tensor"], help="train.loss_kernel")
    p.add_argument("--dropout-kernel", default="native", choices=["native", "tensor"], help="train.dropout_kernel")
    p.add_argument("--residual-kernel", default="native", choices=["native", "tensor"], help="train.residual_kernel")
    p.add_argument("--rdrop-alpha", type=float, default=0.0, help="R-Drop (each batch twice + alpha x KL)")
    p.add_argument(
        "--passes",
        type=int,
        default=1,
        help="time the same --steps batches this many times in a row, one figure per pass (a "
        "throughput that falls from pass to pass is the process slowing down, e.g. its allocator)",
    )
    p.add_argument("--profile", action="store_true")
    p.add_argument("--gemm-shapes", action="store_true", help="GFLOP/s of each matrix-product shape of one update")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    data = PreparedData.open(args.data)
    shape = dict(parse_override(text) for text in args.model_set)
    shape = {key.removeprefix("model."): value for key, value in shape.items()}
    cfg = ModelConfig.preset(
        args.preset,
        vocab_size=len(data.vocabs.src),
        **shape,
        **({} if data.vocabs.shared else {"tgt_vocab_size": len(data.vocabs.tgt), "tie_embeddings": "target"}),
    )
    model = Transformer(cfg).train()
    if not args.plain_dropout:
        use_fast_dropout(model, native=args.dropout_kernel == "native")
        if args.dropout_kernel == "native" and args.residual_kernel == "native":  # as transduce.train.kernels
            use_native_residual(model)
    opt = torch.optim.Adam(
        model.parameters(), betas=(0.9, 0.98), eps=1e-9, fused=args.adam == "fused", foreach=args.adam == "foreach"
    )
    native = args.loss_kernel == "native"
    objective = (
        RDrop(cfg.label_smoothing, args.rdrop_alpha, native=native)
        if args.rdrop_alpha > 0
        else SmoothedLoss(cfg.label_smoothing, native=native)
    )
    stepper = Stepper(
        model,
        opt,
        Schedule("rsqrt", 4000, cfg.d_model),
        device=torch.device("cpu"),
        dtype=args.dtype,
        kernel=args.sdpa,
        objective=objective,
    )
    batches = TokenBatches(data.split("train"), args.max_tokens, seed=1).epoch(1)
    for i in range(args.warmup):
        stepper.update([batches[i]], i + 1)
    timed = batches[args.warmup : args.warmup + args.steps]
    if args.profile or args.gemm_shapes:  # the profiled batch once before: its shapes' oneDNN builds are not shown
        stepper.update([timed[0]], 99)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            stepper.update([timed[0]], 100)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
        return
    if args.gemm_shapes:
        gemm_shapes(stepper, timed[0], args.dtype)
        return
    from transduce.allocator import loaded

    for number in range(1, args.passes + 1):
        tokens, seconds, cpu = 0, 0.0, 0.0
        faults = minor_faults()
        for i, batch in enumerate(timed):
            start, start_cpu = time.perf_counter(), time.process_time()
            tokens += stepper.update([batch], 100 + i).tokens
            seconds += time.perf_counter() - start
            cpu += time.process_time() - start_cpu
        faults = (minor_faults() - faults) / len(timed)
        name = args.preset + "".join(f" {key}={value}" for key, value in shape.items())
        print(
            f"{name} {args.dtype} threads={args.threads} dropout={'plain' if args.plain_dropout else 'fast'}"
            f"{f' pass {number}/{args.passes}' if args.passes > 1 else ''}: "
            f"{tokens / seconds:.0f} target tokens/s wall, {tokens / cpu * args.threads:.0f} per {args.threads} "
            f"CPU-seconds ({len(timed)} updates of ~{tokens // len(timed)} tokens, {seconds:.1f} s; "
            f"adam={args.adam} sdpa={args.sdpa} loss={args.loss_kernel} dropout={args.dropout_kernel} "
            f"malloc={'jemalloc' if loaded() else 'libc'}; {faults:,.0f} page faults per update; "
            f"peak resident {max_resident_mb():.0f} MB)",
            flush=True,
        )


def minor_faults() -> int:
    """The process's minor page faults so far: pages the kernel mapped in on first touch (memory the allocator
    gave back and took again, each fault a few microseconds of system time)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def max_resident_mb() -> float:
    """The process's peak resident memory so far, in MB (Linux reports kB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def product_flops(name: str, shapes: list) -> int:
    """FLOPs of one ``aten::mm`` / ``addmm`` / ``bmm`` / ``baddbmm`` call from its input shapes (0 otherwise)."""
    first = {"aten::mm": 0, "aten::bmm": 0, "aten::addmm": 1, "aten::baddbmm": 1}.get(name)  # addmm: the sum first
    if first is None or len(shapes) < first + 2:
        return 0
    a, b = shapes[first], shapes[first + 1]  # (M, K) and (K, N), or with a batch dimension first
    if len(a) not in (2, 3) or len(b) != len(a):
        return 0
    batch = a[0] if len(a) == 3 else 1
    return 2 * batch * a[-2] * a[-1] * b[-1]


def gemm_shapes(stepper, batch, dtype: str) -> None:
    """One update under the profiler with shapes: time and GFLOP/s per product shape, against the peak."""
    from common import gemm_peak
    from torch.profiler import ProfilerActivity, profile

    peak = gemm_peak(torch.bfloat16 if dtype == "bf16" else torch.float32)  # BENCHMARKS.md's MFU peak
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        start = time.perf_counter()
        stepper.update([batch], 100)
        wall = time.perf_counter() - start
    rows = []
    for e in prof.key_averages(group_by_input_shape=True):
        flops = product_flops(e.key, e.input_shapes)
        if flops:
            shapes = " × ".join("x".join(map(str, s)) for s in e.input_shapes if len(s) in (2, 3))  # out= too
            seconds = e.self_cpu_time_total / 1e6  # the calling thread's time: intra-op threads run inside it
            rows.append((seconds, e.key.removeprefix("aten::"), shapes, e.count, flops * e.count))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(
        f"one update: {wall * 1e3:.0f} ms, of which matrix products {total * 1e3:.0f} ms ({total / wall:.0%}); "
        f"{dtype} peak (best 1024³ or 2048³ product, {torch.get_num_threads()} threads) {peak / 1e9:.0f} GFLOP/s"
    )
    print("| op | shapes | calls | ms | GFLOP/s | of peak |")
    print("|---|---|---|---|---|---|")
    for seconds, op, shapes, calls, flops in rows:
        rate = flops / seconds if seconds else 0.0
        print(f"| {op} | {shapes} | {calls} | {seconds * 1e3:.1f} | {rate / 1e9:.0f} | {rate / peak:.0%} |")
    all_flops = sum(r[4] for r in rows)
    print(f"all products: {all_flops / total / 1e9:.0f} GFLOP/s, {all_flops / total / peak:.0%} of peak")


if __name__ == "__main__":
    main()
