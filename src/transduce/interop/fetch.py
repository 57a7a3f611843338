"""Find the files of a model to import: a local directory, a release ``.zip``, a URL, or a hub name.

    transduce import Helsinki-NLP/opus-mt-en-de --out models/en-de        (HuggingFace hub, huggingface_hub)
    transduce import opus-mt-en-de --out models/en-de                     (the same: Helsinki-NLP/ is implied)
    transduce import https://object.pouta.csc.fi/OPUS-MT-models/en-de/opus-2020-02-26.zip --out models/en-de
    transduce import ./opus-2020-02-26.zip --out models/en-de             (a release downloaded before)
    transduce import ./opus-mt-en-de/ --out models/en-de                  (a MarianMT or native Marian directory)

Downloads go to a cache directory and are reused. From the hub only what the import reads is fetched
(JSON, SentencePiece models, safetensors weights), never a pickled ``pytorch_model.bin``. Zip members
are checked to stay inside their directory before anything is written.
"""

from __future__ import annotations

import http.client
import os
import re
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path

from ..data.corpora import DEFAULT_CACHE

HUB_ORG = "Helsinki-NLP"  # where OPUS-MT's MarianMT conversions live on the hub
HUB_FILES = ["*.json", "*.spm", "*.safetensors", "*.yml", "README.md"]  # never *.bin, *.h5, *.msgpack (pickles…)
HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
DEFAULT_MODEL_CACHE = Path(DEFAULT_CACHE) / "models"
USER_AGENT = "transduce"


def resolve(source: str, cache_dir: Path = DEFAULT_MODEL_CACHE, revision: str | None = None) -> Path:
    """A local directory holding the model that ``source`` names (downloading it if needed)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.is_file():
        if not zipfile.is_zipfile(path):
            raise ValueError(
                f"{path}: a file, but not a .zip release; give a model directory, a release .zip, a URL or a hub name"
            )
        return unzip(path, cache_dir / "releases" / path.stem)
    if re.match(r"^(https?|file)://", source):
        return unzip(download(source, cache_dir / "downloads"), cache_dir / "releases" / _url_stem(source))
    if source.startswith(("opus-mt-", "opus-tatoeba-")):
        source = f"{HUB_ORG}/{source}"
    if HUB_NAME.match(source):
        return hub_snapshot(source, cache_dir / "hub", revision)
    raise FileNotFoundError(f"{source}: no such directory or file, and not a URL or a hub name (ORG/NAME)")


def hub_snapshot(repo_id: str, cache_dir: Path, revision: str | None = None) -> Path:
    """The hub repository's files that an import reads, from the cache or downloaded (``huggingface_hub``).

    With ``HF_HUB_OFFLINE=1`` only the cache is used."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
        )
    except ImportError as e:
        raise ValueError("downloading from the hub needs huggingface_hub (pip install 'transduce[interop]')") from e
    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=str(cache_dir), allow_patterns=HUB_FILES))
    except RepositoryNotFoundError:
        raise FileNotFoundError(
            f"{repo_id}: no such repository on the HuggingFace hub (nor a local directory)"
        ) from None
    except LocalEntryNotFoundError:
        raise FileNotFoundError(
            f"{repo_id}: no local directory of that name, not in the cache {cache_dir}, and the "
            "hub cannot be reached (offline, or HF_HUB_OFFLINE=1); import it where there is "
            "internet, or give the path of a downloaded copy"
        ) from None
    except (HfHubHTTPError, OSError) as e:
        raise ValueError(f"{repo_id}: download from the HuggingFace hub failed ({e})") from None


def _url_stem(url: str) -> str:
    parts = [p for p in urllib.parse.urlparse(url).path.split("/") if p]
    stem = "-".join(parts[-2:]) if len(parts) >= 2 else (parts[-1] if parts else "download")
    return re.sub(r"[^\w.-]", "_", stem.removesuffix(".zip"))


class DownloadError(ValueError):
    """A download failed: the address could not be read, or it sent fewer bytes than it announced."""


def download(url: str, directory: Path) -> Path:
    """Fetch ``url`` (http, https or file) into ``directory`` once; a partial download is never left as the file."""
    name = Path(urllib.parse.urlparse(url).path).name or "download.zip"
    out = directory / name
    if out.is_file():
        return out
    return fetch_file(url, out)


def fetch_file(url: str, out: Path, check: Callable[[Path], object] | None = None) -> Path:
    """Fetch ``url`` (http, https or file) to ``out`` through a temporary file beside it, replacing ``out`` only
    once the byte count the server announced has arrived and ``check(temporary file)`` has returned (it raises
    to refuse the file)."""
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    try:
        try:
            with os.fdopen(fd, "wb") as f, urllib.request.urlopen(request, timeout=60) as response:
                announced = response.headers.get("Content-Length")
                shutil.copyfileobj(response, f)
                received = f.tell()
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            raise DownloadError(f"{url}: download failed ({getattr(e, 'reason', e)})") from None
        if announced is not None and announced.isdigit() and int(announced) != received:
            raise DownloadError(f"{url}: download cut short ({received} of {announced} bytes)")
        if check is not None:
            check(Path(tmp))
        os.replace(tmp, out)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return out


def unzip(archive: Path, out: Path) -> Path:
    """Extract ``archive`` into ``out`` (reused if already there); the directory holding the model files."""
    if not out.is_dir():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            with zipfile.ZipFile(archive) as z:
                for member in z.namelist():
                    target = (tmp / member).resolve()
                    if not target.is_relative_to(tmp.resolve()):
                        raise ValueError(f"{archive}: member {member!r} would be written outside its directory")
                z.extractall(tmp)
            os.rename(tmp, out)
        except zipfile.BadZipFile as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise ValueError(f"{archive}: corrupted .zip ({e}); download it again") from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    # a release zips its files at the top level; some archives wrap them in one folder
    entries = [p for p in out.iterdir() if not p.name.startswith(".")]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else out
