"""Argos Translate packages by language pair, from the package index that argostranslate, argospm and
LibreTranslate's ``--update-models`` download from.

    transduce import argos:en-de --out models/en-de
    transduce import argos:translate-en_de --out models/en-de          (the index's ``code``, argospm's name)
    transduce import argos:en-de --argos-index ./index.json --out models/en-de
    transduce import argos:en-de --argos-index https://example.org/my-index/ --out models/en-de

The index is one JSON list with an object per package, as argostranslate reads it::

    {"code": "translate-en_de", "from_code": "en", "from_name": "English", "to_code": "de", "to_name": "German",
     "package_version": "1.0", "argos_version": "1.0", "type": "translate" (when absent),
     "links": ["https://argos-net.com/v1/translate-en_de-1_0.argosmodel", "ipfs://..."]}

Its default address is argostranslate's: ``$ARGOS_PACKAGE_INDEX`` followed by ``index.json`` when that variable
is set, else :data:`DEFAULT_INDEX`. ``--argos-index`` gives another: a URL (http, https, file), a local file, or
a folder (an address ending in ``/``, as ``$ARGOS_PACKAGE_INDEX`` is written, gets ``index.json`` appended). An
index read from a URL is kept in ``CACHE/argos/``; when the address cannot be read, the kept copy is used.

Of the translation packages for the pair, the one with the highest ``package_version`` is chosen (LibreTranslate's
``--update-models`` upgrades to it; the published index has one per pair). Its links are tried in order, relative
ones against the index's address; those that are not http, https, file or a local path (``ipfs://``) are
skipped, as argostranslate skips them. A package is kept in ``CACHE/argos/`` as ``CODE-VERSION.argosmodel``
only once it is verified (:func:`verify_package`), and verified again before a kept copy is reused. The index
and ``metadata.json`` are read as JSON; nothing downloaded is executed.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import sys
import urllib.parse
import zipfile
import zlib
from pathlib import Path
from typing import Any

from ..config import ConfigError, parse_json
from .argos import parse_metadata
from .fetch import DownloadError, fetch_file

PREFIX = "argos:"
DEFAULT_INDEX = "https://raw.githubusercontent.com/argosopentech/argospm-index/main/index.json"
INDEX_ENV = "ARGOS_PACKAGE_INDEX"  # argostranslate's setting: the index's folder, "index.json" appended
REQUIRED_KEYS = ("from_code", "to_code", "package_version", "links")
URL = re.compile(r"^(https?|file)://")
SCHEMES = ("http", "https", "file")


def is_argos_name(source: str) -> bool:
    """``argos:PAIR`` (and not a file or folder that happens to be called so)."""
    return source.startswith(PREFIX) and not Path(source).exists()


def index_address(given: str | None = None) -> str:
    """The index to read: ``given``, else argostranslate's (``$ARGOS_PACKAGE_INDEX`` + ``index.json``, or
    :data:`DEFAULT_INDEX`); a folder's address, ending in ``/``, gets ``index.json`` appended."""
    address = given or os.environ.get(INDEX_ENV) or DEFAULT_INDEX
    return address + "index.json" if address.endswith("/") else address


def fetch_by_name(source: str, cache_dir: Path, index: str | None = None) -> tuple[Path, dict[str, Any], str]:
    """(the verified package file, its index entry, the index's address) for ``argos:PAIR``."""
    wanted = source.removeprefix(PREFIX).strip()
    entries, address = load_index(index_address(index), cache_dir)
    entry = find_entry(entries, wanted, shown(address))
    return fetch_package(entry, address, cache_dir), entry, address


# ----------------------------------------------------------------------------- the index
def load_index(address: str, cache_dir: Path) -> tuple[list[Any], str]:
    """(the index's entries, the URL that relative links resolve against) for a URL, a file or a folder.

    A URL's index is fetched each time and kept; if it cannot be fetched, the copy kept before is used."""
    if not URL.match(address):
        path = Path(address).expanduser()
        path = path / "index.json" if path.is_dir() else path
        if not path.is_file():
            raise FileNotFoundError(
                f"{path}: no such package index (a JSON file, a folder holding index.json, or a URL)"
            )
        return parse_index(path.read_bytes(), str(path)), path.resolve().as_uri()
    kept = cache_dir / "argos" / f"index-{hashlib.sha256(address.encode()).hexdigest()[:16]}.json"
    try:
        fetch_file(address, kept, check=lambda tmp: parse_index(tmp.read_bytes(), address))
    except DownloadError as e:
        if not kept.is_file():
            raise DownloadError(f"{e}; no copy of this index was kept before (give --argos-index FILE)") from None
        print(f"note: {e}; using the copy of the index kept at {kept}", file=sys.stderr)
    return parse_index(kept.read_bytes(), address), address


def parse_index(raw: bytes, where: str) -> list[Any]:
    """The index's JSON list (its entries are checked when chosen, :func:`check_entry`)."""
    return parse_json(raw, where, list, "a JSON list of packages", prefix="not a package index: ")


def pair(entry: dict[str, Any]) -> str:
    """``FROM-TO`` of an entry (``?`` for a missing code)."""
    return f"{entry.get('from_code', '?')}-{entry.get('to_code', '?')}"


def names(entry: dict[str, Any]) -> set[str]:
    """What ``argos:NAME`` may call an entry: ``en-de``, ``en_de``, argospm's ``translate-en_de`` and its ``code``."""
    found = {entry["code"].lower()} if isinstance(entry.get("code"), str) else set()
    src, tgt = entry.get("from_code"), entry.get("to_code")
    if isinstance(src, str) and isinstance(tgt, str):
        found |= {f"{src}-{tgt}".lower(), f"{src}_{tgt}".lower(), f"translate-{src}_{tgt}".lower()}
    return found


def shown(address: str) -> str:
    """An index's address as a reader knows it: a local file's path, else the URL."""
    parts = urllib.parse.urlparse(address)
    return urllib.parse.unquote(parts.path) if parts.scheme == "file" else address


def version_key(entry: dict[str, Any]) -> tuple[int, ...]:
    """``package_version`` as numbers, for choosing the newest ("1.9" < "1.10")."""
    return tuple(int(n) for n in re.findall(r"\d+", str(entry.get("package_version", ""))))


def find_entry(entries: list[Any], wanted: str, where: str) -> dict[str, Any]:
    """The checked entry of the newest translation package called ``wanted``, or an error naming what exists."""
    packages = {
        i: e for i, e in enumerate(entries) if isinstance(e, dict) and e.get("type", "translate") == "translate"
    }
    found = [(i, e) for i, e in packages.items() if wanted.lower() in names(e)]
    if not found:
        raise FileNotFoundError(not_found(wanted, list(packages.values()), where))
    position, entry = max(found, key=lambda item: version_key(item[1]))
    check_entry(entry, f"{where}, entry {position + 1} of {len(entries)} ({pair(entry)})")
    return entry


def not_found(wanted: str, packages: list[dict[str, Any]], where: str) -> str:
    """The error for a pair the index lacks: the pairs from the same source language, else close names."""
    pairs = sorted({pair(e) for e in packages if isinstance(e.get("from_code"), str)})
    head = f"{PREFIX}{wanted}: no such translation package in the index {where}"
    if not pairs:
        return f"{head} (it lists none)"
    source = re.split(r"[-_]", wanted.lower().removeprefix("translate-"))[0]
    same_source = [p for p in pairs if p.split("-")[0].lower() == source]
    if same_source:
        return f"{head}; from {source} it has: {', '.join(same_source)}"
    close = difflib.get_close_matches(wanted.lower().replace("_", "-"), pairs, n=5, cutoff=0.5)
    sources = sorted({p.split("-")[0] for p in pairs})
    hint = f"; close: {', '.join(close)}" if close else ""
    return f"{head}{hint}; it has {len(pairs)} pairs, from {', '.join(sources)} (name one as {PREFIX}FROM-TO)"


def check_entry(entry: dict[str, Any], where: str) -> None:
    """Refuse an entry that lacks what the import needs, naming every missing or malformed key."""
    problems = [f"missing key {key!r}" for key in REQUIRED_KEYS if key not in entry]
    for key in ("from_code", "to_code", "package_version"):
        if key in entry and not (isinstance(entry[key], str) and entry[key]):
            problems.append(f"key {key!r} is {entry[key]!r}, not a non-empty string")
    links = entry.get("links")
    if "links" in entry and not (isinstance(links, list) and links and all(isinstance(x, str) for x in links)):
        problems.append(f"key 'links' is {links!r}, not a non-empty list of addresses")
    digest = entry.get("sha256")
    if digest is not None and not (isinstance(digest, str) and re.fullmatch(r"[0-9a-fA-F]{64}", digest)):
        problems.append(f"key 'sha256' is {digest!r}, not 64 hexadecimal digits")
    if entry.get("target_prefix"):
        problems.append(f"key 'target_prefix' is {entry['target_prefix']!r}: target prefixes are not supported")
    if problems:
        raise ConfigError(f"{where}: " + "; ".join(problems))


# ----------------------------------------------------------------------------- the package
def kept_name(entry: dict[str, Any]) -> str:
    """The file a package is kept as: ``translate-en_de-1_0.argosmodel``, the published packages' own names."""
    code = (
        entry.get("code")
        if isinstance(entry.get("code"), str)
        else f"translate-{entry['from_code']}_{entry['to_code']}"
    )
    return re.sub(r"[^\w.-]", "_", f"{code}-{entry['package_version'].replace('.', '_')}") + ".argosmodel"


def fetch_package(entry: dict[str, Any], index_url: str, cache_dir: Path) -> Path:
    """The entry's package, verified: the kept copy, or the first of its links that downloads and verifies."""
    kept = cache_dir / "argos" / kept_name(entry)
    if kept.is_file():
        try:
            verify_package(kept, entry, str(kept))
            return kept
        except ConfigError as e:
            print(f"note: {e}; downloading it again", file=sys.stderr)
            kept.unlink()
    urls = [urllib.parse.urljoin(index_url, link) for link in entry["links"]]
    usable = [u for u in urls if urllib.parse.urlparse(u).scheme in SCHEMES]
    if not usable:
        raise DownloadError(f"{PREFIX}{pair(entry)}: no link to download ({', '.join(SCHEMES)}) among {urls}")
    failures = []
    for url in usable:
        try:
            return fetch_file(url, kept, check=lambda tmp, url=url: verify_package(tmp, entry, url))
        except ValueError as e:  # DownloadError, ConfigError: the next link may serve a good copy
            failures.append(str(e))
    raise DownloadError(f"{PREFIX}{pair(entry)}: no link gave the package: " + " | ".join(failures))


def verify_package(path: Path, entry: dict[str, Any], where: str) -> None:
    """Refuse ``path`` (read from ``where``) unless it is the package ``entry`` describes: the entry's ``sha256``
    if it gives one, a zip whose every member reads back with its CRC, holding one ``metadata.json`` (at the top
    or in its one folder) that is well-formed and names the entry's ``from_code`` and ``to_code``."""
    if entry.get("sha256"):
        digest = sha256_file(path)
        if digest != entry["sha256"].lower():
            raise ConfigError(f"{where}: sha256 {digest}, but the index gives {entry['sha256'].lower()}")
    if not zipfile.is_zipfile(path):
        raise ConfigError(f"{where}: not a zip archive (an .argosmodel is one; a cut-short download is not)")
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
            if bad is not None:
                raise ConfigError(f"{where}: corrupted zip: {bad!r} does not match its CRC")
            found = [n for n in z.namelist() if n.count("/") <= 1 and n.rsplit("/", 1)[-1] == "metadata.json"]
            if len(found) != 1:
                raise ConfigError(f"{where}: not an Argos package: {len(found)} metadata.json files, expected 1")
            raw = z.read(found[0])
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
        raise ConfigError(f"{where}: corrupted zip ({e})") from None
    meta = parse_metadata(raw, f"{where}: {found[0]}")
    if (meta["from_code"], meta["to_code"]) != (entry["from_code"], entry["to_code"]):
        raise ConfigError(
            f"{where}: the package translates {meta['from_code']}-{meta['to_code']}, but the index lists it as "
            f"{pair(entry)}; refused"
        )


def sha256_file(path: Path) -> str:
    """The hex SHA-256 of a file, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
