"""Turn a :class:`~.corpora.Corpus` into a data directory (layout in :mod:`.dataset`), or reuse it.

Steps: filter text (empty everywhere; duplicates in train), train the BPE vocabulary on the kept
training text, encode every split, filter training pairs by length and ratio in subword tokens,
write text, token-id cache, vocabulary and, last, ``manifest.json`` (so a half-built directory is
never taken for a finished one). A directory that is neither empty nor a data directory is refused.

The manifest's ``key`` is a hash of the inputs' content hashes and every setting; when it matches
and every file still has its recorded hash, the directory is reused as is.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .corpora import Corpus, SplitText
from .dataset import FORMAT, MANIFEST, TokenArray
from .filters import FilterSettings, select, text_filters, token_filters
from .reading import file_sha256
from .vocab import Vocab, Vocabs

BUILDING = ".building"


@dataclass
class BuildSettings:
    vocab_size: int = 8000
    separate_vocab: bool = False
    skip_invalid: bool = False
    lowercase: bool = False  # a lowercasing vocabulary (see transduce.data.vocab)
    filters: FilterSettings = field(default_factory=FilterSettings)
    vocab_from: str | None = None  # a model directory whose vocabulary is used instead of training one

    def __post_init__(self):
        if self.vocab_size < 8:
            raise ValueError(f"--vocab-size must be at least 8 (4 special tokens + pieces), got {self.vocab_size}")


def described_settings(settings: BuildSettings) -> dict[str, Any]:
    """The settings as recorded in the manifest and hashed into its key; ``lowercase`` only when set,
    so directories built before the option existed keep their key and are reused."""
    described = asdict(settings)
    if not settings.lowercase:
        del described["lowercase"]
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
    for sub in ("cache", "vocab"):
        shutil.rmtree(out / sub, ignore_errors=True)


def train_vocabs(train: SplitText, settings: BuildSettings) -> Vocabs:
    """BPE on the kept training text: one model for both sides (§5.1), or one per side; or, with
    ``vocab_from``, that model directory's vocabulary (for fine-tuning it: train.init_from)."""
    if settings.vocab_from is not None:
        from ..modeldir import load_vocabs

        return load_vocabs(Path(settings.vocab_from) / "vocab")
    if settings.separate_vocab:
        return Vocabs(
            Vocab.train(train.src, settings.vocab_size, settings.lowercase),
            Vocab.train(train.tgt, settings.vocab_size, settings.lowercase),
        )
    shared = Vocab.train(train.src + train.tgt, settings.vocab_size, settings.lowercase)
    return Vocabs(shared, shared)


def write_split(out: Path, name: str, split: SplitText, ids: tuple[list, list], stems: tuple[str, str]) -> dict:
    """Text and token-id cache of one split; returns the manifest entry's counts and file names."""
    entry, files = {"sentences": len(split)}, {}
    for side, stem, text, side_ids in (("src", stems[0], split.src, ids[0]), ("tgt", stems[1], split.tgt, ids[1])):
        files[f"{side}_text"] = f"{name}.{stem}"
        files[f"{side}_ids"] = f"cache/{name}.{side}.bin"
        files[f"{side}_offsets"] = f"cache/{name}.{side}.idx.npy"
        for line in text:
            if "\n" in line:
                raise ValueError(f"split {name!r} has a sentence with a line break: {line[:80]!r}")
        (out / files[f"{side}_text"]).write_text("".join(t + "\n" for t in text), encoding="utf-8", newline="")
        TokenArray.write(side_ids, out / files[f"{side}_ids"], out / files[f"{side}_offsets"])
        entry[f"{side}_tokens"] = sum(len(s) for s in side_ids)
    return {**entry, "files": files}


def build(corpus: Corpus, settings: BuildSettings, out: Path, force: bool = False) -> tuple[dict[str, Any], bool]:
    """Build ``out`` from ``corpus`` (or reuse it); returns (manifest, reused)."""
    key = corpus_key(corpus, settings)
    if not force and (manifest := reusable(out, key)) is not None:
        return manifest, True
    marker = out / BUILDING
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file() and not marker.is_file():
        raise ValueError(f"{out}: not empty and not a data directory (no {MANIFEST}); choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    marker.touch()  # a build that stops half-way can be redone in place
    _clear(out)
    splits, report = {}, {}
    for name, split in corpus.splits.items():
        splits[name], counts = text_filters(split, dedup=settings.filters.dedup and name == "train")
        report[name] = {"read": len(split) + sum(split.skipped.values()), "skipped": split.skipped, "filtered": counts}
    if not len(splits["train"]):
        raise ValueError(f"{corpus.name}: no training pairs left after reading and filtering")
    vocabs = train_vocabs(splits["train"], settings)
    vocabs.save(out / "vocab")
    (out / "cache").mkdir()
    stems = (corpus.src_lang, corpus.tgt_lang) if corpus.src_lang != corpus.tgt_lang else ("src", "tgt")
    entries, hashes = {}, {}
    for name, split in splits.items():
        src_ids, tgt_ids = vocabs.src.encode_batch(split.src), vocabs.tgt.encode_batch(split.tgt)
        if name == "train":
            keep, counts = token_filters([len(s) for s in src_ids], [len(t) for t in tgt_ids], settings.filters)
            report[name]["filtered"].update(counts)
            split = select(split, keep)
            src_ids, tgt_ids = [src_ids[i] for i in keep], [tgt_ids[i] for i in keep]
        entries[name] = {**report[name], **write_split(out, name, split, (src_ids, tgt_ids), stems)}
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
        "vocab": {"shared": vocabs.shared, "src_size": len(vocabs.src), "tgt_size": len(vocabs.tgt)},
        "splits": entries,
        "hashes": hashes,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    marker.unlink()
    return manifest, False
