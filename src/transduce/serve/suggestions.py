"""Translations users suggest (LibreTranslate's ``POST /suggest``), kept for fine-tuning.

Suggestions are rows of an embedded SQLite file (``--suggestions FILE``): the source text, the
suggested translation, their languages and the time. ``transduce serve --suggestions FILE
--export-suggestions OUT.tsv`` writes them as ``SOURCE<TAB>TARGET`` lines, the format
``transduce prepare files --tsv`` reads; whitespace runs (tabs and line breaks included) become one
space so that each suggestion stays one line.
"""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from pathlib import Path

_SPACE = re.compile(r"\s+")
SCHEMA = """CREATE TABLE IF NOT EXISTS suggestions (
    id INTEGER PRIMARY KEY, source_text TEXT NOT NULL, suggestion TEXT NOT NULL,
    source TEXT NOT NULL, target TEXT NOT NULL, created REAL NOT NULL)"""


class Store:
    """The suggestions file; safe to use from several threads."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._db = sqlite3.connect(self.path, check_same_thread=False)
        self._lock = threading.Lock()
        with self._lock, self._db:
            self._db.execute(SCHEMA)

    def add(self, source_text: str, suggestion: str, source: str, target: str) -> None:
        with self._lock, self._db:
            self._db.execute(
                "INSERT INTO suggestions (source_text, suggestion, source, target, created) VALUES (?, ?, ?, ?, ?)",
                (source_text, suggestion, source, target, time.time()),
            )

    def rows(self, source: str | None = None, target: str | None = None) -> list[tuple[str, str, str, str]]:
        """``(source_text, suggestion, source, target)`` in the order they came, for one pair or all."""
        query, args = "SELECT source_text, suggestion, source, target FROM suggestions", []
        if source and target:
            query, args = query + " WHERE source = ? AND target = ?", [source, target]
        with self._lock:
            return list(self._db.execute(query + " ORDER BY id", args))

    def export(self, out: str | Path, source: str | None = None, target: str | None = None) -> int:
        """Write the suggestions as TSV (module docstring); returns how many."""
        rows = self.rows(source, target)
        with open(out, "w", encoding="utf-8") as f:
            for text, suggestion, _, _ in rows:
                f.write(f"{_SPACE.sub(' ', text).strip()}\t{_SPACE.sub(' ', suggestion).strip()}\n")
        return len(rows)

    def close(self) -> None:
        with self._lock:
            self._db.close()
