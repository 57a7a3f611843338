"""The training loss alone, C++ against tensor ops: forward + backward of `projected_rdrop_loss` over
929 rows × 2 R-Drop copies, d_model 128, vocabulary 8,000, bf16 matmuls, 1 thread, and the same block
matmuls alone. ``python bench/loss_block.py`` (README, "Which loss kernel trains")."""

import time

import torch

from transduce.train import native_loss
from transduce.train.loss import projected_rdrop_loss

torch.set_num_threads(1)
torch.manual_seed(0)
N, d, V, ROWS = 929, 128, 8000, 32
h = torch.randn(2 * N, d, requires_grad=True)
w = (torch.randn(V, d) * 0.05).requires_grad_()
y = torch.randint(1, V, (N,))
hc, wc = h.detach().bfloat16(), w.detach().bfloat16()


def loss_once():
    loss, _ = projected_rdrop_loss(h, w, y, 0.1, 0, 2.0, torch.bfloat16, ROWS)
    loss.backward()


def matmuls_once():  # the four products of either version: two block-wise forward, two backward
    g = torch.empty(N, V, dtype=torch.bfloat16)
    for s in range(0, N, ROWS):
        e = min(s + ROWS, N)
        torch.mm(hc[s:e], wc.t(), out=g[s:e])
        torch.mm(hc[N + s : N + e], wc.t(), out=g[s:e])
    for copy in (hc[:N], hc[N:]):
        g @ wc, g.t() @ copy


def ms(fn, repeats=10):
    for _ in range(3):
        fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1000


real = native_loss.applies
for _ in range(2):  # alternating
    native_loss.applies = real
    print(f"C++ loss:   {ms(loss_once):6.1f} ms forward + backward")
    native_loss.applies = lambda *blocks: False
    print(f"tensor ops: {ms(loss_once):6.1f} ms forward + backward")
native_loss.applies = real
print(f"matmuls:    {ms(matmuls_once):6.1f} ms")
