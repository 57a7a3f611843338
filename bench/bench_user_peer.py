"""Training throughput against nn.Transformer as a user typically trains it.

bench_train.py runs both models through transduce's ``Stepper``, so only the model differs. This script
compares whole training steps instead: transduce's trainer update (fused projection + block-wise
label-smoothed loss on non-pad rows, fused Adam) against the same-weight ``nn.Transformer`` peer trained
the usual way: full (B, T, V) logits under autocast, ``F.cross_entropy(label_smoothing=0.1,
ignore_index=pad)``, ``torch.optim.Adam`` with its defaults for the implementation. Same batches, timed
runs alternating A B A B ..., medians. Peak memory: each side again in a process of its own (``--only``),
which builds both models as the timed run does, drops the other one, resets the peak and trains its own:
the VmHWM of those steps (Linux), i.e. the weights plus what training adds.

    python bench/bench_user_peer.py --preset small --dtype bf16 --threads 2 --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from bench_train import build_models
from common import alternate, machine, set_threads
from data import prepared, train_batches

from transduce.train.schedule import Schedule
from transduce.train.step import Stepper

CPU = torch.device("cpu")


def user_step(model, dtype: str, pad_id: int = 0):
    """One plain PyTorch training step on a batch, as a user of nn.Transformer writes it."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else contextlib.nullcontext()

    def step(batch) -> float:
        src, tgt = batch.src, batch.tgt
        with cast:
            logits = model(src, tgt[:, :-1])  # (B, T-1, V)
        labels = tgt[:, 1:]  # (B, T-1)
        loss = F.cross_entropy(
            logits.float().flatten(0, 1), labels.flatten(), ignore_index=pad_id, label_smoothing=0.1, reduction="sum"
        ) / int((labels != pad_id).sum())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def ours_step(model, dtype: str):
    opt = torch.optim.Adam(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9, fused=True)  # as the trainer
    stepper = Stepper(model, opt, Schedule("rsqrt", 4000, model.config.d_model), device=CPU, dtype=dtype)  # ε_ls 0.1
    counter = iter(range(1, 10**9))
    return lambda batch: stepper.update([batch], next(counter)).loss


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--dtype", default="bf16", choices=["fp32", "bf16"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batches", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", choices=["transduce", "peer"], help="train one side twice, print its peak RSS (MiB)")
    args = p.parse_args()
    set_threads(args.threads)
    data = prepared()
    batches = train_batches(data, args.batches)
    models = build_models(args.preset, len(data.vocabs.src))
    if args.only:  # the memory run: the other model dropped, a warm-up and one more pass, then peak RSS
        step = (
            ours_step(models.pop("transduce"), args.dtype)
            if args.only == "transduce"
            else user_step(models.pop("nn.Transformer"), args.dtype)
        )
        models.clear()
        gc.collect()
        Path("/proc/self/clear_refs").write_text("5")  # Linux: reset VmHWM, the peak so far (data, both models)
        for _ in range(2):
            [step(b) for b in batches]
        hwm = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM"))
        print(int(hwm.split()[1]) / 1024)  # kB -> MiB
        return
    steps = {
        "transduce trainer": ours_step(models["transduce"], args.dtype),
        "nn.Transformer + F.cross_entropy": user_step(models["nn.Transformer"], args.dtype),
    }
    timings = alternate({n: (lambda f=f: [f(b) for b in batches]) for n, f in steps.items()}, repeats=args.repeats)
    tokens = sum(b.tgt_tokens for b in batches)
    tok_s = {n: tokens / timings.median(n) for n in steps}
    print(
        f"machine {machine()}, threads {torch.get_num_threads()}, {args.preset} {args.dtype}, {len(batches)} "
        f"batches ({tokens} target tokens) per timed run, median of {args.repeats} alternating runs"
    )
    for n, v in tok_s.items():
        print(f"  {n:34s} {v:8,.0f} target tok/s  (spread ±{timings.spread(n) * 50:.0f}%)")
    a, b = tok_s.values()
    print(f"  ratio transduce / user-style peer: {a / b:.2f}x")
    base = [sys.executable, __file__, *sys.argv[1:]]
    peak = {
        side: float(
            subprocess.run(base + ["--only", side], capture_output=True, text=True, check=True).stdout.split()[-1]
        )
        for side in ("transduce", "peer")
    }
    print(
        f"  peak RSS while training, each side in its own process: transduce {peak['transduce']:,.0f} MiB, "
        f"user-style peer {peak['peer']:,.0f} MiB (weights included)"
    )


if __name__ == "__main__":
    main()
