"""The int8 GEMM of the C++ step (int8_gemm.h) against fbgemm's, at the decoder step's shapes.

    python bench/int8_gemm_vs_fbgemm.py --threads 1

Times y = x Wᵀ + b for 4 rows (batch 1, beam 4) and 256 rows (batch 64), weights packed once for both;
median of 3 rounds of many calls, alternating.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch

from transduce.backends import native

SHAPES = [
    (4, 128, 384),
    (4, 128, 128),
    (4, 128, 256),
    (4, 256, 128),
    (4, 128, 8000),
    (256, 128, 384),
    (256, 128, 256),
    (256, 256, 128),
    (256, 128, 8000),
]  # (rows, in, out)


def per_call(f, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - start) / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    ext = native.extension()
    torch.manual_seed(0)
    print(f"{args.threads} thread(s), AVX-512 VNNI kernel: {ext.has_vnni()}")
    warnings.simplefilter("ignore")  # fbgemm_* announce a deprecation
    for M, K, N in SHAPES:
        x, w, b = torch.randn(M, K), torch.randn(N, K) * 0.1, torch.randn(N)
        ours = ext.Linear.int8(w, b)
        wq, col_offsets, scale, zero = torch.fbgemm_linear_quantize_weight(w)
        packed = torch.fbgemm_pack_quantized_matrix(wq)
        theirs = lambda: torch.fbgemm_linear_int8_weight_fp32_activation(x, wq, packed, col_offsets, scale, zero, b)
        n = 3000 if M < 10 else 100
        rounds = sorted((per_call(theirs, n), per_call(lambda: ours(x), n)) for _ in range(3))
        fb, us = rounds[1]
        print(f"  {M:4d} x {K:4d} -> {N:5d}: fbgemm {fb * 1e6:7.1f} µs, int8_gemm.h {us * 1e6:7.1f} µs, {fb / us:.2f}x")


if __name__ == "__main__":
    main()
