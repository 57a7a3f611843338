"""The accuracy record ``MODEL/backends.json``: what the ``auto`` backend policy reads.

A record says, for the weights it was measured on (their SHA-256), how an approximate backend (the
``candidate``) scored against ``fp32`` on held-out sentences with the same search settings, and the command
that made it. ``transduce check-backends`` (:mod:`transduce.check_backends`) and ``transduce recipe`` write
it; :mod:`transduce.backends.policy` reads it. A record holds only for the weights it measured.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..data.reading import file_sha256
from ..modeldir import WEIGHTS

RECORD = "backends.json"
CANDIDATE = "int8-native"  # the backend a record measures against fp32
REQUIRED = ("delta", "weights_sha256", "sentences", "data")  # the keys the policy reads


def weights_digest(model_dir: str | Path) -> str:
    """SHA-256 of the model directory's weights file: a record holds only for the weights it measured."""
    return file_sha256(Path(model_dir) / WEIGHTS)


def read_record(model_dir: str | Path) -> tuple[dict[str, Any] | None, str]:
    """The directory's record and "", or None and why there is none that holds (missing, malformed, or
    made for other weights)."""
    path = Path(model_dir) / RECORD
    hint = f"`transduce check-backends {model_dir} --data DATA` makes one"
    if not path.is_file():
        return None, f"no accuracy record {path} ({hint})"
    try:
        record = json.loads(path.read_text())
        float(record["delta"]), *(record[key] for key in REQUIRED[1:])
    except (ValueError, KeyError, TypeError) as e:
        return None, f"{path} is not a valid record ({type(e).__name__}: {e}; {hint})"
    if record["weights_sha256"] != weights_digest(model_dir):
        return None, f"{path} was measured on other weights ({hint})"
    return record, ""


def write_record(model_dir: str | Path, record: dict[str, Any]) -> Path:
    """Write ``record`` into ``model_dir`` atomically (a reader sees the old record or the new one); returns
    its path."""
    path = Path(model_dir) / RECORD
    tmp = path.with_name(f".{RECORD}.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)
    return path
