"""Read a CTranslate2 model directory (``model.bin``, ``config.json``, vocabularies) without CTranslate2.

``model.bin`` is a little-endian binary file written by CTranslate2's ``ModelSpec._serialize``:

    uint32  binary version (5 or 6 read here; CTranslate2 4.x writes 6, the version tested)
    string  spec name, e.g. "TransformerSpec"            string = uint16 length (NUL included), bytes, NUL
    uint32  spec revision
    uint32  number of variables, then for each:
        string   name, e.g. "encoder/layer_0/self_attention/linear_0/weight"
        uint8    rank, then rank × uint32 dimensions
        uint8    dtype: 0 float32, 1 int8, 2 int16, 3 int32, 4 float16, 5 bfloat16
        uint32   number of bytes, then the raw values (C order)
    uint32  number of aliases, then for each: string alias, string name of the variable it repeats

Quantised weights (int8, int16) come with a ``<name>_scale`` variable: ``float = int / scale``, per row for
int8 (one scale per output row) and one number for int16. :func:`dequantize` returns float32 for every
weight. Parsing is ``struct`` and ``numpy.frombuffer`` only: nothing in the file is executed.

Vocabularies: ``shared_vocabulary.json`` (a JSON list of tokens in id order) or ``source_vocabulary.json``
and ``target_vocabulary.json``; older conversions wrote ``.txt`` files with one token a line.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..config import ConfigError, parse_json

READ_VERSIONS = (5, 6)
DTYPES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")  # index = the file's dtype id


@dataclass
class CT2Variable:
    """One stored variable: ``data`` has the file's dtype and ``shape`` (bfloat16 is read as float32)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    data: np.ndarray


@dataclass
class CT2Model:
    """What a CTranslate2 model directory holds."""

    path: Path  # the model.bin read
    version: int
    spec: str
    revision: int
    variables: dict[str, CT2Variable]
    aliases: dict[str, str]  # alias -> name of a stored variable
    config: dict = field(default_factory=dict)
    source_vocabulary: list[str] = field(default_factory=list)
    target_vocabulary: list[str] = field(default_factory=list)
    shared_vocabulary: bool = True

    def resolve(self, name: str) -> str:
        """The stored variable that ``name`` is or aliases."""
        return self.aliases.get(name, name)

    def get(self, name: str) -> CT2Variable | None:
        """The variable ``name``, following aliases; None when absent."""
        return self.variables.get(self.resolve(name))

    def names(self) -> set[str]:
        return set(self.variables) | set(self.aliases)

    def scalar(self, name: str, default=None):
        """A 0-d variable as a Python number (CTranslate2 stores flags such as ``pre_norm`` this way)."""
        var = self.get(name)
        if var is None:
            return default
        if var.data.size != 1:
            raise ConfigError(f"{self.path}: variable {name!r} has shape {var.shape}, expected a single value")
        return var.data.reshape(()).item()


class _Reader:
    def __init__(self, path: Path, buffer: bytes):
        self.path, self.buffer, self.offset = path, buffer, 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.offset + n > len(self.buffer):
            raise ConfigError(
                f"{self.path}: truncated at byte {self.offset} while reading {what} "
                f"({n} bytes wanted, {len(self.buffer) - self.offset} left): copy or convert the model again"
            )
        chunk = self.buffer[self.offset : self.offset + n]
        self.offset += n
        return chunk

    def unpack(self, fmt: str, what: str):
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt), what))[0]

    def string(self, what: str) -> str:
        n = self.unpack("H", what)
        raw = self.take(n, what)
        if n == 0 or raw[-1:] != b"\0":
            raise ConfigError(f"{self.path}: {what} at byte {self.offset - n} is not a NUL-terminated string")
        try:
            return raw[:-1].decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"{self.path}: {what} is not UTF-8 ({e})") from None


def _array(raw: bytes, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    if dtype == "bfloat16":  # the upper half of a float32
        halves = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return halves.view(np.float32).reshape(shape)
    return np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape)


def read_model_bin(path: str | Path) -> CT2Model:
    """Parse ``model.bin``: version, spec name and revision, every variable and alias."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (a CTranslate2 model directory holds model.bin)")
    r = _Reader(path, path.read_bytes())
    version = r.unpack("I", "the binary version")
    if version not in READ_VERSIONS:
        raise ConfigError(
            f"{path}: binary version {version}; transduce reads versions {', '.join(map(str, READ_VERSIONS))} "
            "(CTranslate2 4.x writes 6): convert the model again with a current CTranslate2"
        )
    spec = r.string("the spec name")
    revision = r.unpack("I", "the spec revision")
    count = r.unpack("I", "the number of variables")
    variables: dict[str, CT2Variable] = {}
    for i in range(count):
        name = r.string(f"the name of variable {i}")
        rank = r.unpack("B", f"the rank of {name!r}")
        shape = tuple(r.unpack("I", f"the shape of {name!r}") for _ in range(rank))
        type_id = r.unpack("B", f"the dtype of {name!r}")
        if type_id >= len(DTYPES):
            raise ConfigError(f"{path}: variable {name!r} has unknown dtype id {type_id} (known: 0-{len(DTYPES) - 1})")
        dtype = DTYPES[type_id]
        nbytes = r.unpack("I", f"the size of {name!r}")
        expected = int(np.prod(shape, dtype=np.int64)) * (2 if dtype == "bfloat16" else np.dtype(dtype).itemsize)
        if nbytes != expected:
            raise ConfigError(
                f"{path}: variable {name!r} ({dtype}, shape {shape}) declares {nbytes} bytes, not {expected}"
            )
        variables[name] = CT2Variable(
            name, shape, dtype, _array(r.take(nbytes, f"the values of {name!r}"), dtype, shape)
        )
    aliases = {}
    for i in range(r.unpack("I", "the number of aliases")):
        alias = r.string(f"alias {i}")
        target = r.string(f"the variable of alias {alias!r}")
        if target not in variables:
            raise ConfigError(f"{path}: alias {alias!r} names {target!r}, which the file does not hold")
        aliases[alias] = target
    if r.offset != len(r.buffer):
        raise ConfigError(f"{path}: {len(r.buffer) - r.offset} bytes after the last alias (not a model.bin?)")
    return CT2Model(path, version, spec, revision, variables, aliases)


def _vocabulary(directory: Path, stem: str) -> list[str] | None:
    json_path, txt_path = directory / f"{stem}.json", directory / f"{stem}.txt"
    if json_path.is_file():
        tokens = parse_json(json_path.read_bytes(), str(json_path), list, "a JSON list of token strings")
        if not all(isinstance(t, str) for t in tokens):
            raise ConfigError(f"{json_path}: expected a JSON list of token strings")
        return tokens
    if txt_path.is_file():
        return txt_path.read_text(encoding="utf-8").split("\n")[:-1] if txt_path.stat().st_size else []
    return None


def read_model_dir(directory: str | Path) -> CT2Model:
    """:func:`read_model_bin` plus ``config.json`` (optional) and the vocabularies."""
    directory = Path(directory)
    model = read_model_bin(directory / "model.bin")
    config_path = directory / "config.json"
    if config_path.is_file():
        model.config = parse_json(config_path.read_bytes(), str(config_path), dict, "a JSON object")
    shared = _vocabulary(directory, "shared_vocabulary")
    if shared is not None:
        model.source_vocabulary = model.target_vocabulary = shared
        return model
    source, target = _vocabulary(directory, "source_vocabulary"), _vocabulary(directory, "target_vocabulary")
    missing = [name for name, v in (("source_vocabulary", source), ("target_vocabulary", target)) if v is None]
    if missing:
        raise FileNotFoundError(
            f"{directory}: no shared_vocabulary.json/.txt and no {' or '.join(missing)}.json/.txt "
            "(a CTranslate2 model directory holds its vocabularies)"
        )
    model.source_vocabulary, model.target_vocabulary, model.shared_vocabulary = source, target, False
    return model


def dequantize(model: CT2Model, name: str) -> np.ndarray:
    """Variable ``name`` as float32: int8/int16 divided by its ``<name>_scale`` (per row for int8)."""
    name = model.resolve(name)  # an alias is quantised (or not) under the name it repeats
    var = model.get(name)
    if var is None:
        raise ConfigError(f"{model.path}: missing variable {name!r}")
    if var.dtype in ("float32", "float16", "bfloat16"):
        return var.data.astype(np.float32)
    if var.dtype in ("int8", "int16"):
        scale = model.get(f"{name}_scale")
        if scale is None:
            raise ConfigError(f"{model.path}: {var.dtype} variable {name!r} has no {name + '_scale'!r}")
        s = scale.data.astype(np.float32)
        if s.size == 1:
            return var.data.astype(np.float32) / s.reshape(())
        if var.data.ndim < 1 or s.shape != (var.shape[0],):
            raise ConfigError(
                f"{model.path}: {name + '_scale'!r} has shape {scale.shape}; {name!r} of shape {var.shape} needs "
                f"one scale per row ({var.shape[0] if var.shape else 1},)"
            )
        return var.data.astype(np.float32) / s.reshape((-1,) + (1,) * (var.data.ndim - 1))
    raise ConfigError(f"{model.path}: variable {name!r} has dtype {var.dtype}, not a weight type")
