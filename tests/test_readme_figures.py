"""The README's results tables say what their sources say.

Each row of the tables under README.md's "## Results" (the machine the tests run on, then "### Other
machines") links, in its "measured" column, to the page and section its figures come from: a section of
BENCHMARKS.md (what ``make bench`` writes) or of a guide in docs/. Every figure of the row's "figure" column (a
ratio such as ``2.25×``, a number such as ``42.31`` or ``−0.08``) must stand in that section as written, and a
BENCHMARKS.md section must name the row's date and commit(s). A benchmark re-run that rewrites a section
therefore fails here until the README carries its new figures.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MINUS = str.maketrans({"−": "-", "–": "-"})  # the tables write both U+2212 and ASCII minus signs
RATIO = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)×")
DECIMAL = re.compile(r"(?<![\d.])-?\d+\.\d+(?![\d×])")
LINK = re.compile(r"\[([^\]]*)\]\(([^)#\s]+)(?:#([^)\s]+))?\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def sections(text: str) -> dict[str, str]:
    """Each heading's anchor -> its section: the heading and what follows up to the next heading of its level or
    above. Lines in fenced code blocks are not headings; a repeated anchor gets -1, -2, ... as on GitHub."""
    lines = text.splitlines()
    heads: list[tuple[int, int, str]] = []  # (line index, level, anchor)
    fenced, seen = False, {}
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"(#{1,6}) (.+)", line)
        if m:
            anchor = slug(m.group(2))
            n = seen.get(anchor, 0)
            seen[anchor] = n + 1
            heads.append((i, len(m.group(1)), f"{anchor}-{n}" if n else anchor))
    out = {}
    for k, (i, level, anchor) in enumerate(heads):
        end = next((j for j, lv, _ in heads[k + 1 :] if lv <= level), len(lines))
        out[anchor] = "\n".join(lines[i:end])
    return out


def table_rows(text: str, heading: str) -> list[dict[str, str]]:
    """The first table after ``heading`` as dicts keyed by its header row (``\\|`` inside a cell is kept)."""
    lines = text[text.index(heading) :].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    block = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        block.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]])
    header = block[0]
    return [dict(zip(header, cells, strict=True)) for cells in block[2:]]


def figures(cell: str) -> list[str]:
    """The figures a cell states: ratios (``2.25×``) and decimal numbers (``42.31``, ``-0.08``)."""
    plain = cell.replace("**", "").replace("`", "").translate(MINUS)
    return [f"{m}×" for m in RATIO.findall(plain)] + DECIMAL.findall(plain)


def stands_in(figure: str, text: str) -> bool:
    """Whether ``figure`` is written in ``text`` as itself, not as part of a longer number (7.5 is not in 7.50)."""
    end = "" if figure.endswith("×") else r"(?![\d])"
    return re.search(r"(?<![\d.])" + re.escape(figure) + end, text.replace("**", "").translate(MINUS)) is not None


README = (ROOT / "README.md").read_text(encoding="utf-8")
# the machine the tests run on, then the other machines
RESULTS = table_rows(README, "## Results") + table_rows(README, "### Other machines")


def test_the_results_tables_are_found_and_every_row_names_its_source():
    assert len(table_rows(README, "## Results")) >= 5 and len(table_rows(README, "### Other machines")) >= 1
    for row in RESULTS:
        assert LINK.search(row["measured"]), f"no link to its source: {row['what']}"
        assert re.search(r"\d{4}-\d{2}-\d{2}", row["measured"]), f"no date: {row['what']}"
        assert re.search(r"`[0-9a-f]{7,40}`", row["measured"]), f"no commit: {row['what']}"
        assert "..." not in row["command"] and "…" not in row["command"], f"command cut off: {row['command']}"


@pytest.mark.parametrize("row", RESULTS, ids=[f"row{i + 1}" for i in range(len(RESULTS))])
def test_each_figure_stands_in_the_section_it_links_to(row):
    _, path, anchor = LINK.search(row["measured"]).groups()
    page = ROOT / path
    assert page.is_file(), f"{row['what']}: {path} does not exist"
    text = page.read_text(encoding="utf-8")
    if anchor:
        found = sections(text)
        assert anchor in found, f"{path} has no heading #{anchor}; its anchors: {sorted(found)}"
        text = found[anchor]
    missing = [f for f in figures(row["figure"]) if not stands_in(f, text)]
    assert not missing, f"{row['what']}: {missing} not in {path}#{anchor or ''}"
    if path == "BENCHMARKS.md":
        for date in re.findall(r"\d{4}-\d{2}-\d{2}", row["measured"]):
            assert date in text, f"{row['what']}: BENCHMARKS.md#{anchor} is not dated {date}"
        for commit in re.findall(r"`([0-9a-f]{7,40})`", row["measured"]):
            assert f"`{commit}`" in text, f"{row['what']}: BENCHMARKS.md#{anchor} does not name {commit}"


def test_the_parsers_see_what_a_reader_sees():
    assert slug("Training, against nn.Transformer as users train it: Intel Xeon (2 cores)") == (
        "training-against-nntransformer-as-users-train-it-intel-xeon-2-cores"
    )
    assert figures("**4.90×** / **8.03×**, BLEU −0.08 against fp32; 7.6M, 3.1 h") == [
        "4.90×",
        "8.03×",
        "-0.08",
        "7.6",
        "3.1",
    ]
    assert stands_in("-0.08", "| 40.36 (−0.08) |") and not stands_in("7.5", "7.50 / 7.22")
    assert not stands_in("7.2×", "**7.16×**") and stands_in("1.76×", "**1.76×**")
    text = "# A\nx\n## B: c\ny\n```\n# not a heading\n```\n## B: c\nz\n# D\n"
    assert sections(text)["b-c"].endswith("```") and sections(text)["b-c-1"] == "## B: c\nz"
