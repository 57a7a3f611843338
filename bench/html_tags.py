"""How often --format html puts a tag around the right words: bench/data/html_tags_en_de.tsv.

Each line of the set is an English sentence with one tagged word or short phrase and the German
word(s) a correct translation puts that tag around. A line counts only when the translation contains
one of those German words (otherwise there is nothing right to wrap); then the tag either wraps
exactly them (punctuation aside), wraps them with extra words, or misses them.

    PYTHONPATH=src python bench/html_tags.py --model DIR [--layer L] [--beam 4]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

from transduce.api import load
from transduce.decode.search_options import SearchOptions
from transduce.text.markup import translate_html

SET = Path(__file__).with_name("data") / "html_tags_en_de.tsv"
TAGGED = re.compile(r"<(b|i|a|span)\b[^>]*>(.*?)</\1>")


def words(text: str) -> list[str]:
    return [w.strip(".,;:!?\"'") for w in re.sub(r"<[^>]+>", "", text).split()]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--layer", type=int, default=None, help="alignment layer (default: the last)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--show", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    translator = load(args.model)
    rows = [line.rstrip("\n").split("\t") for line in SET.read_text().splitlines() if not line.startswith("#")]
    counts = {"exact": 0, "wider": 0, "missed": 0, "not translated": 0}
    for src, expected in rows:
        out = translate_html(translator, src, search=SearchOptions(beam=args.beam), alignment_layer=args.layer)
        inner = words(TAGGED.search(out).group(2)) if TAGGED.search(out) else []
        full = words(out)
        options = [alt.split() for alt in expected.split("|")]
        present = [o for o in options if any(full[k : k + len(o)] == o for k in range(len(full)))]
        if not present:
            kind = "not translated"
        elif any(inner == o for o in present):
            kind = "exact"
        elif any(any(inner[k : k + len(o)] == o for k in range(len(inner))) for o in present):
            kind = "wider"
        else:
            kind = "missed"
        counts[kind] += 1
        if args.show:
            print(f"{kind:15s} {out}")
    judged = len(rows) - counts["not translated"]
    print(
        f"{len(rows)} sentences, {judged} with the expected word(s) in the translation: "
        f"exact {counts['exact']} ({counts['exact'] / max(judged, 1):.0%}), "
        f"wider {counts['wider']} ({counts['wider'] / max(judged, 1):.0%}), "
        f"missed {counts['missed']} ({counts['missed'] / max(judged, 1):.0%}); "
        f"layer {args.layer if args.layer is not None else 'default'}, beam {args.beam}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
