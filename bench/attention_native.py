"""Multi-head attention for training on CPU, the C++ kernel against the written-out formula: forward + backward of
one layer's attention from its projections' output to the merged heads (what ``W^O`` takes), under bf16 autocast,
best of 3 × 20 calls, the two alternating. ``python bench/attention_native.py [--threads N]``
(`train/attention.py`; the reference is `model/attention.py`'s ``attention_written_out``).

Shapes: ~4,000 tokens of Multi30k-length sentences (222 × 18, paper-base's batch in BENCHMARKS.md) at small (4 heads
of 32), medium (4 × 64) and paper-base (8 × 64); encoder self-attention with a key-padding mask, decoder causal
self-attention, encoder–decoder attention."""

import argparse

import torch
from common import best_ms

from transduce.model.attention import MultiHeadAttention, use_kernel
from transduce.train.attention import use_native_attention
from transduce.train.native import extension

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--batch", type=int, default=222)
parser.add_argument("--length", type=int, default=18)
parser.add_argument("--presets", default="small,medium,paper-base")
parser.add_argument("--rounds", type=int, default=2, help="alternating rounds; the best of each side is shown")
args = parser.parse_args()
torch.set_num_threads(args.threads)
assert extension() is not None, "the C++ training kernels did not build"

print(
    f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, {args.threads} thread(s), bf16 autocast, "
    f"{args.batch} × {args.length} tokens"
)
B, T = args.batch, args.length
lengths = torch.randint(T // 2, T + 1, (B,))
key_mask = (torch.arange(T) < lengths[:, None])[:, None, None, :]  # (B, 1, 1, T)
SIZES = {"small": (128, 4), "medium": (256, 4), "paper-base": (512, 8)}  # d_model, heads
for name in args.presets.split(","):
    d, h = SIZES[name]
    for kind in ("encoder self", "decoder self", "enc-dec"):
        written = MultiHeadAttention(d, h, self_attention=kind != "enc-dec")
        native = MultiHeadAttention(d, h, self_attention=kind != "enc-dec")
        native.load_state_dict(written.state_dict())
        use_kernel(written, "written")
        use_native_attention(native)
        x = torch.randn(B, T, d, requires_grad=True)
        memory = torch.randn(B, T, d, requires_grad=True) if kind == "enc-dec" else None
        mask, causal = (None, True) if kind == "decoder self" else (key_mask, False)
        g = torch.randn(B, T, d)

        def step(m):
            x.grad = None
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = m(x, memory, mask=mask, is_causal=causal)
            out.backward(g)

        times = {"written": [], "C++": []}
        for _ in range(args.rounds):
            times["written"].append(best_ms(lambda: step(written), calls=20, warmup=3))
            times["C++"].append(best_ms(lambda: step(native), calls=20, warmup=3))
        a, b = min(times["written"]), min(times["C++"])
        print(f"{name:10s} {kind:12s}  written {a:7.2f} ms  C++ {b:7.2f} ms  {a / b:.2f}x  (with the projections)")
