"""Files in, files out: LibreTranslate's ``POST /translate_file`` and ``GET /download_file/<name>``.

    POST /translate_file   multipart: file, source (a code or "auto"), target, api_key
                           -> {"translatedFileUrl": "http://HOST/download_file/<32 hex>.<name>"}
    GET  /download_file/<name>   the translated file (404 once expired or for any other name)

Formats: ``.txt``, ``.html``/``.htm``, ``.srt``, ``.docx``/``.pptx``/``.odt``/``.odp``, read and written by
:mod:`transduce.text.files` (as ``transduce translate --input`` does); their texts run as ``format: text``,
their HTML and office paragraphs as ``format: html``, through a pivot language or after identifying
the language of the whole file (``source: auto``) as ``/translate`` does. The upload is bounded by
``--max-body``, an archive's unpacked size by 50 × ``--max-body``, and its text by ``--char-limit``.
Translated files are written under one folder (``--files-dir``, default a folder of the process under
the system's temporary folder) as ``<random 32 hex>.<sanitised name>``, are deleted ``--file-expiry``
seconds after they were written, and a download name must be exactly that shape and resolve inside the
folder, so no request can reach another file.
"""

from __future__ import annotations

import os
import re
import secrets
import tempfile
import threading
import time
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse

from ..text import files
from .fields import api_key, client_host, error, ignore_unknown
from .languages import detect_sources, plan
from .libre import check_size, run_html, run_text
from .service import Rejected, Service

FORMATS = files.SUFFIXES
_NAME = re.compile(r"^[0-9a-f]{32}\.[A-Za-z0-9._-]{1,120}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def default_folder() -> Path:
    """A folder of this process under the system's temporary folder."""
    return Path(tempfile.gettempdir()) / f"transduce-files-{os.getpid()}"


class FileStore:
    """Translated files under ``folder``, each deleted ``expiry_s`` seconds after it was written."""

    def __init__(self, folder: Path, expiry_s: float = 1800.0):
        self.folder, self.expiry_s = Path(folder), expiry_s
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def put(self, original_name: str, data: bytes) -> str:
        self.sweep()
        stem = _UNSAFE.sub("_", Path(original_name).name).strip("._")[-100:] or "file"
        name = f"{secrets.token_hex(16)}.{stem}"
        (self.folder / name).write_bytes(data)
        return name

    def get(self, name: str) -> Path | None:
        """The file's path, or None: a name not of the store's shape, outside its folder, or expired."""
        self.sweep()
        if not _NAME.match(name):
            return None
        path = (self.folder / name).resolve()
        if path.parent != self.folder.resolve() or not path.is_file():
            return None
        return path

    def sweep(self) -> None:
        cutoff = time.time() - self.expiry_s
        with self._lock:
            for path in self.folder.iterdir():
                if _NAME.match(path.name) and path.stat().st_mtime < cutoff:
                    path.unlink(missing_ok=True)


async def translate_file(service: Service, store: FileStore, request: Request) -> dict:
    form = await request.form()
    fields = {k: form.get(k) for k in form}
    ignore_unknown(fields, {"file", "source", "target", "api_key", "secret"}, "/translate_file")
    upload = form.get("file")
    if upload is None or isinstance(upload, str):
        raise Rejected(400, "Invalid request: missing file parameter (a multipart file upload)")
    for name in ("source", "target"):
        if not fields.get(name):
            raise Rejected(400, f"Invalid request: missing {name} parameter")
    char_limit = service.authorize_chars(api_key(fields, request), client_host(request))
    name = upload.filename or ""
    try:
        suffix = files.suffix_of(name)
        units = files.read(await upload.read(), name, 50 * service.settings.max_body)
    except ValueError as e:
        raise Rejected(400, f"Invalid request: {e}") from None
    check_size(service, [units.plain], char_limit)
    done = []
    if units.texts:
        hops = route(service, fields, units.plain)
        search = service.settings.search  # the server's, one translation per text
        run = (run_html if units.markup else run_text)(service, hops, units.texts, search)
        done = [out[0] for out in await run]
    stored = store.put(name or f"file{suffix}", units.write(done))
    return {"translatedFileUrl": str(request.url_for("libre_download_file", name=stored))}


def route(service: Service, fields: dict, text: str):
    source, target = str(fields["source"]), str(fields["target"])
    if source == "auto":
        source = detect_sources(service, [text], target)[0][0]
    return plan(service, source, target)


def router(service: Service, store: FileStore) -> APIRouter:
    api = APIRouter(tags=["LibreTranslate API"])

    @api.post("/translate_file", summary="LibreTranslate: translate a .txt, .html or .srt file")
    async def libre_translate_file(request: Request):
        try:
            return JSONResponse(await translate_file(service, store, request))
        except Rejected as e:
            return error(400 if e.status == 422 else e.status, e.message, e.retry_after)
        except Exception as e:  # noqa: BLE001 - answered in LibreTranslate's shape, not a traceback
            return error(500, f"translation failed: {type(e).__name__}: {e}")

    @api.get("/download_file/{name}", summary="LibreTranslate: a translated file")
    async def libre_download_file(name: str):
        path = store.get(name)
        if path is None:
            return error(404, "no such file (translated files expire)")
        return FileResponse(path, filename=name.split(".", 1)[1])

    return api
