"""Residual dropout on CPU, the C++ kernel against FastDropout's tensor ops: forward + backward of a (156, 12, 128)
activation (one R-Drop batch of 78 Multi30k sentences, d_model 128), p = 0.1, 1 thread, best of 3 × 50 calls,
the two alternating. ``python bench/dropout_kernel.py`` (`train/dropout.py`)."""

import torch
from common import best_ms

from transduce.train import dropout

torch.set_num_threads(1)

assert dropout.extension() is not None, "the C++ dropout did not build"
drop = dropout.FastDropout(0.1).train()
native = dropout.extension
for dtype in (torch.bfloat16, torch.float32):
    x = torch.randn(156, 12, 128, dtype=dtype, requires_grad=True)
    g = torch.randn(156, 12, 128, dtype=dtype)
    times = {"tensor ops": [], "C++": []}
    for _ in range(2):
        dropout.extension = lambda: None  # FastDropout falls back to its tensor ops
        times["tensor ops"].append(best_ms(lambda: drop(x).backward(g), calls=50, warmup=5))
        dropout.extension = native
        times["C++"].append(best_ms(lambda: drop(x).backward(g), calls=50, warmup=5))
    a, b = min(times["tensor ops"]), min(times["C++"])
    print(f"{str(dtype).removeprefix('torch.'):9s} tensor ops {a:.3f} ms  C++ {b:.3f} ms  {a / b:.2f}x")
