"""Measuring the backends of a model directory on this machine: accuracy against fp32, and speed.

:func:`measure` decodes held-out sentences with ``fp32`` and the candidate (``int8-native``) at one thread
(the batch-invariant setting), scores both against the references, times both and ``fp32-native`` (what
``auto`` runs when it does not pick the candidate: the candidate must beat it), and writes the result
into the directory's ``backends.json`` (:mod:`~transduce.backends.record`): the accuracy once, the speed
under this machine's name, beside the speeds other machines measured. :func:`measure_speed` times the three
alone, for a model whose accuracy is recorded, on a machine that has not measured it yet.

``transduce check-backends`` runs them; ``transduce train`` (at its end, on its validation set),
``transduce average`` and ``transduce recipe`` run :func:`measure` on the model they write, so that
``transduce.load`` picks the fast path on the machine that made the model without another command.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from ..decode.search_options import PAPER, SearchOptions
from ..decode.translator import Translator
from ..fastpaths import Choice, FastPaths
from ..modeldir import load_model_dir
from .policy import FASTEST, TOLERANCE, baseline, decoder_for
from .record import CANDIDATE, machine, read_record, speed_here, weights_digest, write_record

MEASURED = ("fp32", CANDIDATE)  # the backends a record scores
TIMED = ("fp32", "fp32-native", CANDIDATE)  # the backends a record times: the candidate against auto's fp32


def _translator(model_dir: Path, backend: str):
    """``model_dir`` loaded to decode with ``backend`` on the CPU (as ``transduce.load`` does)."""
    model, vocabs, meta = load_model_dir(model_dir, torch.device("cpu"))
    decoder, ran = decoder_for(model.eval(), Choice(backend, "measured"), torch.device("cpu"))
    if ran.name != backend:
        raise RuntimeError(f"{backend} cannot run here: {ran.why}")
    return Translator(decoder, vocabs, torch.device("cpu"), meta, fast_paths=FastPaths(decoder=ran))


def _decode(model_dir: Path, sources: list[str], search: SearchOptions, batch_tokens: int) -> dict[str, Any]:
    """Each timed backend's output and speed on ``sources`` with ``search`` at one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = {}
        for backend in TIMED:
            translator = _translator(model_dir, backend)
            translator.translate(sources[:1], search)  # warm-up: lazy set-up is not decoding
            start = time.perf_counter()
            hyps = translator.translate(sources, search, batch_tokens=batch_tokens)
            seconds = time.perf_counter() - start
            words = sum(len(h.split()) for h in hyps)
            out[backend] = {"hyps": hyps, "seconds": seconds, "words_per_s": round(words / max(seconds, 1e-9), 1)}
        return out
    finally:
        torch.set_num_threads(threads)


def _speed_entry(decoded: dict[str, Any], sentences: int, beam: int) -> dict[str, Any]:
    return {
        "words_per_s": {b: decoded[b]["words_per_s"] for b in TIMED},
        "threads": 1,
        "sentences": sentences,
        "beam": beam,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def measure(
    model_dir: str | Path,
    sources: list[str],
    refs: list[str],
    lang: str,
    data: str,
    search: SearchOptions = PAPER,
    batch_tokens: int = 4096,
    command: str = "",
    metric: str = "bleu",
) -> dict[str, Any]:
    """Decode ``sources`` with fp32 and the candidate, score both against ``refs`` (target language ``lang``),
    time both (decoding with ``search``, default the paper's), and write the record into ``model_dir``; returns it. ``data`` names the sentences in the
    record; ``metric`` is "bleu" (sacreBLEU) or "tok_lc_bleu" (for lowercased data). Speeds other machines
    recorded for the same weights are kept."""
    from ..metrics import score_translations

    if len(sources) != len(refs):
        raise ValueError(f"{len(sources)} source lines but {len(refs)} references")
    if not sources:
        raise ValueError("no sentences to measure the backends on")
    model_dir = Path(model_dir)
    decoded = _decode(model_dir, sources, search, batch_tokens)
    scores, result = {}, {}
    for backend in MEASURED:
        result = score_translations(decoded[backend]["hyps"], refs, lang)
        scores[backend] = {
            "bleu": result["bleu"],
            "tok_lc_bleu": result["tok_lc_bleu"],
            "decode_s": round(decoded[backend]["seconds"], 1),
        }
    old, _ = read_record(model_dir)
    speed = dict(old.get("speed", {})) if old else {}
    speed[machine()] = _speed_entry(decoded, len(sources), search.beam)
    record = {
        "candidate": CANDIDATE,
        "metric": metric,
        "delta": round(scores[CANDIDATE][metric] - scores["fp32"][metric], 2),
        "scores": scores,
        "data": data,
        "sentences": len(sources),
        "beam": search.beam,
        "alpha": search.alpha,
        "threads": 1,
        "bleu_signature": result["bleu_signature"],
        "weights_sha256": weights_digest(model_dir),
        "speed": speed,
        "command": command,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_record(model_dir, record)
    return record


def measure_speed(
    model_dir: str | Path, sources: list[str], search: SearchOptions = PAPER, batch_tokens: int = 4096
) -> dict[str, Any]:
    """Time fp32, fp32-native and the candidate on ``sources`` on this machine and add the speeds to the directory's
    record, whose accuracy must already be measured (an error otherwise); returns the record."""
    model_dir = Path(model_dir)
    record, why = read_record(model_dir)
    if record is None:
        raise ValueError(f"speed alone needs a record of accuracy first: {why}")
    if not sources:
        raise ValueError("no sentences to time the backends on")
    decoded = _decode(model_dir, sources, search, batch_tokens)
    record["speed"] = {**record.get("speed", {}), machine(): _speed_entry(decoded, len(sources), search.beam)}
    write_record(model_dir, record)
    return record


def measure_valid(
    model_dir: str | Path, data_dir: str | Path, count: int, command: str = "", split_name: str = "valid"
) -> dict[str, Any]:
    """:func:`measure` on the first ``count`` sentences of the prepared data directory's validation split
    (lowercased data scored with tokenised lowercased BLEU, as the papers do); an error names a directory
    without one."""
    from ..data import PreparedData

    data = PreparedData.open(data_dir)
    split = data.split(split_name)
    n = min(count, len(split))
    sources = [split.src_text(i) for i in range(n)]
    refs = [split.tgt_text(i) for i in range(n)]
    manifest = data.manifest
    metric = "tok_lc_bleu" if manifest.get("lowercase") else "bleu"
    lang = manifest.get("tgt_lang") or "en"
    return measure(
        model_dir, sources, refs, lang, f"{data_dir} {split_name} (first {n})", metric=metric, command=command
    )


def summary(record: dict[str, Any]) -> str:
    """One line: both scores, the difference, both speeds here, and whether ``auto`` will use the candidate."""
    m, s = record["metric"], record["scores"]
    speed = speed_here(record) or {}
    base = baseline(speed)
    fast, exact = speed.get(FASTEST), speed.get(base)
    if record["delta"] < -TOLERANCE:
        verdict = f"more than {TOLERANCE} below: auto stays on fp32 arithmetic"
    elif fast is None or exact is None:
        verdict = "speed not measured on this machine: auto stays on fp32 arithmetic"
    elif fast <= exact:
        verdict = f"not faster than {base} here: auto stays on fp32 arithmetic"
    else:
        verdict = "auto uses it"
    rate = lambda v: f"{v:,.0f}" if v >= 10 else f"{v:.2g}"  # noqa: E731 - an untrained model's few words/s
    timing = f"; {base} {rate(exact)} against {rate(fast)} words/s on {machine()}, 1 thread" if fast and exact else ""
    return (
        f"{m} fp32 {s['fp32'][m]:.2f}, {record['candidate']} {s[record['candidate']][m]:.2f} "
        f"({record['delta']:+.2f}{timing}; {verdict}) on {record['sentences']} sentences of {record['data']}"
    )
