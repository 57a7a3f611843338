"""Run several variants of one recipe side by side and tabulate their scores.

    python bench/sweep.py configs/multi30k-en-de.toml SWEEP.toml --out runs/sweep

The sweep file has a [common] table of ``--set`` overrides for every variant and one [variants.NAME]
table each (its own overrides, merged over common):

    [common]
    "train.max_steps" = 6600
    [variants.base]
    [variants.rdrop5]
    "train.rdrop_alpha" = 5.0

Each variant is one ``transduce recipe`` process (``OUT/NAME/log.txt``), at most ``--parallel`` at a time.
Used on a GPU machine to compare recipes by update count, where a CPU hour allows one run: the CPU run of
the winner is what counts, not these figures. Writes ``OUT/summary.md`` and ``OUT/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path


def overrides(table: dict) -> list[str]:
    return [f"{key}={json.dumps(value)}" for key, value in table.items()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("recipe", type=Path)
    p.add_argument("sweep", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--only", nargs="*", help="run only these variants")
    args = p.parse_args(argv)
    spec = tomllib.loads(args.sweep.read_text())
    unknown = set(spec) - {"common", "variants"}
    if unknown:
        raise SystemExit(f"{args.sweep}: unknown tables {sorted(unknown)} (expected [common], [variants.NAME])")
    common, variants = spec.get("common", {}), spec["variants"]
    names = [n for n in variants if not args.only or n in args.only]
    args.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    pending, running, started = list(names), {}, {}
    while pending or running:
        while pending and len(running) < args.parallel:
            name = pending.pop(0)
            out = args.out / name
            out.mkdir(parents=True, exist_ok=True)
            sets = overrides({**common, **variants[name], "recipe.out": str(out)})
            cmd = [sys.executable, "-m", "transduce", "recipe", str(args.recipe)] + [
                a for s in sets for a in ("--set", s)
            ]
            (out / "command.txt").write_text(" ".join(cmd) + "\n")
            running[name] = subprocess.Popen(cmd, stdout=(out / "log.txt").open("w"), stderr=subprocess.STDOUT, env=env)
            started[name] = time.perf_counter()
            print(f"started {name}", flush=True)
        for name, proc in list(running.items()):
            if proc.poll() is not None:
                print(
                    f"finished {name}: exit {proc.returncode} after {time.perf_counter() - started.pop(name):.0f} s",
                    flush=True,
                )
                del running[name]
        time.sleep(2)
    rows, table = (
        [],
        [
            "| variant | overrides | updates | chosen | val tok-lc | test tok-lc | test chrF | val ppl |",
            "|---|---|---|---|---|---|---|---|",
        ],
    )
    for name in names:
        path = args.out / name / "results.json"
        if not path.is_file():
            table.append(f"| {name} | {variants[name]} | failed: see {args.out / name / 'log.txt'} | | | | | |")
            continue
        r = json.loads(path.read_text())
        chosen = r["scores"][r["chosen"]]
        row = {
            "variant": name,
            "overrides": variants[name],
            "updates": r["train"].get("step"),
            "chosen": r["chosen"],
            "val": chosen["valid"]["tok_lc_bleu"],
            "test": chosen["test"]["tok_lc_bleu"],
            "test_chrf": chosen["test"]["chrf"],
            "val_ppl": chosen["valid"].get("ref_perplexity"),
            "all": {m: {s: v["tok_lc_bleu"] for s, v in splits.items()} for m, splits in r["scores"].items()},
        }
        rows.append(row)
        table.append(
            f"| {name} | {variants[name]} | {row['updates']} | {row['chosen']} | {row['val']:.2f} | "
            f"{row['test']:.2f} | {row['test_chrf']:.2f} | {row['val_ppl']:.2f} |"
        )
    (args.out / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    (args.out / "summary.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
