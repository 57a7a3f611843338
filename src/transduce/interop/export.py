"""``transduce export``: a model directory -> CTranslate2 or a HuggingFace MarianMT directory.

transduce export --to ct2 --model DIR --out CT2DIR [--quantization int8]
transduce export --to hf  --model DIR --out HFDIR
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..modeldir import load_model_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--to", required=True, choices=("ct2", "hf"), help="ct2: CTranslate2 model; hf: HuggingFace MarianMT directory"
    )
    parser.add_argument("--model", required=True, type=Path, help="transduce model directory")
    parser.add_argument("--out", required=True, type=Path, help="output directory (replaced if it exists)")
    parser.add_argument(
        "--quantization",
        default=None,
        help="ct2 only: weight type, e.g. int8, int8_float32, int16, float16 (default float32)",
    )


def run(args: argparse.Namespace) -> int:
    if args.quantization is not None and args.to != "ct2":
        raise ValueError("--quantization applies to --to ct2 only")
    model, vocabs, meta = load_model_dir(args.model)
    if args.to == "ct2":
        from .ctranslate2 import export_ctranslate2

        out = export_ctranslate2(model, vocabs, args.out, quantization=args.quantization)
    else:
        from .marian import export_marian

        out = export_marian(model, vocabs, args.out, meta)
    print(f"wrote {out}")
    return 0
