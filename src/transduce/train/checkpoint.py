"""Checkpoints that never lose work and never execute code on load.

    RUN_DIR/checkpoints/step_00001200/
        model.safetensors      weights (tied tensors stored once)
        optimizer.safetensors  Adam moments per parameter, RNG states as uint8 tensors
        state.json             step, data position, optimizer hyper-parameters, python/numpy RNG, configs…
        NAME.safetensors       weights that a technique keeps beside the model, e.g. ema.safetensors: the
                               moving average of train.ema_decay (train/ema.py)

A checkpoint is written into a temporary sibling directory, every file fsync'ed, then renamed into place
(rename is atomic), so a run killed at any moment leaves only whole checkpoints. ``keep_last`` prunes the
oldest ``step_*`` directories; ``best/`` is kept apart.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from ..modeldir import _fsync_tree, load_weights, save_weights
from ..safefiles import read_json, read_safetensors

MODEL, OPTIM, STATE = "model.safetensors", "optimizer.safetensors", "state.json"


def fix_for(directory: Path) -> str:
    """What to do about a damaged checkpoint: resume from the one before."""
    return (
        f"this checkpoint is damaged; move {directory} aside and resume (--resume takes the newest "
        "complete checkpoint left), or start the run again"
    )


def read_state(directory: Path) -> dict[str, Any]:
    """A checkpoint's state.json, a damaged one named in one error line."""
    return read_json(Path(directory) / STATE, fix_for(Path(directory)))


def read_tensors(directory: Path, name: str) -> dict[str, torch.Tensor]:
    """One safetensors file of a checkpoint, a damaged one named in one error line."""
    return read_safetensors(Path(directory) / name, fix_for(Path(directory)))


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete ``step_*`` checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.glob("step_*") if (p / STATE).is_file()]
    return sorted(found, key=lambda p: int(p.name.split("_")[1]))


def rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Every RNG that training draws from: torch's as tensors, python's and numpy's as JSON."""
    tensors = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors["rng.cuda"] = torch.cuda.get_rng_state()
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return tensors, {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
    }


def set_rng_state(tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["rng.torch"])
    if "rng.cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["rng.cuda"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split ``optimizer.state_dict()`` into tensors (``state.{param}.{name}``) and JSON (the rest)."""
    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, slots in sd["state"].items():
        for name, value in slots.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{index}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{index}.{name}"] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def load_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith("state."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = value
    for key, value in meta["scalars"].items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def save_checkpoint(
    directory: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    extra: dict[str, torch.nn.Module] | None = None,
) -> Path:
    """Write one checkpoint atomically to ``directory`` (replacing it if present); ``extra``: more weights
    to keep, each as ``NAME.safetensors`` (e.g. ``{"ema": ...}``, the moving average of train/ema.py)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        save_weights(model, tmp / MODEL)
        for name, module in (extra or {}).items():
            save_weights(module, tmp / f"{name}.safetensors")
        tensors, optim_meta = optimizer_tensors(optimizer)
        rng_tensors, rng_meta = rng_state()
        save_file({**tensors, **rng_tensors}, str(tmp / OPTIM))
        (tmp / STATE).write_text(json.dumps({**state, "optimizer": optim_meta, "rng": rng_meta}) + "\n")
        _fsync_tree(tmp)
        old = directory.with_name(f".{directory.name}.old")
        if directory.exists():  # only `best/` is ever rewritten; step dirs are unique
            shutil.rmtree(old, ignore_errors=True)
            os.rename(directory, old)
        os.rename(tmp, directory)
        _fsync_dir(directory.parent)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def load_checkpoint(
    directory: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    restore_rng: bool = True,
    extra: dict[str, torch.nn.Module] | None = None,
) -> dict[str, Any]:
    """Load weights (and ``extra``'s, each from ``NAME.safetensors``), optimizer and RNG states from
    ``directory``; return the JSON state."""
    directory = Path(directory)
    extra = extra or {}
    for name in (MODEL, STATE, *(f"{n}.safetensors" for n in extra)):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory / name}: missing checkpoint file")
    fix = fix_for(directory)
    state = read_json(directory / STATE, fix)
    load_weights(model, directory / MODEL, fix=fix)
    for name, module in extra.items():
        load_weights(module, directory / f"{name}.safetensors", fix=fix)
    if optimizer is not None or restore_rng:
        tensors = read_safetensors(directory / OPTIM, fix)
        if optimizer is not None:
            load_optimizer(optimizer, tensors, state["optimizer"])
        if restore_rng:
            set_rng_state(tensors, state["rng"])
    return state


def prune(root: str | Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` step checkpoints (and stale temporary directories)."""
    root = Path(root)
    for old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    for tmp in root.glob(".step_*"):
        shutil.rmtree(tmp, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
