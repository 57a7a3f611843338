"""``transduce translate``: files or stdin in, one translation per input line out.

    transduce translate --model DIR [FILE ...] [--beam 4 --alpha 0.6 ...] > out.txt
    transduce translate --model DIR                  # a prompt when stdin is a terminal

With ``--nbest N`` (N > 1) each input line gives N lines in the Moses n-best format
``LINE ||| translation ||| score`` (LINE counts from 0; an empty input line has one empty
hypothesis); ``--scores`` prefixes each 1-best line with its score and a tab. ``--mbr N`` outputs,
for each line, the one of the beam's N best that the others agree with most (minimum Bayes risk,
:mod:`~transduce.decode.mbr`); ``--rerank N --channel DIR`` the one of them that a target→source
model also scores well (noisy channel, :mod:`~transduce.decode.rerank`).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

from . import mbr as mbr_
from . import rerank as rerank_
from .options import add_backend_arguments, backend_from_args
from .search import SampleConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="*", help="input files, one sentence per line (default: stdin)")
    p.add_argument("--model", required=True, help="model directory")
    p.add_argument("--ensemble", nargs="+", default=[], metavar="DIR", help="more model directories to ensemble")
    p.add_argument("--output", "-o", help="write here instead of stdout")
    search = p.add_argument_group("search (defaults: the paper, §6.1)")
    search.add_argument("--beam", type=int, default=4, help="beam size; 1 = greedy")
    search.add_argument("--alpha", type=float, default=0.6, help="length penalty ((5+|Y|)/6)^alpha")
    search.add_argument("--max-len-a", type=float, default=1.0, help="max output length = a*source length + b")
    search.add_argument("--max-len-b", type=int, default=50)
    search.add_argument("--nbest", type=int, default=1, help="print the N best hypotheses (Moses n-best format)")
    search.add_argument("--scores", action="store_true", help="prefix each line with its score and a tab")
    mbr_.add_arguments(search)
    rerank_.add_arguments(search)
    sample = p.add_argument_group("sampling (instead of search)")
    sample.add_argument("--sample", action="store_true", help="sample tokens instead of searching")
    sample.add_argument("--temperature", type=float, default=1.0)
    sample.add_argument("--top-k", type=int, default=0, help="0 = no top-k filter")
    sample.add_argument("--top-p", type=float, default=1.0, help="1.0 = no nucleus filter")
    sample.add_argument("--seed", type=int, default=1, help="line i is sampled with seed + i")
    run_ = p.add_argument_group("running")
    run_.add_argument("--batch-tokens", type=int, default=4096, help="padded source tokens per batch")
    run_.add_argument("--batch-size", type=int, default=None, help="at most this many sentences per batch")
    run_.add_argument("--device", default="cpu")
    run_.add_argument("--threads", type=int, default=1,
                      help="CPU threads; 1 (default) is bit-exactly batch-invariant, more may change last bits")
    add_backend_arguments(run_)
    run_.add_argument("--no-truncate", action="store_true", help="error on inputs longer than the model allows")
    run_.add_argument("--stats", action="store_true", help="print sentences/s and tokens/s to stderr")


def read_lines(path: str | Path | None) -> list[str]:
    """Lines of a file (or stdin for None / '-') as strict UTF-8; an error names file and line."""
    name = "<stdin>" if path in (None, "-") else str(path)
    data = sys.stdin.buffer.read() if path in (None, "-") else Path(path).read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out = []
    for n, raw in enumerate(lines, 1):
        try:
            out.append(raw.decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError as e:
            raise ValueError(f"{name}:{n}: invalid UTF-8 at byte {e.start}") from None
    return out


def _options(args) -> dict:
    sample = SampleConfig(args.temperature, args.top_k, args.top_p, args.seed) if args.sample else None
    if args.nbest > args.beam and not args.sample:
        raise ValueError(f"--nbest {args.nbest} needs --beam of at least {args.nbest}")
    mbr = mbr_.from_args(args)
    if mbr is not None and (args.nbest > 1 or args.sample):
        raise ValueError("--mbr chooses one translation from the beam: it goes with neither --nbest nor --sample")
    rerank = rerank_.from_args(args)
    if rerank is not None and (args.nbest > 1 or args.sample or mbr is not None):
        raise ValueError("--rerank chooses one translation from the beam: it goes with neither --nbest, "
                         "--sample nor --mbr")
    return dict(beam=args.beam, alpha=args.alpha, max_len_a=args.max_len_a, max_len_b=args.max_len_b,
                nbest=args.nbest, sample=sample, batch_tokens=args.batch_tokens, batch_size=args.batch_size,
                truncate=not args.no_truncate, return_scores=True, mbr=mbr, rerank=rerank)


def format_results(results: list, nbest: int, scores: bool, first_line: int = 0) -> list[str]:
    if nbest > 1:
        return [f"{first_line + i} ||| {t.text} ||| {t.score:.4f}" for i, hyps in enumerate(results) for t in hyps]
    return [f"{t.score:.4f}\t{t.text}" if scores else t.text for t in results]


def run(args) -> int:
    from ..api import load

    options = _options(args)
    torch.set_num_threads(args.threads)
    translator = load(args.model, args.device, ensemble=args.ensemble, channel=args.channel,
                      backend=backend_from_args(args))
    print(f"transduce translate: {translator.fast_paths.line()}", file=sys.stderr)
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    try:
        if not args.files and sys.stdin.isatty():
            return _interactive(translator, options, args)
        sentences = tokens = 0
        seconds = 0.0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for path in args.files or [None]:
                lines = read_lines(path)
                start = time.perf_counter()
                results = translator.translate(lines, **options)
                seconds += time.perf_counter() - start
                sentences += len(lines)
                tokens += sum(len(h.tokens) + 1 for r in results for h in (r if args.nbest > 1 else [r])[:1])
                for line in format_results(results, args.nbest, args.scores):
                    out.write(line + "\n")
        for w in caught:
            print(f"transduce translate: warning: {w.message}", file=sys.stderr)
        if args.stats:
            print(f"transduce translate: {sentences} sentences, {tokens} output tokens (with eos) in "
                  f"{seconds:.2f} s: {sentences / seconds:.1f} sentences/s, {tokens / seconds:.1f} tokens/s "
                  f"({torch.get_num_threads()} threads, {translator.fast_paths.decoder.name}, beam {args.beam})",
                  file=sys.stderr)
    finally:
        if args.output:
            out.close()
    return 0


def _interactive(translator, options: dict, args) -> int:
    print("type a sentence and Enter; Ctrl-D ends", file=sys.stderr)
    n = 0
    while True:
        try:
            line = input("> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        for text in format_results(translator.translate([line], **options), args.nbest, args.scores, n):
            print(text, flush=True)
        n += 1
