"""A precompiled `torch/extension.h` for the builds' `main.cpp`, made once per compiler and flag set by the harness.

Why: every `load_inline` build compiles a `main.cpp` that is `#include <torch/extension.h>` and the bindings:
13.7 s of CPU alone on an H200 host, 17 s each with 16 at once, of a CUDA build's 70 (nvcc's unit is the rest).
With the header precompiled it takes 5.6-6.6 s (docs/benchmarks.md, "Precompiled headers"): where builds are
bound by CPU (many distinct candidates), that is work the cores do for the next build instead.

How, without touching a build's command or files: gcc looks for `X.h.gch` in each include folder just before it
looks for `X.h` there, and CPATH folders come before the `-isystem` ones `load_inline` names for torch. A folder
holding only `torch/extension.h.gch`, first on a build's CPATH, is used by `main.cpp`'s first line when the
build's flags match those it was made with (gcc checks; otherwise it reads the header as before, silently), and
ninja does not record it among the object's dependencies, so no build needs it again (a later load, another
node). The flags are `load_inline`'s own for a `main.cpp` without extra flags, read from the `build.ninja`
torch writes for them, less the extension's name.

Trust: a candidate's code would reach every later build through this file, so only the harness writes it (in
the background, on the builds' cores, under a lock, renamed into place, its digest signed with the cache's key),
the harness checks the folder once per process before any build is pointed at it, and a build worker puts it
on its CPATH only where Landlock confines that worker's writes (`enter`), so nothing a candidate runs can rewrite
it meanwhile. `KBEVAL_PCH`: `auto` (default: CUDA builds, made when a run has more builds than run at once, or
used when made before), `on` (CPU builds too, made for any run with a build), `off`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pydantic import BaseModel

from kernelbench_eval import interrupts
from kernelbench_eval.containment import SandboxRecord
from kernelbench_eval.isolation import cores, landlock, sandbox
from kernelbench_eval.isolation.workerenv import PACKAGE_ROOT, worker_env
from kernelbench_eval.store import keys, locks, paths

MODE_VAR = "KBEVAL_PCH"
DIR_VAR = "KBEVAL_PCH_DIR"  # the harness names the folder; a build worker moves it onto CPATH (`enter`)
HEADER = "#include <torch/extension.h>\n"
GCH = "torch/extension.h.gch"
RECORD = "pch.json"
TIMEOUT_S = 1800.0  # a precompile takes 30 s on an idle core, 200 s on a busy 2-core box
LOCK_WAIT_S = TIMEOUT_S + 60  # another run making the same header


class PchRecord(BaseModel):
    """How a header was precompiled (what its key is made of), and the digest of what came out."""

    torch_version: str
    cxx: str
    cxx_version: str
    cflags: str
    post_cflags: str
    header: str
    gch_sha256: str = ""
    seconds: float = 0.0

    def key(self) -> str:
        made_of = self.model_dump(exclude={"gch_sha256", "seconds"})
        return hashlib.sha256(json.dumps(made_of, sort_keys=True).encode()).hexdigest()


def mode(environ: os._Environ[str] | dict[str, str] = os.environ) -> str:
    raw = environ.get(MODE_VAR, "auto").strip().lower()
    return {"0": "off", "no": "off", "false": "off", "1": "on", "yes": "on", "true": "on"}.get(raw, raw)


def wanted(device: str) -> bool:
    """Whether this run's builds may use a precompiled header (see the module's docstring for why Landlock)."""
    chosen = mode()
    if chosen == "off" or (chosen != "on" and device != "cuda"):
        return False
    return "landlock" not in sandbox.disabled() and landlock.abi() > 0


class _Header:
    """One cache's header for one kind of build (CUDA or not), as this process knows it: found or made in a
    thread of its own, so that no build waits for it (the builds that start before it is ready go without)."""

    def __init__(self, cache_dir: Path, with_cuda: bool, make: bool) -> None:
        self.cache_dir, self.with_cuda, self.make = cache_dir, with_cuda, make
        self.folder: Path | None = None
        self.error: str | None = None
        self.done = threading.Event()
        threading.Thread(target=self._run, name="kbeval-pch", daemon=True).start()

    def _run(self) -> None:
        try:
            self.folder = prepare(self.cache_dir, self.with_cuda, self.make)
        except Exception as exc:  # noqa: BLE001  (no header: builds go on as they would without one)
            self.error = f"{type(exc).__name__}: {exc}"[:300]
        except interrupts.Interrupted:  # the run is ending: no header, and nothing of it recorded
            self.error = "interrupted"
        finally:
            self.done.set()


_headers: dict[tuple[Path, bool], _Header] = {}
_headers_lock = threading.Lock()


def plan(cache_dir: Path, device: str, builds: int, at_once: int) -> None:
    """Before a run's builds: find this setup's header (and make it when `auto` says the run will use it, or `on`)."""
    if builds < 1 or not wanted(device):
        return
    make = mode() == "on" or builds > at_once  # the builds after the first `at_once` find it made
    key = (cache_dir.resolve(), device == "cuda")
    with _headers_lock:
        known = _headers.get(key)
        if known is None or (make and not known.make and known.done.is_set() and known.folder is None):
            _headers[key] = _Header(key[0], key[1], make)


def env(cache_dir: Path, device: str) -> dict[str, str]:
    """What a build worker's environment gets: the header's folder, when it is ready and this run may use it."""
    header = _headers.get((cache_dir.resolve(), device == "cuda"))
    if header is None or header.folder is None or not wanted(device):
        return {}
    return {DIR_VAR: str(header.folder)}


def wait(cache_dir: Path, device: str, timeout: float) -> Path | None:
    """The header's folder once its thread is done (None: none), for benches and tests."""
    header = _headers.get((cache_dir.resolve(), device == "cuda"))
    if header is None or not header.done.wait(timeout):
        return None
    return header.folder


def enter(record: SandboxRecord | None) -> None:
    """In a build worker, before candidate code: the harness's header goes first on CPATH if Landlock holds
    this worker's writes (else the folder is forgotten: a process that could rewrite it must not use it)."""
    folder = os.environ.pop(DIR_VAR, None)
    if folder and record is not None and record.landlock_fs:
        os.environ["CPATH"] = os.pathsep.join(filter(None, [folder, os.environ.get("CPATH")]))


def prepare(cache_dir: Path, with_cuda: bool, make: bool) -> Path | None:
    """The verified folder of this setup's header, made first if missing and `make`; None if there is none."""
    build_env = _build_env()
    record = discover(with_cuda, build_env)
    key = record.key()
    folder = cache_dir / "pch" / key[:24]
    signing = keys.load_key(cache_dir)
    with locks.hold(cache_dir / "locks" / f"{keys.name_for(signing, 'pch-' + key[:24])}.lock", wait=LOCK_WAIT_S):
        if verified(folder, signing, key):
            return folder
        if not make:
            return None
        (cache_dir / "pch").mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".making-", dir=cache_dir / "pch"))
        try:
            made = precompile(record, staging, build_env)
            payload = made.model_dump(mode="json")
            (staging / RECORD).write_text(json.dumps({"record": payload, "mac": keys.sign(signing, payload)}))
            paths.clear(folder)
            staging.rename(folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return folder if verified(folder, signing, key) else None


def verified(folder: Path, signing: bytes, key: str) -> bool:
    """The folder holds exactly the harness's record and the header it describes (signature, key, digest), and
    nothing else: any other file in it would be found on the builds' CPATH before torch's own headers."""
    try:
        if folder.is_symlink() or not folder.is_dir():
            return False
        found = {str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir() or p.is_symlink()}
        if found != {RECORD, GCH} or (folder / GCH).is_symlink():
            return False
        stored = json.loads((folder / RECORD).read_text())
        record = PchRecord.model_validate(stored["record"])
        return (keys.verify(signing, stored["record"], stored.get("mac")) and record.key() == key
                and _sha256(folder / GCH) == record.gch_sha256)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def discover(with_cuda: bool, build_env: dict[str, str]) -> PchRecord:
    """`load_inline`'s compiler and `main.cpp` flags, from the `build.ninja` torch writes for an extension without
    extra flags (in a fresh interpreter: with CUDA, torch would otherwise initialise the device to pick archs)."""
    with tempfile.TemporaryDirectory(prefix="kbeval-pch-flags-") as tmp:
        env = build_env | {"TORCH_CUDA_ARCH_LIST": build_env.get("TORCH_CUDA_ARCH_LIST") or "9.0"}  # not main.cpp's
        code = ("import sys; from kernelbench_eval.building.pch import _write_ninja; "
                "_write_ninja(sys.argv[1], sys.argv[2])")
        _run([sys.executable, "-c", code, tmp, "cuda" if with_cuda else "cpu"], env, 300)
        ninja = (Path(tmp) / "build.ninja").read_text()
    cxx = _ninja_var(ninja, "cxx") or "c++"
    version = _run([*shlex.split(cxx), "--version"], build_env, 60).splitlines()
    cflags = re.sub(r"-DTORCH_EXTENSION_NAME=\S+\s*", "", _ninja_var(ninja, "cflags")).strip()
    import torch

    return PchRecord(torch_version=torch.__version__, cxx=cxx, cxx_version=version[0] if version else "",
                     cflags=cflags, post_cflags=_ninja_var(ninja, "post_cflags"), header=HEADER)


def precompile(record: PchRecord, folder: Path, build_env: dict[str, str]) -> PchRecord:
    """Compile `record.header` into `folder/GCH` with the record's flags; the wrapper source is removed after."""
    source = folder / "source" / "kbeval_pch.h"
    source.parent.mkdir()
    source.write_text(record.header)
    (folder / GCH).parent.mkdir(parents=True)
    started = time.monotonic()
    _run([*shlex.split(record.cxx), *shlex.split(record.cflags), "-x", "c++-header", str(source), "-o",
          str(folder / GCH), *shlex.split(record.post_cflags)], build_env, TIMEOUT_S)
    shutil.rmtree(source.parent)
    return record.model_copy(update={"gch_sha256": _sha256(folder / GCH), "seconds": time.monotonic() - started})


def _write_ninja(folder: str, device: str) -> None:
    """(In the flag-reading interpreter.) The `build.ninja` `load_inline` would write for an extension of two
    empty sources and no extra flags."""
    from torch.utils import cpp_extension

    sources = [f"{folder}/main.cpp"] + ([f"{folder}/cuda.cu"] if device == "cuda" else [])
    cpp_extension._write_ninja_file_to_build_library(
        path=f"{folder}/build.ninja", name="kbeval_pch", sources=sources, extra_cflags=[], extra_cuda_cflags=[],
        extra_sycl_cflags=[], extra_ldflags=[], extra_include_paths=[], with_cuda=device == "cuda",
        with_sycl=False, is_standalone=False)


def _build_env() -> dict[str, str]:
    """The environment a build worker compiles in (the allow-listed variables), with the package importable."""
    path = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))
    return worker_env(os.environ) | {"PYTHONPATH": path}


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> str:
    """Run on the builds' cores (this thread's affinity is what a child starts with), never on the lanes'."""
    builds = cores.parse(os.environ.get(cores.ENV, ""))
    if builds:
        os.sched_setaffinity(threading.get_native_id(), builds)
    interrupts.check()
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:  # its own group: an interrupt kills the whole compiler
        handle = interrupts.track(lambda: os.killpg(proc.pid, signal.SIGKILL))
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        finally:
            interrupts.untrack(handle)
    interrupts.check()
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd[:3])} ... exited {proc.returncode}: {stderr.strip()[-300:]}")
    return stdout


def _ninja_var(text: str, name: str) -> str:
    found = re.search(rf"^{name} = (.*)$", text, re.M)
    return found.group(1).strip() if found else ""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            digest.update(chunk)
    return digest.hexdigest()
