"""Your own parallel text: two line-aligned files, or one TSV file (source TAB target per line), plain,
gzip or xz; for training, several corpora with weights (``--corpus NAME SRC TGT WEIGHT``)."""

from __future__ import annotations

from pathlib import Path

from .corpora import Corpus, SplitText, StreamSplit
from .reading import file_sha256
from .sources import Source


def read_tsv(path: Path, skip_invalid: bool = False) -> tuple[SplitText, str]:
    """Pairs from a TSV file, in memory; a line without exactly one tab is an error naming file and line."""
    pairs = list(Source("", tsv=Path(path)).pairs(skip_invalid))
    kept = [(s, t) for s, t in pairs if s is not None]
    skipped = {"invalid_utf8": len(pairs) - len(kept)} if len(kept) < len(pairs) else {}
    return SplitText([s for s, _ in kept], [t for _, t in kept], skipped), file_sha256(path)


def load_files(
    src_lang: str,
    tgt_lang: str,
    pairs: dict[str, tuple[Path, Path]],
    tsvs: dict[str, Path],
    skip_invalid: bool = False,
    extra: list[Source] = (),
) -> Corpus:
    """``pairs``: split -> (source file, target file); ``tsvs``: split -> TSV file; ``extra``: more weighted
    training corpora. Every split is streamed while it is built (see :mod:`.sources`). Training data is required."""
    if "train" not in pairs and "train" not in tsvs and not extra:
        raise ValueError("no training data: give --src-file and --tgt-file, or --tsv, or --corpus")
    splits: dict[str, StreamSplit] = {}
    for name, (a, b) in pairs.items():
        splits[name] = StreamSplit([Source(Path(a).name if name == "train" and extra else "", Path(a), Path(b))])
    for name, path in tsvs.items():
        splits[name] = StreamSplit([Source(Path(path).name if name == "train" and extra else "", tsv=Path(path))])
    if extra:
        splits["train"] = StreamSplit(splits.get("train", StreamSplit([])).sources + list(extra))
    inputs, weights = {}, {}
    for name, split in splits.items():
        for source in split.sources:
            for path in source.files:
                if not path.is_file():
                    raise FileNotFoundError(f"{path}: no such file")
                inputs[f"{name}:{path}"] = file_sha256(path)
            if source.name:
                weights[source.name] = source.weight
    names = [s.name for s in splits.get("train", StreamSplit([])).sources if s.name]
    if len(set(names)) != len(names):
        raise ValueError(f"corpus names must differ, got {', '.join(names)}")
    splits = {name: splits[name] for name in ("train", "valid", "test") if name in splits}
    return Corpus("files", src_lang, tgt_lang, splits, inputs, info={"weights": weights} if weights else {})
