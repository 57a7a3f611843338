"""``transduce score``: the model's log-probability of given translations, one line per pair.

    transduce score --model DIR --source src.en --target hyp.de [--normalize] > scores.txt

Each output line is ``log p(y | x)`` in nats: the teacher-forced sum over the target's subwords and
its eos, as fairseq's ``--score-reference`` and CTranslate2's ``score_batch`` compute it; with
``--normalize`` divided by that token count. In Python: :func:`score`.
"""

from __future__ import annotations

import argparse
import sys

import torch

from .decode.rerank import sequence_logprobs
from .decode.step import pytorch_model
from .model import Transformer


def score(
    translator, sources: list[str], targets: list[str], normalize: bool = False, batch_tokens: int = 4096
) -> list[float]:
    """``log p(target | source)`` (nats, eos included) per pair, or per token with ``normalize``.
    Inputs longer than the model's ``max_positions`` are an error naming the line (never truncated)."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} source lines but {len(targets)} target lines")
    model = pytorch_model(translator.model)  # teacher-forced: the PyTorch model a C++ step stands for
    if not isinstance(model, Transformer):
        raise ValueError("scoring needs a single PyTorch model, not an ensemble")
    limit = translator.config.max_positions - 1
    src = translator.vocabs.src.encode_batch(sources)
    tgt = translator.vocabs.tgt.encode_batch(targets)
    for n, (s, t) in enumerate(zip(src, tgt), 1):
        if len(s) > limit or len(t) > limit:
            side = "source" if len(s) > limit else "target"
            raise ValueError(f"line {n}: the {side} has more than max_positions - 1 = {limit} tokens")
    out = sequence_logprobs(model, list(zip(src, tgt)), batch_tokens, translator.device)
    return [lp / (len(t) + 1) for lp, t in zip(out, tgt)] if normalize else out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model directory")
    p.add_argument("--source", required=True, help="source sentences, one per line")
    p.add_argument("--target", required=True, help="their translations, one per line")
    p.add_argument("--normalize", action="store_true", help="divide by the target's token count (with eos)")
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)


def run(args) -> int:
    from .api import load
    from .data.reading import read_lines

    torch.set_num_threads(args.threads)
    lines = [read_lines(args.source).lines, read_lines(args.target).lines]
    if len(lines[0]) != len(lines[1]):
        raise ValueError(f"{args.source} has {len(lines[0])} lines but {args.target} has {len(lines[1])}")
    translator = load(args.model, args.device, backend="fp32")  # teacher-forced in PyTorch: fp32, not int8
    for value in score(translator, lines[0], lines[1], args.normalize, args.batch_tokens):
        sys.stdout.write(f"{value:.4f}\n")
    return 0
