"""The record ``MODEL/backends.json``: what the ``auto`` backend policy reads.

A record says, for the weights it was measured on (their SHA-256), how an approximate backend (the
``candidate``) scored against ``fp32`` on held-out sentences with the same search settings, how fast each
decoded on each machine that measured them (``speed``, keyed by :func:`machine`: words per second at one
thread), and the command that made it. :mod:`transduce.backends.measure` writes it (through ``transduce
check-backends``, ``train``, ``average`` and ``recipe``); :mod:`transduce.backends.policy` reads it. A record
holds only for the weights it measured, and a speed only on the machine that measured it.
"""

from __future__ import annotations

import functools
import json
import os
import platform
from pathlib import Path
from typing import Any

from ..cpp import chosen_isa
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


@functools.cache
def machine() -> str:
    """This machine's name in a record's speeds: the CPU's model name and the SIMD level the C++ step runs,
    e.g. ``AMD EPYC (avx2)``; the speed of a backend holds for that pair."""
    name = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Model", "CPU part")):
                name = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    return f"{name or platform.processor() or platform.machine()} ({chosen_isa()[0].name})"


def speed_here(record: dict[str, Any]) -> dict[str, float] | None:
    """The words per second of each measured backend on this machine, or None if it has not measured them."""
    entry = record.get("speed", {}).get(machine()) if isinstance(record.get("speed"), dict) else None
    try:
        return {name: float(v) for name, v in entry["words_per_s"].items()} if entry else None
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
