"""``transduce average RUN_DIR --last N --out MODEL_DIR``: the mean of the last N checkpoints' weights.

The paper averaged the last 5 checkpoints (written every 10 minutes) for the base model and the last 20
for the big one (§6.1). Each tensor is summed in float64 and divided by N, then cast back to its dtype.
The result is a model directory (weights, config, vocabulary) ready for translation.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from ..config import read_toml
from ..data.vocab import Vocabs
from ..model import ModelConfig, Transformer
from ..modeldir import save_model_dir
from .checkpoint import MODEL, list_checkpoints, read_state, read_tensors


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="a training run directory (with checkpoints/ and vocab/)")
    parser.add_argument(
        "--last", type=int, default=5, metavar="N", help="how many of the newest checkpoints (default 5)"
    )
    parser.add_argument("--out", type=Path, required=True, help="model directory to write")
    parser.add_argument(
        "--check-backends",
        type=int,
        default=500,
        metavar="N",
        help="measure int8-native against fp32 (accuracy, and speed here) on N sentences of the run's valid "
        "split and record it in the model directory, so that decoding picks the fast path (0: off; default 500)",
    )


def average_tensors(paths: list[Path], filename: str = MODEL) -> dict[str, torch.Tensor]:
    """Mean of each tensor over the ``filename`` files (weights) in ``paths``; tensor names must agree."""
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for path in paths:
        if not (path / filename).is_file():
            raise FileNotFoundError(f"{path / filename}: missing checkpoint file")
        tensors = read_tensors(path, filename)
        if total and set(tensors) != set(total):
            raise ValueError(f"{path / filename}: tensor names differ from {paths[0] / filename}")
        for name, t in tensors.items():
            dtypes.setdefault(name, t.dtype)
            total[name] = total[name] + t.double() if name in total else t.double()
    return {name: (t / len(paths)).to(dtypes[name]) for name, t in total.items()}


def run_languages(run_dir: Path) -> dict[str, str]:
    """src_lang / tgt_lang from the manifest of the run's data directory, if it can still be read."""
    try:
        data = read_toml(run_dir / "config.toml")["train"]["data"]
        manifest = json.loads((Path(data) / "manifest.json").read_text())
    except (OSError, KeyError, ValueError):  # ConfigError is a ValueError
        return {}
    return {key: manifest[key] for key in ("src_lang", "tgt_lang") if key in manifest}


def average(run_dir: Path, last: int, out: Path) -> Path:
    """Average the last ``last`` checkpoints of ``run_dir`` into the model directory ``out``."""
    if last < 1:
        raise ValueError(f"--last must be at least 1, got {last}")
    found = list_checkpoints(run_dir / "checkpoints")
    if not found:
        raise FileNotFoundError(f"{run_dir / 'checkpoints'}: no checkpoints (is {run_dir} a run directory?)")
    if len(found) < last:
        raise ValueError(f"{run_dir / 'checkpoints'}: only {len(found)} checkpoints, asked to average {last}")
    chosen = found[-last:]
    state = read_state(chosen[-1])
    model = Transformer(ModelConfig.from_dict(state["model_config"], where=f"{chosen[-1]}/state.json model_config"))
    weights = average_tensors(chosen, MODEL)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # a tied tensor is stored once under one of its names; its other names are loaded through it
    params = model.state_dict(keep_vars=True)
    stored = {params[name].data_ptr() for name in weights if name in params}
    if unexpected or any(params[name].data_ptr() not in stored for name in missing):
        raise ValueError(
            f"{chosen[-1] / MODEL}: weights do not match the model config (missing {missing}, unexpected {unexpected})"
        )
    meta = {**run_languages(run_dir), "averaged": [p.name for p in chosen], "steps": state["step"]}
    return save_model_dir(out, model, Vocabs.load(run_dir / "vocab"), meta)


def run(args: argparse.Namespace) -> int:
    out = average(args.run_dir, args.last, args.out)
    print(f"averaged the last {args.last} checkpoints of {args.run_dir} into {out}")
    later = f"exact fp32 until `transduce check-backends {out} --data DATA` records it"
    if args.check_backends < 0:
        raise ValueError(f"--check-backends must be non-negative, got {args.check_backends}")
    if args.check_backends == 0:
        print(f"decoding backends not measured (--check-backends 0): {later}")
        return 0
    from ..backends.measure import measure_valid, summary

    try:
        data = read_toml(args.run_dir / "config.toml")["train"]["data"]
        record = measure_valid(out, data, args.check_backends, command=f"transduce average {args.run_dir}")
    except (OSError, KeyError, RuntimeError, ValueError) as e:  # no data to measure on, or no C++ step here
        print(f"decoding backends not measured ({type(e).__name__}: {e}): {later}")
        return 0
    print(f"decoding backends: {summary(record)}")
    return 0
