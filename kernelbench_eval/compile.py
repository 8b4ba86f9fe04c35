"""Stage 2: build each candidate by importing it in a fresh process, cached by content.

`load_inline` compiles at import time, so "compiling" a candidate means importing it. Each source gets
its own extension directory keyed by its SHA-256, the torch version and the device kind: an unchanged
candidate is never rebuilt, and two candidates never share (or clobber) a build.
"""

from __future__ import annotations

import fcntl
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from kernelbench_eval.discover import Candidate
from kernelbench_eval.models import CompileRecord, WorkerRequest
from kernelbench_eval.process import WorkerFailure, WorkerProcess
from kernelbench_eval.record import write_atomic

RECORD_NAME = "compile.json"


@dataclass
class Compiled:
    record: CompileRecord
    build_dir: Path
    cached: bool


def build_dir(cache_dir: Path, candidate: Candidate, device: str) -> Path:
    torch_tag = torch.__version__.replace("+", "_")
    return cache_dir / "builds" / f"{candidate.source_sha256[:24]}-{torch_tag}-{device}"


def extension_env(build: Path) -> dict[str, str]:
    """The environment that points `load_inline` at this candidate's own build directory."""
    return {"TORCH_EXTENSIONS_DIR": str(build / "ext")}


def compile_candidate(
    candidate: Candidate, device: str, cache_dir: Path, log_path: Path, timeout: float
) -> Compiled:
    """Import the candidate once in isolation, unless this exact source already built on this setup.

    An exclusive lock per build directory makes identical sources (in this run or in another run sharing
    the cache) build once: the second waits, then finds the record.
    """
    build = build_dir(cache_dir, candidate, device)
    with build_lock(build):
        return _compile_locked(candidate, build, log_path, timeout)


@contextmanager
def build_lock(build: Path) -> Iterator[None]:
    """Held by whoever imports a candidate from `build` (its compile, and each evaluation's load).

    `load_inline` guards its build folder with a lock file it deletes when done (torch's FileBaton); a
    process killed while holding it (a harness killed mid-run, a candidate killed at its timeout) leaves
    the file behind, and every later import of that source waits for it forever. Since every import of a
    build happens under this lock, any such file found once we hold it is stale, and is removed.
    """
    build.parent.mkdir(parents=True, exist_ok=True)
    with open(build.with_name(build.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for stale in (build / "ext").glob("*/lock"):
            stale.unlink(missing_ok=True)
        yield


def _compile_locked(candidate: Candidate, build: Path, log_path: Path, timeout: float) -> Compiled:
    record_path = build / RECORD_NAME
    if record_path.exists():
        record = CompileRecord.model_validate_json(record_path.read_text())
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(f"compile cached: {build}\n" + _cached_log(build))
        return Compiled(record, build, cached=True)
    build.mkdir(parents=True, exist_ok=True)
    record = _import_once(candidate, build, log_path, timeout)
    if not record.timed_out:  # a timeout may be the machine's fault: try again next run
        shutil.copyfile(log_path, build / "compile.log")
        write_atomic(record_path, record.model_dump_json())
    return Compiled(record, build, cached=False)


def _import_once(candidate: Candidate, build: Path, log_path: Path, timeout: float) -> CompileRecord:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kbeval-compile-") as workdir:
        worker = WorkerProcess(Path(workdir), log_path, extension_env(build))
        req = WorkerRequest(op="import", path=str(candidate.path.resolve()), class_name="ModelNew")
        try:
            with worker:
                reply = worker.request(req, timeout)
        except WorkerFailure as failure:
            timed_out = failure.status == "timeout"
            return CompileRecord(
                ok=False,
                status="compile_error" if timed_out else failure.status,
                error=f"compile gave {failure.message}" if timed_out else failure.message,
                timed_out=timed_out,
                seconds=time.perf_counter() - started,
            )
    return CompileRecord(
        ok=reply.ok,
        status=None if reply.ok else (reply.error_kind or "load_error"),
        error=reply.error,
        seconds=time.perf_counter() - started,
        torch_version=reply.torch_version or "",
    )


def _cached_log(build: Path) -> str:
    log = build / "compile.log"
    return log.read_text(errors="replace") if log.exists() else ""
