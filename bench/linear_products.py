"""The three matrix products of a linear layer in a training update, each alone, against the square-product peak:
forward ``x W^T`` (tokens × d_in by d_in × d_out), input gradient ``g W`` and weight gradient ``g^T x``, whose
reduction runs over the batch's tokens. ``python bench/linear_products.py [--dtype bf16] [--tokens 4032]``

Shapes: paper-base's feed-forward (512 → 2,048 and back) and attention projection (512 → 512) at ~4,000 tokens,
the layouts autograd hands the products (``x`` and ``g`` row-major, tokens first). Each product's rate is the best
of ``--rounds`` alternating rounds, on 1 and on 2 threads, beside the best 1024³ and 2048³ products of the same
round (``common.gemm_peak``'s sizes): where an update's products can stand against the MFU's peak."""

import argparse

import torch
from common import PEAK_SIZES, best_ms

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
parser.add_argument("--tokens", type=int, default=4032)
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--threads", default="1,2")
args = parser.parse_args()
dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
T = args.tokens


def operands(d_in: int, d_out: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The (left, right) operands of the layer's three products."""
    x = torch.randn(T, d_in).to(dtype)  # the layer's input, (T, d_in)
    w = torch.randn(d_out, d_in).to(dtype)  # nn.Linear's weight, (d_out, d_in)
    g = torch.randn(T, d_out).to(dtype)  # the output's gradient, (T, d_out)
    return {"forward": (x, w.t()), "input grad": (g, w), "weight grad": (g.t(), x)}


products = {}
for d_in, d_out in ((512, 2048), (2048, 512), (512, 512)):
    for name, pair in operands(d_in, d_out).items():
        products[f"{d_in}→{d_out} {name}"] = pair
for n in PEAK_SIZES:
    square = torch.randn(n, n).to(dtype)
    products[f"{n}³ square"] = (square, square)

print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, {args.dtype}, {T} tokens")
for threads in map(int, args.threads.split(",")):
    torch.set_num_threads(threads)
    best = dict.fromkeys(products, float("inf"))
    for _ in range(args.rounds):
        for name, (a, b) in products.items():
            best[name] = min(best[name], best_ms(lambda a=a, b=b: torch.mm(a, b), calls=5, repeats=2))
    peak = max(2 * n**3 / best[f"{n}³ square"] for n in PEAK_SIZES) / 1e-3
    for name, (a, b) in products.items():
        rate = 2 * a.shape[0] * a.shape[1] * b.shape[1] / best[name] / 1e-3
        print(f"{threads} thread(s)  {name:24s} {best[name]:7.2f} ms  {rate / 1e9:6.0f} GFLOP/s  {rate / peak:4.0%}")
