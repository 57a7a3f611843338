"""Your own parallel text: two line-aligned files, or one TSV file (source TAB target per line)."""

from __future__ import annotations

from pathlib import Path

from .corpora import Corpus, SplitText, pair_lines
from .reading import Lines, read_aligned, read_lines


def read_tsv(path: Path, skip_invalid: bool = False) -> tuple[SplitText, str]:
    """Pairs from a TSV file; a line without exactly one tab is an error naming file and line."""
    lines = read_lines(path, skip_invalid)
    src, tgt = [], []
    for number, line in enumerate(lines.lines, 1):
        if line is None:
            src.append(None)
            tgt.append(None)
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise ValueError(
                f"{path}, line {number}: expected 2 tab-separated fields (source, target), found {len(fields)}"
            )
        src.append(fields[0])
        tgt.append(fields[1])
    split = pair_lines(Lines(path, src, lines.sha256), Lines(path, tgt, lines.sha256))
    return split, lines.sha256


def load_files(
    src_lang: str, tgt_lang: str, pairs: dict[str, tuple[Path, Path]], tsvs: dict[str, Path], skip_invalid: bool = False
) -> Corpus:
    """``pairs``: split -> (source file, target file); ``tsvs``: split -> TSV file. ``train`` is required."""
    if "train" not in pairs and "train" not in tsvs:
        raise ValueError("no training data: give --src-file and --tgt-file, or --tsv")
    splits, inputs = {}, {}
    for name, (a_path, b_path) in pairs.items():
        a, b = read_aligned(a_path, b_path, skip_invalid)
        splits[name] = pair_lines(a, b)
        inputs.update({f"{name}:{a.path}": a.sha256, f"{name}:{b.path}": b.sha256})
    for name, path in tsvs.items():
        splits[name], inputs[f"{name}:{path}"] = read_tsv(path, skip_invalid)
    return Corpus("files", src_lang, tgt_lang, splits, inputs)
