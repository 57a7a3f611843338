"""One (row, seed) of a study, in its own process: ``python -m transduce.study.row RUN_DIR/spec.json``.

Trains with ``transduce train RUN_DIR/train.toml --resume`` (from the run's newest checkpoint when there is
one, so a killed row goes on where it stopped), then scores the trained model on the data's validation split
the same way for every row: exact fp32 decoding, the paper's beam search (§6.1: beam 4, α 0.6, maximum
length input + 50), no checkpoint averaging (as Table 3), and the per-piece perplexity of the references.
The result is written last, atomically, to the ``result`` path of the spec: its presence means "done".
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ..decode.search_options import SearchOptions


def run_row(spec: dict[str, Any]) -> dict[str, Any]:
    """Train and score the row that ``spec`` (written by :mod:`transduce.study.sweep`) describes."""
    from ..cli import main as cli
    from ..train.checkpoint import list_checkpoints

    run_dir = Path(spec["run_dir"])
    torch.set_num_threads(spec["threads"])
    found = list_checkpoints(run_dir / "run" / "checkpoints")
    resumed_from = int(found[-1].name.split("_")[1]) if found else 0  # the trainer goes on from the newest
    start = time.perf_counter()
    status = cli(["train", spec["train_toml"], "--resume"])
    if status != 0:
        raise RuntimeError(f"transduce train {spec['train_toml']} failed with status {status} (its message is above)")
    train_wall = time.perf_counter() - start
    end = _end_record(run_dir / "run" / "metrics.jsonl")
    if end.get("step") != spec["steps"]:
        raise RuntimeError(f"{run_dir}: training stopped at step {end.get('step')}, not {spec['steps']}: {end}")
    start = time.perf_counter()
    scores = score(run_dir / "run" / "model", spec)
    return {
        "row": spec["row"],
        "group": spec["group"],
        "seed": spec["seed"],
        "key": spec["key"],
        "shape": spec["shape"],
        "steps": end["step"],
        "weights": end.get("weights"),
        "curve": _curve(run_dir / "run" / "metrics.jsonl"),
        **scores,
        "train_wall_s": round(train_wall, 1),
        "resumed_from_step": resumed_from,
        "eval_wall_s": round(time.perf_counter() - start, 1),
        "threads": spec["threads"],
        "dtype": _run_dtype(run_dir / "run" / "config.toml"),
        "device": spec["device"],
    }


def score(model_dir: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """Dev perplexity and BLEU of the model in ``model_dir`` on the spec's data and split."""
    from ..api import load
    from ..data import PreparedData
    from ..decode.step import pytorch_model
    from ..metrics import score_translations
    from .significance import bleu_statistics

    data = PreparedData.open(spec["data"])
    ids = data.split(spec["valid_split"])
    sources = [ids.src_text(i) for i in range(len(ids))]
    refs = [ids.tgt_text(i) for i in range(len(ids))]
    device = "cuda" if spec["device"] == "cuda" else "cpu"
    # fp32 arithmetic: on a CPU the C++ loop step (the Python step's results within rounding; 2.2x its speed at
    # batch 64 on the demo's model, docs/performance.md)
    translator = load(model_dir, device=device, backend="fp32" if device == "cuda" else "fp32-native")
    search = SearchOptions(**{k: spec[k] for k in ("beam", "alpha", "max_len_a", "max_len_b")})
    hyps = translator.translate(sources, search)
    (model_dir.parent / "hypotheses.txt").write_text("".join(h + "\n" for h in hyps))
    lang = data.manifest["tgt_lang"]
    result = score_translations(hyps, refs, lang)
    per_sentence = translator.sentence_nll(sources, refs)  # one teacher-forced pass: the paired tests and the ppl
    nll, tokens = sum(x for x, _ in per_sentence), sum(n for _, n in per_sentence)
    return {
        "params": pytorch_model(translator.model).num_parameters(),
        "dev_ppl": round(math.exp(nll / max(tokens, 1)), 3),
        "dev_bleu": result["bleu"],
        "dev_tok_lc_bleu": result["tok_lc_bleu"],
        "dev_chrf": result["chrf"],
        "bleu_signature": result.get("bleu_signature"),
        "sentences": len(sources),
        # per dev sentence, for the report's paired tests (significance.py): BLEU's and perplexity's statistics
        "bleu_stats": bleu_statistics(hyps, refs, lang),
        "nll_stats": [[round(nll, 4), n] for nll, n in per_sentence],
    }


def _end_record(path: Path) -> dict[str, Any]:
    """The last "end" record of a run's metrics.jsonl (empty when there is none)."""
    end: dict[str, Any] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("kind") == "end":
                end = record
    return end


def _curve(path: Path) -> list[dict[str, Any]]:
    """The learning curve: dev perplexity at each validation of the run, ``[{"step", "dev_ppl"}]``."""
    curve = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") == "valid":
            curve[record["step"]] = round(record["valid_ppl"], 3)  # a resumed run may repeat a step: keep the last
    return [{"step": step, "dev_ppl": ppl} for step, ppl in sorted(curve.items())]


def _run_dtype(path: Path) -> str:
    from ..config import read_toml

    return read_toml(path)["train"]["dtype"] if path.is_file() else "?"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m transduce.study.row RUN_DIR/spec.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    try:
        result = run_row(spec)
    except RuntimeError as e:  # stopped or failed: the sweep reports it; a re-run resumes from the checkpoint
        print(f"{spec['row']} seed {spec['seed']}: {e}", file=sys.stderr)
        return 1
    out = Path(spec["result"])
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".json.partial")
    partial.write_text("{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in result.items()) + "\n}\n")
    partial.replace(out)
    print(f"{spec['row']} seed {spec['seed']}: dev ppl {result['dev_ppl']}, dev BLEU {result['dev_bleu']} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
