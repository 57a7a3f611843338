"""Decoding throughput, latency and peak memory against HuggingFace generate and CTranslate2.

Beam 4 on Multi30k test sentences (test_2016_flickr, en→de) with the same trained weights:
transduce (fp32, bf16, int8 dynamic quantisation of its Linear layers) against HuggingFace
``MarianMTModel.generate`` and CTranslate2 (float32, int8), both through transduce's exporters
(:mod:`transduce.interop`). Every engine gets the same source token ids; each run is its own
subprocess (so ``ru_maxrss`` is that engine's peak memory) and runs alternate between engines.
Ranking is by log-probability alone (length penalty 0 everywhere: the libraries define α
differently), at most ``|x| + 50`` output tokens and no minimum (an empty output may win), so where
the arithmetic is the same the best hypotheses must agree.

    python bench/bench_decode.py worker ENGINE --model DIR --batch 64 --sentences FILE   (one timed run)
    python bench/bench_decode.py compare --model DIR --data DATA [--split test --count 1000 --batch 64
        --threads 1 --rounds 3 --engines transduce-load ct2-float32]   (side by side, alternating; a table)

``transduce-load`` is what ``transduce.load(model_dir)`` decodes with when given no speed arguments (the
backend ``transduce.backends.policy`` chooses; the worker prints that choice).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import ROOT, markdown_table

ENGINES = (
    "transduce-load",  # transduce.load(model_dir) with no speed arguments
    "transduce-fp32",
    "transduce-bf16",
    "transduce-int8",
    "transduce-fp32-native",
    "transduce-bf16-native",
    "transduce-int8-native",
    "hf-fp32",
    "ct2-float32",
    "ct2-int8",
)
# torch.compile'd steps: slower at batch 64 when measured; runnable by name, not by default
EXPERIMENTS = ("transduce-bf16-compile", "transduce-int8-compile")
SAME_ARITHMETIC = {"hf-fp32": "transduce-fp32", "ct2-float32": "transduce-fp32"}  # pairs whose outputs must agree
MAX_LEN_B = 50


# ----------------------------------------------------------------------------- workers (one engine per process)
def _transduce(model_dir: Path, variant: str, threads: int):
    import torch

    from transduce.backends.precision import for_decoding
    from transduce.decode.search import beam_search
    from transduce.modeldir import load_model_dir

    model, _, _ = load_model_dir(model_dir)
    dtype, _, how = variant.partition("-")
    if dtype == "load":  # transduce.load(model_dir) with no speed arguments: its default backend
        from transduce.api import load

        translator = load(model_dir)
        print(translator.fast_paths.line(), file=sys.stderr)
        model = translator.model
    elif how == "native":  # what `transduce translate --dtype DTYPE --native` runs: the C++ step
        from transduce.backends.native import NativeStep
        from transduce.backends.policy import decoder_for
        from transduce.fastpaths import Choice

        model = decoder_for(model.eval(), Choice(f"{dtype}-native", "asked for"), torch.device("cpu"))[0]
        if not isinstance(model, NativeStep):
            raise SystemExit("the C++ decoder step is not available here")
    else:
        model = for_decoding(model.eval(), dtype, torch.device("cpu"))  # what `transduce translate --dtype` runs
    if how == "compile":  # an experiment, not a product option: dynamic-shape recompiles make it slower at batch 64
        model.decode_step = torch.compile(model.decode_step, dynamic=True)

    @torch.inference_mode()
    def run(batch: list[list[int]], beam: int) -> list[list[int]]:
        width = max(len(s) for s in batch)
        src = torch.tensor([s + [0] * (width - len(s)) for s in batch])  # (B, S) ids + eos, right-padded
        hyps = beam_search(model, src, beam=beam, alpha=0.0, max_len_a=1.0, max_len_b=MAX_LEN_B)
        return [h[0].tokens for h in hyps]

    return run


def _hf(export_dir: Path, threads: int):
    import torch
    from transformers import MarianMTModel

    model = MarianMTModel.from_pretrained(str(export_dir)).eval()
    eos = model.config.eos_token_id

    @torch.inference_mode()
    def run(batch: list[list[int]], beam: int) -> list[list[int]]:
        width = max(len(s) for s in batch)
        ids = torch.tensor([s + [model.config.pad_token_id] * (width - len(s)) for s in batch])  # (B, S)
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in batch])
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            num_beams=beam,
            do_sample=False,
            length_penalty=0.0,
            max_new_tokens=width + MAX_LEN_B,
            early_stopping=True,
        )
        return [[t for t in row.tolist()[1:] if t != eos and t != model.config.pad_token_id] for row in out]

    return run


def _ct2(export_dir: Path, compute_type: str, threads: int, vocab):
    import ctranslate2

    translator = ctranslate2.Translator(
        str(export_dir), device="cpu", compute_type=compute_type, intra_threads=threads, inter_threads=1
    )

    def run(batch: list[list[int]], beam: int) -> list[list[int]]:
        pieces = [vocab.pieces(s[:-1]) for s in batch]  # CTranslate2 appends eos itself
        # min_decoding_length=0: translate_batch defaults to 1, which bars eos at the first step, so an empty
        # hypothesis (eos first) could not win there while transduce's and HF's beam search allow it.
        results = translator.translate_batch(
            pieces,
            beam_size=beam,
            length_penalty=0.0,
            max_batch_size=len(batch),
            max_decoding_length=max(len(s) for s in batch) + MAX_LEN_B,
            min_decoding_length=0,
        )
        return [[vocab.sp.piece_to_id(p) for p in r.hypotheses[0]] for r in results]

    return run


def worker(argv: list[str]) -> None:
    """One timed run of one engine; prints a JSON line: seconds, sentences, tokens, peak RSS, hypotheses."""
    import torch

    from transduce.data.vocab import Vocabs

    p = argparse.ArgumentParser()
    p.add_argument("engine", choices=ENGINES + EXPERIMENTS)
    p.add_argument("--model", type=Path, required=True, help="transduce model directory")
    p.add_argument("--exports", type=Path, required=True, help="where the hf/ and ct2-*/ exports are")
    p.add_argument("--sources", type=Path, required=True, help="JSON list of source id lists (ids + eos)")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    sources = json.loads(args.sources.read_text())
    kind, _, variant = args.engine.partition("-")
    if kind == "transduce":
        run = _transduce(args.model, variant, args.threads)
    elif kind == "hf":
        run = _hf(args.exports / "hf", args.threads)
    else:
        run = _ct2(args.exports / f"ct2-{variant}", variant, args.threads, Vocabs.load(args.model / "vocab").tgt)
    t0 = time.perf_counter()
    run(sources[: args.batch], args.beam)  # warm-up, a full batch: first-call allocations, lazy init, compiling
    warmup = time.perf_counter() - t0
    hyps, t0, c0 = [], time.perf_counter(), time.process_time()
    for i in range(0, len(sources), args.batch):
        hyps += run(sources[i : i + args.batch], args.beam)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0  # cpu: all of the process's threads
    print(
        json.dumps(
            {
                "seconds": seconds,
                "cpu_seconds": cpu,
                "sentences": len(hyps),
                "tokens": sum(len(h) + 1 for h in hyps),
                "maxrss_mb": peak_rss_mb(),
                "warmup_s": warmup,
                "hyps": hyps,
            }
        )
    )


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM). ``ru_maxrss`` would not do: Linux keeps it across
    execve, so a worker started by a big parent reports the parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # not Linux: best effort


# ----------------------------------------------------------------------------- the driver
def export_all(model_dir: Path, exports: Path) -> dict[str, str]:
    """HF and CTranslate2 exports of ``model_dir`` (made once); returns engine -> why it is unavailable."""
    from transduce.interop.ctranslate2 import export_ctranslate2
    from transduce.interop.marian import export_marian
    from transduce.modeldir import load_model_dir

    model, vocabs, meta = load_model_dir(model_dir)
    missing = {}
    jobs = {
        "hf-fp32": ("hf", lambda out: export_marian(model, vocabs, out, meta, ids_only=True)),  # ids in, ids out
        "ct2-float32": ("ct2-float32", lambda out: export_ctranslate2(model, vocabs, out, None)),
        "ct2-int8": ("ct2-int8", lambda out: export_ctranslate2(model, vocabs, out, "int8")),
    }
    for engine, (name, export) in jobs.items():
        if (exports / name / "DONE").is_file():
            continue
        try:
            export(exports / name)
            (exports / name / "DONE").write_text(str(model_dir) + "\n")
        except Exception as e:  # a peer that cannot be built is reported, never silently dropped
            missing[engine] = f"{type(e).__name__}: {e}"
    return missing


def quick_model(data, preset: str, steps: int, out: Path):
    """A model trained for ``steps`` updates with transduce's trainer step (reused when present)."""
    import torch
    from bench_train import Trainer
    from data import train_batches

    from transduce.model import ModelConfig, Transformer
    from transduce.modeldir import save_model_dir
    from transduce.train.dropout import use_fast_dropout

    if (out / "model.safetensors").is_file():
        return out
    torch.manual_seed(1)
    model = Transformer(ModelConfig.preset(preset, vocab_size=len(data.vocabs.src)))
    use_fast_dropout(model)
    step = Trainer(model.train(), "bf16", warmup=min(4000, max(steps // 2, 1)))
    epoch, done = 0, 0
    while done < steps:
        for batch in train_batches(data, None, epoch=epoch)[: steps - done]:
            loss = step(batch)
            done += 1
            if done % 50 == 0:
                print(f"  decode model: update {done}/{steps}, loss {loss:.3f}", flush=True)
        epoch += 1
    save_model_dir(
        out,
        model,
        data.vocabs,
        {"src_lang": "en", "tgt_lang": "de", "bench": f"{preset}, {steps} bf16 updates of ~3,840 target tokens"},
    )
    return out


def describe(meta: dict) -> str:
    """What the model directory's [meta] says about how the model was trained."""
    if "bench" in meta:
        return meta["bench"]
    known = [f"{k} {meta[k]}" for k in ("trained_by", "steps", "final_loss") if k in meta]
    return ", ".join(known) or "given with --decode-model"


def run_engine(engine: str, model_dir: Path, exports: Path, sources: Path, batch: int, threads: int) -> dict:
    cmd = [
        sys.executable,
        str(Path(__file__)),
        "worker",
        engine,
        "--model",  # absolute: the worker runs in ROOT, where a path relative to the caller names nothing
        str(model_dir.resolve()),
        "--exports",
        str(exports.resolve()),
        "--sources",
        str(sources.resolve()),
        "--batch",
        str(batch),
        "--threads",
        str(threads),
    ]
    # the worker runs in ROOT: a relative PYTHONPATH (``cd bench && PYTHONPATH=../src``) would name another
    # directory there and import whatever transduce is installed instead of this checkout
    path = os.pathsep.join(os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": path})
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    return sum(x == y for x, y in zip(a, b)) / len(a)


def part_decode(args, data) -> str:
    """Run every engine at batch 1 and batch 64, alternating, and return the markdown section."""
    from transduce.evaluate import score_translations
    from transduce.modeldir import load_model_dir

    model_dir = (
        Path(args.decode_model)
        if args.decode_model
        else quick_model(
            data,
            args.decode_preset,
            args.decode_train_steps,
            ROOT / "runs" / "bench" / f"decode-{args.decode_preset}-{args.decode_train_steps}",
        )
    )
    exports = ROOT / "runs" / "bench" / "exports" / model_dir.name
    exports.mkdir(parents=True, exist_ok=True)
    missing = export_all(model_dir, exports)
    _, vocabs, _ = load_model_dir(model_dir)
    test = data.split("test")
    sources_all = [ids + [3] for ids in vocabs.src.encode_batch([test.src_text(i) for i in range(len(test))])]
    engines = [e for e in ENGINES if e not in missing]
    rows, notes = [], []
    from transduce.train.step import native_bf16

    has_bf16, why = native_bf16("cpu")
    if not has_bf16:  # reported, not dropped: emulated bf16 takes minutes per run and measures nothing useful
        notes += [f"- {e}: not run, {why}" for e in engines if "bf16" in e]
        engines = [e for e in engines if "bf16" not in e]
    results: dict[tuple[str, int], list[dict]] = {}
    for batch, count in ((64, args.decode_sentences), (1, args.decode_sentences_batch1)):
        path = exports / f"sources-{count}.json"
        path.write_text(json.dumps(sources_all[:count]))
        for _ in range(args.decode_repeats):
            for engine in engines:  # alternating: every engine once per round
                results.setdefault((engine, batch), []).append(
                    run_engine(engine, model_dir, exports, path, batch, args.threads)
                )
        medians = {}
        for engine in engines:
            runs = [r for r in results[(engine, batch)] if "error" not in r]
            if not runs:
                notes.append(f"- {engine} batch {batch}: failed — {results[(engine, batch)][0]['error']}")
                continue
            sec = statistics.median(r["seconds"] for r in runs)
            if engine.endswith("-compile"):
                notes.append(
                    f"- {engine} batch {batch}: compiling plus the untimed warm-up batch took "
                    f"{statistics.median(r['warmup_s'] for r in runs):.0f} s (median)"
                )
            medians[engine] = (
                runs[0]["tokens"] / sec,
                runs[0]["sentences"] / sec,
                max(r["maxrss_mb"] for r in runs),
                runs[0]["hyps"],
            )
        ref = medians.get("transduce-fp32")
        refs = [test.tgt_text(i) for i in range(min(count, len(sources_all)))]  # what every engine decoded
        bleu = {
            engine: score_translations([vocabs.tgt.decode(h) for h in m[3]], refs, data.manifest["tgt_lang"])[
                "tok_lc_bleu"
            ]
            for engine, m in medians.items()
        }
        for engine, (tok_s, sent_s, rss, hyps) in medians.items():
            vs_ct2 = tok_s / medians["ct2-float32"][0] if "ct2-float32" in medians else float("nan")
            vs_hf = tok_s / medians["hf-fp32"][0] if "hf-fp32" in medians else float("nan")
            agree = f"{agreement(hyps, ref[3]):.0%}" if ref else "n/a"
            delta = f" ({bleu[engine] - bleu['transduce-fp32']:+.2f})" if ref and engine != "transduce-fp32" else ""
            rows.append(
                [
                    str(batch),
                    engine,
                    f"{tok_s:,.0f}",
                    f"{sent_s:,.1f}",
                    f"{rss:,.0f}",
                    f"{vs_ct2:.2f}×",
                    f"{vs_hf:.2f}×",
                    agree,
                    f"{bleu[engine]:.2f}{delta}",
                ]
            )
    notes += [f"- {engine}: not measured — {why}" for engine, why in missing.items()]
    table = markdown_table(
        [
            "batch",
            "engine",
            "tokens/s",
            "sentences/s",
            "peak RSS MB",
            "vs CT2 float32",
            "vs HF generate",
            "best hyp = transduce fp32",
            "tok-lc BLEU (Δ fp32)",
        ],
        rows,
    )
    meta = load_model_dir(model_dir)[2]
    return (
        f"### Decoding, beam 4\n\nModel `{model_dir.relative_to(ROOT) if model_dir.is_relative_to(ROOT) else model_dir}`"
        f" ({describe(meta)}); Multi30k test_2016_flickr en→de, first "
        f"{args.decode_sentences} sentences at batch 64 and {args.decode_sentences_batch1} at batch 1; median of "
        f"{args.decode_repeats} alternating runs, each engine in its own process (peak RSS = that process's "
        "VmHWM, model load included). Length penalty 0, max length |x| + 50. Tokens = output tokens + eos. "
        "BLEU: tokenised, lowercased, on the sentences decoded at that batch size (bf16 and "
        "int8 are meant to stay within 0.3 of fp32). "
        f"Pairs with the same arithmetic: {', '.join(f'{a} ≡ {b}' for a, b in SAME_ARITHMETIC.items())}.\n\n"
        + table
        + "\n\n"
        + "\n".join(notes)
        + "\n"
    )


def compare(argv: list[str]) -> None:
    """Engines side by side on the same sentences, alternating rounds; prints a markdown table with each
    engine's median target tokens/s and its ratio to the last engine named (the rival), and the sacreBLEU of
    its first round's output against the split's references (length penalty 0, as every engine here)."""
    from transduce.data import PreparedData
    from transduce.evaluate import score_translations
    from transduce.modeldir import load_model_dir

    p = argparse.ArgumentParser(prog="bench_decode.py compare")
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True, help="prepared data directory (its --split's sources)")
    p.add_argument("--split", default="test")
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--engines", nargs="+", default=["transduce-load", "ct2-float32"], choices=ENGINES)
    args = p.parse_args(argv)
    exports = args.model.parent / f"{args.model.name}-exports"
    exports.mkdir(exist_ok=True)
    missing = export_all(args.model, exports)
    if any(e in missing for e in args.engines):
        raise SystemExit(f"cannot export: {missing}")
    _, vocabs, _ = load_model_dir(args.model)
    data = PreparedData.open(args.data)
    split = data.split(args.split)
    eos = 3
    sources = [ids + [eos] for ids in vocabs.src.encode_batch([split.src_text(i) for i in range(len(split))])]
    path = exports / f"sources-{args.split}-{args.count}.json"
    path.write_text(json.dumps(sources[: args.count]))
    runs: dict[str, list[dict]] = {e: [] for e in args.engines}
    for _ in range(args.rounds):
        for engine in args.engines:
            result = run_engine(engine, args.model, exports, path, args.batch, args.threads)
            if "error" in result:
                raise SystemExit(f"{engine}: {result['error']}")
            runs[engine].append(result)
    rival = args.engines[-1]
    refs = [split.tgt_text(i) for i in range(len(sources[: args.count]))]
    bleu = {
        e: score_translations([vocabs.tgt.decode(h) for h in rs[0]["hyps"]], refs, data.manifest["tgt_lang"])["bleu"]
        for e, rs in runs.items()
    }
    wall = {e: statistics.median(r["tokens"] / r["seconds"] for r in rs) for e, rs in runs.items()}
    cpu = {e: statistics.median(r["tokens"] / r["cpu_seconds"] for r in rs) for e, rs in runs.items()}
    rows = [
        [
            e,
            f"{wall[e]:,.0f}",
            f"{wall[e] / wall[rival]:.2f}×",
            f"{cpu[e]:,.0f}",
            f"{cpu[e] / cpu[rival]:.2f}×",
            f"{agreement(runs[e][0]['hyps'], runs[rival][0]['hyps']):.0%}",
            f"{bleu[e]:.2f}",
        ]
        for e in args.engines
    ]
    print(
        f"{len(sources[: args.count])} sentences of {args.data} {args.split}, batch {args.batch}, beam 4, "
        f"{args.threads} thread(s), median of {args.rounds} alternating rounds, each engine in its own process; "
        f"load average {os.getloadavg()[0]:.1f} (per CPU-second: robust to other processes taking the cores)"
    )
    print(
        markdown_table(
            [
                "engine",
                "target tokens/s (wall)",
                f"vs {rival}",
                "target tokens per CPU-second",
                f"vs {rival}",
                f"same best hyp as {rival}",
                "BLEU",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "compare":
        compare(sys.argv[2:])
    else:
        sys.exit(__doc__)
