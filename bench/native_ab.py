"""A/B of two batch-1 decoding changes (ghost rows, the C++ step), in one process, alternating.

Engines, all beam search with the same model, beam 4, α 0.6, max length |x| + 50:
  python-ghosts  the Python step with ghosts at every step (the older search)
  python         the Python step, ghosts only while slots × rows is not a multiple of 4
  native         the C++ step (transduce.decode.native) with the same search as `python`

Usage: T=2 .venv/bin/python bench/native_ab.py DTYPE BATCH SENTENCES REPEATS [MODEL DATA]
Prints tokens/s per engine (median of REPEATS), the ratio to python-ghosts, and how many outputs
(tokens and score) equal python-ghosts'.
"""
import os
import statistics
import sys
import time

import torch

from transduce.data import PreparedData
from transduce.decode import search
from transduce.decode.native import native_step
from transduce.decode.translator import for_decoding
from transduce.modeldir import load_model_dir

torch.set_num_threads(int(os.environ.get("T", "2")))
dtype, bs, n, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
model_dir = sys.argv[5] if len(sys.argv) > 5 else "runs/attempt5-seed1/model"
data_dir = sys.argv[6] if len(sys.argv) > 6 else "runs/attempt5-seed1/data"
model, vocabs, _ = load_model_dir(model_dir)
model = for_decoding(model.eval(), dtype, torch.device("cpu")).eval()
fast = native_step(model)
assert fast is not None, "the C++ step is not available"

test = PreparedData.open(data_dir).split("test")
srcs = [ids + [3] for ids in vocabs.src.encode_batch([test.src_text(i) for i in range(n)])]
order = sorted(range(n), key=lambda i: len(srcs[i]))
batches = []
for i in range(0, n, bs):
    chunk = [srcs[j] for j in order[i:i + bs]]
    width = -(-max(map(len, chunk)) // 8) * 8
    batches.append(torch.tensor([s + [0] * (width - len(s)) for s in chunk]))  # (B, S)

new_of = search._Batch.of.__func__
old_of = classmethod(lambda cls, sentences, rows=1: new_of(cls, sentences, 1))  # ghosts at every step
engines = {"python-ghosts": (model, old_of), "python": (model, classmethod(new_of)), "native": (fast, classmethod(new_of))}
times: dict[str, list[float]] = {k: [] for k in engines}
outs: dict[str, list] = {}
with torch.inference_mode():
    search.beam_search(fast, batches[0], beam=4)  # warm-up (and the extension's first load)
    for r in range(reps):
        for name in (list(engines) if r % 2 == 0 else list(engines)[::-1]):
            decoder, of = engines[name]
            search._Batch.of = of
            t0, toks, hyps = time.perf_counter(), 0, []
            for b in batches:
                for h in search.beam_search(decoder, b, beam=4, alpha=0.6):
                    toks += len(h[0].tokens) + 1
                    hyps.append((h[0].tokens, h[0].score))
            times[name].append(toks / (time.perf_counter() - t0))
            outs[name] = hyps
search._Batch.of = classmethod(new_of)
base = statistics.median(times["python-ghosts"])
for name in engines:
    med = statistics.median(times[name])
    same = sum(a == b for a, b in zip(outs[name], outs["python-ghosts"]))
    print(f"{dtype} batch {bs} threads {torch.get_num_threads()} {name}: {med:.0f} tok/s ({med / base:.2f}x), "
          f"same tokens and score as python-ghosts {same}/{len(outs[name])}")
