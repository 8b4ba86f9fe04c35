"""OS containment of every process that runs candidate code (its build and its evaluation).

Why: a candidate runs as the harness's user (root on our machines). Unconfined it could stop or re-pin the
reference's worker while the reference is timed, read the checker's memory, rewrite verdicts, caches and
baselines, reach the network, or leave a daemon that edits its verdict after the run. Each worker
therefore confines itself right after it starts, single-threaded and before it runs a line of candidate
code, in its own process (no helper binary, no extra `import torch`); the harness puts it in a cgroup of
its own beforehand and kills that cgroup whole when its work ends. In order:

1. `netns`: a network namespace of its own, with no interface up (no TCP, UDP or anything else out);
2. `caps`: every capability dropped for good (`capabilities.py`), so root is an ordinary user that cannot
   read or re-schedule processes holding capabilities or non-dumpable (the checker, the harness, the fork
   server, other workers);
3. CUDA initialised (a CUDA run only), since `cuInit` needs what comes next would refuse;
4. `landlock`: writes only to the worker's own folder (and, for a build, its build folder), device files,
   and its own /proc entries; ptrace, signals and abstract unix sockets confined to its own processes;
   TCP refused;
5. `seccomp`: ptrace, process_vm_*, pidfd_*, kcmp, namespaces, mounts, io_uring, and changing another
   process's scheduling, affinity or limits refused (`seccomp.py`);
6. `cgroup` (harness side, `cgroups.py`): its own cgroup v2 leaf, killed with `cgroup.kill` when its work
   ends, before its verdict is recorded.

The harness builds each worker's `SandboxSpec` (the layers it wants and where the worker may write); the
worker applies what the platform allows and reports a `SandboxRecord` on its reply pipe before it reads
its first request, i.e. before any candidate code runs, so the report cannot be forged. Where a layer is
refused, the run goes on with one warning line, and each verdict's `sandbox` says what held.

`KBEVAL_SANDBOX_OFF` (`all`, or some of `cgroup,netns,caps,landlock,seccomp`) turns layers off, for tests
that show an attack works without them. Only the harness reads it: workers get an allow-listed environment.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Literal

from kernelbench_eval.containment import SandboxRecord, SandboxSpec
from kernelbench_eval.isolation import capabilities, cgroups, landlock, seccomp
from kernelbench_eval.messages import SandboxReply

SPEC_VAR = "KBEVAL_SANDBOX_SPEC"  # the spec, in the worker's environment (popped before candidate code runs)
OFF_VAR = "KBEVAL_SANDBOX_OFF"
LAYERS = ("cgroup", "netns", "caps", "landlock", "seccomp")
_CLONE_NEWNET = 0x40000000
_PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS = 4, 38
_libc = ctypes.CDLL(None, use_errno=True)
_pinned: list[int] = []  # O_PATH fds held for the worker's life (see `_own_proc`)
_warned: set[str] = set()
_warn_lock = threading.Lock()


# -- harness side ---------------------------------------------------------------------------------------------


def disabled() -> set[str]:
    """Layers turned off by the harness's environment (tests)."""
    raw = os.environ.get(OFF_VAR, "").replace(" ", "")
    if raw in ("all", "1"):
        return set(LAYERS)
    return {name for name in raw.split(",") if name in LAYERS}


def spec(writable: list[Path], device: str, role: Literal["build", "evaluate"]) -> SandboxSpec:
    """What a candidate's worker may do: write only to `writable` (made if missing), and which layers to try."""
    for path in writable:
        path.mkdir(parents=True, exist_ok=True)
    off = disabled()
    cuda: Literal["none", "init", "context"] = "none"
    if device == "cuda":
        cuda = "context" if role == "evaluate" else "init"  # an evaluation needs a context anyway
    return SandboxSpec(writable=[str(p) for p in writable], cuda=cuda,
                       layers=[name for name in LAYERS if name not in off])


def join_leaf(spec_: SandboxSpec, pid: int) -> tuple[cgroups.Leaf | None, str | None]:
    """Put worker `pid` in a cgroup leaf of its own (before it is sent any request): (leaf, why not)."""
    if "cgroup" not in spec_.layers:
        return None, "turned off"
    try:
        leaf = cgroups.Leaf()
    except OSError as exc:
        return None, str(exc)
    try:
        leaf.add(pid)
    except OSError as exc:
        leaf.kill()
        return None, f"cgroup v2: {exc.strerror or exc}"
    return leaf, None


def warn(record: SandboxRecord) -> None:
    """One warning line on stderr per distinct shortfall: the run goes on, the verdicts say what held."""
    if not record.uncontained:
        return
    why = "; ".join(f"{layer}: {reason}" for layer, reason in sorted(record.missing.items()))
    line = (f"kbeval: warning: candidates are NOT contained against {', '.join(record.uncontained)} on this "
            f"machine ({why}); each verdict's `sandbox` records what held")
    with _warn_lock:
        if line in _warned:
            return
        _warned.add(line)
    print(line, file=sys.stderr, flush=True)


def probe(timeout: float = 60.0) -> SandboxRecord:
    """Apply every layer in a throwaway process (and a cgroup leaf around it): what this machine allows."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kbeval-probe-") as tmp:
        wanted = spec([Path(tmp)], "cpu", "build")
        # the package and whatever the harness itself imports from (a --target install of pydantic, say): a
        # probe that cannot import the package reports every layer refused on a machine that allows them all
        path = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")]))
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": path, SPEC_VAR: wanted.model_dump_json()}
        proc = subprocess.Popen([sys.executable, "-m", "kernelbench_eval.isolation.sandbox", "--probe"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp)
        leaf, why = join_leaf(wanted, proc.pid)
        try:
            out, err = proc.communicate(b"go\n", timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        finally:
            if leaf is not None:
                leaf.kill()
    try:
        record = SandboxRecord.model_validate_json(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        record = SandboxRecord(missing={"all": f"the probe failed: {err.decode(errors='replace')[-300:]}"})
    return finish(record, leaf is not None, why)


def finish(record: SandboxRecord, in_leaf: bool, why: str | None) -> SandboxRecord:
    """The worker's own report, with what the harness did around it (the cgroup)."""
    record.cgroup = in_leaf
    if why:
        record.missing["cgroup"] = why
    return record.settle()


# -- worker side ----------------------------------------------------------------------------------------------


def enter_and_report(reply_fd: int) -> SandboxRecord | None:
    """A worker's first act: confine itself as the harness asked (if it did) and say so on its reply pipe."""
    record = enter_from_env()
    if record is not None:
        data = (SandboxReply(ok=True, sandbox=record).model_dump_json() + "\n").encode()
        while data:
            data = data[os.write(reply_fd, data):]
    return record


def enter_from_env() -> SandboxRecord | None:
    """In a new worker, before any candidate code: apply the spec the harness set, if any; what held."""
    raw = os.environ.pop(SPEC_VAR, None)
    if raw is None:
        return None
    try:
        wanted = SandboxSpec.model_validate_json(raw)
    except ValueError as exc:
        return SandboxRecord(missing={"all": f"unreadable sandbox spec: {exc}"[:300]}).settle()
    return apply(wanted)


def apply(wanted: SandboxSpec) -> SandboxRecord:
    """Apply the layers of `wanted`, in the order the module docstring gives; never raises."""
    record, layers = SandboxRecord(), set(wanted.layers)
    for layer in ("netns", "caps", "landlock", "seccomp"):
        if layer not in layers:
            record.missing[layer] = "turned off"
    if "netns" in layers:
        record.netns = _step(record, "netns", lambda: _check(_libc.unshare(_CLONE_NEWNET), "unshare"))
    had_capabilities = capabilities.held()
    if "caps" in layers:
        record.caps_dropped = _step(record, "caps", capabilities.drop_all)
    if wanted.cuda != "none":
        with contextlib.suppress(Exception):  # a worker without a usable GPU fails later, as it would anyway
            _init_cuda(wanted.cuda)
    record.no_new_privs = _step(record, "no_new_privs", lambda: _check(_prctl(_PR_SET_NO_NEW_PRIVS, 1), "prctl"))
    if "landlock" in layers:
        def confine() -> None:
            done = landlock.restrict([Path(p) for p in wanted.writable] + _own_proc(), _device_files(),
                                     threads=_threads())
            record.landlock_abi, record.landlock_fs, record.landlock_net = done.abi, done.fs, done.net
            record.landlock_scopes, record.landlock_all_threads = done.scopes, done.all_threads
        _step(record, "landlock", confine)
    if "seccomp" in layers:
        signals = not record.landlock_scopes  # Landlock cannot scope signals here: refuse them by pid instead
        record.seccomp = _step(record, "seccomp", lambda: seccomp.install(signals))
        record.seccomp_signals = record.seccomp and signals
    if record.caps_dropped and had_capabilities:  # run as root: only the harness may read its memory now
        _prctl(_PR_SET_DUMPABLE, 0)  # (not as a user: the harness reads its /proc files to find what it left)
    return record.settle()


def _step(record: SandboxRecord, layer: str, action) -> bool:  # noqa: ANN001
    try:
        action()
    except Exception as exc:  # noqa: BLE001  (a refused layer is recorded, never fatal)
        record.missing[layer] = f"{type(exc).__name__}: {exc}"[:200]
        return False
    return True


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _prctl(option: int, arg2: int) -> int:
    return _libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg2), ctypes.c_ulong(0), ctypes.c_ulong(0),
                       ctypes.c_ulong(0))


def _threads() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 1


def _init_cuda(how: str) -> None:
    import torch

    torch.cuda.init()
    if how == "context":
        torch.cuda.synchronize()  # creates the primary context on the worker's device


def _own_proc() -> list[Path]:
    """/proc/<pid>/task, where CUDA names its threads; pinned open, so the rule's inode stays the same."""
    path = Path(f"/proc/{os.getpid()}/task")
    with contextlib.suppress(OSError):
        _pinned.append(os.open(path, os.O_PATH | os.O_CLOEXEC))
    return [path]


def _device_files() -> list[Path]:
    """Character devices (GPUs, /dev/null...) directly in /dev and in /dev/nvidia-caps: writable."""
    found: list[Path] = []
    for folder in (Path("/dev"), Path("/dev/nvidia-caps")):
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            found += [Path(e.path) for e in entries if stat.S_ISCHR(e.stat(follow_symlinks=False).st_mode)]
    return found


def main() -> None:
    """`--probe` (`probe`): wait until placed in a leaf, apply, print the record. `--reply-fd N`: a cold
    candidate worker (no fork server), confined before it imports torch (whose import starts a thread, and
    Landlock, capabilities and namespaces are per thread), then the worker itself."""
    import argparse
    import runpy

    parser = argparse.ArgumentParser(description="kbeval sandbox entry (started by the harness, not by hand)")
    parser.add_argument("--probe", action="store_true")
    parser.add_argument("--reply-fd", type=int)
    args = parser.parse_args()
    if args.probe:
        sys.stdin.readline()
        record = enter_from_env() or SandboxRecord(missing={"all": "no spec"})
        print(json.dumps(record.model_dump(mode="json")), flush=True)
        return
    enter_and_report(args.reply_fd)
    sys.argv = ["", "--reply-fd", str(args.reply_fd)]  # argv[0] becomes the module's path, as with -m
    runpy.run_module("kernelbench_eval.worker.main", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
