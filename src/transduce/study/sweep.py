"""``transduce study table3 --data DIR --out SWEEP``: the paper's Table 3, every row trained and scored.

Each (row, seed) runs in its own process (:mod:`transduce.study.row`), ``--parallel`` at a time, the costliest
first, so a row that fails loses nothing else. Every row gets the same number of updates (the big row three
times as many, as in the paper), the same batches, schedule and scoring; the base row runs with several seeds,
the noise yardstick each variation is tested against (:mod:`transduce.study.report`). A row's result is one JSON file, ``SWEEP/results/ROW.seedS.json``, written when it is done; running
the same command again skips the rows that have one and resumes the others from their newest checkpoint
(``SWEEP/runs/ROW.seedS/``). The table and the plots (:mod:`transduce.study.report`) are rewritten at the
end of every run, and alone with ``--report-only``.

The optimisation is the Multi30k recipe's (Muon, weight decay, linear warm-up and decay to zero at each row's
last update): with the paper's rsqrt schedule (``--schedule rsqrt --optimizer adam --weight-decay 0``, one
lr_scale for every row, the base peaking at ``--peak-lr``, each row with its own d_model^-0.5), a CPU-sized
budget ends with the learning rate at a third of its peak and the rows far from trained.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..config import ConfigError, parse_override, to_toml_text
from ..decode.search_options import PAPER, SearchOptions, add_search_arguments
from . import report
from .table3 import Row, rows, select

# --scale: sizes for two CPU cores (the base translates: docs/paper-in-miniature.md, "Calibration"; the whole
# table is about 32 base rows, "Time") and for one GPU (the paper's base width). Any of them can be overridden by
# its option. Optimisation is the Multi30k recipe's (docs/multi30k.md), not the paper's: Muon for the matrices,
# AdamW for the rest, decoupled weight decay, and a learning rate that warms up and decays linearly to zero at the
# row's last update, so that every row ends trained rather than at a third of its peak rate.
_RECIPE = dict(optimizer="muon", schedule="linear", peak_lr=0.006, weight_decay=0.1, threads=1)
SCALES: dict[str, dict[str, Any]] = {
    "cpu": dict(_RECIPE, d_model=128, steps=3000, max_tokens=1024, device="cpu"),
    "gpu": dict(_RECIPE, d_model=512, steps=4000, max_tokens=8192, device="cuda", parallel=1),
}


@dataclass
class Settings:
    """Everything a sweep's rows share; all but ``parallel`` and ``rows`` must stay fixed across re-runs."""

    data: str
    d_model: int
    steps: int
    max_tokens: int
    warmup: int
    peak_lr: float
    seeds: list[int]
    base_seeds: list[int]
    optimizer: str
    schedule: str
    weight_decay: float
    device: str
    threads: int
    dtype: str
    beam: int = PAPER.beam
    alpha: float = PAPER.alpha
    max_len_a: float = PAPER.max_len_a
    max_len_b: int = PAPER.max_len_b
    valid_split: str = "valid"
    train_set: dict[str, Any] = field(default_factory=dict)  # --set: more [train] keys, the same for every row

    FIXED = (
        "data",
        "d_model",
        "steps",
        "max_tokens",
        "warmup",
        "peak_lr",
        "optimizer",
        "schedule",
        "weight_decay",
        "device",
        "dtype",
        "beam",
        "alpha",
        "max_len_b",
        "train_set",
    )

    def lr_scale(self) -> float:
        """lr_scale such that the rsqrt schedule peaks at ``peak_lr`` for the base width at step ``warmup``."""
        return self.peak_lr / (self.d_model**-0.5 * self.warmup**-0.5)

    def key(self, row: Row) -> str:
        """A digest of what the row's result depends on; a result with another key is not this row's."""
        fixed = {k: getattr(self, k) for k in self.FIXED}
        if self.max_len_a != PAPER.max_len_a:  # keyed only when set, so the keys of earlier sweeps stay
            fixed["max_len_a"] = self.max_len_a
        text = json.dumps({**fixed, "model": row.model}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("experiment", choices=["table3"], help="table3: the paper's Table 3 (variations on the base model)")
    p.add_argument("--data", help="a data directory made by `transduce prepare` (e.g. Multi30k en-de)")
    p.add_argument("--out", required=True, type=Path, help="the sweep directory (created; re-use it to resume)")
    p.add_argument(
        "--scale",
        choices=["auto", "cpu", "gpu"],
        default="auto",
        help="row sizes and budget: cpu (base d_model 128, 3,000 updates of 1,024 tokens), gpu (d_model 512, "
        "4,000 updates of 8,192 tokens); auto: gpu when CUDA is available",
    )
    p.add_argument("--d-model", type=int, help="the base row's d_model (the paper: 512); others scale with it")
    p.add_argument("--steps", type=int, help="updates per row, the same for every row")
    p.add_argument("--max-tokens", type=int, help="target tokens per update, padding included")
    p.add_argument("--warmup", type=int, help="warm-up updates (default: a tenth of --steps)")
    p.add_argument("--peak-lr", type=float, help="the peak learning rate (both scales: 0.006, Muon)")
    p.add_argument("--optimizer", choices=["adam", "muon"], help="muon (both scales) or adam (the paper's)")
    p.add_argument(
        "--schedule",
        choices=["linear", "rsqrt"],
        help="linear: warm-up, then decay to zero at each row's last update (both scales); rsqrt: the paper's, "
        "peaking at --peak-lr for the base width, every row with its own d_model^-0.5",
    )
    p.add_argument("--weight-decay", type=float, help="decoupled weight decay (both scales: 0.1; the paper: 0)")
    p.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[1],
        help="seeds of each variation (default 1: each is tested against every base seed, report.py)",
    )
    p.add_argument(
        "--base-seeds",
        type=int,
        nargs="+",
        default=[1, 2, 3],
        help="seeds of the base row, the noise yardstick (default 1 2 3)",
    )
    p.add_argument("--rows", nargs="+", help="only these rows (names as in the table, e.g. base A-h-1 C-N-8)")
    p.add_argument("--parallel", type=int, help="rows trained at once (default: one per core on CPU, 1 on GPU)")
    p.add_argument("--threads", type=int, help="torch threads per row (default 1)")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "fp32", "bf16"],
        help="training dtype (auto: bf16 where the device has it natively)",
    )
    p.add_argument("--valid-split", default="valid", help="the split scored as dev")
    add_search_arguments(p.add_argument_group("search for dev BLEU (defaults: the paper, §6.1)"), modes=())
    p.add_argument(
        "--set",
        dest="train_set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another [train] key for every row (e.g. loss_kernel=tensor); the study's own keys cannot be set",
    )
    p.add_argument("--report-only", action="store_true", help="write the table and plots from the results so far")


def settings_from_args(args: argparse.Namespace) -> tuple[Settings, int]:
    """The sweep's settings and its parallelism from the command line (``--scale`` first, then options)."""
    import torch

    scale = args.scale if args.scale != "auto" else ("gpu" if torch.cuda.is_available() else "cpu")
    if scale == "gpu" and not torch.cuda.is_available():
        raise ValueError("--scale gpu: no CUDA device here (--scale cpu, or auto)")
    base = SCALES[scale]
    pick = lambda name: getattr(args, name) if getattr(args, name) is not None else base[name]  # noqa: E731
    steps = pick("steps")
    search = SearchOptions.from_args(args)
    checked = (
        ("--steps", steps),
        ("--max-tokens", pick("max_tokens")),
        ("--seeds", min(args.seeds)),
        ("--base-seeds", min(args.base_seeds)),
    )
    for name, value in checked:
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    warmup = args.warmup if args.warmup is not None else max(1, steps // 10)
    if args.parallel is not None and args.parallel < 1:
        raise ValueError(f"--parallel must be at least 1, got {args.parallel}")
    parallel = args.parallel or base.get("parallel") or max(1, (os.cpu_count() or 1) // pick("threads"))
    if not args.data:
        raise ValueError("--data: name a prepared data directory (transduce prepare ...)")
    if not (Path(args.data) / "manifest.json").is_file():
        raise FileNotFoundError(f"--data {args.data}: no manifest.json there; build it with `transduce prepare`")
    settings = Settings(
        data=str(Path(args.data).resolve()),
        d_model=pick("d_model"),
        steps=steps,
        max_tokens=pick("max_tokens"),
        warmup=warmup,
        peak_lr=pick("peak_lr"),
        optimizer=pick("optimizer"),
        schedule=pick("schedule"),
        weight_decay=pick("weight_decay"),
        seeds=sorted(set(args.seeds)),
        base_seeds=sorted(set(args.base_seeds)),
        device=base["device"],
        threads=pick("threads"),
        dtype=args.dtype,
        valid_split=args.valid_split,
        beam=search.beam,
        alpha=search.alpha,
        max_len_a=search.max_len_a,
        max_len_b=search.max_len_b,
        train_set=dict(parse_override(text) for text in args.train_set),
    )
    own = train_table(replace(settings, train_set={}), rows(settings.d_model)[0], 1, Path())["train"]
    taken = sorted(set(settings.train_set) & set(own))
    if taken:
        raise ConfigError(f"--set {', '.join(taken)}: the study sets these itself (use its own options)")
    return settings, parallel


def check_sweep_dir(out: Path, settings: Settings) -> None:
    """Record the settings in ``out/sweep.json``, or check them against those a previous run recorded."""
    path = out / "sweep.json"
    if path.is_file():
        old = json.loads(path.read_text())
        for key in Settings.FIXED:
            if old.get(key) != getattr(settings, key):
                raise ConfigError(
                    f"{path}: key {key!r} was {old.get(key)!r} when this sweep started, now {getattr(settings, key)!r}; "
                    "run with the same settings to resume it, or choose another --out"
                )
        for key in ("seeds", "base_seeds"):
            old[key] = sorted(set(old.get(key, [])) | set(getattr(settings, key)))
        path.write_text(json.dumps(old, indent=2) + "\n")
        return
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(settings), indent=2) + "\n")


def train_table(settings: Settings, row: Row, seed: int, run_dir: Path) -> dict[str, Any]:
    """The [train] and [model] tables of one row's run."""
    steps = settings.steps * row.steps_scale
    if settings.schedule == "rsqrt":  # the paper's: one lr_scale, each row's own d_model^-0.5
        schedule = {"schedule": "rsqrt", "warmup": settings.warmup, "lr_scale": settings.lr_scale()}
    else:
        schedule = {"schedule": settings.schedule, "warmup": settings.warmup, "peak_lr": settings.peak_lr}
    train = {
        "data": settings.data,
        "out": str(run_dir / "run"),
        "valid_split": settings.valid_split,
        "max_tokens": settings.max_tokens,
        **schedule,
        "optimizer": settings.optimizer,
        "weight_decay": settings.weight_decay,
        "dtype": settings.dtype,
        "device": settings.device,
        "threads": settings.threads,
        "max_steps": steps,
        "save_every_steps": max(1, steps // 10),  # a killed row loses at most a tenth of its updates
        "save_every_minutes": 10.0,
        "keep_last": 2,
        "validate_every": max(1, steps // 10),  # the learning curve: dev perplexity at every tenth of the row
        "bleu_sentences": 0,
        "check_backends": 0,  # the study scores with exact fp32 (row.py): no decoding backends to measure
        "log_every": max(1, min(50, steps // 10)),
        "tensorboard": False,
        "seed": seed,
    }
    train.update(settings.train_set)
    model = {k: v for k, v in row.model.items() if v is not None}
    return {"train": train, "model": model}


def job_spec(settings: Settings, row: Row, seed: int, out: Path) -> dict[str, Any]:
    """Write a (row, seed)'s train.toml and spec.json under ``out/runs``; return the spec."""
    run_dir = out / "runs" / f"{row.slug}.seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    toml = run_dir / "train.toml"
    toml.write_text(to_toml_text(train_table(settings, row, seed, run_dir)))
    spec = {
        "row": row.name,
        "group": row.group,
        "seed": seed,
        "key": settings.key(row),
        "shape": row.shape(),
        "run_dir": str(run_dir),
        "train_toml": str(toml),
        "result": str(result_path(out, row, seed)),
        "steps": settings.steps * row.steps_scale,
        **{k: getattr(settings, k) for k in ("data", "valid_split", "threads", "device")},
        **{k: getattr(settings, k) for k in ("beam", "alpha", "max_len_a", "max_len_b")},
    }
    (run_dir / "spec.json").write_text(json.dumps(spec, indent=2) + "\n")
    return spec


def result_path(out: Path, row: Row, seed: int) -> Path:
    return out / "results" / f"{row.slug}.seed{seed}.json"


def is_done(path: Path, key: str) -> bool:
    """A result for these settings is there (written last by the row's process)."""
    if not path.is_file():
        return False
    try:
        return json.loads(path.read_text()).get("key") == key
    except json.JSONDecodeError:
        return False


def run_sweep(settings: Settings, chosen: list[Row], out: Path, parallel: int) -> list[str]:
    """Run every (row, seed) without a result, ``parallel`` processes at a time, the costliest first (so that
    the last to finish is a short one); return the failures, one line each."""
    check_sweep_dir(out, settings)
    pending = []
    for seed in sorted(set(settings.seeds) | set(settings.base_seeds)):
        for row in (r for r in chosen if seed in (settings.base_seeds if r.name == "base" else settings.seeds)):
            if is_done(result_path(out, row, seed), settings.key(row)):
                print(f"done already: {row.name} seed {seed}", flush=True)
            else:
                pending.append((row.cost(), seed, job_spec(settings, row, seed, out)))
    pending = [spec for _, _, spec in sorted(pending, key=lambda job: (-job[0], job[1]))]
    failures: list[str] = []
    running: list[tuple[subprocess.Popen, dict[str, Any], Any, float]] = []
    env = {**os.environ, "OMP_NUM_THREADS": str(settings.threads)}
    previous = signal.signal(signal.SIGTERM, _interrupt)  # `kill PID` stops the rows as Ctrl-C does
    try:
        while pending or running:
            while pending and len(running) < parallel:
                spec = pending.pop(0)
                log = open(Path(spec["run_dir"]) / "log.txt", "a")
                command = [sys.executable, "-m", "transduce.study.row", str(Path(spec["run_dir"]) / "spec.json")]
                print(f"start: {spec['row']} seed {spec['seed']} (log {log.name})", flush=True)
                running.append(
                    (
                        subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env),
                        spec,
                        log,
                        time.perf_counter(),
                    )
                )
            time.sleep(0.2)
            for job in list(running):
                process, spec, log, started = job
                if process.poll() is None:
                    continue
                running.remove(job)
                log.close()
                took = time.perf_counter() - started
                if process.returncode == 0:
                    print(f"done: {spec['row']} seed {spec['seed']} in {took:.0f} s", flush=True)
                else:
                    line = f"{spec['row']} seed {spec['seed']}: status {process.returncode}, see {log.name}"
                    print(f"FAILED: {line}", flush=True)
                    failures.append(line)
    finally:
        signal.signal(signal.SIGTERM, previous)
        for process, _, log, _ in running:  # interrupted: each row saves a checkpoint and stops; it resumes next time
            process.terminate()
            process.wait()
            log.close()
    return failures


def _interrupt(signum, _frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def run(args: argparse.Namespace) -> int:
    out, failures = args.out, []
    if not args.report_only:
        settings, parallel = settings_from_args(args)
        failures = run_sweep(settings, select(rows(settings.d_model), args.rows), out, parallel)
    written = report.write_report(out)
    print(f"\n{written['markdown']}\n")
    print(f"table: {written['table']}; plots: {', '.join(str(p) for p in written['plots'])}")
    if failures:
        print(f"{len(failures)} row(s) failed (run the same command again to retry them):", file=sys.stderr)
        for line in failures:
            print(f"  {line}", file=sys.stderr)
        return 1
    return 0
