"""The three matrix products of a linear layer in a training update, each alone, against the square-product peak:
forward ``x W^T`` (tokens × d_in by d_in × d_out), input gradient ``g W`` and weight gradient ``g^T x``, whose
reduction runs over the batch's tokens; and the weight gradient with the narrower of ``x`` and ``g`` first copied
to a transposed, row-major layout (the copy timed with the product; ``(x^T g)^T`` when d_in < d_out). ``python bench/linear_products.py [--dtype bf16] [--tokens 4032]``

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


def narrow_first(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The weight gradient, (d_out, d_in) or its transpose, from the narrower operand copied transposed."""
    if x.shape[1] < g.shape[1]:
        return x.t().contiguous() @ g  # (d_in, T) @ (T, d_out): the gradient's transpose
    return g.t().contiguous() @ x  # (d_out, T) @ (T, d_in)


def operands(d_in: int, d_out: int) -> dict[str, tuple]:
    """The layer's products: name -> (the call, its FLOPs)."""
    x = torch.randn(T, d_in).to(dtype)  # the layer's input, (T, d_in)
    w = torch.randn(d_out, d_in).to(dtype)  # nn.Linear's weight, (d_out, d_in)
    g = torch.randn(T, d_out).to(dtype)  # the output's gradient, (T, d_out)
    flops = 2 * T * d_in * d_out
    return {
        "forward": (lambda: torch.mm(x, w.t()), flops),
        "input grad": (lambda: torch.mm(g, w), flops),
        "weight grad": (lambda: torch.mm(g.t(), x), flops),
        "weight grad, narrow first": (lambda: narrow_first(x, g), flops),
    }


products = {}
for d_in, d_out in ((512, 2048), (2048, 512), (512, 512)):
    for name, call in operands(d_in, d_out).items():
        products[f"{d_in}→{d_out} {name}"] = call
for n in PEAK_SIZES:
    square = torch.randn(n, n).to(dtype)
    products[f"{n}³ square"] = (lambda a=square: torch.mm(a, a), 2 * n**3)

print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, {args.dtype}, {T} tokens")
for threads in map(int, args.threads.split(",")):
    torch.set_num_threads(threads)
    best = dict.fromkeys(products, float("inf"))
    for _ in range(args.rounds):
        for name, (call, _) in products.items():
            best[name] = min(best[name], best_ms(call, calls=5, repeats=2))
    peak = max(2 * n**3 / best[f"{n}³ square"] for n in PEAK_SIZES) / 1e-3
    for name, (_, flops) in products.items():
        rate = flops / best[name] / 1e-3
        print(f"{threads} thread(s)  {name:34s} {best[name]:7.2f} ms  {rate / 1e9:6.0f} GFLOP/s  {rate / peak:4.0%}")
