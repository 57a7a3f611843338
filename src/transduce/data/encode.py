"""Encoding in parallel processes: chunks of sentences in, flat token-id arrays out, in order.

Each worker holds the SentencePiece models (sent once, at start) and turns a chunk of
``(sources, targets)`` into ``(src_ids, src_lengths, tgt_ids, tgt_lengths)``: flat ``int32`` ids
and ``int64`` lengths, which :mod:`.build` appends to the memory-mapped cache. At most ``2 × processes``
chunks are in flight (``Pool.imap`` would read its whole input ahead), so memory does not grow with the corpus.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections import deque
from collections.abc import Iterable, Iterator

import numpy as np

from .vocab import Vocab

Chunk = tuple[list[str], list[str]]
Encoded = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]

_worker: dict[str, Vocab] = {}


def _start(src: tuple[bytes, bool], tgt: tuple[bytes, bool]) -> None:
    _worker["src"] = Vocab(*src)
    _worker["tgt"] = _worker["src"] if tgt == src else Vocab(*tgt)


def _flat(vocab: Vocab, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    ids = vocab.encode_batch(texts)
    lengths = np.fromiter((len(s) for s in ids), dtype=np.int64, count=len(ids))  # (B,)
    flat = np.fromiter((i for s in ids for i in s), dtype=np.int32, count=int(lengths.sum()))  # (sum lengths,)
    return flat, lengths


def _encode(chunk: Chunk) -> Encoded:
    return (*_flat(_worker["src"], chunk[0]), *_flat(_worker["tgt"], chunk[1]))


def default_processes() -> int:
    """All cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def encode_chunks(src: Vocab, tgt: Vocab, chunks: Iterable[Chunk], processes: int | None = None) -> Iterator[Encoded]:
    """Encode ``chunks`` (consumed lazily) with ``processes`` workers; results in input order.
    One process encodes in this one, without a pool."""
    processes = processes or default_processes()
    specs = ((src.proto, src.lowercase), (tgt.proto, tgt.lowercase))
    if processes == 1:
        _start(*specs)
        yield from map(_encode, chunks)
        return
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    with ctx.Pool(processes, initializer=_start, initargs=specs) as pool:
        pending: deque = deque()
        for chunk in chunks:
            pending.append(pool.apply_async(_encode, (chunk,)))
            if len(pending) >= 2 * processes:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
