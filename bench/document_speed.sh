#!/bin/bash
# Line mode against document mode on the same sentences (docs/documents.md, "Speed of document mode").
#   MODEL=DIR bench/document_speed.sh SENTENCES.txt      (e.g. Multi30k test 2016, English side)
# Sentences ending in "." are put five to a paragraph; the line-mode input is the splitter's own output,
# so both modes translate the same sentences in the same batches. Three alternating runs; CPU seconds.
set -euo pipefail
: "${MODEL:?set MODEL=model directory}"
PY=${PYTHON:-python}
cd "$(dirname "$0")/.."
work=$(mktemp -d)
PYTHONPATH=$PWD/src $PY - "$1" "$work" <<'PYEOF'
import sys
from transduce.text.document import sentences, split_text
keep = [s.strip() for s in open(sys.argv[1], encoding="utf-8") if s.strip().endswith(".")]
doc = "\n\n".join(" ".join(keep[i : i + 5]) for i in range(0, len(keep), 5)) + "\n"
open(f"{sys.argv[2]}/doc.txt", "w").write(doc)
open(f"{sys.argv[2]}/lines.txt", "w").write("\n".join(sentences(split_text(doc, "en"))) + "\n")
PYEOF
for rep in 1 2 3; do
  for mode in line doc; do
    if [ $mode = line ]; then in=$work/lines.txt; flags=""; else in=$work/doc.txt; flags="--document"; fi
    PYTHONPATH=$PWD/src /usr/bin/time -f "run $rep $mode: %e s wall, %U s user, %S s sys" \
      $PY -m transduce translate --model "$MODEL" --threads 1 $flags "$in" > "$work/$mode.out"
  done
done
rm -r "$work"
