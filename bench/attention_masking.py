"""The written-out training attention with its scale and mask inside the score product (one ``baddbmm``), against
the same formula in separate passes (product, scale, ``masked_fill`` of the scores and of the weights' empty
rows, as :func:`transduce.model.attention.attention_reference` does), in fp32 scores under bf16 autocast.

    python bench/attention_masking.py

The demo's shapes: 18 sentences × 4 heads × 54 positions × 32 per head, a padding mask and a causal one;
forward + backward, 1 thread, 50 calls per timing, the two alternating 6 times; best and median.
"""

from __future__ import annotations

import math
import time

import torch

from transduce.model.attention import _softmax_and_mix, attention_written_out


def separate_passes(q, k, v, mask):
    with torch.autocast("cpu", enabled=False):
        scores = torch.matmul(q.float(), k.float().transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    return _softmax_and_mix(scores, v, mask, 0.0, short_rows=True)[0]


def main() -> None:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    B, h, T, d = 18, 4, 54, 32
    lengths = torch.randint(20, T + 1, (B,), generator=g)
    lengths[0] = T
    pad = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    masks = {
        "padding": pad[:, None, None, :],  # (B, 1, 1, T)
        "causal": pad[:, None, None, :] & torch.ones(T, T, dtype=torch.bool).tril(),  # (B, 1, T, T)
    }
    for name, mask in masks.items():
        q, k, v = (torch.randn(B, h, T, d, generator=g).bfloat16().requires_grad_() for _ in range(3))
        times: dict[str, list[float]] = {}
        for _ in range(6):
            for f in (separate_passes, attention_written_out):
                start = time.perf_counter()
                for _ in range(50):
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        out = f(q, k, v, mask)
                    torch.autograd.grad(out.float().sum(), (q, k, v))
                times.setdefault(f.__name__, []).append((time.perf_counter() - start) / 50 * 1000)
        line = ", ".join(f"{n} best {min(t):.2f} median {sorted(t)[3]:.2f} ms" for n, t in times.items())
        print(f"{name} mask: {line}")


if __name__ == "__main__":
    main()
