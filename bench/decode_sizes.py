"""Decoding at the sizes users run: a paper-base model and an OPUS-MT-shaped one against CTranslate2.

Two model directories with random weights (so every hypothesis runs to |x| + 50 tokens, the worst case of
the length limit), written once under runs/bench/sizes/:

- ``paper-base``: Table 3's base shape (6+6 layers, d_model 512, d_ff 2048, 8 heads, ReLU), the 8,000-piece
  vocabulary of a prepared Multi30k directory;
- ``opus-mt``: the shape of the OPUS-MT models users import (base shape, Swish feed-forwards, an output
  bias, three-way tying) with a 32,000-piece vocabulary (a prepared Bible directory).

Each gets its ``backends.json`` from ``transduce check-backends`` (accuracy and speed on this machine), then
``bench_decode.py compare`` runs ``transduce-load`` (what ``transduce.load(model)`` decodes with),
CTranslate2 float32 and CTranslate2 int8 (the rival, last) side by side, alternating
rounds, each in its own process, at 1 and 2 threads, batch 64 and batch 1.

    python bench/decode_sizes.py --base-data runs/bench/m30k-en-de-8k --opus-data runs/bench/bible-en-de-32k

``--engines transduce-fp32-native ct2-float32`` holds fp32 against CTranslate2's float32 instead.

The data directories: ``transduce prepare multi30k --src en --tgt de --raw ../shared/data/multi30k
--vocab-size 8000 --out runs/bench/m30k-en-de-8k`` and ``transduce prepare bible --src 4 --tgt s
--vocab-size 32000 --out runs/bench/bible-en-de-32k``. Prints one markdown section per model.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from common import ROOT, machine

SHAPES = {
    "paper-base": dict(),
    "opus-mt": dict(activation="swish", output_bias=True),
}
ENGINES = ("transduce-load", "ct2-float32", "ct2-int8")


def random_model(data: Path, shape: str, out: Path) -> Path:
    """A ``paper-base``-shaped model with ``SHAPES[shape]``'s switches and random weights (made once)."""
    import torch

    from transduce.data import PreparedData
    from transduce.model import ModelConfig, Transformer
    from transduce.modeldir import save_model_dir

    if (out / "model.safetensors").is_file():
        return out
    prepared = PreparedData.open(data)
    torch.manual_seed(1)
    cfg = ModelConfig.preset("paper-base", vocab_size=len(prepared.vocabs.src), dropout=0.0, **SHAPES[shape])
    meta = {"src_lang": prepared.manifest["src_lang"], "tgt_lang": prepared.manifest["tgt_lang"], "bench": shape}
    save_model_dir(out, Transformer(cfg).eval(), prepared.vocabs, meta)
    return out


def run(cmd: list[str]) -> str:
    print("$", " ".join(cmd), file=sys.stderr, flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    return done.stdout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-data", type=Path, required=True, help="prepared data dir, 8,000 pieces (Multi30k)")
    p.add_argument("--opus-data", type=Path, required=True, help="prepared data dir, 32,000 pieces (Bible)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "sizes")
    p.add_argument("--count", type=int, default=64, help="sentences at batch 64")
    p.add_argument("--count-batch1", type=int, default=8, help="sentences at batch 1")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES), help="models to run")
    p.add_argument("--check-sentences", type=int, default=64, help="sentences check-backends decodes")
    p.add_argument(
        "--engines", nargs="+", default=list(ENGINES), help="bench_decode.py engines, the rival last (the ratios' base)"
    )
    args = p.parse_args()
    bench = str(Path(__file__).with_name("bench_decode.py"))
    print(f"## Decoding at base size ({machine()})\n")
    for shape, data in (("paper-base", args.base_data), ("opus-mt", args.opus_data)):
        if shape not in args.shapes:
            continue
        model = random_model(data, shape, args.out / shape)
        check = [sys.executable, "-m", "transduce", "check-backends", str(model), "--data", str(data)]
        print(run([*check, "--count", str(args.check_sentences)]).strip().splitlines()[0], "\n")
        for threads in args.threads:
            for batch, count in ((64, args.count), (1, args.count_batch1)):
                print(f"### {shape}, {threads} thread(s), batch {batch}\n")
                cmd = [sys.executable, bench, "compare", "--model", str(model), "--data", str(data)]
                cmd += ["--split", "test", "--count", str(count), "--batch", str(batch), "--threads", str(threads)]
                cmd += ["--rounds", str(args.rounds), "--engines", *args.engines]
                print(run(cmd), flush=True)


if __name__ == "__main__":
    main()
