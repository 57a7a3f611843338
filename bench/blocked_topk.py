"""A/B of beam search's projection + log-softmax + top-k in row blocks (not adopted: the decoder keeps whole rows).

  python bench/blocked_topk.py micro            # the step's tail alone, random weights: whole vs blocks of 32
  git apply bench/blocked_topk.diff             # restores the blocked search (decode/search.py: _step_topk)
  python bench/blocked_topk.py decode fp32 3    # whole decodes, 1,000 test sentences, batch 64, beam 4
  git apply -R bench/blocked_topk.diff

Both modes use 2 threads; ``decode`` alternates the two paths in one process and needs a Multi30k model
(default runs/attempt5-seed1/model: a cased `small` model of `make multi30k SEED=1` at commit 3e16641).
"""

from __future__ import annotations

import functools
import gzip
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from transduce.decode.search import row_topk  # noqa: E402


def timed(f, n: int = 200) -> float:
    for _ in range(10):
        f()
    start = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - start) / n * 1e3  # ms


def micro() -> None:
    N, d, V, k = 256, 128, 8000, 8
    h, W = torch.randn(N, d), torch.randn(V, d) * 0.1

    def whole():
        return row_topk(torch.log_softmax(h @ W.T, -1), k)  # (N, V) logits written, read, written

    def blocked(B: int = 32):
        parts = [row_topk(torch.log_softmax(h[i:i + B] @ W.T, -1), k) for i in range(0, N, B)]
        return torch.cat([v for v, _ in parts]), torch.cat([j for _, j in parts])

    print("same indices:", torch.equal(whole()[1], blocked()[1]))
    for _ in range(3):
        print(f"whole {timed(whole):.2f} ms   blocks of 32 {timed(blocked):.2f} ms")


def decode(dtype: str, reps: int) -> None:
    import transduce.decode.search as S
    from transduce.api import load

    if not hasattr(S, "_step_topk"):
        raise SystemExit("apply bench/blocked_topk.diff first (see the docstring)")
    src = gzip.open(ROOT.parent / "shared/data/multi30k/test_2016_flickr.en.gz", "rt").read().splitlines()
    tr = load(ROOT / "runs/attempt5-seed1/model", dtype=dtype)
    modes = {"whole": functools.partial(S._step_topk, block=10**9), "block32": S._step_topk}
    out, times = {}, {m: [] for m in modes}
    tr.translate(src[:64], beam=4, batch_size=64)  # warm-up
    for _ in range(reps):
        for m, f in modes.items():
            S._step_topk = f
            start = time.perf_counter()
            out[m] = tr.translate(src, beam=4, alpha=0.6, batch_size=64)
            times[m].append(time.perf_counter() - start)
    med = {m: sorted(t)[reps // 2] for m, t in times.items()}
    for m in modes:
        print(f"{dtype} {m}: median {med[m]:.2f} s {[round(x, 2) for x in times[m]]}")
    print("identical outputs:", sum(a == b for a, b in zip(out["whole"], out["block32"])), "/", len(src))
    print(f"whole / block32 time: {med['whole'] / med['block32']:.3f}")


if __name__ == "__main__":
    torch.set_num_threads(2)
    if sys.argv[1] == "micro":
        micro()
    else:
        decode(sys.argv[2], int(sys.argv[3]))
