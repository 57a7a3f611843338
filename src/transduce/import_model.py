"""``transduce import SOURCE --out MODELDIR [--check-backends SRC REF]``: import a model, then measure it.

The conversion is :mod:`transduce.interop.import_marian`'s. A release carries no held-out text, so the
decoding backends of the written model are measured only when ``--check-backends`` names a source and a
reference file: accuracy of ``int8-native`` against fp32 and the speed of both on this machine, recorded
in ``MODELDIR/backends.json`` as ``transduce check-backends`` does, so that ``transduce.load`` decodes the
model with the fastest backend within tolerance from the start. A WMT test set, for one:
``sacrebleu -t wmt14 -l en-de --echo src > src.en`` and ``--echo ref > ref.de``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from .backends.measure import measure, summary
from .data.reading import read_lines
from .interop import import_marian


def add_arguments(parser: argparse.ArgumentParser) -> None:
    import_marian.add_arguments(parser)
    parser.add_argument(
        "--check-backends",
        nargs=2,
        type=Path,
        metavar=("SRC", "REF"),
        help="measure the decoding backends on these held-out files (source, reference) once the model is written",
    )
    parser.add_argument("--check-count", type=int, help="with --check-backends: the first N sentences only")


def run(args: argparse.Namespace) -> int:
    check = held_out(args)  # read before the import: a bad file costs no download
    status = import_marian.run(args)
    if status != 0:
        return status
    if check is None:
        print(
            "decoding backends: not measured (a release holds no held-out text); "
            f"`transduce check-backends {args.out} --src FILE --ref FILE` measures them"
        )
        return 0
    from .modeldir import read_model_config

    _, meta = read_model_config(args.out)
    lang = meta.get("tgt_lang")
    if not lang:
        raise ValueError(
            f"--check-backends: the target language of {args.out} is unknown; "
            f"measure with `transduce check-backends {args.out} --src FILE --ref FILE --lang CODE`"
        )
    sources, refs, name = check
    command = shlex.join(["transduce", *sys.argv[1:]]) if sys.argv[1:2] == ["import"] else ""
    print(summary(measure(args.out, sources, refs, lang, name, command=command)))
    return 0


def held_out(args: argparse.Namespace) -> tuple[list[str], list[str], str] | None:
    """(sources, references, their name) of ``--check-backends``, or None without it."""
    if args.check_backends is None:
        if args.check_count is not None:
            raise ValueError("--check-count needs --check-backends SRC REF")
        return None
    src, ref = args.check_backends
    sources, refs = read_lines(src).lines, read_lines(ref).lines
    if len(sources) != len(refs):
        raise ValueError(f"--check-backends: {src} has {len(sources)} lines but {ref} has {len(refs)}")
    name = str(src)
    if args.check_count is not None:
        if args.check_count < 1:
            raise ValueError(f"--check-count must be at least 1, got {args.check_count}")
        sources, refs = sources[: args.check_count], refs[: args.check_count]
        name += f" (first {len(sources)})"
    return sources, refs, name
