"""``transduce check-backends MODEL``: score the approximate decoding backend against fp32 on held-out data
and record the result in the model directory (``MODEL/backends.json``).

    transduce check-backends runs/multi30k-en-de/model --data runs/multi30k-en-de/data          # its valid split
    transduce check-backends MODEL --src valid.en --ref valid.de                                  # any files

The record says, for the weights it was measured on (their SHA-256), the BLEU of ``fp32`` and of
``int8-native`` with the same beam and length penalty on the same sentences, and the command that made it.
``transduce.load(MODEL)`` (so ``translate``, ``evaluate``, ``serve``) decodes with ``int8-native`` by default
only where the record shows it within 0.3 BLEU of fp32 (:mod:`transduce.backends.policy`; the record itself:
:mod:`transduce.backends.record`). ``transduce recipe`` runs this check on the model it keeps.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from .backends.policy import TOLERANCE
from .backends.record import CANDIDATE, RECORD, weights_digest, write_record


def check(
    model_dir: str | Path,
    sources: list[str],
    refs: list[str],
    lang: str,
    data: str,
    beam: int = 4,
    alpha: float = 0.6,
    batch_tokens: int = 4096,
    command: str = "",
    metric: str = "bleu",
) -> dict[str, Any]:
    """Decode ``sources`` with ``fp32`` and ``int8-native`` (1 thread: the batch-invariant setting), score
    both against ``refs``, and write the record into ``model_dir``; returns it. ``data`` names the sentences
    in the record; ``metric`` is "bleu" (sacreBLEU) or "tok_lc_bleu" (for lowercased data)."""
    import torch

    from .api import load
    from .evaluate import score_translations

    if len(sources) != len(refs):
        raise ValueError(f"{len(sources)} source lines but {len(refs)} references")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        scores: dict[str, dict[str, Any]] = {}
        for backend in ("fp32", CANDIDATE):
            translator = load(model_dir, backend=backend)
            if translator.fast_paths.decoder.name != backend:
                raise RuntimeError(f"{backend} cannot run here: {translator.fast_paths.decoder.why}")
            start = time.perf_counter()
            hyps = translator.translate(sources, beam=beam, alpha=alpha, batch_tokens=batch_tokens)
            seconds = time.perf_counter() - start
            result = score_translations(hyps, refs, lang)
            scores[backend] = {
                "bleu": result["bleu"],
                "tok_lc_bleu": result["tok_lc_bleu"],
                "decode_s": round(seconds, 1),
            }
    finally:
        torch.set_num_threads(threads)
    record = {
        "candidate": CANDIDATE,
        "metric": metric,
        "delta": round(scores[CANDIDATE][metric] - scores["fp32"][metric], 2),
        "scores": scores,
        "data": data,
        "sentences": len(sources),
        "beam": beam,
        "alpha": alpha,
        "threads": 1,
        "bleu_signature": result["bleu_signature"],
        "weights_sha256": weights_digest(model_dir),
        "command": command,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_record(model_dir, record)
    return record


def summary(record: dict[str, Any]) -> str:
    """One line: both scores, the difference, and whether ``auto`` will use the candidate."""
    m, s = record["metric"], record["scores"]
    verdict = "auto uses it" if record["delta"] >= -TOLERANCE else f"more than {TOLERANCE} below: auto stays on fp32"
    return (
        f"{m} fp32 {s['fp32'][m]:.2f}, {record['candidate']} {s[record['candidate']][m]:.2f} "
        f"({record['delta']:+.2f}; {verdict}) on {record['sentences']} sentences of {record['data']}"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=Path, help="model directory (the record is written into it)")
    p.add_argument("--data", type=Path, help="a prepared data directory: score its --split")
    p.add_argument("--split", default="valid", help="with --data (default: valid; keep test for the final figure)")
    p.add_argument("--src", type=Path, help="source file (instead of --data)")
    p.add_argument("--ref", type=Path, help="reference file (with --src)")
    p.add_argument("--lang", help="target language (default: the model's tgt_lang)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--alpha", type=float, default=0.6)
    p.add_argument(
        "--metric",
        choices=("bleu", "tok_lc_bleu"),
        default="bleu",
        help="the score compared: sacreBLEU, or tokenised lowercased BLEU for lowercased data",
    )


def run(args) -> int:
    from .modeldir import read_model_config

    _, meta = read_model_config(args.model)
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
        from .text.streaming import read_lines

        if args.ref is None:
            raise ValueError("--src needs --ref")
        sources, refs, name = read_lines(args.src), read_lines(args.ref), str(args.src)
        lang = args.lang or meta.get("tgt_lang")
        if not lang:
            raise ValueError("the target language is unknown: give --lang")
    command = shlex.join(["transduce", *sys.argv[1:]]) if sys.argv[1:2] == ["check-backends"] else ""
    record = check(args.model, sources, refs, lang, name, args.beam, args.alpha, command=command, metric=args.metric)
    print(summary(record))
    print(f"wrote {Path(args.model) / RECORD}")
    return 0
