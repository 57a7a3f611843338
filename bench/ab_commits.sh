#!/usr/bin/env bash
# A/B of two versions of transduce on the same translation work, alternating, each run its own process:
#   bench/ab_commits.sh BASE_COMMIT MODEL_DIR DTYPE BATCH SENTENCES THREADS REPEATS [--native]
# "base" is BASE_COMMIT (checked out in a temporary worktree), "work" is this working tree. Each side
# builds its own copy of the C++ extension (separate TORCH_EXTENSIONS_DIR). Prints sentences/s and a
# hash of the translations per run (equal hashes: identical output).
set -euo pipefail
base=$1; model=$(realpath "$2"); shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
tree=$(mktemp -d /tmp/transduce-ab.XXXXXX)
trap 'git -C "$root" worktree remove --force "$tree"' EXIT
git -C "$root" worktree add -q --detach "$tree" "$base"
for _ in $(seq "$5"); do
  for side in base work; do
    if [ $side = base ]; then src=$tree/src; else src=$root/src; fi
    r=$(cd /tmp && PYTHONPATH=$src TORCH_EXTENSIONS_DIR=/tmp/transduce-ab-ext-$side \
        "$root/.venv/bin/python" "$root/bench/translate_time.py" "$model" "$1" "$2" "$3" "$4" "${6:-}" 2>/dev/null | tail -1)
    echo "$side $1 batch $2 threads $4: $r"
  done
done
