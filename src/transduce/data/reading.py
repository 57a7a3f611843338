"""Reading text: strict UTF-8 that names the file and line, NFC normalisation, content hashes.

A line is what lies between ``\\n`` bytes; a trailing ``\\r`` (Windows line ends) is part of the
line end, not the text. ``.gz`` files are decompressed transparently. Every text is NFC-normalised
(Unicode canonical composition), so the same visible sentence is always the same ids.

:func:`read_lines` is the one reader of a whole text file: ``prepare``'s corpora, and the sources,
references and hypotheses of ``evaluate``, ``score``, ``check-backends`` and ``import --check-backends``.
"""

from __future__ import annotations

import gzip
import hashlib
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Lines:
    """The lines of one file: ``None`` where a line is not valid UTF-8 (only with ``skip_invalid``)."""

    path: Path | str  # "<stdin>" for standard input
    lines: list[str | None]
    sha256: str

    @property
    def invalid(self) -> int:
        return sum(line is None for line in self.lines)


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes (as stored, i.e. of the ``.gz`` for compressed files)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def decode_line(raw: bytes, path: Path | str, number: int, skip_invalid: bool | None) -> str | None:
    """UTF-8 decode one line (``number`` counts from 1); on bad bytes raise naming file and line.

    ``skip_invalid``: True gives None for such a line (the caller counts it); False raises, suggesting
    ``--skip-invalid``; None raises without that suggestion (for commands that have no such option)."""
    try:
        return nfc(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        if skip_invalid:
            return None
        hint = "; fix the file or pass --skip-invalid to skip and count such lines" if skip_invalid is False else ""
        raise ValueError(
            f"{path}, line {number}: invalid UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1}){hint}"
        ) from None


def read_lines(path: str | Path | None, skip_invalid: bool | None = None) -> Lines:
    """All lines of a text file (``.gz`` allowed), or of stdin for None or ``-``, UTF-8 decoded and
    NFC-normalised; ``skip_invalid`` as :func:`decode_line` takes it."""
    if path is None or path == "-":
        path, data = "<stdin>", sys.stdin.buffer.read()
    else:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file")
        data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    if isinstance(path, Path) and path.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise ValueError(f"{path}: not a valid gzip file ({e})") from None
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]  # a UTF-8 byte-order mark is not text
    raw_lines = data.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()  # the final newline ends the last line, it does not start another
    lines = [decode_line(raw.removesuffix(b"\r"), path, i, skip_invalid) for i, raw in enumerate(raw_lines, 1)]
    return Lines(path, lines, sha)


def read_aligned(src: str | Path, tgt: str | Path, skip_invalid: bool = False) -> tuple[Lines, Lines]:
    """Two line-aligned files; different line counts are an error naming both files and counts."""
    a, b = read_lines(src, skip_invalid), read_lines(tgt, skip_invalid)
    if len(a.lines) != len(b.lines):
        raise ValueError(
            f"line counts differ: {a.path} has {len(a.lines)} lines, {b.path} has {len(b.lines)}; "
            "parallel files must be line-aligned (nothing is truncated to fit)"
        )
    return a, b
