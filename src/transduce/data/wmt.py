"""WMT14 English-German as the paper trained on it (§5.1: about 4.5 million sentence pairs).

Training data: Europarl v7, Common Crawl and News Commentary v9 (the WMT14 task's parallel data,
as tensor2tensor and fairseq's ``prepare-wmt14en2de.sh --icml17`` assemble it); valid: newstest2013;
test: newstest2014 (the ``full`` version, 3,003 sentences, from its SGML). Archives are downloaded
from statmt.org into the cache (``--url-base`` points elsewhere, e.g. ``file://`` a local mirror with
the same archive names), only the needed members are extracted, and the text is streamed from there.
"""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

from .corpora import Corpus, StreamSplit
from .download import fetch
from .reading import file_sha256
from .sources import Source, iter_lines

ARCHIVES = {
    "training-parallel-europarl-v7.tgz": "http://statmt.org/wmt13/training-parallel-europarl-v7.tgz",
    "training-parallel-commoncrawl.tgz": "http://statmt.org/wmt13/training-parallel-commoncrawl.tgz",
    "training-parallel-nc-v9.tgz": "http://statmt.org/wmt14/training-parallel-nc-v9.tgz",
    "dev.tgz": "http://statmt.org/wmt14/dev.tgz",
    "test-full.tgz": "http://statmt.org/wmt14/test-full.tgz",
}
TRAIN = {  # corpus name -> (archive, member stem: STEM.LANG inside the archive)
    "europarl": ("training-parallel-europarl-v7.tgz", "training/europarl-v7.de-en"),
    "commoncrawl": ("training-parallel-commoncrawl.tgz", "commoncrawl.de-en"),
    "news-commentary": ("training-parallel-nc-v9.tgz", "training/news-commentary-v9.de-en"),
}
LANGS = ("en", "de")
SEG = re.compile(r"<seg[^>]*>(.*)</seg>")


def extract(archive: Path, member: str, target: Path) -> Path:
    """One member of a .tgz archive, extracted (once) to ``target/member``."""
    path = target / member
    if path.is_file():
        return path
    with tarfile.open(archive, "r:gz") as tar:
        try:
            info = tar.getmember(member)
        except KeyError:
            raise ValueError(f"{archive}: no member {member!r}; is it the statmt.org archive?") from None
        if not info.isfile():
            raise ValueError(f"{archive}: {member!r} is not a regular file")
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        with tar.extractfile(info) as src, open(partial, "wb") as out:
            while block := src.read(1 << 20):
                out.write(block)
        partial.rename(path)
    return path


def sgm_to_text(sgm: Path, target: Path) -> Path:
    """The ``<seg>`` texts of an SGML test set, one a line (entities kept, as sacreBLEU reads them)."""
    if target.is_file():
        return target
    segments = [m.group(1).strip() for line in iter_lines(sgm) if line and (m := SEG.search(line))]
    partial = target.with_name(target.name + ".partial")
    partial.write_text("".join(s + "\n" for s in segments), encoding="utf-8")
    partial.rename(target)
    return target


def fetch_wmt14(
    src: str, tgt: str, cache: Path, url_base: str | None = None, weights: dict[str, float] | None = None
) -> Corpus:
    """Download (unless cached), extract and describe WMT14 ``src``-``tgt`` (en-de or de-en) for streaming."""
    if {src, tgt} != set(LANGS):
        raise ValueError(f"WMT14 here is English-German: --src/--tgt must be en and de, got {src!r}, {tgt!r}")
    weights = weights or {}
    unknown = set(weights) - set(TRAIN)
    if unknown:
        raise ValueError(f"no WMT14 corpus {', '.join(sorted(unknown))}; the corpora are {', '.join(TRAIN)}")
    archives = {}
    for name, url in ARCHIVES.items():
        if url_base is not None:
            url = url_base + ("" if url_base.endswith("/") else "/") + name
        archives[name] = fetch(url, cache / name)
    out = cache / "extracted"
    sources = []
    for name, (archive, stem) in TRAIN.items():
        a, b = (extract(archives[archive], f"{stem}.{lang}", out) for lang in (src, tgt))
        sources.append(Source(name, a, b, weight=weights.get(name, 1.0)))
    valid = [extract(archives["dev.tgz"], f"dev/newstest2013.{lang}", out) for lang in (src, tgt)]
    test = [
        sgm_to_text(
            extract(archives["test-full.tgz"], f"test-full/newstest2014-deen-{kind}.{lang}.sgm", out),
            out / f"newstest2014.{lang}",
        )
        for kind, lang in (("src", src), ("ref", tgt))
    ]
    splits = {
        "train": StreamSplit(sources),
        "valid": StreamSplit([Source("", *valid)]),
        "test": StreamSplit([Source("", *test)]),
    }
    inputs = {name: file_sha256(path) for name, path in archives.items()}
    return Corpus(
        "wmt14",
        src,
        tgt,
        splits,
        inputs,
        aliases={"newstest2013": "valid", "newstest2014": "test"},
        info={"weights": {s.name: s.weight for s in sources}},
    )
