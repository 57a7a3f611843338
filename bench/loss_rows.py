"""The projected loss alone at each block size: forward + backward of ``ProjectedSmoothedCrossEntropy`` over
914 rows, d_model 128, vocabulary 8,000 (``--vocab V``), bf16 matmuls, 1 thread, three rounds of 20 calls per
size. ``python bench/loss_rows.py [--vocab V]`` (docs/performance.md, "Where the demo's update goes on 2 processes"); the trainer's
block size is :func:`transduce.train.step.loss_block_rows`."""

import argparse
import time

import torch

from transduce.train.loss import ProjectedSmoothedCrossEntropy

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--vocab", type=int, default=8000)
torch.set_num_threads(1)
N, d, V = 914, 128, p.parse_args().vocab
g = torch.Generator().manual_seed(0)
h = torch.randn(N, d, generator=g, requires_grad=True)
w = (torch.randn(V, d, generator=g) * 0.05).requires_grad_()
y = torch.randint(4, V, (N,), generator=g)


def once(rows: int) -> None:
    loss, _ = ProjectedSmoothedCrossEntropy.apply(h, w, y, 0.1, 0, torch.bfloat16, rows, True)
    loss.backward()


times: dict[int, list[float]] = {}
for _ in range(3):  # rounds, so that a slow spell of the machine touches every size
    for rows in (64, 128, 256, 512, 1024):
        for _ in range(3):
            once(rows)
        start = time.perf_counter()
        for _ in range(20):
            once(rows)
        times.setdefault(rows, []).append((time.perf_counter() - start) / 20 * 1000)
for rows, ms in times.items():
    print(f"rows {rows:5d}: " + " ".join(f"{m:.1f}" for m in ms) + " ms per forward + backward")
