"""Builds that travel: a build directory as bytes, so a node without a shared filesystem can use a build
made on another node (the Ray backend moves these bytes through Ray's object store).

Why a tar of the whole build directory: `load_inline` re-loads without rebuilding only when ninja finds
its sources, objects, `build.ninja`, `.ninja_log` and `.ninja_deps` as it left them (mtimes included),
so nothing short of the whole tree will do; the compile record and log travel with it. Lock files never
travel: a lock means something only on the node that holds it.

Why mtimes travel in the manifest, to the nanosecond: ninja (log v7) records for each output the exact mtime
of its newest input and rebuilds when an input is newer than that record. A tar carries mtimes as a float,
which moves a nanosecond mtime by up to ~100 ns either way, so an input could come out newer than its record
(a coin flip per file) and the build would be rebuilt. `unpack` sets every file's recorded mtime exactly.

Why a manifest: bytes that crossed a network and a cache must never become a loaded extension unless
they are exactly what was packed. Every file's SHA-256 is checked before the build becomes visible, and
it becomes visible all at once (unpacked beside its destination, then renamed into place).

What does not travel: the absolute path. torch's `build.ninja` (and Triton's cache) name files by absolute
path, so the manifest records where the build was made (`unpack` returns it) and `relocate` rewrites a
build unpacked under another path, so that it loads there without being rebuilt.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

MANIFEST = "kbeval-manifest.json"


class ArtifactError(Exception):
    """The bytes are not a build this module packed, or not as it packed them."""


def _travels(path: Path) -> bool:
    return path.is_file() and not path.is_symlink() and path.name != "lock" and not path.name.endswith(".lock")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pack(build: Path) -> bytes:
    """The build directory as a gzipped tar, manifest first. Hold the build's lock while packing."""
    files = sorted(p for p in build.rglob("*") if _travels(p))
    manifest = {"root": str(build), "files": {str(p.relative_to(build)): _digest(p) for p in files},
                "mtimes": {str(p.relative_to(build)): p.stat().st_mtime_ns for p in files}}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        blob = json.dumps(manifest, sort_keys=True).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size = len(blob)
        tar.addfile(info, io.BytesIO(blob))
        for path in files:
            tar.add(path, arcname=str(path.relative_to(build)), recursive=False)
    return buf.getvalue()


def manifest_of(data: bytes) -> dict:
    """The manifest of packed bytes: where the build was made, and each file's digest."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            member = tar.extractfile(MANIFEST)
            if member is None:
                raise ArtifactError("manifest is not a file")
            return json.loads(member.read())
    except (tarfile.TarError, KeyError, ValueError, OSError) as exc:
        raise ArtifactError(f"not a packed build: {exc}") from exc


def unpack(data: bytes, dest: Path) -> Path:
    """Verify and place a packed build at `dest`, replacing what is there; return where it was made (for
    `relocate`). Hold `dest`'s lock while calling.

    Raises ArtifactError, leaving `dest` untouched, when a file is missing, extra, or differs.
    """
    manifest = manifest_of(data)
    want: dict[str, str] = manifest["files"]
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            members = [m for m in tar.getmembers() if m.name != MANIFEST]
            if any(not m.isfile() for m in members) or sorted(m.name for m in members) != sorted(want):
                raise ArtifactError("the files do not match the manifest")
            tar.extractall(tmp, members=members, filter="data")
        for rel, digest in want.items():
            if _digest(tmp / rel) != digest:
                raise ArtifactError(f"{rel}: SHA-256 differs from the manifest")
        _restore_mtimes(tmp, manifest.get("mtimes", {}), want)
        if dest.exists():  # a torn or failed build of this node: the caller's lock says nobody uses it
            shutil.rmtree(dest)
        os.rename(tmp, dest)
        return Path(str(manifest["root"]))
    except (tarfile.TarError, OSError) as exc:
        raise ArtifactError(f"cannot unpack into {dest}: {exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _restore_mtimes(root: Path, mtimes: object, files: dict[str, str]) -> None:
    """Each file's mtime exactly as packed (the tar's own is rounded: see the module docstring)."""
    if not isinstance(mtimes, dict) or set(mtimes) != set(files):
        raise ArtifactError("the manifest's mtimes do not name its files")
    for rel, ns in mtimes.items():
        if type(ns) is not int or ns < 0:
            raise ArtifactError(f"{rel}: mtime in the manifest is not a count of nanoseconds")
        os.utime(root / rel, ns=(ns, ns))
