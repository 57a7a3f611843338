"""One layer's attention in bf16 training on CPU: SDPA's math kernel against the formula written out.

    python bench/attention_train_cpu.py --threads 2

Forward + backward at paper-base shapes on Multi30k lengths (227 sentences × 17 tokens, 8 heads of 64),
under bf16 autocast with a padding mask; mean of 5 calls after a warm-up, the two alternating twice.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from transduce.model.attention import attention_fast, attention_written_out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    B, T, h, d_k = 227, 17, 8, 64
    torch.manual_seed(0)
    x = torch.randn(B, T, 3 * h * d_k, requires_grad=True)
    mask = torch.ones(B, 1, 1, T, dtype=torch.bool)
    mask[:50, ..., 12:] = False

    def run(kind: str) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            q, k, v = (t.transpose(1, 2) for t in x.to(torch.bfloat16).view(B, T, 3, h, d_k).unbind(2))
            if kind == "math":
                with sdpa_kernel(SDPBackend.MATH):
                    out = attention_fast(q, k, v, mask)
            else:
                out = attention_written_out(q, k, v, mask)
        out.float().sum().backward()

    for kind in ("math", "written out") * 2:
        run(kind)
        start = time.perf_counter()
        for _ in range(5):
            run(kind)
        print(
            f"{kind:12s} {(time.perf_counter() - start) / 5 * 1000:6.1f} ms forward + backward ({args.threads} threads)"
        )


if __name__ == "__main__":
    main()
