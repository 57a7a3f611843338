"""The repository speaks of the software, not of how it was made.

A grep over the tracked text files (``git ls-files``) for words that only make sense in a work log:
"session 12", "sessions 30-33", "attempt 7", "issue 6", "the issue asks", "the issue's target", "the recipe of
its time", "is open work". Legitimate uses of "session" (pytest's ``scope="session"``, ``tmp_path_factory``'s
session-scoped directories, an HTTP session) are not numbered, so the patterns do not catch them; the
allow-list below is for the rest.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A number may be written 12, #12 or 12–14 / 12-14; "attempts 3 and 5" is caught by its first number.
PATTERNS = [
    re.compile(r"\bsessions?\s+#?\d+", re.IGNORECASE),
    re.compile(r"\battempts?\s+#?\d+", re.IGNORECASE),
    re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE),
    re.compile(r"\bthe\s+issue\s+asks\b", re.IGNORECASE),
    re.compile(r"\bthe\s+issue['’]s\s+target", re.IGNORECASE),
    # docs describe the software as it is, not its history or a to-do list
    re.compile(r"\bthe\s+\w+\s+of\s+its\s+time\b", re.IGNORECASE),
    re.compile(r"\bis\s+open\s+work\b", re.IGNORECASE),
]

# (path, substring of the line) pairs that may match: keep this list short and say why for each.
ALLOWED: list[tuple[str, str]] = [
    # this file names the patterns it looks for
    ("tests/test_repository_words.py", ""),
]


def offending_lines(path: str, text: str) -> list[str]:
    """``path:line: text`` for each line of ``text`` that matches a pattern and is not allowed."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if not any(p.search(line) for p in PATTERNS):
            continue
        if any(path == allowed_path and needle in line for allowed_path, needle in ALLOWED):
            continue
        found.append(f"{path}:{number}: {line.strip()[:160]}")
    return found


def tracked_text_files() -> list[str]:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: nothing to compare against")
    return [name for name in out.decode().split("\0") if name]


def read_text(path: Path) -> str | None:
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):  # deleted in the working tree, or a submodule
        return None
    if b"\0" in data[:8192]:
        return None  # binary
    return data.decode("utf-8", errors="replace")


def test_no_tracked_file_speaks_of_sessions_attempts_or_issues():
    found = []
    for name in tracked_text_files():
        text = read_text(ROOT / name)
        if text is not None:
            found.extend(offending_lines(name, text))
    assert not found, (
        "work-history words in tracked files:\n"
        + "\n".join(found[:50])
        + (f"\n... and {len(found) - 50} more" if len(found) > 50 else "")
    )


@pytest.mark.parametrize(
    "line",
    [
        "On session 11's Intel Xeon it ran at 4k tok/s.",
        "sessions 30-33 used an AVX2 host",
        "Attempt 70 scored 42.31.",
        "the target of issue 6",
        "as issue #8 says",
        "The issue asks for 2x.",
        "the issue's target is 42",
        "against the recipe of its time",
        "Closing that gap is open work.",
    ],
)
def test_the_patterns_catch_work_history(line):
    assert offending_lines("README.md", line)


@pytest.mark.parametrize(
    "line",
    [
        '@pytest.fixture(scope="session")',
        "def tiny_model_dir(tmp_path_factory):  # built once per test session",
        "requests.Session() keeps the connection",
        "a known issue with MKL on AMD CPUs",
        "each attempt to connect times out after 5 s",
        "nn.Dropout spending much of its time generating the mask",
    ],
)
def test_the_patterns_leave_ordinary_words_alone(line):
    assert not offending_lines("README.md", line)
