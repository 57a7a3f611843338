"""First pass of a build: stream each corpus of a split once, drop what cannot be used, and stage the rest.

Each pair is read, checked (undecodable sides with ``--skip-invalid``: ``invalid_utf8``; a side empty
or only whitespace: ``empty``), hashed (:mod:`.dedup`) and written to two staging files, one line per
side. Nothing but counts and 8-byte digests stays in memory. After the pass, repeats across all the
split's corpora are known (``duplicate``, training data with ``--dedup``), and :func:`vocab_sample`
draws the BPE training sample from the kept pairs.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .dedup import Digests, first_occurrences, pair_digest, sampled


def progress(total: int | None, desc: str) -> tqdm:
    """A tqdm bar on stderr, shown only when stderr is a terminal."""
    return tqdm(
        total=total,
        desc=desc,
        unit=" pairs",
        unit_scale=True,
        disable=not sys.stderr.isatty(),
        mininterval=1.0,
        file=sys.stderr,
    )


@dataclass
class StagedCorpus:
    """One corpus after the first pass: staging files, the digest of each staged pair, and what it held."""

    name: str
    weight: float
    files: tuple[Path, Path]
    digests: np.ndarray  # (n,) uint64, one per staged pair
    keep: np.ndarray  # (n,) bool, False for repeats (filled in by :func:`stage_split`)
    read: int

    def copies(self) -> Iterator[np.ndarray]:
        """For each pass over the corpus, (n,) bool of the pairs it writes: ``floor(weight)`` full
        copies, then a fixed ``weight - floor(weight)`` share chosen by digest."""
        full, share = int(self.weight), self.weight - int(self.weight)
        for copy in range(math.ceil(self.weight)):
            yield self.keep if copy < full else self.keep & sampled(self.digests, share)

    def chunks(self, size: int) -> Iterator[tuple[int, list[str], list[str]]]:
        """The staged pairs as ``(first index, source lines, target lines)`` of at most ``size`` pairs."""
        with open(self.files[0], "rb") as fs, open(self.files[1], "rb") as ft:
            for start in range(0, len(self.digests), size):
                k = min(size, len(self.digests) - start)
                yield start, [b[:-1].decode() for b in islice(fs, k)], [b[:-1].decode() for b in islice(ft, k)]


@dataclass
class StagedSplit:
    corpora: list[StagedCorpus]
    read: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    filtered: dict[str, int] = field(default_factory=dict)


def _stage_corpus(name: str, weight: float, pairs: Iterator, stem: Path, split: StagedSplit, bar: tqdm) -> StagedCorpus:
    digests, read = Digests(), 0
    files = (stem.parent / f"{stem.name}.src", stem.parent / f"{stem.name}.tgt")
    skipped, filtered = split.skipped, split.filtered
    with open(files[0], "wb") as fs, open(files[1], "wb") as ft:
        for src, tgt in pairs:
            read += 1
            if src is None or tgt is None:
                skipped["invalid_utf8"] = skipped.get("invalid_utf8", 0) + 1
            elif not src.strip() or not tgt.strip():
                filtered["empty"] += 1
            else:
                if "\n" in src or "\n" in tgt:
                    raise ValueError(f"corpus {name!r} has a sentence with a line break: {(src + tgt)[:80]!r}")
                digests.append(pair_digest(src, tgt))
                fs.write(src.encode() + b"\n")
                ft.write(tgt.encode() + b"\n")
            if read % 4096 == 0:
                bar.update(4096)
        bar.update(read % 4096)
    kept = digests.array()
    return StagedCorpus(name, weight, files, kept, np.ones(len(kept), dtype=bool), read)


def stage_split(
    name: str, sources: list[tuple[str, float, Iterator]], skipped: dict[str, int], workdir: Path, dedup: bool
) -> StagedSplit:
    """Stream ``sources`` ((corpus name, weight, pairs), pairs ``None`` where undecodable) into staging
    files under ``workdir``; ``skipped``: pairs already left out by the reader, by reason."""
    split = StagedSplit([], skipped=dict(skipped), filtered={"empty": 0})
    with progress(None, f"reading {name}") as bar:
        for number, (corpus, weight, pairs) in enumerate(sources):
            split.corpora.append(_stage_corpus(corpus, weight, pairs, workdir / f"{name}.{number}", split, bar))
    split.read = sum(c.read for c in split.corpora) + sum(skipped.values())
    if dedup:
        keep = first_occurrences(np.concatenate([c.digests for c in split.corpora]))  # (n,) over all corpora
        start = 0
        for c in split.corpora:
            c.keep, start = keep[start : start + len(c.digests)], start + len(c.digests)
        split.filtered["duplicate"] = int(len(keep) - keep.sum())
    return split


def vocab_sample(split: StagedSplit, size: int, workdir: Path, lowercase: bool) -> tuple[Path, Path, int]:
    """Write a uniform sample of ``size`` kept pairs (all when fewer; corpus weights not applied), in
    corpus order, to a source and a target file; returns them and the number of pairs sampled.
    The draw is fixed (seed 0), so the same corpus gives the same vocabulary."""
    counts = [int(c.keep.sum()) for c in split.corpora]
    total = sum(counts)
    chosen = np.ones(total, dtype=bool)
    if total > size:
        chosen[:] = False
        chosen[np.random.default_rng(0).choice(total, size, replace=False)] = True
    paths = (workdir / "sample.src", workdir / "sample.tgt")
    with (
        open(paths[0], "w", encoding="utf-8", newline="") as fs,
        open(paths[1], "w", encoding="utf-8", newline="") as ft,
    ):
        offset = 0
        for c, count in zip(split.corpora, counts):
            mine = np.zeros(len(c.keep), dtype=bool)
            mine[c.keep] = chosen[offset : offset + count]  # (n,) sampled among this corpus' kept pairs
            offset += count
            for start, src, tgt in c.chunks(1 << 16):
                for i in np.flatnonzero(mine[start : start + len(src)]):
                    fs.write((src[i].lower() if lowercase else src[i]) + "\n")
                    ft.write((tgt[i].lower() if lowercase else tgt[i]) + "\n")
    return paths[0], paths[1], int(chosen.sum())
