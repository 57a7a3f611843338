"""``make bench``: run the side-by-side benchmarks and write BENCHMARKS.md.

    python bench/run.py --out BENCHMARKS.md                      # everything, paper-sized defaults
    python bench/run.py --parts train --configs small --dtypes bf16 --repeats 3

Each part writes its section to ``runs/bench/PART[-SUFFIX].md`` (with the command, CPU, threads, dtypes
and date that produced it); BENCHMARKS.md is the introduction followed by every section present, grouped
by machine, so parts can be re-run one at a time and results of several machines kept side by side
(``--suffix``).
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
from pathlib import Path

import torch
from common import ROOT, gemm_peak, load_average, machine, revision, set_threads

SECTIONS = ROOT / "runs" / "bench"
PARTS = ("train", "curves", "profile", "decode")
INTRO = """# Benchmarks

What `make bench` (`bench/run.py`) writes: one table per part and machine kind, each under the command,
CPU, threads, dtypes and date that produced it. Ratios are transduce / peer, measured side by side in one
run (alternating A B A B, medians). Peers: `torch.nn.Transformer` wired the paper's way for training;
HuggingFace `generate` and CTranslate2 for decoding. How to read them: docs/performance.md.
"""


def header(args: argparse.Namespace, title: str, dtypes: str) -> str:
    command = "python bench/run.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"## {title}: {machine()}\n\n`{command}`\n\n"
        f"CPU {machine()}, instruction set {torch.backends.cpu.get_cpu_capability()}, "
        f"{torch.get_num_threads()} threads, {dtypes}, torch {torch.__version__}, transduce at {revision()}, "
        f"{when}, 1-min load average at start {load_average()}"
        + (" — **a shared machine: absolute figures are noisy, read the ratios**" if args.shared else "")
        + "\n\n"
    )


def part_train(args, batches, vocab_size: int) -> str:
    from bench_train import DTYPES, throughput, throughput_table

    dtypes = args.dtypes.split(",")
    peaks: dict[str, float] = {}
    results = []
    for item in args.configs.split(","):
        preset, _, only = item.partition(":")  # "paper-base:bf16" runs that preset in bf16 only
        for d in only.split("+") if only else dtypes:
            if d not in peaks:
                peaks[d] = gemm_peak(DTYPES[d])
            results.append(throughput(preset, d, batches, vocab_size, args.repeats, peaks[d]))
            print(throughput_table(results[-1:]), flush=True)
    tokens = results[0].tokens_per_run
    text = (
        f"### Training throughput\n\n{len(batches)} Multi30k en→de batch(es) per timed run, {tokens:,} target "
        f"tokens in all (~{tokens // len(batches):,} per batch), {args.repeats} alternating timed runs per "
        "model after one warm-up run. Both models: the same weights, batches and trainer update "
        "(`transduce.train.step.Stepper`: label-smoothed CE ε = 0.1 on non-pad positions, "
        "Adam β = (0.9, 0.98), ε = 1e-9). GEMM peak: the best 1024³ or 2048³ matmul in the same process. "
        "MFU = tok/s × FLOPs/token ÷ peak. Spread = ±half the (max − min) / median of the timed runs.\n\n"
    )
    text += throughput_table(results) + "\n\n" + targets(results) + "\n"
    return text


RATIO_GOAL = 2.0  # transduce / nn.Transformer through the same bf16 update, at every preset
MFU_GOAL = {"medium": 0.70, "paper-base": 0.70}  # where the CPU has native bf16


def targets(results) -> str:
    """One line per bf16 preset: its ratio against RATIO_GOAL and, at medium and paper-base, its MFU."""
    lines = []
    for r in results:
        if r.dtype != "bf16":
            continue
        lines.append(
            f"- {r.preset} bf16: {r.ratio:.2f}× nn.Transformer, target ≥ {RATIO_GOAL}× — {verdict(r.ratio, RATIO_GOAL, '×')}"
        )
        if r.preset in MFU_GOAL:
            mfu, goal = r.mfu("transduce"), MFU_GOAL[r.preset]
            lines.append(f"- {r.preset} bf16: MFU {mfu:.0%}, target ≥ {goal:.0%} — {verdict(mfu, goal, '%')}")
    return "\n".join(lines)


def verdict(value: float, goal: float, unit: str) -> str:
    if value >= goal:
        return "met"
    gap = f"{goal - value:+.2f}" if unit == "×" else f"{100 * (goal - value):+.0f} points"
    return f"missed (needs {gap})"


def part_curves(args, data, vocab_size: int) -> str:
    from bench_train import curve_table, curves
    from data import train_batches

    batches = train_batches(data, args.curve_steps, max_tokens=args.curve_max_tokens)
    r = curves(args.curve_preset, "bf16", batches, vocab_size, warmup=args.curve_warmup)
    noise, gap = r.tail_gap("transduce", "transduce seed 2"), r.tail_gap("transduce", "nn.Transformer")
    verdict = "within noise" if gap <= 2 * noise else "**outside noise**"
    return (
        f"### Convergence per token\n\n`{r.preset}`, bf16, {r.steps} identical updates of ≤ {args.curve_max_tokens} "
        f"tokens, the paper's schedule with warm-up {r.warmup}, all runs from the same initial weights; "
        "only the dropout seed (and the dropout implementation) differs. Smoothed loss per target token:\n\n"
        + curve_table(r)
        + f"\n\nMean |Δloss| over the last 20 steps: transduce vs nn.Transformer {gap:.4f}, "
        f"transduce seed 1 vs seed 2 (dropout noise) {noise:.4f} — {verdict} (criterion: ≤ 2 × noise).\n"
    )


def part_profile(args, batches, vocab_size: int) -> str:
    from bench_train import top_ops

    text = "### Where transduce's bf16 training step spends its time\n\n"
    for preset in args.profile_configs.split(","):
        table = top_ops(preset, "bf16", batches[:1], vocab_size)
        text += f"`{preset}`, torch.profiler, self CPU time, one update after one warm-up:\n\n```\n{table}\n```\n\n"
    return text


def fairseq_status() -> str:
    """fairseq is a peer only where it imports; say why not otherwise."""
    import importlib.util

    if importlib.util.find_spec("fairseq") is None:
        return (
            "- fairseq: **not installed** — fairseq 0.12.2 (the latest on PyPI) does not install on Python "
            f"{sys.version_info.major}.{sys.version_info.minor}: its sdist lacks "
            "`fairseq/clib/libbase/balanced_assignment.cpp` (the C++ build fails); built without extensions it "
            "fails at import (mutable dataclass defaults in `fairseq/dataclass/configs.py` and in the "
            "hydra-core 1.0.7 it pins; with hydra-core 1.3.2 / omegaconf 2.3.0 omegaconf raises "
            "`ValidationError: Object of unsupported type: '_MISSING_TYPE'`). fairseq also "
            "cannot train in bf16 on a CPU.\n"
        )
    try:
        import fairseq.models.transformer  # noqa: F401
    except Exception as e:  # a broken install is reported, not hidden
        return f"- fairseq: installed but does not import: {type(e).__name__}: {e}\n"
    return "- fairseq: imports, but this harness has no fairseq runner yet (not measured).\n"


def compose(out: Path, sections: Path) -> None:
    """INTRO, then every section file, those of one machine together (the CPU named in their title)."""
    files = [f for p in PARTS for f in sorted(sections.glob(f"{p}*.md"))]  # train.md, train-amx.md, ...
    texts = [f.read_text() for f in files]
    machines = list(dict.fromkeys(t.split("\n", 1)[0].partition(": ")[2] for t in texts))
    ordered = sorted(texts, key=lambda t: machines.index(t.split("\n", 1)[0].partition(": ")[2]))
    out.write_text(INTRO + "\n" + "\n".join(ordered))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    p.add_argument("--parts", default=",".join(PARTS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--configs",
        default="small,medium,paper-base",
        help="presets for training throughput; PRESET:bf16 limits one preset's dtypes (fp32+bf16)",
    )
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--batches", type=int, default=2, help="batches per timed training run")
    p.add_argument("--max-tokens", type=int, default=4224, help="batch budget (4224 → ~3,840 target tokens)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--curve-preset", default="small")
    p.add_argument("--curve-steps", type=int, default=100)
    p.add_argument("--curve-max-tokens", type=int, default=1024)
    p.add_argument("--curve-warmup", type=int, default=400)
    p.add_argument("--profile-configs", default="medium,paper-base")
    p.add_argument("--decode-model", help="a trained transduce model directory (default: train one, see below)")
    p.add_argument("--decode-preset", default="small", help="preset of the model trained for decoding")
    p.add_argument("--decode-train-steps", type=int, default=1500, help="bf16 updates of that model")
    p.add_argument("--decode-sentences", type=int, default=1000, help="test sentences decoded at batch 64")
    p.add_argument("--decode-sentences-batch1", type=int, default=200, help="test sentences decoded at batch 1")
    p.add_argument("--decode-repeats", type=int, default=3)
    p.add_argument("--shared", action="store_true", help="say in the output that other jobs share the machine")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--sections", type=Path, default=SECTIONS, help="where each part's section is kept")
    p.add_argument("--suffix", default="", help="keep this run's sections beside earlier ones: PART-SUFFIX.md")
    args = p.parse_args(argv)
    set_threads(args.threads)
    from data import prepared, train_batches

    data = prepared(args.vocab_size)
    V = len(data.vocabs.src)
    batches = train_batches(data, args.batches, args.max_tokens)
    args.sections.mkdir(parents=True, exist_ok=True)
    parts = args.parts.split(",")
    for part in parts:
        if part not in PARTS:
            p.error(f"unknown part {part!r}; choose from {', '.join(PARTS)}")
    for part in parts:
        if part == "train":
            text = (
                header(args, "Training", f"dtypes {args.dtypes}")
                + part_train(args, batches, V)
                + "\n"
                + fairseq_status()
            )
        elif part == "curves":
            text = header(args, "Training: convergence", "bf16") + part_curves(args, data, V)
        elif part == "profile":
            text = header(args, "Training: profile", "bf16") + part_profile(args, batches, V)
        else:
            from bench_decode import part_decode

            text = header(args, "Decoding", "fp32, bf16 and int8 engines") + part_decode(args, data)
        (args.sections / f"{part}{'-' + args.suffix if args.suffix else ''}.md").write_text(text)
        compose(args.out, args.sections)
        print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
