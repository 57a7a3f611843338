"""The GPU measurements, in one run: training speed, peak memory, DDP over NCCL, decoding against CTranslate2.

1. Training tokens/s of ``paper-base`` (and ``paper-big``) with transduce's trainer update
   (:class:`transduce.train.step.Stepper`) against ``torch.nn.Transformer`` wired the paper's way
   (``bench/peer.py``) driven by the same update, same weights, same batches, in bf16 and fp16; peak GPU memory.
2. ``torchrun --nproc_per_node=1 -m transduce train`` on the GPU: a ``paper-base`` model trained for
   ``--train-minutes`` on the prepared data, the trainer's model directory. With one GPU this is one rank
   (no process group); NCCL needs a rank per GPU, so DDP over NCCL needs a machine with two or more.
3. Decoding that model (beam 4, α 0.6, batches of 64 sentences) in fp32, bf16 and fp16, against CTranslate2
   on the same GPU and the same weights (exported with ``transduce.interop``), where CTranslate2 can run.

    python bench/gpu.py --data runs/gpudata --out OUT      (a data directory from `transduce prepare`)

Writes OUT/gpu.json and OUT/gpu.md (the tables docs/scale.md quotes). Needs a CUDA device.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parents[1]

from peer import PeerTransformer, copy_weights  # noqa: E402

from transduce.data import PreparedData  # noqa: E402
from transduce.data.batching import TokenBatches  # noqa: E402
from transduce.model import ModelConfig, Transformer  # noqa: E402
from transduce.train.loss import SmoothedLoss  # noqa: E402
from transduce.train.schedule import Schedule  # noqa: E402
from transduce.train.step import Stepper  # noqa: E402


def environment(device: torch.device) -> dict:
    if device.type != "cuda":
        return {
            "gpu": "none (CPU smoke run)",
            "memory_gib": 0,
            "torch": torch.__version__,
            "cuda": None,
            "cpu_count": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d"),
        }
    p = torch.cuda.get_device_properties(0)
    return {
        "gpu": p.name,
        "memory_gib": round(p.total_memory / 2**30, 1),
        "sms": p.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpu_count": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
    }


def train_speed(
    data: PreparedData,
    preset: str,
    impl: str,
    dtype: str,
    max_tokens: int,
    steps: int,
    device: torch.device,
    warmup: int = 5,
) -> dict:
    """Target tokens per second over ``steps`` updates (after ``warmup``), and peak GPU memory."""
    cfg = ModelConfig.preset(preset, vocab_size=len(data.vocabs.src))
    torch.manual_seed(1)
    ours = Transformer(cfg)
    model = ours
    if impl == "nn.Transformer":
        model = PeerTransformer(cfg)
        copy_weights(model, ours)
    model = model.to(device).train()
    opt = torch.optim.Adam(model.parameters(), betas=(0.9, 0.98), eps=1e-9, fused=True)
    stepper = Stepper(
        model,
        opt,
        Schedule("rsqrt", 4000, cfg.d_model),
        device=device,
        dtype=dtype,
        objective=SmoothedLoss(cfg.label_smoothing),
    )
    batches = TokenBatches(data.split("train"), max_tokens, seed=1).epoch(1)
    batches = [batches[i % len(batches)] for i in range(warmup + steps)]
    for i in range(warmup):
        stepper.update([batches[i]], i + 1)
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    tokens, start = 0, time.perf_counter()
    for i in range(warmup, warmup + steps):
        tokens += stepper.update([batches[i]], i + 1).tokens
    sync(device)
    seconds = time.perf_counter() - start
    out = {
        "preset": preset,
        "impl": impl,
        "dtype": dtype,
        "max_tokens": max_tokens,
        "steps": steps,
        "tgt_tokens_per_s": round(tokens / seconds),
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None,
        "parameters": sum(p.numel() for p in ours.parameters()),
    }
    del stepper, opt, model, ours
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def train_under_torchrun(
    data_dir: Path, run: Path, minutes: float, device: torch.device, preset: str, peak_lr: float
) -> dict:
    """``transduce train`` under torchrun for ``minutes``; the trainer writes RUN/run/model."""
    cfg = run / "train.toml"
    run.mkdir(parents=True, exist_ok=True)
    cfg.write_text(f"""[train]
data = "{data_dir}"
out = "{run / "run"}"
device = "{device.type}"
dtype = "{"bf16" if device.type == "cuda" else "fp32"}"
max_tokens = 8192
schedule = "linear"
peak_lr = {peak_lr}
warmup = 400
max_minutes = {minutes}
save_every_steps = 100
save_every_minutes = 60.0
keep_last = 5
validate_every = 100000
bleu_sentences = 0
tensorboard = false

[model]
preset = "{preset}"
dropout = 0.3
""")
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    start = time.perf_counter()
    log = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=1",
            "-m",
            "transduce",
            "train",
            str(cfg),
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    tail = (log.stdout + log.stderr)[-3000:]
    print(tail, flush=True)
    if log.returncode != 0:
        raise SystemExit(f"torchrun train failed ({log.returncode})")
    return {"wall_s": round(wall, 1), "minutes": minutes, "log_tail": tail[-1500:]}


def decode_speed(
    model_dir: Path,
    data: PreparedData,
    device: torch.device,
    split: str = "test",
    batch: int = 64,
    sentences: int | None = None,
) -> list[dict]:
    """Beam 4 over ``split``: transduce in fp32/bf16/fp16 and CTranslate2 where it runs; sentences/s and BLEU."""
    from transduce.api import load
    from transduce.evaluate import score_translations

    ids = data.split(split)
    sources, refs = ids.lines("src")[:sentences], ids.lines("tgt")[:sentences]
    lang = data.manifest["tgt_lang"]
    rows = []
    for dtype in ("fp32", "bf16", "fp16") if device.type == "cuda" else ("fp32",):
        tr = load(model_dir, device=device, dtype=dtype)
        tr.translate(sources[:batch], batch_size=batch, batch_tokens=10**9)  # warm-up
        best = None
        for _ in range(2):
            sync(device)
            t = time.perf_counter()
            hyps = tr.translate(sources, batch_size=batch, batch_tokens=10**9)  # the paper's search
            sync(device)
            best = min(best or 1e9, time.perf_counter() - t)
        s = score_translations(hyps, refs, lang)
        rows.append(
            {
                "engine": f"transduce-{dtype}",
                "seconds": round(best, 2),
                "sentences_per_s": round(len(sources) / best, 1),
                "tok_lc_bleu": s["tok_lc_bleu"],
                "bleu": s["bleu"],
            }
        )
        print(rows[-1], flush=True)
        del tr
    rows += ct2_speed(model_dir, sources, refs, lang, batch, device)
    return rows


def ct2_speed(
    model_dir: Path, sources: list[str], refs: list[str], lang: str, batch: int, device: torch.device
) -> list[dict]:
    """CTranslate2 on the GPU with the same weights, or one row saying why it could not run."""
    try:
        import ctranslate2

        from transduce.evaluate import score_translations
        from transduce.interop.ctranslate2 import export_ctranslate2
        from transduce.modeldir import load_model_dir

        if device.type != "cuda" or ctranslate2.get_cuda_device_count() < 1:
            raise RuntimeError("CTranslate2 sees no CUDA device")
        model, vocabs, _ = load_model_dir(model_dir)
        out = model_dir.parent / "ct2"
        export_ctranslate2(model, vocabs, out)
        src_pieces = [vocabs.src.pieces(vocabs.src.encode(s)) for s in sources]
        rows = []
        for compute in ("float32", "float16", "bfloat16"):
            tr = ctranslate2.Translator(str(out), device="cuda", compute_type=compute)
            kw = dict(beam_size=4, length_penalty=0.6, max_batch_size=batch, max_decoding_length=256)
            tr.translate_batch(src_pieces[:batch], **kw)
            best = None
            for _ in range(2):
                t = time.perf_counter()
                res = tr.translate_batch(src_pieces, **kw)
                best = min(best or 1e9, time.perf_counter() - t)
            hyps = [vocabs.tgt.sp.decode_pieces(r.hypotheses[0]) for r in res]
            s = score_translations(hyps, refs, lang)
            rows.append(
                {
                    "engine": f"ct2-{compute}",
                    "seconds": round(best, 2),
                    "sentences_per_s": round(len(sources) / best, 1),
                    "tok_lc_bleu": s["tok_lc_bleu"],
                    "bleu": s["bleu"],
                }
            )
            print(rows[-1], flush=True)
        return rows
    except Exception as e:  # noqa: BLE001 - the reason is the measurement
        print(f"CTranslate2 on the GPU: not run: {type(e).__name__}: {e}", flush=True)
        return [{"engine": "ct2", "error": f"{type(e).__name__}: {e}"[:400]}]


def markdown(results: dict) -> str:
    env = results["environment"]
    lines = [
        f"GPU: {env['gpu']} ({env['memory_gib']} GiB), torch {env['torch']} (CUDA {env['cuda']}), "
        f"{env['date']}; `python bench/gpu.py --data DATA --out OUT` on Multi30k en-de (8,000 shared pieces)",
        "",
        "| preset | dtype | tokens/update | transduce tgt tok/s | nn.Transformer tgt tok/s | ratio | peak GiB (transduce / peer) |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = results["train"]
    for r in rows:
        if r["impl"] != "transduce":
            continue
        peer = next(
            (
                p
                for p in rows
                if p["impl"] == "nn.Transformer" and p["preset"] == r["preset"] and p["dtype"] == r["dtype"]
            ),
            None,
        )
        ratio = f"{r['tgt_tokens_per_s'] / peer['tgt_tokens_per_s']:.2f}x" if peer else "-"
        peer_speed, peer_peak = (f"{peer['tgt_tokens_per_s']:,}", peer["peak_gib"]) if peer else ("-", "-")
        lines.append(
            f"| {r['preset']} | {r['dtype']} | {r['max_tokens']:,} | {r['tgt_tokens_per_s']:,} | "
            f"{peer_speed} | {ratio} | {r['peak_gib']} / {peer_peak} |"
        )
    lines += ["", "| engine | sentences/s | seconds | tok-lc BLEU | sacreBLEU |", "|---|---|---|---|---|"]
    for r in results.get("decode", []):
        if "error" in r:
            lines.append(f"| {r['engine']} | not run: {r['error']} | | | |")
        else:
            lines.append(
                f"| {r['engine']} | {r['sentences_per_s']} | {r['seconds']} | {r['tok_lc_bleu']} | {r['bleu']} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--train-minutes", type=float, default=2.0)
    p.add_argument("--train-preset", default="paper-base", help="the model trained under torchrun and decoded")
    p.add_argument("--peak-lr", type=float, default=0.001)
    p.add_argument("--skip", nargs="*", default=[], choices=["speed", "torchrun", "decode"])
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of this script (tiny preset, fp32)")
    p.add_argument("--sentences", type=int, default=None, help="decode only the first N test sentences")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench/gpu.py needs a CUDA device (or --device cpu for a smoke run)")
    args.out.mkdir(parents=True, exist_ok=True)
    data = PreparedData.open(args.data)
    results: dict = {"environment": environment(device), "train": []}
    print(results["environment"], flush=True)
    cuda = device.type == "cuda"
    runs = (
        (("paper-base", 25000, ("bf16", "fp16")), ("paper-big", 25000, ("bf16",)))
        if cuda
        else (("tiny", 2048, ("fp32",)),)
    )

    def save() -> None:
        (args.out / "gpu.json").write_text(json.dumps(results, indent=1))
        (args.out / "gpu.md").write_text(markdown(results))

    if "speed" not in args.skip:
        for preset, tokens, dtypes in runs:
            for dtype in dtypes:
                for impl in ("transduce", "nn.Transformer"):
                    results["train"].append(train_speed(data, preset, impl, dtype, tokens, args.steps, device))
                    print(results["train"][-1], flush=True)
                    save()
    run = Path("/tmp/transduce-gpu-run")
    if "torchrun" not in args.skip:
        results["torchrun"] = train_under_torchrun(
            args.data.resolve(), run, args.train_minutes, device, args.train_preset if cuda else "tiny", args.peak_lr
        )
        save()
    if "decode" not in args.skip and (run / "run" / "model").is_dir():
        results["decode"] = decode_speed(run / "run" / "model", data, device, sentences=args.sentences)
        save()
    print(markdown(results))


if __name__ == "__main__":
    main()
