"""Attention's softmax over short rows on CPU: torch's kernel against `softmax_last`'s whole-tensor ops,
forward + backward of (156, 4, T, T) fp32 scores (one R-Drop batch of 78 Multi30k sentences, 4 heads),
1 thread, best of 3 × 30 calls for each T, the two alternating. ``python bench/softmax_rows.py``
(`model/attention.py`, ``softmax_last``)."""

import torch
from common import best_ms

from transduce.model.attention import SHORT_ROW, _ShortRowSoftmax

torch.set_num_threads(1)

print(f"softmax_last takes the whole-tensor path below {SHORT_ROW} keys")
print("T   torch ms  whole-tensor ms  ratio")
for T in (6, 8, 10, 12, 14, 15, 16, 17, 20, 25, 32):
    x = torch.randn(156, 4, T, T, requires_grad=True)  # (B, h, T_q, T_k)
    g = torch.randn(156, 4, T, T)
    a = best_ms(lambda: torch.softmax(x, dim=-1).backward(g))
    b = best_ms(lambda: _ShortRowSoftmax.apply(x).backward(g))
    print(f"{T:<3d} {a:8.3f}  {b:15.3f}  {a / b:5.2f}x")
