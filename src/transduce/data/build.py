"""Turn a :class:`~.corpora.Corpus` into a data directory (layout in :mod:`.dataset`), or reuse it.

Two passes over the text, in memory that does not grow with the corpus:

1. :mod:`.staging` streams every corpus once: drops empty pairs (every split) and, in train,
   repeats (8-byte digests, :mod:`.dedup`), and stages the rest in ``DIR/.staging``;
2. BPE is trained on a uniform sample of at most ``vocab_sample`` kept training pairs; then
   :mod:`.encode` encodes the staged pairs in parallel processes, training pairs are filtered by
   length and ratio in subword tokens, and text and token ids are appended to their files.

Last comes ``manifest.json`` (so a half-built directory is never taken for a finished one). A
directory that is neither empty nor a data directory is refused.

The manifest's ``key`` is a hash of the inputs' content hashes and every setting; when it matches
and every file still has its recorded hash, the directory is reused as is.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import shutil
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .corpora import Corpus, SplitText, split_sources
from .dataset import FORMAT, MANIFEST
from .encode import Encoded, encode_chunks
from .filters import FilterSettings, token_filters
from .reading import file_sha256
from .staging import StagedSplit, progress, stage_split, vocab_sample
from .vocab import Vocab, Vocabs

BUILDING, STAGING = ".building", ".staging"
CHUNK = 4096  # pairs per encoding task
DEFAULT_VOCAB_SAMPLE = 1_000_000  # training pairs BPE learns from (SentencePiece suggests millions of sentences)


@dataclass
class BuildSettings:
    vocab_size: int = 8000
    separate_vocab: bool = False
    skip_invalid: bool = False
    lowercase: bool = False  # a lowercasing vocabulary (see transduce.data.vocab)
    filters: FilterSettings = field(default_factory=FilterSettings)
    vocab_sample: int = DEFAULT_VOCAB_SAMPLE  # BPE is trained on at most this many pairs, drawn uniformly
    vocab_from: str | None = None  # a model directory whose vocabulary is used instead of training one

    def __post_init__(self):
        if self.vocab_sample < 1:
            raise ValueError(f"--vocab-sample must be at least 1 pair, got {self.vocab_sample}")
        if self.vocab_size < 8:
            raise ValueError(f"--vocab-size must be at least 8 (4 special tokens + pieces), got {self.vocab_size}")


def described_settings(settings: BuildSettings) -> dict[str, Any]:
    """The settings as recorded in the manifest and hashed into its key; ``lowercase`` and ``vocab_sample``
    only when not the default, so directories built before the options existed keep their key."""
    described = asdict(settings)
    if not settings.lowercase:
        del described["lowercase"]
    if settings.vocab_sample == DEFAULT_VOCAB_SAMPLE:
        del described["vocab_sample"]
    if settings.vocab_from is None:
        del described["vocab_from"]
    else:  # the vocabulary's content, so that a changed model directory rebuilds
        described.update(vocab_size=None, separate_vocab=None, lowercase=None)
        files = sorted((Path(settings.vocab_from) / "vocab").iterdir())
        described["vocab_from"] = {
            "path": str(settings.vocab_from),
            "sha256": {p.name: file_sha256(p) for p in files if p.is_file()},
        }
    return described


def corpus_key(corpus: Corpus, settings: BuildSettings) -> str:
    described = {
        "format": FORMAT,
        "corpus": corpus.name,
        "src_lang": corpus.src_lang,
        "tgt_lang": corpus.tgt_lang,
        "inputs": corpus.inputs,
        "info": corpus.info,
        "settings": described_settings(settings),
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


def reusable(out: Path, key: str) -> dict[str, Any] | None:
    """The existing manifest if it was built with ``key`` and every file is intact, else None."""
    path = out / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    if manifest.get("key") != key:
        return None
    for name, sha in manifest.get("hashes", {}).items():
        if not (out / name).is_file() or file_sha256(out / name) != sha:
            return None
    return manifest


def _clear(out: Path) -> None:
    """Remove what an earlier build wrote (only files it listed, and the cache and vocab folders)."""
    path = out / MANIFEST
    if path.is_file():
        try:
            old = json.loads(path.read_text()).get("hashes", {})
        except json.JSONDecodeError:
            old = {}
        path.unlink()
        for name in old:
            (out / name).unlink(missing_ok=True)
    for sub in ("cache", "vocab", STAGING):
        shutil.rmtree(out / sub, ignore_errors=True)


def train_vocabs(train: StagedSplit, settings: BuildSettings, workdir: Path) -> tuple[Vocabs, int]:
    """BPE on a sample of the kept training pairs: one model for both sides (§5.1), or one per side;
    returns them and the number of pairs sampled. With ``vocab_from``, that model directory's vocabulary
    (for fine-tuning it: train.init_from), and 0 pairs sampled."""
    if settings.vocab_from is not None:
        from ..modeldir import load_vocabs

        return load_vocabs(Path(settings.vocab_from) / "vocab"), 0
    src, tgt, sampled = vocab_sample(train, settings.vocab_sample, workdir, settings.lowercase)
    inputs = [[src], [tgt]] if settings.separate_vocab else [[src, tgt]]
    # in a child process: SentencePiece's memory (the sample, its counts) leaves with it instead of staying in
    # this process' heap, where the encoding workers forked later would each count it again
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    with ctx.Pool(1) as pool:
        protos = pool.starmap(_bpe, [(paths, settings.vocab_size, settings.lowercase) for paths in inputs])
    vocabs = [Vocab(proto, settings.lowercase) for proto in protos]
    return Vocabs(vocabs[0], vocabs[-1]), sampled


def _bpe(paths: list[Path], size: int, lowercase: bool) -> bytes:
    return Vocab.train_files(paths, size, lowercase, already_lowercased=True).proto


class SplitWriter:
    """Appends encoded chunks to one split's text files and token-id cache (layout in :mod:`.dataset`)."""

    def __init__(self, out: Path, name: str, stems: tuple[str, str]):
        self.out, self.files = out, {}
        for side, stem in (("src", stems[0]), ("tgt", stems[1])):
            self.files.update(
                {
                    f"{side}_text": f"{name}.{stem}",
                    f"{side}_ids": f"cache/{name}.{side}.bin",
                    f"{side}_offsets": f"cache/{name}.{side}.idx.npy",
                }
            )
        self.handles = {k: open(out / self.files[k], "wb") for k in ("src_text", "tgt_text", "src_ids", "tgt_ids")}
        self.lengths: dict[str, list[np.ndarray]] = {"src": [], "tgt": []}

    def append(self, text: tuple[list[str], list[str]], encoded: Encoded, keep: np.ndarray) -> int:
        """Write the pairs of a chunk where ``keep`` (B,) is True; returns how many."""
        for side, lines, ids, lengths in (("src", text[0], *encoded[:2]), ("tgt", text[1], *encoded[2:])):
            self.handles[f"{side}_text"].write("".join(lines[i] + "\n" for i in np.flatnonzero(keep)).encode())
            ids[np.repeat(keep, lengths)].tofile(self.handles[f"{side}_ids"])
            self.lengths[side].append(lengths[keep])
        return int(keep.sum())

    def close(self) -> dict:
        """Write the offsets; returns the manifest entry's counts and file names."""
        for f in self.handles.values():
            f.close()
        entry = {}
        for side in ("src", "tgt"):
            lengths = np.concatenate(self.lengths[side] or [np.zeros(0, np.int64)])  # (N,)
            with open(self.out / self.files[f"{side}_offsets"], "wb") as f:
                np.save(f, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), allow_pickle=False)
            entry["sentences"], entry[f"{side}_tokens"] = len(lengths), int(lengths.sum())
        return {**entry, "files": self.files}


def encode_split(
    out: Path,
    name: str,
    split: StagedSplit,
    vocabs: Vocabs,
    stems: tuple[str, str],
    filters: FilterSettings | None,
    processes: int | None,
) -> dict:
    """Second pass: encode every corpus' kept pairs (each as often as its weight says) in parallel
    and write them; ``filters``: the token filters, for training data."""
    writer, texts = SplitWriter(out, name, stems), deque()
    passes = [(c, copy, mask) for c in split.corpora for copy, mask in enumerate(c.copies())]
    if filters is not None:
        split.filtered.update(
            {
                k: 0
                for k, on in (("too_long", filters.max_tokens_per_sentence), ("ratio", filters.max_ratio))
                if on is not None
            }
        )
    written = {c.name: 0 for c in split.corpora}

    def chunks() -> Iterator[tuple[list[str], list[str]]]:
        for corpus, _, mask in passes:
            for start, src, tgt in corpus.chunks(CHUNK):
                chosen = np.flatnonzero(mask[start : start + len(src)])
                text = ([src[i] for i in chosen], [tgt[i] for i in chosen])
                texts.append(text)
                yield text

    counts = split.filtered
    runs = ((corpus, copy, int(mask.sum())) for corpus, copy, mask in passes)
    corpus, copy, left = next(runs, (None, 0, 0))
    with progress(sum(int(m.sum()) for *_, m in passes), f"encoding {name}") as bar:
        for encoded in encode_chunks(vocabs.src, vocabs.tgt, chunks(), processes):
            text = texts.popleft()
            while left == 0:
                corpus, copy, left = next(runs)
            keep = np.ones(len(text[0]), dtype=bool)
            if filters is not None:  # repeated copies are filtered alike and counted once
                keep = token_filters(encoded[1], encoded[3], filters, counts if copy == 0 else {})
            written[corpus.name] += writer.append(text, encoded, keep)
            left -= len(text[0])
            bar.update(len(text[0]))
    entry = writer.close()
    if any(c.name for c in split.corpora):
        entry["corpora"] = [
            {"name": c.name, "weight": c.weight, "read": c.read, "kept": int(c.keep.sum()), "written": written[c.name]}
            for c in split.corpora
        ]
    return entry


def _build_splits(
    corpus: Corpus, settings: BuildSettings, out: Path, workdir: Path, processes: int | None
) -> tuple[dict, Vocabs, int]:
    """Stage every split, train the vocabulary, encode and write every split; returns the manifest's
    split entries, the vocabularies and how many pairs BPE learnt from."""
    staged, clock = {}, Clock()
    for name, split in corpus.splits.items():
        skipped = split.skipped if isinstance(split, SplitText) else {}
        staged[name] = stage_split(
            name,
            split_sources(split, settings.skip_invalid),
            skipped,
            workdir,
            dedup=settings.filters.dedup and name == "train",
        )
        clock.lap(f"read {name}: {staged[name].read:,} pairs")
    if not sum(int(c.keep.sum()) for c in staged["train"].corpora):
        raise ValueError(f"{corpus.name}: no training pairs left after reading and filtering")
    vocabs, sampled = train_vocabs(staged["train"], settings, workdir)
    vocabs.save(out / "vocab")
    clock.lap(f"BPE on {sampled:,} pairs")
    (out / "cache").mkdir()
    stems = (corpus.src_lang, corpus.tgt_lang) if corpus.src_lang != corpus.tgt_lang else ("src", "tgt")
    entries = {}
    for name, split in staged.items():
        entry = encode_split(out, name, split, vocabs, stems, settings.filters if name == "train" else None, processes)
        entries[name] = {"read": split.read, "skipped": split.skipped, "filtered": split.filtered, **entry}
        clock.lap(f"encoded {name}: {entry['sentences']:,} pairs")
    return entries, vocabs, sampled


class Clock:
    """Prints each step's wall time on stderr."""

    def __init__(self):
        self.last = time.perf_counter()

    def lap(self, what: str) -> None:
        now = time.perf_counter()
        print(f"{what} in {now - self.last:.1f} s", file=sys.stderr, flush=True)
        self.last = now


def build(
    corpus: Corpus, settings: BuildSettings, out: Path, force: bool = False, processes: int | None = None
) -> tuple[dict[str, Any], bool]:
    """Build ``out`` from ``corpus`` (or reuse it); returns (manifest, reused). ``processes``: encoding
    workers (default: all cores)."""
    key = corpus_key(corpus, settings)
    if not force and (manifest := reusable(out, key)) is not None:
        return manifest, True
    marker = out / BUILDING
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file() and not marker.is_file():
        raise ValueError(f"{out}: not empty and not a data directory (no {MANIFEST}); choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    marker.touch()  # a build that stops half-way can be redone in place
    _clear(out)
    workdir = out / STAGING
    workdir.mkdir()
    try:
        entries, vocabs, sampled = _build_splits(corpus, settings, out, workdir, processes)
    finally:
        shutil.rmtree(workdir)  # staging files are as large as the corpus: never left behind
    hashes = {}
    for f in [f for e in entries.values() for f in e["files"].values()] + [
        f"vocab/{p.name}" for p in sorted((out / "vocab").iterdir())
    ]:
        hashes[f] = file_sha256(out / f)
    manifest = {
        "format": FORMAT,
        "key": key,
        "corpus": corpus.name,
        "src_lang": corpus.src_lang,
        "tgt_lang": corpus.tgt_lang,
        "inputs": corpus.inputs,
        "settings": described_settings(settings),
        **corpus.info,
        "aliases": corpus.aliases,
        "vocab": {
            "shared": vocabs.shared,
            "src_size": len(vocabs.src),
            "tgt_size": len(vocabs.tgt),
            "trained_on_pairs": sampled,
        },
        "splits": entries,
        "hashes": hashes,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    marker.unlink()
    return manifest, False
