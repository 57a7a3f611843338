"""Argos Translate packages (``.argosmodel``, what LibreTranslate runs): import one, export one.

A package is a zip holding one folder::

    translate-en_fr-1_0/
      metadata.json          {"package_version", "argos_version", "from_code", "to_code", "from_name", ...}
      model/                 a CTranslate2 model directory (model.bin, config.json, *_vocabulary.json)
      sentencepiece.model    the tokenizer, one SentencePiece model for both sides
      (bpe.model)            newer packages' alternative: Moses tokenisation + subword-nmt BPE
      (stanza/, minisbd/)    argostranslate's sentence splitter for the source language
      README.md

Import reads ``metadata.json``, the CTranslate2 model (``ct2_model.py``, no CTranslate2 needed, nothing
executed) and ``sentencepiece.model``, and converts them with ``ct2_import.py``. Packages with
``bpe.model`` are refused: transduce tokenises with SentencePiece only. The sentence splitter's files are
not used (transduce splits documents itself, docs/documents.md).

Export writes the same layout from a model directory: the CTranslate2 export of ``ctranslate2.py`` (float32
unless ``quantization``), the model's SentencePiece model as ``sentencepiece.model`` (so only a model with
one shared vocabulary exports), and metadata. It ships no sentence splitter: argostranslate uses its
default one (see docs/interop.md).
"""

from __future__ import annotations

import json
import re
import shutil
import stat
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import ConfigError, parse_json
from ..data.vocab import Vocabs
from ..model import Transformer
from .ct2_import import convert_ct2
from .ct2_model import read_model_dir

REQUIRED_KEYS = ("from_code", "to_code", "package_version", "argos_version")
PACKAGE_FORMAT = "1.0"  # metadata.json's argos_version: the package format (argostranslate reads it, compares nothing)
SUFFIX = ".argosmodel"


@dataclass
class ArgosPackage:
    """An unpacked package: its folder and metadata."""

    root: Path
    metadata: dict[str, Any]
    origin: Path


def is_argos_package(path: Path) -> bool:
    """A ``.argosmodel`` file, or a folder holding ``metadata.json`` and ``model/model.bin``."""
    if path.is_file():
        return path.suffix == SUFFIX
    return path.is_dir() and (path / "metadata.json").is_file() and (path / "model" / "model.bin").is_file()


def extract(archive: Path, out: Path) -> Path:
    """Unzip ``archive`` into the empty folder ``out`` after checking every entry stays inside it (no absolute
    paths, no ``..``, no links); the folder holding ``metadata.json``."""
    if not zipfile.is_zipfile(archive):
        raise ConfigError(f"{archive}: not a zip archive (an .argosmodel is one)")
    root = out.resolve()
    with zipfile.ZipFile(archive) as z:
        bad = []
        for info in z.infolist():
            name = info.filename
            target = (root / name).resolve()
            if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name) or not target.is_relative_to(root):
                bad.append(f"{name!r} would be written outside the package folder")
            elif stat.S_ISLNK(info.external_attr >> 16):
                bad.append(f"{name!r} is a symbolic link")
        if bad:
            raise ConfigError(f"{archive}: unsafe zip entries, nothing extracted: " + "; ".join(bad))
        try:
            z.extractall(root)
        except zipfile.BadZipFile as e:
            raise ConfigError(f"{archive}: corrupted zip ({e})") from None
    if (root / "metadata.json").is_file():
        return root
    folders = [p for p in root.iterdir() if p.is_dir() and (p / "metadata.json").is_file()]
    if len(folders) != 1:
        raise ConfigError(f"{archive}: expected one folder holding metadata.json, found {len(folders)}")
    return folders[0]


def read_metadata(path: Path) -> dict[str, Any]:
    """A package folder's ``metadata.json``, checked as :func:`parse_metadata` does."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (an Argos package holds metadata.json)")
    return parse_metadata(path.read_bytes(), str(path))


def parse_metadata(raw: bytes, where: str) -> dict[str, Any]:
    """The JSON object of a ``metadata.json`` (read from ``where``): its REQUIRED_KEYS strings, a translation
    package without a target prefix; every problem named in one error."""
    meta = parse_json(raw, where, dict, "a JSON object")
    problems = [f"missing key {key!r}" for key in REQUIRED_KEYS if not isinstance(meta.get(key), str)]
    if meta.get("type", "translate") != "translate":
        problems.append(f"key 'type' is {meta['type']!r}: only translation packages ('translate') import")
    if meta.get("target_prefix"):
        problems.append(f"key 'target_prefix' is {meta['target_prefix']!r}: target prefixes are not supported")
    if problems:
        raise ConfigError(f"{where}: " + "; ".join(problems))
    return meta


def import_argos(source: str | Path) -> tuple[Transformer, Vocabs, dict[str, Any]]:
    """(model, vocabs, meta) from an ``.argosmodel`` file or an unpacked (installed) package folder."""
    source = Path(source).expanduser()
    with tempfile.TemporaryDirectory(prefix="transduce-argos-") as tmp:
        root = extract(source, Path(tmp)) if source.is_file() else source
        metadata = read_metadata(root / "metadata.json")
        spm_path, bpe_path = root / "sentencepiece.model", root / "bpe.model"
        if not spm_path.is_file():
            if bpe_path.is_file():
                raise ConfigError(
                    f"{bpe_path}: this package tokenises with Moses + BPE (bpe.model); transduce imports "
                    "packages with a sentencepiece.model only"
                )
            raise FileNotFoundError(f"{spm_path}: missing (an Argos package holds its tokenizer there)")
        model_dir = root / "model"
        if not (model_dir / "model.bin").is_file():
            raise FileNotFoundError(f"{model_dir / 'model.bin'}: missing (an Argos package holds a CTranslate2 model)")
        ct2 = read_model_dir(model_dir)
        spm = spm_path.read_bytes()
        model, vocabs, meta = convert_ct2(ct2, spm, spm, str(spm_path))
        ignored = sorted(p.name for p in root.iterdir() if p.name in ("stanza", "minisbd", "spacy"))
    meta.update(
        imported_from=str(source.resolve()),
        import_format="argos",
        src_lang=metadata["from_code"],
        tgt_lang=metadata["to_code"],
        argos_package_version=metadata["package_version"],
    )
    if ignored:
        meta["argos_sentence_splitter_not_used"] = ignored
    return model, vocabs, meta


# ----------------------------------------------------------------------------- export
def _language_name(code: str) -> str:
    try:
        import langcodes
    except ImportError:
        return code
    try:
        return langcodes.Language.get(code).display_name()
    except (ValueError, LookupError):
        return code


def package_metadata(from_code: str, to_code: str, package_version: str) -> dict[str, Any]:
    return {
        "package_version": package_version,
        "argos_version": PACKAGE_FORMAT,
        "from_code": from_code,
        "from_name": _language_name(from_code),
        "to_code": to_code,
        "to_name": _language_name(to_code),
        "type": "translate",
        "links": [],
    }


def export_argos(
    model: Transformer,
    vocabs: Vocabs,
    out: str | Path,
    meta: dict[str, Any] | None = None,
    *,
    from_code: str | None = None,
    to_code: str | None = None,
    package_version: str = "1.0",
    quantization: str | None = None,
) -> Path:
    """Write ``out`` (an ``.argosmodel``) that argostranslate installs and translates with."""
    from .ctranslate2 import export_ctranslate2

    meta = meta or {}
    out = Path(out)
    from_code, to_code = from_code or meta.get("src_lang"), to_code or meta.get("tgt_lang")
    problems = []
    if not vocabs.shared:
        problems.append(
            "the model has separate source and target vocabularies; an Argos package has one sentencepiece.model "
            "for both sides"
        )
    if vocabs.lowercase:
        problems.append("the vocabulary lowercases its input (prepare --lowercase), which argostranslate cannot do")
    for name, code in (("--from-code", from_code), ("--to-code", to_code)):
        if not code:
            problems.append(f"no source/target language in the model directory's [meta]: give {name}")
        elif not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", code):
            problems.append(f"{name} {code!r} is not a language code")
    if not re.fullmatch(r"[0-9A-Za-z.]+", package_version):
        problems.append(f"--package-version {package_version!r}: use digits, letters and dots")
    if out.suffix != SUFFIX:
        problems.append(f"{out}: the file name must end in {SUFFIX}")
    if problems:
        raise ConfigError("cannot export an Argos package: " + "; ".join(problems))
    folder = f"translate-{from_code}_{to_code}-{package_version.replace('.', '_')}"
    with tempfile.TemporaryDirectory(prefix="transduce-argos-") as tmp:
        root = Path(tmp) / folder
        export_ctranslate2(model, vocabs, root / "model", quantization=quantization)
        for name in ("source.spm", "target.spm"):  # the package's tokenizer is sentencepiece.model
            (root / "model" / name).unlink(missing_ok=True)
        vocabs.src.save(root / "sentencepiece.model")
        metadata = package_metadata(from_code, to_code, package_version)
        (root / "metadata.json").write_text(json.dumps(metadata, indent=2, ensure_ascii=False) + "\n")
        (root / "README.md").write_text(
            f"# {metadata['from_name']} → {metadata['to_name']}\n\n"
            f"Exported by transduce (`transduce export --to argos`), weights {quantization or 'float32'}.\n"
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(f".{out.name}.partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
            for path in sorted(root.rglob("*")):
                if path.is_file():
                    z.write(path, path.relative_to(Path(tmp)).as_posix())
        shutil.move(partial, out)
    return out
