"""Validated, dataclass-based configuration shared by every part of transduce.

A config is a flat dataclass. Every value that comes from a file or the command
line goes through :func:`build`, which rejects unknown keys, wrong types and
impossible values with a :class:`ConfigError` that names the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import tomllib
import typing
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A configuration key is unknown, has the wrong type or an impossible value."""


def parse_json(raw: bytes, where: str, kind: type, expected: str, prefix: str = "") -> Any:
    """The JSON value in ``raw`` (read from ``where``), which must be a ``kind`` (``dict``, ``list``); a
    :class:`ConfigError` naming ``where`` otherwise: "``where``: ``prefix``not valid JSON (...)" or "...expected
    ``expected``". Plain JSON: nothing in it runs."""
    try:
        value = json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where}: {prefix}not valid JSON ({e})") from None
    if not isinstance(value, kind):
        raise ConfigError(f"{where}: {prefix}expected {expected}")
    return value


def _type_ok(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        return any(_type_ok(value, h) for h in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin in (list, tuple):
        return isinstance(value, (list, tuple))
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _describe(hint: Any) -> str:
    if typing.get_origin(hint) is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    return getattr(hint, "__name__", str(hint))


def build(cls: type, values: dict[str, Any], where: str = "") -> Any:
    """Build dataclass ``cls`` from ``values``, naming any bad key in the error.

    ``where`` (e.g. a file name and section) is prefixed to error messages.
    """
    prefix = f"{where}: " if where else ""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key, value in values.items():
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{prefix}unknown key {key!r}{hint}")
        if not _type_ok(value, hints[key]):
            raise ConfigError(
                f"{prefix}key {key!r} must be {_describe(hints[key])}, got {value!r} ({type(value).__name__})"
            )
    kwargs = {k: (float(v) if hints[k] is float else v) for k, v in values.items()}
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{prefix}{e}") from None


def check(condition: bool, key: str, message: str) -> None:
    """Raise a :class:`ConfigError` naming ``key`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(f"key {key!r}: {message}")


def parse_override(text: str) -> tuple[str, Any]:
    """Parse a ``key=value`` command-line override; the value is read as TOML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # bare strings need no quotes on the command line
    return key, value


def to_toml_text(table: dict[str, dict[str, Any]]) -> str:
    """Write nested ``{section: {key: value}}`` as TOML (flat values only)."""
    lines: list[str] = []
    for section, values in table.items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            if value is None:
                continue  # TOML has no null; absent means default
            lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file, naming the file in any parse error."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
