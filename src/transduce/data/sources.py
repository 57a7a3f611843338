"""Streaming reads of parallel text: plain, gzip or xz files, one line at a time, never a whole file.

A :class:`Source` is one corpus of a split: two line-aligned files or one TSV file, with a weight
(how many times its pairs go into the split, as OpenNMT-py's ``data:`` weights; 0.5 keeps a fixed
half). :meth:`Source.pairs` is a generator of ``(source, target)`` pairs, ``None`` for a side that
is not valid UTF-8 (with ``skip_invalid``; otherwise the error names the file and line). The
compression is recognised by the file's first bytes, so a misnamed file still reads.
"""

from __future__ import annotations

import gzip
import lzma
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path
from typing import IO

from ..config import check
from .reading import decode_line

GZIP_MAGIC, XZ_MAGIC = b"\x1f\x8b", b"\xfd7zXZ\x00"


def open_binary(path: str | Path) -> IO[bytes]:
    """``path`` opened for reading bytes, decompressed when it is gzip or xz."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    with open(path, "rb") as f:
        head = f.read(6)
    if head.startswith(GZIP_MAGIC):
        return gzip.open(path, "rb")
    if head.startswith(XZ_MAGIC):
        return lzma.open(path, "rb")
    return open(path, "rb")


def iter_lines(path: str | Path, skip_invalid: bool = False) -> Iterator[str | None]:
    """The lines of ``path``, NFC text without the line end (``\\n`` or ``\\r\\n``); a generator."""
    with open_binary(path) as f:
        number = 0
        try:
            for number, raw in enumerate(f, 1):
                raw = raw.removesuffix(b"\n").removesuffix(b"\r")
                if number == 1:
                    raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte-order mark is not text
                yield decode_line(raw, path, number, skip_invalid)
        except (OSError, EOFError, lzma.LZMAError) as e:
            raise ValueError(f"{path}, after line {number}: not a valid compressed file ({e})") from None


def _count(lines: Iterator) -> int:
    return sum(1 for _ in lines)


@dataclass(frozen=True)
class Source:
    """One corpus of a split: ``src`` and ``tgt`` line-aligned files, or ``tsv`` alone."""

    name: str
    src: Path | None = None
    tgt: Path | None = None
    tsv: Path | None = None
    weight: float = 1.0

    def __post_init__(self):
        check(self.weight > 0, "weight", f"of corpus {self.name!r} must be > 0, got {self.weight}")
        check(
            (self.tsv is None) == (self.src is not None and self.tgt is not None),
            "files",
            f"corpus {self.name!r} needs either a source and a target file or one TSV file",
        )

    @property
    def files(self) -> list[Path]:
        return [self.tsv] if self.tsv is not None else [self.src, self.tgt]

    def pairs(self, skip_invalid: bool = False) -> Iterator[tuple[str | None, str | None]]:
        """The corpus' pairs in file order; a generator (memory does not grow with the corpus)."""
        if self.tsv is not None:
            yield from _tsv_pairs(self.tsv, skip_invalid)
            return
        a, b = iter_lines(self.src, skip_invalid), iter_lines(self.tgt, skip_invalid)
        n = 0
        for n, (s, t) in enumerate(zip_longest(a, b, fillvalue=EOFError), 1):
            if s is EOFError or t is EOFError:
                na, nb = (n + _count(a), n - 1) if t is EOFError else (n - 1, n + _count(b))
                raise ValueError(
                    f"line counts differ: {self.src} has {na} lines, {self.tgt} has {nb}; "
                    "parallel files must be line-aligned (nothing is truncated to fit)"
                )
            yield s, t


def _tsv_pairs(path: Path, skip_invalid: bool) -> Iterator[tuple[str | None, str | None]]:
    for number, line in enumerate(iter_lines(path, skip_invalid), 1):
        if line is None:
            yield None, None
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise ValueError(
                f"{path}, line {number}: expected 2 tab-separated fields (source, target), found {len(fields)}"
            )
        yield fields[0], fields[1]
