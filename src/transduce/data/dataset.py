"""A prepared data directory, opened for training and evaluation.

    DIR/manifest.json              what was built from what (see :mod:`.prepare`)
    DIR/vocab/                     :class:`~transduce.data.vocab.Vocabs`
    DIR/cache/SPLIT.SIDE.bin       token ids of all sentences, concatenated, int32 (memory-mapped)
    DIR/cache/SPLIT.SIDE.idx.npy   offsets, int64 (N+1,): sentence i is ids[off[i]:off[i+1]]
    DIR/SPLIT.LANG                 the NFC text, one sentence a line (BLEU references)

Opening reads the manifest and the vocabulary, and computes each split's sentence lengths; ids and offsets
stay on disk (memory-mapped) until a batch touches them, so a process holds 2 bytes per sentence and side
(the lengths), not the corpus.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .vocab import Vocabs

MANIFEST = "manifest.json"
FORMAT = 1


CHUNK = 1 << 20  # sentences per step when computing lengths from offsets
SHORT = 30_000  # lengths up to this are held as int16 (room left for +bos +eos), longer ones as int32


def lengths_of(offsets: np.ndarray) -> np.ndarray:
    """(N,) sentence lengths from (N+1,) offsets, int16 where every length is at most ``SHORT`` (else
    int32), computed a chunk at a time so that no int64 copy of the whole array is made."""
    n = len(offsets) - 1
    out = np.empty(n, dtype=np.int32)  # (N,)
    for a in range(0, n, CHUNK):
        b = min(n, a + CHUNK)
        out[a:b] = np.diff(offsets[a : b + 1])
    return out.astype(np.int16) if n and int(out.max()) <= SHORT else out


class TokenArray:
    """Sentences of token ids (no bos/eos): ``arr[i]`` is an int32 array, ``arr.lengths`` (N,) int16
    (int32 if a sentence is longer than ``SHORT`` tokens)."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray):
        self.ids, self.offsets = ids, offsets  # (sum of lengths,) int32, (N+1,) int64
        self.lengths = lengths_of(self.offsets)  # (N,)

    @classmethod
    def open(cls, ids_path: Path, offsets_path: Path) -> TokenArray:
        """The arrays written by :meth:`write`, ids and offsets memory-mapped."""
        offsets = np.load(offsets_path, mmap_mode="r", allow_pickle=False)  # (N+1,) int64
        size = ids_path.stat().st_size
        if size != 4 * int(offsets[-1]):
            raise ValueError(
                f"{ids_path}: {size} bytes, the offsets in {offsets_path} need "
                f"{4 * int(offsets[-1])}; re-run `transduce prepare ... --force`"
            )
        return cls(np.memmap(ids_path, dtype=np.int32, mode="r") if size else np.zeros(0, np.int32), offsets)

    @classmethod
    def from_sentences(cls, sentences: Sequence[Sequence[int]]) -> TokenArray:
        """An in-memory array of ``sentences`` (lists of ids)."""
        offsets = np.concatenate([[0], np.cumsum([len(s) for s in sentences])]).astype(np.int64)  # (N+1,)
        ids = np.fromiter((i for s in sentences for i in s), dtype=np.int32, count=int(offsets[-1]))
        return cls(ids, offsets)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.ids[self.offsets[i] : self.offsets[i + 1]]

    @staticmethod
    def write(sentences: Sequence[Sequence[int]], ids_path: Path, offsets_path: Path) -> None:
        arr = TokenArray.from_sentences(sentences)
        arr.ids.tofile(ids_path)
        with open(offsets_path, "wb") as f:
            np.save(f, arr.offsets, allow_pickle=False)


class ParallelIds:
    """One split: ``src[i]``, ``tgt[i]`` int32 ids without bos/eos; ``src_text(i)``, ``tgt_text(i)`` NFC text."""

    def __init__(self, name: str, directory: Path, files: dict[str, str]):
        self.name = name
        self.src = TokenArray.open(directory / files["src_ids"], directory / files["src_offsets"])
        self.tgt = TokenArray.open(directory / files["tgt_ids"], directory / files["tgt_offsets"])
        if len(self.src) != len(self.tgt):
            raise ValueError(
                f"{directory}: split {name!r} has {len(self.src)} source and {len(self.tgt)} "
                "target sentences; re-run `transduce prepare ... --force`"
            )
        self._text_paths = {"src": directory / files["src_text"], "tgt": directory / files["tgt_text"]}
        self._text: dict[str, list[str]] = {}

    def __len__(self) -> int:
        return len(self.src)

    def lines(self, side: str) -> list[str]:
        """All sentences of ``side`` ("src" or "tgt") as NFC text, read once."""
        if side not in self._text:
            with open(self._text_paths[side], encoding="utf-8", newline="") as f:
                lines = f.read().split("\n")[: len(self)]
            if len(lines) != len(self):
                raise ValueError(f"{self._text_paths[side]}: {len(lines)} lines, expected {len(self)}")
            self._text[side] = lines
        return self._text[side]

    def src_text(self, i: int) -> str:
        return self.lines("src")[i]

    def tgt_text(self, i: int) -> str:
        return self.lines("tgt")[i]


class PreparedData:
    """``PreparedData.open(dir)``: ``.vocabs``, ``.manifest``, ``.split(name)``, ``.splits``."""

    def __init__(self, directory: Path, manifest: dict[str, Any], vocabs: Vocabs):
        self.directory, self.manifest, self.vocabs = directory, manifest, vocabs
        self._splits: dict[str, ParallelIds] = {}

    @classmethod
    def open(cls, directory: str | Path) -> PreparedData:
        directory = Path(directory)
        path = directory / MANIFEST
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no manifest; build the directory with `transduce prepare`")
        manifest = json.loads(path.read_text())
        if manifest.get("format") != FORMAT:
            raise ValueError(
                f"{path}: format {manifest.get('format')!r}, this transduce reads {FORMAT}; "
                "re-run `transduce prepare ... --force`"
            )
        return cls(directory, manifest, Vocabs.load(directory / "vocab"))

    @property
    def splits(self) -> list[str]:
        return list(self.manifest["splits"])

    def split(self, name: str) -> ParallelIds:
        name = self.manifest.get("aliases", {}).get(name, name)
        if name not in self.manifest["splits"]:
            known = self.splits + list(self.manifest.get("aliases", {}))
            raise ValueError(f"{self.directory}: no split {name!r}; it has {', '.join(known)}")
        if name not in self._splits:
            self._splits[name] = ParallelIds(name, self.directory, self.manifest["splits"][name]["files"])
        return self._splits[name]
