"""Downloads that never leave a half-written file: fetch to ``NAME.partial``, rename when complete."""

from __future__ import annotations

import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path


def fetch(url: str, path: Path) -> Path:
    """``url`` (``http(s)://`` or ``file://``) saved as ``path``, unless ``path`` is there already."""
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    print(f"downloading {url}", file=sys.stderr)
    partial = path.with_name(path.name + ".partial")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(partial, "wb") as out:
            shutil.copyfileobj(response, out, 1 << 20)
    except (urllib.error.URLError, OSError) as e:
        partial.unlink(missing_ok=True)
        raise FileNotFoundError(f"{url}: download failed ({e})") from None
    partial.rename(path)  # a half-downloaded file never looks complete
    return path
