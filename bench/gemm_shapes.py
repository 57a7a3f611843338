"""fp32 matmul speed at the small model's training shapes, 1 thread: is the BLAS healthy on this CPU?

``python bench/gemm_shapes.py``. PyTorch's x86 wheels multiply fp32 matrices with MKL, which on AMD CPUs once
took slow code paths; this prints GFLOP/s for the products a `small` update is made of (1,024 target tokens,
d_model 128, d_ff 256, 8,000 pieces), forward and backward shapes, each timed for a second after 3 warm-up
calls. A diagnostic, not a comparison: read it against the core's FMA peak (AVX2: 32 fp32 FLOP per cycle).
"""

import time

import torch

torch.set_num_threads(1)
SHAPES = {  # (m, k, n): (m x k) @ (k x n)
    "logits (T, d) @ (d, V)": (1024, 128, 8000),
    "grad of hidden (T, V) @ (V, d)": (1024, 8000, 128),
    "grad of output embedding (d, T) @ (T, V)": (128, 1024, 8000),
    "feed-forward in (T, d) @ (d, d_ff)": (1024, 128, 256),
    "feed-forward out (T, d_ff) @ (d_ff, d)": (1024, 256, 128),
    "attention projection (T, d) @ (d, d)": (1024, 128, 128),
}
print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, 1 thread, fp32")
for name, (m, k, n) in SHAPES.items():
    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(3):
        a @ b
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < 1.0:
        a @ b
        calls += 1
    seconds = (time.perf_counter() - start) / calls
    print(f"{name:44s} {m:5d} x {k:5d} x {n:5d}  {2 * m * k * n / seconds / 1e9:6.1f} GFLOP/s")
