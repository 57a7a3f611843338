"""``transduce export``: a model directory -> CTranslate2, a HuggingFace MarianMT directory or an Argos package.

transduce export --to ct2   --model DIR --out CT2DIR [--quantization int8]
transduce export --to hf    --model DIR --out HFDIR
transduce export --to argos --model DIR --out NAME.argosmodel [--quantization int8] [--from-code en --to-code fr]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..modeldir import load_model_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--to",
        required=True,
        choices=("ct2", "hf", "argos"),
        help="ct2: CTranslate2 model; hf: HuggingFace MarianMT directory; argos: Argos Translate package (.argosmodel)",
    )
    parser.add_argument("--model", required=True, type=Path, help="transduce model directory")
    parser.add_argument(
        "--out", required=True, type=Path, help="output directory, or the .argosmodel file (replaced if it exists)"
    )
    parser.add_argument(
        "--quantization",
        default=None,
        help="ct2 and argos: weight type, e.g. int8, int8_float32, int16, float16 (default float32)",
    )
    parser.add_argument("--from-code", help="argos: source language code (default: the model directory's src_lang)")
    parser.add_argument("--to-code", help="argos: target language code (default: the model directory's tgt_lang)")
    parser.add_argument("--package-version", default="1.0", help="argos: metadata.json's package_version (1.0)")


def run(args: argparse.Namespace) -> int:
    if args.quantization is not None and args.to == "hf":
        raise ValueError("--quantization applies to --to ct2 and --to argos only")
    if args.to != "argos" and (args.from_code or args.to_code):
        raise ValueError("--from-code and --to-code apply to --to argos only")
    model, vocabs, meta = load_model_dir(args.model)
    if args.to == "argos":
        from .argos import export_argos

        out = export_argos(
            model,
            vocabs,
            args.out,
            meta,
            from_code=args.from_code,
            to_code=args.to_code,
            package_version=args.package_version,
            quantization=args.quantization,
        )
    elif args.to == "ct2":
        from .ctranslate2 import export_ctranslate2

        out = export_ctranslate2(model, vocabs, args.out, quantization=args.quantization)
    else:
        from .marian import export_marian

        out = export_marian(model, vocabs, args.out, meta)
    print(f"wrote {out}")
    return 0
