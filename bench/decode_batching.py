"""What decoding several sentences in one call buys, offline: milliseconds a sentence at each batch size.

    python bench/decode_batching.py --model DIR --sentences FILE [--count 400] [--batches 1 2 4 8 16] \
        [--order length|input]

Translates the first ``--count`` sentences, sorted by source length (``--order length``: a call's sentences
have about one length) or in the file's order (``--order input``: a call mixes lengths, as a server's batch
of a few requests does), ``--batches`` sentences a call, with the model's
``auto`` backend, beam 4, length penalty 0.2 (the LibreTranslate benchmark's), one thread. Prints the
milliseconds a sentence at each batch size, in order: the serving batcher's gain from grouping requests is
the gap between the rows. ``perf record -g python bench/decode_batching.py ... --batches 1`` shows where a
lone sentence's time goes inside the C++ step.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from common import machine, revision

from transduce.api import load
from transduce.decode.search_options import SearchOptions


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--sentences", type=Path, required=True)
    p.add_argument("--count", type=int, default=400)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--order", choices=("length", "input"), default="length", help="sentences by length or as read")
    args = p.parse_args()
    torch.set_num_threads(1)
    translator = load(args.model)
    lines = [s.strip() for s in args.sentences.read_text(encoding="utf-8").splitlines() if s.strip()]
    lines = lines[: args.count]
    if args.order == "length":
        lines.sort(key=lambda s: len(translator.vocabs.src.encode(s)))
    search = SearchOptions(beam=4, alpha=0.2)
    translator.translate(lines[:4], search)  # warm-up
    print(f"{machine()}; commit {revision()}; {len(lines)} sentences in {args.order} order; 1 thread; beam 4, α 0.2")
    print("| sentences a call | ms a sentence |\n|---|---|")
    for size in args.batches:
        start = time.perf_counter()
        for i in range(0, len(lines), size):
            translator.translate(lines[i : i + size], search)
        print(f"| {size} | {1000 * (time.perf_counter() - start) / len(lines):.2f} |", flush=True)


if __name__ == "__main__":
    main()
