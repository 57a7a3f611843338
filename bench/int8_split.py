"""Where a beam-4 search spends its time with the C++ step: decoder step, candidate selection, encoder.

    python bench/int8_split.py runs/attempt5-seed1/model --sentences 100 --threads 1 [--fp32]

Translates the first ``--sentences`` test sentences one at a time (batch 1) with ``--native`` (int8 unless
``--fp32``) and prints target tok/s and the share of wall-clock inside each NativeStep method. Run it in a
worktree of another commit (PYTHONPATH=that/src) for a before/after.
"""

from __future__ import annotations

import argparse
import time

import torch

from transduce.data import PreparedData
from transduce.decode import search
from transduce.decode.native import DeferredCache, native_step
from transduce.modeldir import load_model_dir


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--sentences", type=int, default=100)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--fp32", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model, vocabs, _ = load_model_dir(args.model)
    fast = native_step(model.eval(), int8=not args.fp32)
    test = PreparedData.open(f"{args.model}/../data").split("test")
    ids = vocabs.src.encode_batch([test.src_text(i) for i in range(args.sentences)])
    batches = [torch.tensor([s + [3] + [0] * (-(len(s) + 1) % 8)]) for s in ids]  # eos, padded to 8
    spent = {"decode_step": 0.0, "beam_candidates": 0.0, "encode": 0.0, "reorder": 0.0}

    def timed(owner, name, key):
        f = getattr(owner, name)

        def g(*a, **k):
            start = time.perf_counter()
            out = f(*a, **k)
            spent[key] += time.perf_counter() - start
            return out
        setattr(owner, name, g)

    for name in ("decode_step", "beam_candidates", "encode"):
        timed(fast, name, name)
    timed(DeferredCache, "reorder", "reorder")
    with torch.inference_mode():
        for b in batches[:10]:  # warm-up
            search.beam_search(fast, b, beam=4)
        spent.update(dict.fromkeys(spent, 0.0))
        start, tokens = time.perf_counter(), 0
        for b in batches:
            tokens += len(search.beam_search(fast, b, beam=4)[0][0].tokens) + 1
        total = time.perf_counter() - start
    print(f"{'fp32' if args.fp32 else 'int8'} --native, batch 1, beam 4, {args.threads} thread(s): "
          f"{tokens / total:,.0f} target tok/s ({tokens} tokens, {total * 1000:.0f} ms)")
    for key, s in spent.items():
        print(f"  {key:16s} {s * 1000:6.0f} ms  {s / total:4.0%}")


if __name__ == "__main__":
    main()
