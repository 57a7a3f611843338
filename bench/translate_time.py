"""Time one `load(...).translate` of Multi30k test sentences: prints "sentences/s output-hash".

    python bench/translate_time.py MODEL_DIR DTYPE BATCH SENTENCES THREADS [--native]

Used by bench/ab_commits.sh to compare two versions of transduce on the same work; the hash shows
whether their translations are identical. Beam 4, α 0.6, one warm-up call on 8 sentences first.
"""

from __future__ import annotations

import gzip
import hashlib
import sys
import time
import warnings
from pathlib import Path

import torch

from transduce.api import load

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    model, dtype, batch, n, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    torch.set_num_threads(threads)
    with gzip.open(ROOT.parent / "shared/data/multi30k/test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        src = [line.rstrip("\n") for line in f][:n]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        translator = load(model, dtype=dtype, native="--native" in sys.argv)
    translator.translate(src[:8], beam=4, batch_size=batch, batch_tokens=100_000)  # warm-up (and any build)
    start = time.perf_counter()
    out = translator.translate(src, beam=4, batch_size=batch, batch_tokens=100_000)
    seconds = time.perf_counter() - start
    print(f"{n / seconds:.1f} {hashlib.md5(chr(10).join(out).encode()).hexdigest()[:8]}")


if __name__ == "__main__":
    main()
