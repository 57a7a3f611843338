"""API keys and per-key request limits.

Keys file: one key per line, optionally followed by that key's limit in requests per minute and
its limit in characters per request (LibreTranslate's per-key ``char_limit``)::

    # comments and blank lines are ignored
    3f9c1e0b7a2d4c58   120
    b71d09e4c3aa5f26          # no number: the --key-limit default
    9d2e6c41f0b3a777   60  20000

LibreTranslate's keys database (``db/api_keys.db``, SQLite: ``api_key``, ``req_limit`` per minute,
``char_limit``) is read as it is, read-only, in place of a keys file.

A key given with a request is compared with every key in constant time (``hmac.compare_digest``),
so response timing does not reveal how much of a guess was right. Limits are token buckets: a
client may send ``limit`` requests at once, then ``limit`` per minute.
"""

from __future__ import annotations

import hmac
import ipaddress
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError


@dataclass(frozen=True)
class ApiKey:
    key: str
    per_minute: int  # 0: no limit
    line: int  # where it is in the keys file (its name in logs and metrics, never the key itself)
    char_limit: int = 0  # characters per request; 0: the server's --char-limit

    @property
    def label(self) -> str:
        return f"key-line-{self.line}"


SQLITE_MAGIC = b"SQLite format 3\x00"


def read_keys_db(path: Path) -> list[ApiKey]:
    """The keys of a LibreTranslate keys database; its row number stands for the line."""
    import sqlite3

    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            rows = list(db.execute("SELECT api_key, req_limit, char_limit FROM api_keys ORDER BY rowid"))
    except sqlite3.Error as e:
        raise ConfigError(f"{path}: not a LibreTranslate keys database (table api_keys): {e}") from None
    keys = []
    for n, (key, per_minute, chars) in enumerate(rows, 1):
        if not isinstance(key, str) or len(key) < 8:
            raise ConfigError(f"{path}: api_keys row {n}: key missing or shorter than 8 characters")
        keys.append(ApiKey(key, max(int(per_minute or 0), 0), n, max(int(chars or 0), 0)))
    if not keys:
        raise ConfigError(f"{path}: no keys in the database")
    return keys


def read_keys(path: str | Path, default_limit: int = 0) -> list[ApiKey]:
    """The keys of a keys file (or of a LibreTranslate keys database); a malformed line raises naming the
    file and line."""
    path = Path(path)
    with open(path, "rb") as f:
        if f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC:
            return read_keys_db(path)
    keys, seen = [], set()
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) > 3 or not all(w.isdigit() for w in words[1:]):
            raise ConfigError(
                f"{path}:{n}: expected 'KEY [REQUESTS_PER_MINUTE [CHAR_LIMIT]]' with whole numbers, "
                f"got {len(words)} fields"
            )
        if len(words[0]) < 8:
            raise ConfigError(f"{path}:{n}: key shorter than 8 characters")
        if words[0] in seen:
            raise ConfigError(f"{path}:{n}: the same key appears twice")
        seen.add(words[0])
        per_minute = int(words[1]) if len(words) >= 2 else default_limit
        keys.append(ApiKey(words[0], per_minute, n, int(words[2]) if len(words) == 3 else 0))
    if not keys:
        raise ConfigError(f"{path}: no keys in the file")
    return keys


def find_key(keys: list[ApiKey], given: str) -> ApiKey | None:
    """The key equal to ``given``, comparing against every key in constant time."""
    given_b, found = given.encode("utf-8"), None
    for key in keys:
        if hmac.compare_digest(key.key.encode("utf-8"), given_b):
            found = key
    return found


def is_loopback(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class RateLimiter:
    """Token buckets per client: ``allow(client, per_minute)`` -> seconds to wait (0.0: allowed)."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, time)
        self._lock = threading.Lock()

    def allow(self, client: str, per_minute: int) -> float:
        if per_minute <= 0:
            return 0.0
        now = self.clock()
        with self._lock:
            tokens, then = self._buckets.get(client, (float(per_minute), now))
            tokens = min(float(per_minute), tokens + (now - then) * per_minute / 60.0)
            if tokens >= 1.0:
                self._buckets[client] = (tokens - 1.0, now)
                return 0.0
            self._buckets[client] = (tokens, now)
            return (1.0 - tokens) * 60.0 / per_minute


class Denied(Exception):
    """A request refused for its key or its rate: ``status`` is 403 or 429."""

    def __init__(self, status: int, message: str, retry_after: float = 0.0):
        super().__init__(message)
        self.status, self.retry_after = status, retry_after


@dataclass
class Access:
    """The server's key policy. ``require``: "never", "remote" (not from loopback) or "always"."""

    keys: list[ApiKey]
    require: str = "remote"
    anonymous_limit: int = 0  # requests per minute per client address without a key; 0: none

    def __post_init__(self):
        if self.require not in ("never", "remote", "always"):
            raise ValueError(f"require must be never, remote or always, got {self.require!r}")
        if self.require != "never" and not self.keys:
            raise ValueError("API keys are required but no keys file was given (--api-keys FILE)")
        self.limiter = RateLimiter()

    def char_limit(self, given: str | None) -> int:
        """The characters per request of the key ``given`` (0: none of its own)."""
        key = find_key(self.keys, given) if given and self.keys else None
        return key.char_limit if key else 0

    def check(self, given: str | None, client_host: str | None) -> str:
        """The client's label for metrics; raises :class:`Denied` (403 wrong or missing key, 429 over limit).

        A server without keys ignores a key sent to it (LibreTranslate clients always send one)."""
        if given and self.keys:
            key = find_key(self.keys, given)
            if key is None:
                raise Denied(403, "invalid API key")
            wait = self.limiter.allow(key.label, key.per_minute)
            if wait:
                raise Denied(
                    429,
                    f"request limit of {key.per_minute} per minute reached for this API key; retry in {wait:.1f} s",
                    wait,
                )
            return key.label
        if self.require == "always" or (self.require == "remote" and not is_loopback(client_host)):
            raise Denied(403, "an API key is required: send api_key (or the X-API-Key header)")
        wait = self.limiter.allow(f"addr-{client_host}", self.anonymous_limit)
        if wait:
            raise Denied(
                429,
                f"request limit of {self.anonymous_limit} per minute without an API key reached; retry in {wait:.1f} s",
                wait,
            )
        return "anonymous"
