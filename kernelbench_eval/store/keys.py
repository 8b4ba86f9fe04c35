"""The harness's signing key: what lets it tell its own cache records from ones a candidate wrote.

Build records (`compile.json`) and baselines live in folders a candidate can compute and write, as the
same user. Each record the harness writes carries an HMAC-SHA256 over its content under a key kept in
`<cache>/keys/hmac` (folder 0700, file 0600), generated on first use. The key is never put in a worker's
environment, argv or working directory, so a record a candidate forges does not verify and is ignored.

Why a key instead of a record kept "somewhere else": both are files of the same user, but a digest
record anywhere is still forgeable by whoever finds it; a signature needs the key's bytes too. Until
workers run as another user (an OS sandbox), a candidate that knows this layout can still read the key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

KEY_BYTES = 32


def key_path(cache_dir: Path) -> Path:
    return cache_dir / "keys" / "hmac"


def load_key(cache_dir: Path) -> bytes:
    """The cache's key, created (atomically, 0600) if missing; a key of the wrong size is replaced."""
    path = key_path(cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    try:
        key = path.read_bytes()
        if len(key) == KEY_BYTES:
            return key
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        pass
    tmp = path.with_name(f".hmac.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(secrets.token_bytes(KEY_BYTES))
    try:
        os.link(tmp, path)  # first writer wins; everyone then reads the same key
    except FileExistsError:
        if path.is_dir():  # something put a folder there: take the name back
            _remove(path)
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path.read_bytes()


def sign(key: bytes, payload: object) -> str:
    """HMAC of a JSON-able payload (canonical form: sorted keys, no spaces)."""
    data = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def verify(key: bytes, payload: object, mac: object) -> bool:
    return isinstance(mac, str) and hmac.compare_digest(sign(key, payload), mac)


def name_for(key: bytes, name: str) -> str:
    """A name only the key holder can compute (where the harness keeps its lock files)."""
    return hmac.new(key, name.encode(), hashlib.sha256).hexdigest()[:32]


def _remove(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
