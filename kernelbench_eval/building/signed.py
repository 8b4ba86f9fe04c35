"""The harness's signed record of a build (`compile.json`): its outcome, the digest of every artifact, its log's.

A build folder's name is computable from any source's bytes, so a candidate (same user) can write into another's
build. Nothing there is believed unless the record carries the harness's MAC (`keys`) and every artifact still
matches its digest: a record that does not verify, or artifacts that do not match it, mean a rebuild, never a
load. Apart from `compile` because the record is read and written by more than the build (a Ray node adopting a
build it fetched: `adopt`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from kernelbench_eval.records import CompileRecord
from kernelbench_eval.store import keys
from kernelbench_eval.store.atomic import write_atomic

RECORD_NAME = "compile.json"
UNHASHED = frozenset({"lock", ".ninja_log", ".ninja_deps"})  # rewritten by load_inline/ninja on every load


def artifact_digests(build: Path) -> dict[str, str]:
    """sha256 of every file under the build's extension folder and Triton cache (links by target), the lock
    files aside; a Triton file is named `../triton/...` (from the extension folder, as before it existed)."""
    digests: dict[str, str] = {}
    ext = build / "ext"
    paths = [p for folder in (ext, build / "triton") if folder.is_dir() for p in sorted(folder.rglob("*"))]
    for path in paths:
        rel = os.path.relpath(path, ext)
        if path.is_symlink():
            digests[rel] = "link:" + os.readlink(path)
        elif path.is_file() and path.name not in UNHASHED:
            digests[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def verified(build: Path, key: bytes) -> CompileRecord | None:
    """The record if it is the harness's own (signature) and the artifacts are as built; else None."""
    try:
        stored = json.loads((build / RECORD_NAME).read_text())
        payload = {k: stored[k] for k in ("record", "artifacts", "log_sha256")}
        if not keys.verify(key, payload, stored.get("mac")) or payload["artifacts"] != artifact_digests(build):
            return None
        return CompileRecord.model_validate(payload["record"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write_record(build: Path, key: bytes, record: CompileRecord, log: str) -> None:
    payload = {"record": record.model_dump(mode="json"), "artifacts": artifact_digests(build),
               "log_sha256": hashlib.sha256(log.encode()).hexdigest()}
    write_atomic(build / RECORD_NAME, json.dumps(payload | {"mac": keys.sign(key, payload)}))


def adopt(build: Path, record: CompileRecord) -> None:
    """A build that arrived from another node (its bytes checked by `artifacts.unpack`), signed with this
    cache's key so that its loads verify here. Call it under `compile.build_lock(build, verify=False)`."""
    log_file = build / "compile.log"
    write_record(build, keys.load_key(build.parent.parent), record,
                 log_file.read_text(errors="replace") if log_file.exists() else "")


def cached_log(build: Path, key: bytes) -> str:
    """The first build's log, when it is the one the harness recorded (a forged log is not shown)."""
    try:
        log = (build / "compile.log").read_text(errors="replace")
        stored = json.loads((build / RECORD_NAME).read_text())
    except (OSError, ValueError):
        return ""
    return log if hashlib.sha256(log.encode()).hexdigest() == stored.get("log_sha256") else ""
