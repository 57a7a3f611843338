"""The fields of a LibreTranslate request, read as leniently as LibreTranslate reads them.

A field may come in the URL's query string (deep-translator sends every field there), in a JSON
object, or in form data (``application/x-www-form-urlencoded`` or ``multipart/form-data``); a field in
the body wins over the same field in the query string. A JSON ``null`` is a field not sent
(Mastodon sends ``"api_key": null``). Unknown fields are ignored, and each unknown name is logged
once per process, so a client's typo is visible in the server log without failing its requests.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from .service import Rejected

log = logging.getLogger("transduce.serve")
_logged: set[tuple[str, str]] = set()
_logged_lock = threading.Lock()


def error(status: int, message: str, retry_after: float = 0.0) -> JSONResponse:
    """An answer in LibreTranslate's error shape, ``{"error": message}``."""
    headers = {"Retry-After": str(max(1, round(retry_after)))} if retry_after else None
    return JSONResponse(status_code=status, content={"error": message}, headers=headers)


def _form_dict(form) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name in form:
        values = form.getlist(name)
        fields[name] = values if len(values) > 1 else values[0]
    return fields


async def read_fields(request: Request) -> dict[str, Any]:
    """The request's fields: the query string's, then the body's (JSON or form) over them."""
    fields: dict[str, Any] = _form_dict(request.query_params)
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind in ("application/x-www-form-urlencoded", "multipart/form-data"):
        fields.update(_form_dict(await request.form()))
    else:
        body = await request.body()
        if body.strip():
            try:
                parsed = json.loads(body)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise Rejected(400, f"Invalid request: malformed JSON ({e})") from None
            if not isinstance(parsed, dict):
                raise Rejected(400, "Invalid request: the JSON body must be an object")
            fields.update(parsed)
    return {k: v for k, v in fields.items() if v is not None}


def ignore_unknown(fields: dict[str, Any], known: set[str], path: str) -> None:
    """Log each field name outside ``known`` the first time ``path`` receives it."""
    for name in sorted(set(fields) - known):
        with _logged_lock:
            if (path, name) in _logged:
                continue
            _logged.add((path, name))
        log.warning("%s: ignoring unknown field %r (logged once)", path, name)


def as_int(value, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise Rejected(400, f"Invalid request: {name} must be an integer, got {value!r}") from None


def api_key(fields: dict[str, Any], request: Request) -> str | None:
    """The key of a LibreTranslate request: the ``api_key`` field, else the ``X-API-Key`` header."""
    given = fields.get("api_key") or request.headers.get("x-api-key")
    return str(given) if given else None


def client_host(request: Request) -> str | None:
    return request.client.host if request.client else None
