"""The post-norm sub-layer connection LayerNorm(x + Dropout(y)) on CPU, the C++ kernel against the modules (the
C++ dropout, the add and nn.LayerNorm): forward + backward of one connection under bf16 autocast (x the fp32
stream, y the sub-layer's bf16 output, as in a training step), p = 0.1, best of 3 × 50 calls, the two
alternating. ``python bench/residual_kernel.py [--threads N]`` (`train/residual.py`).

Shapes: 4,096 tokens (a batch of the demo's size) at d_model 128, 256 and 512 (small, medium, paper-base)."""

import argparse

import torch
from common import best_ms

from transduce.model.layers import Residual
from transduce.train.dropout import use_fast_dropout
from transduce.train.native import extension
from transduce.train.residual import use_native_residual

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--threads", type=int, default=1)
args = parser.parse_args()
torch.set_num_threads(args.threads)
assert extension() is not None, "the C++ training kernels did not build"

print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, {args.threads} thread(s), bf16 autocast")
for d in (128, 256, 512):
    modules, fused = Residual(d, 0.1, "post", 1e-6), Residual(d, 0.1, "post", 1e-6)
    for m in (modules, fused):
        use_fast_dropout(m)
    use_native_residual(fused)
    x = torch.randn(128, 32, d, requires_grad=True)  # (B, T, d): 4,096 tokens
    y = torch.randn(128, 32, d, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(128, 32, d)

    def step(m):
        x.grad = y.grad = None  # no accumulation pass: a training step's connection writes its gradients once
        with torch.autocast("cpu", dtype=torch.bfloat16):
            z = m(x, lambda _: y)
        z.backward(g)

    times = {"modules": [], "C++": []}
    for _ in range(2):
        times["modules"].append(best_ms(lambda: step(modules), calls=50, warmup=5))
        times["C++"].append(best_ms(lambda: step(fused), calls=50, warmup=5))
    a, b = min(times["modules"]), min(times["C++"])
    print(f"d_model {d:4d}  modules {a:.3f} ms  C++ {b:.3f} ms  {a / b:.2f}x")
