"""The optimizer step alone, 1 thread: Adam against Muon (train/optim.py) on the small model.

``python bench/optimizer_step.py``. Random gradients, a tiny learning rate, 10 timed steps after 3 warm-up ones,
plain and as the trainer makes them (``found_inf`` set), Muon's iterations in the dtype a training run here picks;
then Muon's Newton-Schulz work by itself in fp32 and in bf16, matrix by matrix, stacked by shape, and one rank's
half of each stack (what each of 2 DDP ranks does), with its FLOP count from the shapes. Pin it to an idle core (``taskset -c 0``).
"""

from collections import defaultdict
from functools import partial

import torch
from common import best_ms

from transduce.model import ModelConfig, Transformer
from transduce.train.config import TrainConfig
from transduce.train.kernels import muon_choice
from transduce.train.muon import NS_STEPS, orthogonalize
from transduce.train.optim import build_optimizer
from transduce.train.step import resolve_dtype

torch.set_num_threads(1)
ms = partial(best_ms, calls=10, repeats=1, warmup=3)  # the mean of 10 calls after 3 warm-up ones

model = Transformer(ModelConfig.preset("small", vocab_size=8000, activation="gelu"))
for p in model.parameters():
    p.grad = torch.randn_like(p)


def flagged(opt: torch.optim.Optimizer) -> None:
    """The step as the trainer makes it: with ``found_inf`` (0 here), the flag of a non-finite loss."""
    opt.found_inf = torch.zeros(())
    opt.step()
    del opt.found_inf


for name in ("adam", "muon"):
    cfg = TrainConfig(data="d", out="o", optimizer=name, weight_decay=0.1)
    muon_dtype = muon_choice("auto", resolve_dtype("auto", "cpu")[0]).name  # what a training run here picks
    opt = build_optimizer(model.named_parameters(), cfg, None, muon_dtype)
    for group in opt.param_groups:
        group["lr"] = 1e-6
    print(
        f"{name} step: {ms(opt.step):.1f} ms; as the trainer makes it (found_inf set): {ms(lambda: flagged(opt)):.1f} ms"
    )

grads = [p.grad for group in opt.param_groups if group["kind"] == "muon" for p in group["params"]]
flop = 0
for g in grads:  # per iteration: gram (m, m) from (m, n), gram @ gram, then (m, m) @ (m, n), with m <= n
    m, n = sorted(g.shape)
    flop += NS_STEPS * (2 * m * m * n + 2 * m**3 + 2 * m * m * n)
by_shape = defaultdict(list)
for g in grads:
    by_shape[tuple(g.shape)].append(g)
stacks = [torch.stack(v) for v in by_shape.values()]
print(f"Newton-Schulz, {len(grads)} matrices, {flop / 1e9:.2f} GFLOP per update:")
for dtype in (torch.float32, torch.bfloat16):  # bf16: what train.muon_dtype = "auto" runs in a bf16 run
    name = str(dtype).removeprefix("torch.")
    print(f"  {name}, matrix by matrix: {ms(lambda: [orthogonalize(g, dtype=dtype) for g in grads]):.1f} ms")
    print(f"  {name}, stacked by shape: {ms(lambda: [orthogonalize(s, dtype=dtype) for s in stacks]):.1f} ms")
    half = ms(lambda: [orthogonalize(s[: (len(s) + 1) // 2], dtype=dtype) for s in stacks])
    print(f"  {name}, one rank's half of each stack: {half:.1f} ms")
