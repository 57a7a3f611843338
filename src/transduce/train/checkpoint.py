"""Checkpoints that never lose work and never execute code on load.

    RUN_DIR/checkpoints/step_00001200/
        model.safetensors      weights (tied tensors stored once)
        optimizer.safetensors  Adam moments per parameter, RNG states as uint8 tensors
        state.json             step, data position, optimizer hyper-parameters, python/numpy RNG, configs…
        rng.rank{R}.json       with several ranks: rank R's RNG states (R ≥ 1; rank 0's are in the two above),
                               gathered to rank 0 so that each rank resumes its own dropout stream
        NAME.safetensors       weights that a technique keeps beside the model, e.g. ema.safetensors: the
                               moving average of train.ema_decay (train/ema.py)

A checkpoint is written into a temporary sibling directory, every file fsync'ed, then renamed into place
(rename is atomic), so a run killed at any moment leaves only whole checkpoints. ``keep_last`` prunes the
oldest ``step_*`` directories; ``best/`` is kept apart.
"""

from __future__ import annotations

import base64
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
from ..safefiles import BadFileError, read_json, read_safetensors
from .distributed import Dist, all_gather_bytes, all_sum, broadcast_from_main

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


def resume_point(root: str | Path, ctx: Dist, device: torch.device) -> Path | None:
    """The newest complete checkpoint under ``root`` as rank 0 sees it, which every rank must see too.

    Every rank loads weights, optimizer and RNG states itself: a rank that saw no checkpoint (a node whose
    run directory is not the shared one) would start again from step 0 beside the others and train apart
    silently, so all ranks stop with one error instead. A collective: every rank calls it. Rank 0 first puts
    back a ``best/`` that a kill left aside (:func:`put_back`)."""
    if ctx.is_main:
        put_back(Path(root))
    found = list_checkpoints(root)
    if not ctx.enabled:
        return found[-1] if found else None
    mine = int(found[-1].name.split("_")[1]) if found else -1
    step = int(broadcast_from_main(torch.tensor([float(mine)], dtype=torch.float64, device=device), ctx).item())
    chosen = step_dir(Path(root), step) if step >= 0 else None
    unseen = chosen is not None and not (chosen / STATE).is_file()
    blind = int(all_sum(torch.tensor([float(unseen)], dtype=torch.float64, device=device), ctx).item())
    if blind:
        raise FileNotFoundError(
            f"{chosen}: rank 0 resumes from this checkpoint, but {blind} of {ctx.world_size} ranks "
            f"(rank {ctx.rank} {'among them' if unseen else 'not among them'}) cannot see it; every machine "
            "must see the run directory at the same path (a shared file system)"
        )
    return chosen


def put_back(root: Path) -> None:
    """Put back a checkpoint that a run killed while replacing it left aside as ``.NAME.old`` (only
    ``best/`` is ever replaced: :func:`save_checkpoint` moves the old one aside, then the new one in)."""
    for old in root.glob(".*.old"):
        target = old.with_name(old.name[1 : -len(".old")])
        if not target.exists():
            os.rename(old, target)


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


def rank_rng_name(rank: int) -> str:
    """The file of a checkpoint that holds rank ``rank``'s RNG states (ranks ≥ 1)."""
    return f"rng.rank{rank}.json"


def rng_record() -> dict[str, Any]:
    """This process's RNG states as one JSON object (torch's and CUDA's generator bytes in base64)."""
    tensors, record = rng_state()
    for key, value in tensors.items():
        record[key.removeprefix("rng.")] = base64.b64encode(value.numpy().tobytes()).decode("ascii")
    return record


def gather_rng(ctx: Dist, device: torch.device) -> list[dict[str, Any]]:
    """Every rank's :func:`rng_record`, indexed by rank (a collective: every rank calls it)."""
    blobs = all_gather_bytes(json.dumps(rng_record()).encode(), ctx, device)
    return [json.loads(blob) for blob in blobs]


def restore_rank_rng(directory: str | Path, rank: int) -> bool:
    """Set this process's RNG states to rank ``rank``'s in checkpoint ``directory``; False if the checkpoint
    holds none for that rank (one written by a single process, or without per-rank states)."""
    path = Path(directory) / rank_rng_name(rank)
    if not path.is_file():
        return False
    record = read_json(path, fix_for(Path(directory)))
    try:
        tensors = {
            f"rng.{k}": torch.frombuffer(bytearray(base64.b64decode(record[k], validate=True)), dtype=torch.uint8)
            for k in ("torch", "cuda")
            if k in record
        }
        set_rng_state(tensors, record)
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise BadFileError(f"{path}: not a valid RNG state ({e!r}): {fix_for(Path(directory))}") from None
    return True


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
    ranks_rng: list[dict[str, Any]] | None = None,
) -> Path:
    """Write one checkpoint atomically to ``directory`` (replacing it if present); ``extra``: more weights
    to keep, each as ``NAME.safetensors`` (e.g. ``{"ema": ...}``, the moving average of train/ema.py);
    ``ranks_rng``: every rank's :func:`rng_record` (:func:`gather_rng`), of which ranks ≥ 1 are written."""
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
        for rank, record in enumerate(ranks_rng or []):
            if rank > 0:
                (tmp / rank_rng_name(rank)).write_text(json.dumps(record) + "\n")
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
    for old in list_checkpoints(root)[:-keep_last]:  # hidden first: a half-deleted one never looks complete
        aside = old.with_name(f".{old.name}.pruned")
        os.rename(old, aside)
        shutil.rmtree(aside, ignore_errors=True)
    for tmp in root.glob(".step_*"):
        shutil.rmtree(tmp, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
