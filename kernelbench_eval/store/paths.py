"""Removing a cache entry whatever stands in its place (a candidate can plant a file or a link where a folder was)."""

from __future__ import annotations

import shutil
from pathlib import Path


def clear(path: Path) -> None:
    """Remove `path`: a folder with its contents, or a file or link (never what a link points to)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)
