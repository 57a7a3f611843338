"""Multi30k task 1 (English, German, French image captions): from a local directory or downloaded.

Files ``{train,val,test_2016_flickr}.{en,de,fr}.gz`` as published in the dataset's repository
(``data/task1/raw/``). Stored split names: ``train``, ``valid`` (also reachable as ``val``), ``test``
(also reachable as ``test_2016_flickr``).
"""

from __future__ import annotations

from pathlib import Path

from .corpora import Corpus, pair_lines
from .download import fetch
from .reading import read_aligned

URL_BASE = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
LANGS = ("en", "de", "fr")
SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}  # stored name -> file stem


def file_names(lang: str) -> list[str]:
    return [f"{stem}.{lang}.gz" for stem in SPLITS.values()]


def download(names: list[str], url_base: str, target: Path) -> Path:
    """Fetch ``url_base + name`` into ``target`` for each name not there yet (``file://`` works too)."""
    target.mkdir(parents=True, exist_ok=True)
    base = url_base if url_base.endswith("/") else url_base + "/"
    for name in names:
        fetch(base + name, target / name)
    return target


def load_multi30k(src: str, tgt: str, raw: Path, skip_invalid: bool = False) -> Corpus:
    """Read the three splits for ``src``-``tgt`` from directory ``raw``."""
    for lang in (src, tgt):
        if lang not in LANGS:
            raise ValueError(f"Multi30k has no language {lang!r}; choose from {', '.join(LANGS)}")
    if src == tgt:
        raise ValueError(f"source and target language are both {src!r}")
    splits, inputs = {}, {}
    for name, stem in SPLITS.items():
        a, b = read_aligned(raw / f"{stem}.{src}.gz", raw / f"{stem}.{tgt}.gz", skip_invalid)
        splits[name] = pair_lines(a, b)
        inputs.update({a.path.name: a.sha256, b.path.name: b.sha256})
    return Corpus("multi30k", src, tgt, splits, inputs, aliases={"val": "valid", "test_2016_flickr": "test"})
