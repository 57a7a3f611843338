"""Reading weight and metadata files without executing code, with one clear error per bad file.

Every loader (model directories, training checkpoints, imports) reads through these functions, so a
truncated or corrupted ``model.safetensors``, a ``.npz`` holding Python objects, a pickle (``torch.save``
output) under a weights name, or broken JSON ends in a :class:`BadFileError` that names the file, says
what is wrong with it and how to get a good one, and which the CLI prints as one line.

Nothing here unpickles: safetensors is a JSON header plus raw bytes, ``numpy.load`` runs with
``allow_pickle=False``, and a file that starts like a pickle is refused before any parser sees it.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .config import ConfigError

PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")  # pickle protocols 2-5
ZIP_MAGIC = b"PK\x03\x04"  # torch.save's zip container, and .npz


class BadFileError(ConfigError):
    """A file a loader needs is missing, unreadable, corrupted, or of a kind that could execute code."""


def _sniff(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(8)
    except FileNotFoundError:
        raise BadFileError(f"{path}: missing") from None
    except OSError as e:
        raise BadFileError(f"{path}: cannot read it ({e.strerror or e})") from None


def _is_torch_zip(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as z:
            return any(name.endswith("data.pkl") for name in z.namelist())
    except (zipfile.BadZipFile, OSError):
        return False


def refuse_pickle(path: Path, head: bytes, fix: str) -> None:
    """Raise if ``head`` (a file's first bytes) is a pickle or a torch.save zip: loading it would run code."""
    if head[:2] in PICKLE_MAGIC or (head.startswith(ZIP_MAGIC) and _is_torch_zip(path)):
        raise BadFileError(
            f"{path}: is a Python pickle (torch.save output), which can run code when loaded; "
            f"transduce never loads pickles: {fix}"
        )


def read_safetensors(path: str | Path, fix: str, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file; ``fix`` says how to get a good file, for the error message."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    head = _sniff(path)
    refuse_pickle(path, head, fix)
    size = path.stat().st_size
    if size < 8:
        raise BadFileError(
            f"{path}: truncated ({size} bytes; a safetensors file starts with an 8-byte header length): {fix}"
        )
    header = int.from_bytes(head, "little")
    if header > size - 8:
        raise BadFileError(
            f"{path}: truncated or not a safetensors file (its header claims {header:,} bytes, "
            f"the file has {size:,}): {fix}"
        )
    try:
        with open(path, "rb") as f:
            f.seek(8)
            entries = json.loads(f.read(header))
        end = max((e["data_offsets"][1] for k, e in entries.items() if k != "__metadata__"), default=0)
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError, KeyError, TypeError, IndexError) as e:
        raise BadFileError(f"{path}: corrupted safetensors header ({e}): {fix}") from None
    if 8 + header + end > size:
        raise BadFileError(
            f"{path}: truncated (its header lists {end:,} bytes of tensors, the file holds "
            f"{size - 8 - header:,}): {fix}"
        )
    try:
        return load_file(str(path), device=str(device))
    except (SafetensorError, ValueError, RuntimeError, OSError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise BadFileError(f"{path}: corrupted safetensors file ({first}): {fix}") from None


def read_npz(path: str | Path, fix: str) -> dict[str, np.ndarray]:
    """All arrays of a ``.npz`` archive, refusing object (pickled) arrays."""
    path = Path(path)
    head = _sniff(path)
    if not head.startswith(ZIP_MAGIC):
        refuse_pickle(path, head, fix)
        raise BadFileError(f"{path}: not a .npz archive (no zip header): {fix}")
    refuse_pickle(path, head, fix)
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except ValueError as e:
        if "allow_pickle" in str(e):
            raise BadFileError(
                f"{path}: holds pickled Python objects, which can run code when loaded; transduce "
                f"reads numeric arrays only: {fix}"
            ) from None
        raise BadFileError(f"{path}: corrupted .npz archive ({e}): {fix}") from None
    except (zipfile.BadZipFile, EOFError, OSError, KeyError) as e:
        raise BadFileError(f"{path}: truncated or corrupted .npz archive ({e}): {fix}") from None


def read_json(path: str | Path, fix: str) -> Any:
    path = Path(path)
    _sniff(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadFileError(f"{path}: not valid JSON ({e}): {fix}") from None
