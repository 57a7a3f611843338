"""The C++ training attention (an experiment) against transduce's written-out attention: gradients
against attention_reference in fp64, then forward + backward time of one `small` layer's attention
(156 sentences of 25 tokens, 4 heads of 32, bf16, 1 thread). ``python bench/native_attention/compare.py``"""

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import native_attention as na  # noqa: E402

from transduce.model.attention import attention_reference, attention_written_out  # noqa: E402


def check() -> None:
    torch.manual_seed(0)
    B, H, Tq, Tk, d = 3, 2, 5, 7, 8
    for causal in (False, True):
        q, k, v = (torch.randn(B, H, T, d, dtype=torch.float64) for T in (Tq, Tk, Tk))
        mask = torch.ones(B, 1, 1, Tk, dtype=torch.bool)
        mask[0, ..., 5:] = False
        ref_mask = mask & torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq) if causal else mask
        qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
        out = attention_reference(qr, kr, vr, ref_mask, 0.3)[0].transpose(1, 2).reshape(B, Tq, H * d)
        go = torch.randn_like(out)
        (out * go).sum().backward()
        qn, kn, vn = (x.float().requires_grad_() for x in (q, k, v))
        (na.attend(qn, kn, vn, mask, causal, 0.3) * go.float()).sum().backward()
        worst = max((a.grad.double() - b.grad).abs().max().item() for a, b in ((qn, qr), (kn, kr), (vn, vr)))
        print(f"causal={causal}: largest gradient difference from the fp64 reference {worst:.1e}")


def timing() -> None:
    torch.set_num_threads(1)
    B, H, T, d = 156, 4, 25, 32
    qkv = torch.randn(B, T, 3 * H * d).bfloat16()
    q, k, v = (x.view(B, T, H, d).transpose(1, 2) for x in qkv.chunk(3, -1))  # (B, h, T, d_k), as the model's
    mask = torch.ones(B, 1, 1, T, dtype=torch.bool)
    mask[::3, ..., 18:] = False
    go = torch.randn(B, T, H * d).bfloat16()

    def native():
        qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
        na.attend(qq, kk, vv, mask, False, d**-0.5).backward(go)

    def written():
        qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
        attention_written_out(qq, kk, vv, mask, d**-0.5).transpose(1, 2).reshape(B, T, H * d).backward(go)

    for fn in (native, written, native, written):
        fn()
        start = time.perf_counter()
        for _ in range(10):
            fn()
        print(f"{fn.__name__}: {(time.perf_counter() - start) * 100:.1f} ms per forward + backward")


if __name__ == "__main__":
    check()
    timing()
