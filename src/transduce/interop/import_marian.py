"""``transduce import``: a HuggingFace MarianMT directory on disk -> a transduce model directory.

    transduce import HFDIR --out MODELDIR

Reads config.json, model.safetensors, source.spm/target.spm and vocab.json (never a pickle,
never the network). OPUS-MT models are the paper's base architecture.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..modeldir import save_model_dir
from .marian import import_marian


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("hf_dir", type=Path, help="MarianMT directory (config.json, model.safetensors, ...)")
    parser.add_argument("--out", required=True, type=Path, help="transduce model directory to write")


def run(args: argparse.Namespace) -> int:
    model, vocabs, meta = import_marian(args.hf_dir)
    save_model_dir(args.out, model, vocabs, meta)
    cfg = model.config
    print(f"wrote {args.out}: {cfg.encoder_layers}/{cfg.decoder_layers} layers, d_model={cfg.d_model}, "
          f"vocab {cfg.vocab_size}/{cfg.target_vocab_size}, tie_embeddings={cfg.tie_embeddings}")
    if meta["spm_pieces_without_id"]:
        print(f"note: {meta['spm_pieces_without_id']} SentencePiece pieces have no id in vocab.json "
              "(Marian maps them to <unk>; transduce segments such text into smaller pieces)")
    return 0
