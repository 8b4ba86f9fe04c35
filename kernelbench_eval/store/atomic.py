"""Writing a file whole: to a temporary file beside it, flushed to disk, then renamed into place, so a reader (or a
harness killed mid-write and resumed) finds the old file or the new one, never half of one.

Here, below every stage, because builds, baselines, run folders and reports all write this way.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)
