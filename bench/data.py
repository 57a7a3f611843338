"""Benchmark data: Multi30k en→de prepared by transduce's own pipeline (shared 8k BPE, §5.1).

The data directory is built once with the same code as ``transduce prepare multi30k`` and reused
(the build is keyed on the inputs' hashes and settings).
"""

from __future__ import annotations

from pathlib import Path

from common import MULTI30K, ROOT

from transduce.data import PreparedData
from transduce.data.batching import Batch, TokenBatches
from transduce.data.build import BuildSettings, build
from transduce.data.multi30k import load_multi30k

DATA_DIR = ROOT / "runs" / "bench" / "multi30k-en-de"


def prepared(vocab_size: int = 8000, raw: Path = MULTI30K, out: Path = DATA_DIR) -> PreparedData:
    """Multi30k en→de with a shared BPE vocabulary of ``vocab_size`` pieces, built or reused."""
    if not (raw / "train.en.gz").is_file():
        raise FileNotFoundError(f"{raw}/train.en.gz: Multi30k raw files not found (expected ../shared/data/multi30k)")
    build(load_multi30k("en", "de", raw), BuildSettings(vocab_size=vocab_size), out)
    return PreparedData.open(out)


def train_batches(data: PreparedData, count: int | None, max_tokens: int = 4224, epoch: int = 0) -> list[Batch]:
    """The first ``count`` (None: all) batches of a training epoch: length-bucketed, ~3,840 target tokens each
    at 4224."""
    batches = TokenBatches(data.split("train"), max_tokens=max_tokens, seed=1).epoch(epoch)
    if count is None:
        return batches
    if count > len(batches):
        raise ValueError(f"asked for {count} batches, an epoch has {len(batches)} at max_tokens={max_tokens}")
    return batches[:count]
