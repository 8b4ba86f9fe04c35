"""Stage 2: build each candidate by importing it in a fresh process, cached by content.

`load_inline` compiles at import time, so "compiling" a candidate means importing it. Each source gets
its own extension directory keyed by its SHA-256, the torch version and the device kind: an unchanged
candidate is never rebuilt, and two candidates never share (or clobber) a build.

A candidate that compiles kernels at its first call (Triton) is also called once on problem-shaped inputs in
the build worker (`warmup`), so its kernels land in the build's own Triton cache before judging; the inputs
that warm-up used are part of the build's name, and its time is part of the compile's.

A build folder's name is computable from any source's bytes, so a candidate (same user) can write into
another's. Hence the record the harness keeps (`compile.json`) is signed and lists the digest of every
artifact (`signed`); a record that does not verify, or artifacts that do not match it, are thrown away and
rebuilt, never loaded. Locks live under `<cache>/locks/`, named by the key, and are waited on for a
bounded time (`locks`).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from kernelbench_eval import interrupts
from kernelbench_eval.building import nvcc, pch
from kernelbench_eval.building.jitwarmup import WarmupSpec, build_env, needs_warmup
from kernelbench_eval.building.relocate import rewrite_triton
from kernelbench_eval.building.signed import cached_log, verified, write_record
from kernelbench_eval.discover.corpus import Candidate
from kernelbench_eval.isolation import sandbox
from kernelbench_eval.isolation.process import WorkerFailure, WorkerProcess
from kernelbench_eval.records import CompileRecord
from kernelbench_eval.requests import ImportRequest
from kernelbench_eval.store import keys, locks, paths
from kernelbench_eval.store.atomic import write_atomic


class BuildTampered(OSError):
    """A build's artifacts no longer match the harness's signed record: rebuild it, do not load it."""


@dataclass
class Compiled:
    record: CompileRecord
    build_dir: Path
    cached: bool


def build_dir(cache_dir: Path, candidate: Candidate, device: str, warm: WarmupSpec | None = None) -> Path:
    """`<sha>-<torch>-<device>`, plus `-w<inputs>` for a build warmed up (`warmup_for`) on given inputs, and
    `-n<setting>` where nvcc's commands go through `nvcc` (its `build.ninja` differs)."""
    torch_tag = torch.__version__.replace("+", "_")
    suffix = (f"-w{warm.key()}" if warm is not None else "") + nvcc.tag()
    return cache_dir / "builds" / f"{candidate.source_sha256[:24]}-{torch_tag}-{device}{suffix}"


def warmup_for(candidate: Candidate, warm: WarmupSpec | None) -> WarmupSpec | None:
    """`warm` if this candidate's source needs a build-stage warm-up (Triton), else None."""
    try:
        source = candidate.path.read_text(errors="replace")
    except OSError:
        return None  # its import fails with the reason
    return warm if warm is not None and needs_warmup(source) else None


def extension_env(build: Path, triton: Path | None = None) -> dict[str, str]:
    """The environment that points `load_inline` (and Triton's cache) at this candidate's own build directory,
    and its nvcc commands at `nvcc` (the same for its build and every load, so ninja finds nothing to redo);
    `triton`: a private copy of the build's Triton cache instead (`private_triton`)."""
    env = build_env(build) | nvcc.env()
    if triton is not None:
        env["TRITON_CACHE_DIR"] = str(triton)
    return env


def private_triton(build: Path, dest: Path) -> None:
    """Copy the build's Triton cache to `dest`, its group files naming the copy. Call it under `build_lock`.

    Why: Triton reads a kernel's binary at its first call, after the build's lock is released, and writes
    whatever it compiles then into its cache; reading the verified copy, and writing there, keeps both out
    of the signed build (which another candidate could otherwise alter between the check and the read).
    """
    if (build / "triton").is_dir():
        shutil.copytree(build / "triton", dest, symlinks=True, dirs_exist_ok=True)
        rewrite_triton(dest, build / "triton", dest)


def compile_candidate(candidate: Candidate, device: str, cache_dir: Path, log_path: Path, timeout: float,
                      warm: WarmupSpec | None = None, warm_here: bool = True) -> Compiled:
    """Import the candidate once in isolation, unless this exact source already built on this setup.

    With `warm` (the problem and the run's input settings), a candidate that JIT-compiles at its first call is
    then called once in the same worker (`warmup`); `warm_here=False` leaves that to `warm_build` where the
    device is (a Ray compile task holds no GPU).
    An exclusive lock per build directory makes identical sources (in this run or in another run sharing
    the cache) build once: the second waits, then finds the record.
    """
    names = warm  # the problem and sizes whose module-level names the candidate's import sees (KernelBench's)
    warm = warmup_for(candidate, warm)
    build = build_dir(cache_dir, candidate, device, warm)
    spec = _Warm(warm, device) if warm is not None and warm_here else None
    for attempt in range(2):  # a file error (something planted in the cache) gets one clean retry
        try:
            with build_lock(build, verify=False):
                return _compile_locked(candidate, build, log_path, timeout, device, spec, names)
        except OSError as exc:
            error = f"build folder unusable: {exc}"
            if attempt == 0 and not isinstance(exc, locks.LockError):
                with contextlib.suppress(OSError):
                    paths.clear(build)
    return Compiled(CompileRecord(ok=False, status="compile_error", error=error), build, cached=False)


@contextmanager
def build_lock(build: Path, verify: bool = True) -> Iterator[None]:
    """Held by whoever imports a candidate from `build` (its compile, and each evaluation's load).

    `load_inline` guards its build folder with a lock file it deletes when done (torch's FileBaton); a
    process killed while holding it (a harness killed mid-run, a candidate killed at its timeout) leaves
    the file behind, and every later import of that source waits for it forever. Since every import of a
    build happens under this lock, any such file found once we hold it is stale, and is removed.
    With `verify` (a load), the artifacts must still match the signed record, else `BuildTampered`.
    """
    key = keys.load_key(build.parent.parent)
    with locks.hold(build.parent.parent / "locks" / f"{keys.name_for(key, build.name)}.lock"):
        for stale in (build / "ext").glob("*/lock"):
            stale.unlink(missing_ok=True)
        if verify and verified(build, key) is None:
            raise BuildTampered(f"{build}: build artifacts do not match the harness's record; rebuilding")
        yield


class _Warm(NamedTuple):
    spec: WarmupSpec  # the problem and the input settings the warm-up call uses
    device: str


def _compile_locked(candidate: Candidate, build: Path, log_path: Path, timeout: float, device: str,
                    warm: _Warm | None, names: WarmupSpec | None = None) -> Compiled:
    key = keys.load_key(build.parent.parent)
    record = verified(build, key)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if record is not None:
        log_path.write_text(f"compile cached: {build}\n" + cached_log(build, key))
        if warm is None or not record.ok or record.warmup_seconds is not None:
            return Compiled(record, build, cached=True)
        return Compiled(_warm_locked(candidate, build, log_path, timeout, warm, record, key), build, cached=False)
    paths.clear(build)  # whatever is there was not built (or no longer is as built) by the harness
    build.mkdir(parents=True, exist_ok=True)
    record = _import_once(candidate, build, log_path, timeout, device, warm, names)
    interrupts.check()  # a build cut short by a stop is no build: nothing of it is recorded
    if not record.timed_out:  # a timeout may be the machine's fault: try again next run
        log = log_path.read_text(errors="replace") if log_path.exists() else ""
        write_atomic(build / "compile.log", log)
        write_record(build, key, record, log)
    else:  # nothing of it is kept: a record it planted there (candidates can read the key) must not be found
        paths.clear(build)
    return Compiled(record, build, cached=False)


def warm_build(candidate: Candidate, build: Path, warm: WarmupSpec, device: str, log_path: Path, timeout: float
               ) -> CompileRecord:
    """The warm-up of a build made without it (`warm_here=False`), in this process's environment (a Ray lane's
    GPU); its record updated (the warm-up's time added to the compile's) and signed again. Idempotent."""
    with build_lock(build):
        key = keys.load_key(build.parent.parent)
        record = verified(build, key)
        if record is None:
            raise BuildTampered(f"{build}: build artifacts do not match the harness's record; rebuilding")
        if not record.ok or record.warmup_seconds is not None:
            return record
        return _warm_locked(candidate, build, log_path, timeout, _Warm(warm, device), record, key)


def _warm_locked(candidate: Candidate, build: Path, log_path: Path, timeout: float, warm: _Warm,
                 built: CompileRecord, key: bytes) -> CompileRecord:
    """Warm a verified, unwarmed build (in a worker that imports it again, then calls it); record and sign it."""
    shutil.rmtree(build / "triton", ignore_errors=True)  # whatever is there is no warm-up of ours
    record = _import_once(candidate, build, log_path, timeout, warm.device, warm)
    interrupts.check()
    record = record.model_copy(update={"seconds": built.seconds + record.seconds})  # all of it is build work
    if not record.timed_out:
        log = (build / "compile.log").read_text(errors="replace") if (build / "compile.log").exists() else ""
        log += log_path.read_text(errors="replace") if log_path.exists() else ""
        write_atomic(build / "compile.log", log)
        write_record(build, key, record, log)
    return record


def _import_once(candidate: Candidate, build: Path, log_path: Path, timeout: float, device: str,
                 warm: _Warm | None, names: WarmupSpec | None = None) -> CompileRecord:
    """One build worker: import the candidate (building its extensions), then, with `warm`, its warm-up call.

    `timeout` bounds the two together: a warm-up is part of the compile. A warm-up that fails is the
    build's failure, named as such (`compile_error` for a kernel that does not compile, `load_error` for a
    constructor that does not fit, else `runtime_error`: `CandidateWorker.op_warmup`). The worker is confined
    (`sandbox`): it writes its build folder and its own temporary folder, nothing else.
    """
    started = time.perf_counter()
    warmup_seconds = None
    with tempfile.TemporaryDirectory(prefix="kbeval-compile-") as workdir:
        gpu = {"CUDA_VISIBLE_DEVICES": warm.spec.gpu} if warm and warm.spec.gpu is not None else {}
        confined = sandbox.spec([Path(workdir), build], device, "build")  # it writes its build and nothing else
        env = extension_env(build) | gpu | pch.env(build.parent.parent, device)  # the header, once it is made
        worker = WorkerProcess(Path(workdir), log_path, env, sandbox=confined, role="candidate")
        names = names or (warm.spec if warm else None)  # the candidate's module starts with the problem's names
        req = ImportRequest(path=str(candidate.path.resolve()), class_name="ModelNew",
                            problem=str(names.problem.resolve()) if names else None,
                            dims=dict(names.dims) if names else {})
        stage = "compile"
        try:
            with worker:
                reply = worker.request(req, timeout)
                if reply.ok and warm is not None:
                    stage, warm_started = "warm-up call", time.perf_counter()
                    left = max(1.0, timeout - (warm_started - started))
                    reply = worker.request(warm.spec.request(candidate.path, warm.device), left)
                    warmup_seconds = time.perf_counter() - warm_started
        except WorkerFailure as failure:
            timed_out = failure.status == "timeout"
            return CompileRecord(
                ok=False,
                status="compile_error" if timed_out else failure.status,
                error=f"{stage} gave {failure.message}" if timed_out or stage != "compile" else failure.message,
                timed_out=timed_out,
                seconds=time.perf_counter() - started,
                sandbox=worker.sandbox_record,
            )
    return CompileRecord(
        ok=reply.ok,
        status=None if reply.ok else (reply.error_kind or "load_error"),
        error=reply.error,
        seconds=time.perf_counter() - started,
        warmup_seconds=warmup_seconds,
        torch_version=reply.torch_version or "",
        sandbox=worker.sandbox_record,
    )
