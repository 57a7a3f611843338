"""A model directory: everything translation needs, and nothing that executes on load.

    MODEL_DIR/
      model.safetensors   weights (tied tensors stored once)
      config.toml         [model] = ModelConfig, [meta] = languages, provenance
      vocab/              SentencePiece models + vocab.json (see transduce.data.vocab)

Writes go to a temporary sibling directory that is renamed into place, so a
reader never sees a half-written model.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from .config import ConfigError, read_toml, to_toml_text
from .data.vocab import Vocabs
from .model import ModelConfig, Transformer
from .safefiles import BadFileError, read_safetensors

WEIGHTS = "model.safetensors"
CONFIG = "config.toml"
VOCAB = "vocab"
FIX = "the model directory is damaged; copy it again, or re-create it (`transduce average`, `transduce import`)"


def check_vocab_matches(config: ModelConfig, vocabs: Vocabs, where: str) -> None:
    """Raise if the vocabulary sizes differ from the config's."""
    if len(vocabs.src) != config.vocab_size or len(vocabs.tgt) != config.target_vocab_size:
        raise ConfigError(
            f"{where}: vocabulary sizes {len(vocabs.src)}/{len(vocabs.tgt)} (source/target) do not match "
            f"the model config's vocab_size={config.vocab_size}, tgt_vocab_size={config.target_vocab_size}"
        )
    if vocabs.shared != (config.tie_embeddings == "all") and config.tie_embeddings == "all":
        raise ConfigError(f"{where}: tie_embeddings='all' needs one shared vocabulary, found separate ones")


def tied_groups(model: torch.nn.Module) -> list[list[str]]:
    """State-dict names grouped by the tensor they name (tied weights share a group), in module order."""
    groups: dict[tuple, list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        where = id(tensor) if tensor.is_meta else tensor.data_ptr()  # a meta tensor has no address
        groups.setdefault((where, tuple(tensor.shape)), []).append(name)
    return list(groups.values())


def save_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Safetensors with each tied tensor stored once, under its first name: byte-identical for equal weights."""
    state = model.state_dict()
    save_file(
        {group[0]: state[group[0]].contiguous() for group in tied_groups(model)}, str(path), metadata={"format": "pt"}
    )


def load_weights(model: torch.nn.Module, path: str | Path, device: str | torch.device = "cpu", fix: str = FIX) -> None:
    """Load :func:`save_weights` output (or any file naming each tied group once) into ``model``.

    A model on the meta device (:meth:`Transformer.empty`) takes the file's tensors themselves, tied names
    sharing one parameter: nothing is initialised, allocated or copied twice.

    Raises :class:`ConfigError` naming the file if it is unreadable (``fix`` says what to do then), or a tensor
    is missing, unexpected or misshapen.
    """
    tensors = read_safetensors(path, fix, device)
    state = model.state_dict()
    found: dict[str, torch.Tensor] = {}
    groups = tied_groups(model)
    for group in groups:
        present = [name for name in group if name in tensors]
        if not present:
            raise ConfigError(f"{path}: missing tensor {group[0]!r}")
        found[group[0]] = tensors[present[0]]
    named = {name for group in groups for name in group}
    unexpected = sorted(set(tensors) - named)
    if unexpected:
        raise ConfigError(f"{path}: unexpected tensors {unexpected} (a different model config?)")
    for name, tensor in found.items():
        if tensor.shape != state[name].shape:
            raise ConfigError(
                f"{path}: tensor {name!r} has shape {tuple(tensor.shape)}, the config needs {tuple(state[name].shape)}"
            )
    if any(p.is_meta for p in model.parameters()):
        _assign(model, {name: found[group[0]] for group in groups for name in group})
    else:
        model.load_state_dict(found, strict=False)


def _assign(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Make each of ``model``'s parameters and buffers the tensor of its name, in the model's dtype (as
    ``load_state_dict`` copies a file's fp16 into fp32); names of one tensor share one ``nn.Parameter``, so ties
    stay ties."""
    modules = dict(model.named_modules(remove_duplicate=False))  # a shared module under each of its names
    made: dict[int, torch.nn.Parameter] = {}
    for name, tensor in tensors.items():
        owner, _, leaf = name.rpartition(".")
        module = modules[owner]
        if leaf in module._parameters:
            old = module._parameters[leaf]
            if id(tensor) not in made:
                made[id(tensor)] = torch.nn.Parameter(tensor.to(old.dtype), requires_grad=old.requires_grad)
            module._parameters[leaf] = made[id(tensor)]
        else:
            module._buffers[leaf] = tensor.to(module._buffers[leaf].dtype)


def save_model_dir(
    directory: str | Path,
    model: Transformer,
    vocabs: Vocabs,
    meta: dict[str, Any] | None = None,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write ``model`` (or ``state_dict`` loaded into a copy of it) atomically to ``directory``."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        if state_dict is not None:
            model = Transformer(model.config)
            model.load_state_dict(state_dict)
        save_weights(model, tmp / WEIGHTS)
        meta_table = {k: (json.dumps(v) if isinstance(v, (dict, list)) else v) for k, v in (meta or {}).items()}
        text = model.config.to_toml() + "\n" + to_toml_text({"meta": meta_table} if meta_table else {})
        (tmp / CONFIG).write_text(text)
        vocabs.save(tmp / VOCAB)
        _fsync_tree(tmp)
        if directory.exists():
            old = directory.with_name(f".{directory.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.rename(directory, old)
            os.rename(tmp, directory)
            shutil.rmtree(old)
        else:
            os.rename(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def read_model_config(directory: str | Path) -> tuple[ModelConfig, dict[str, Any]]:
    path = Path(directory) / CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not a model directory (missing {CONFIG})")
    data = read_toml(path)
    if "model" not in data:
        raise ConfigError(f"{path}: missing [model] table")
    return ModelConfig.from_dict(data["model"], where=f"{path} [model]"), data.get("meta", {})


def load_model_dir(
    directory: str | Path, device: str | torch.device = "cpu"
) -> tuple[Transformer, Vocabs, dict[str, Any]]:
    """Load a model directory; returns (model in eval mode, vocabularies, meta)."""
    directory = Path(directory)
    config, meta = read_model_config(directory)
    vocabs = load_vocabs(directory / VOCAB)
    check_vocab_matches(config, vocabs, str(directory / VOCAB))
    weights = directory / WEIGHTS
    if not weights.is_file():
        raise FileNotFoundError(f"{weights}: missing weights")
    model = Transformer.empty(config)  # every weight comes from the file: none is made first
    load_weights(model, weights)
    return model.to(device).eval(), vocabs, meta


def load_vocabs(directory: Path, fix: str = FIX) -> Vocabs:
    """:meth:`Vocabs.load`, with a damaged vocab.json or SentencePiece model named in one error line."""
    try:
        return Vocabs.load(directory)
    except json.JSONDecodeError as e:
        raise BadFileError(f"{directory / 'vocab.json'}: not valid JSON ({e}): {fix}") from None
    except RuntimeError as e:  # SentencePiece's parse error
        raise BadFileError(f"{directory}: a SentencePiece model there is corrupted ({e}): {fix}") from None


def _fsync_tree(directory: Path) -> None:
    for root, _dirs, files in os.walk(directory):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                os.fsync(f.fileno())
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
