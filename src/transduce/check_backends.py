"""``transduce check-backends MODEL``: measure the approximate decoding backend against fp32 on held-out
data, accuracy and speed on this machine, and record the result in the model directory
(``MODEL/backends.json``).

    transduce check-backends runs/multi30k-en-de/model --data runs/multi30k-en-de/data          # its valid split
    transduce check-backends MODEL --src valid.en --ref valid.de                                  # any files
    transduce check-backends MODEL --src some.en --speed-only       # another machine: time it, keep the accuracy

The record says, for the weights it was measured on (their SHA-256), the BLEU of ``fp32`` and of
``int8-native`` with the same beam and length penalty on the same sentences, their words per second and
``fp32-native``'s at one thread on each machine that measured them, and the command that made it.
``transduce.load(MODEL)`` (so ``translate``, ``evaluate``, ``serve``) decodes with ``int8-native`` by default
only where the record shows it within 0.3 BLEU of fp32 and faster than fp32-native on this machine (:mod:`transduce.backends.policy`; the
measurement: :mod:`transduce.backends.measure`). ``transduce train``, ``average`` and ``recipe`` measure the
model they write.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from .backends.measure import measure, measure_speed, summary
from .backends.record import RECORD
from .decode.search_options import SearchOptions, add_search_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=Path, help="model directory (the record is written into it)")
    p.add_argument("--data", type=Path, help="a prepared data directory: score its --split")
    p.add_argument("--split", default="valid", help="with --data (default: valid; keep test for the final figure)")
    p.add_argument("--src", type=Path, help="source file (instead of --data)")
    p.add_argument("--ref", type=Path, help="reference file (with --src)")
    p.add_argument("--lang", help="target language (default: the model's tgt_lang)")
    add_search_arguments(p, modes=(), lengths=False)
    p.add_argument("--count", type=int, help="measure on the first N sentences only")
    p.add_argument(
        "--speed-only",
        action="store_true",
        help="time the backends on this machine and keep the recorded accuracy (needs no --ref)",
    )
    p.add_argument(
        "--metric",
        choices=("bleu", "tok_lc_bleu"),
        default="bleu",
        help="the score compared: sacreBLEU, or tokenised lowercased BLEU for lowercased data",
    )


def run(args) -> int:
    from .modeldir import read_model_config

    _, meta = read_model_config(args.model)
    search = SearchOptions.from_args(args)
    if (args.data is None) == (args.src is None):
        raise ValueError("give either --data DIR or --src FILE --ref FILE")
    if args.data is not None:
        from .data import PreparedData

        data = PreparedData.open(args.data)
        ids = data.split(args.split)
        sources = [ids.src_text(i) for i in range(len(ids))]
        refs = [ids.tgt_text(i) for i in range(len(ids))]
        name, lang = f"{args.data} {args.split}", args.lang or data.manifest["tgt_lang"]
    else:
        from .data.reading import read_lines

        if args.ref is None and not args.speed_only:
            raise ValueError("--src needs --ref (or --speed-only)")
        sources, name = read_lines(args.src).lines, str(args.src)
        refs = read_lines(args.ref).lines if args.ref is not None else []
        lang = args.lang or meta.get("tgt_lang")
        if not lang and not args.speed_only:
            raise ValueError("the target language is unknown: give --lang")
    if args.count is not None:
        if args.count < 1:
            raise ValueError(f"--count must be at least 1, got {args.count}")
        sources, refs = sources[: args.count], refs[: args.count]
        name += f" (first {len(sources)})"
    if args.speed_only:
        record = measure_speed(args.model, sources, search)
        print(summary(record))
        print(f"wrote {Path(args.model) / RECORD}")
        return 0
    command = shlex.join(["transduce", *sys.argv[1:]]) if sys.argv[1:2] == ["check-backends"] else ""
    record = measure(args.model, sources, refs, lang, name, search, command=command, metric=args.metric)
    print(summary(record))
    print(f"wrote {Path(args.model) / RECORD}")
    return 0
