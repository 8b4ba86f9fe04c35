"""OS containment of candidate processes (issue 12, items 1 and 6): each layer, its probe, its record, real runs.

- Layer by layer (`test_each_layer_stops_what_its_record_claims`): a process applies one layer, then tries
  every attack primitive on a victim like the checker (root, non-dumpable); what it blocked must be exactly
  the attack classes its `SandboxRecord` counts as contained (so the record never claims a class no held
  layer stops), and with no layer at all every primitive works.
- Real runs over `fixtures/attacks_sandbox` (a problem, candidates that SIGSTOP, pin, read and ptrace the
  reference's worker, write into the results, cache and baselines, open a TCP connection to the test's
  listener, and leave a daemon that rewrites its verdict after the harness exits): once contained, once
  with every layer off (`KBEVAL_SANDBOX_OFF=all`), where each attack must work. Each test waits a few
  seconds after the harness exits and reads the verdicts again.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import FIXTURES, ROOT, pythonpath

from kernelbench_eval.building.compile import build_dir, compile_candidate
from kernelbench_eval.building.signed import RECORD_NAME, verified
from kernelbench_eval.containment import CONTAINMENT, SandboxRecord
from kernelbench_eval.discover.corpus import Problem, make_candidate
from kernelbench_eval.isolation import cgroups, landlock, sandbox, seccomp
from kernelbench_eval.isolation.process import WorkerProcess
from kernelbench_eval.isolation.workerenv import worker_env
from kernelbench_eval.requests import ImportRequest
from kernelbench_eval.store import keys

pytestmark = pytest.mark.slow  # attack fixtures built and run with and without the sandbox

SBX = FIXTURES / "attacks_sandbox"
FAST = ("--device", "cpu", "--jobs", "1", "--timeout", "60", "--trials", "2", "--timing-budget", "0.3",
        "--reps", "5", "--max-reps", "20", "--warmup", "1", "--warmup-seconds", "0.1", "--threads", "1",
        "--no-compile-baseline")
CORRECT = {"ok", "suspicious"}  # CPU timing on a shared machine is not asserted
ATTACKS = {"signal_ref": ["signal_ref"], "pin_ref": ["pin_ref"], "read_ref_mem": ["read_ref_mem"],
           "ptrace_ref": ["ptrace_ref"], "tcp_out": ["tcp_out"], "zz_daemon": ["daemon"],
           "write_outside": ["write_outside_evaluate"]}
DAEMON_MARK = b"kbeval-sbx-daemon"
FULL = os.geteuid() == 0 and landlock.abi() >= 6 and cgroups.mount_point() is not None
needs_full = pytest.mark.skipif(not FULL, reason="needs root, Landlock ABI >= 6 and cgroup v2 (the CI machine)")


# -- helpers ---------------------------------------------------------------------------------------------------


class Listener:
    """A TCP listener on 127.0.0.1 that keeps what it received."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                with conn:
                    self.received.append(conn.recv(100))

    def close(self) -> None:
        self.sock.close()


def daemons() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if entry.isdigit() and DAEMON_MARK in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
    return found


def kill_daemons() -> None:
    for pid in daemons():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def sandbox_run(root: Path, off: str | None) -> tuple[Path, subprocess.CompletedProcess[str], Listener]:
    """The fixtures, judged by the real command line; returns once the harness has exited *and* 4 s passed."""
    (root / "problems").mkdir(parents=True)
    (root / "tmp").mkdir()
    shutil.copy(SBX / "problems" / "sbx.py", root / "problems")
    shutil.copytree(SBX / "candidates", root / "candidates")
    shutil.copytree(SBX / "lib", root / "lib")
    listener = Listener()
    (root / "port").write_text(str(listener.port))
    env = dict(os.environ, KBEVAL_CACHE_DIR=str(root / "cache"), TMPDIR=str(root / "tmp"), COLUMNS="200")
    env.pop(sandbox.OFF_VAR, None)
    if off:
        env[sandbox.OFF_VAR] = off
    proc = subprocess.run([sys.executable, "-m", "kernelbench_eval", "run", *FAST, "--problems", str(root / "problems"),
                           "--candidates", str(root / "candidates"), "--out", str(root / "out"), "--run-id", "r"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    time.sleep(4)  # what a daemon left behind does once the harness is gone, it has done by now
    return root / "out" / "r", proc, listener


def verdicts(run_dir: Path) -> dict[str, dict]:
    return {v["candidate"]: v for v in map(json.loads, (run_dir / "verdicts.jsonl").read_text().splitlines())}


def attempts(run_dir: Path, candidate: str, stage: str = "eval") -> dict[str, str]:
    """`ATTACK name: succeeded|blocked ...` lines of one candidate's log, by name."""
    log = (run_dir / "logs" / "sbx" / f"{candidate}.{stage}.log").read_text()
    return {line.split(":")[0].split()[1]: line.split(": ", 1)[1] for line in log.splitlines()
            if line.startswith("ATTACK ")}


def planted(root: Path) -> list[Path]:
    return sorted(root.rglob("PLANTED-*"))


@pytest.fixture(scope="module")
def contained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, subprocess.CompletedProcess, Path,
                                                                          Listener]]:
    root = tmp_path_factory.mktemp("sandbox-on")
    run_dir, proc, listener = sandbox_run(root, None)
    yield run_dir, proc, root, listener
    listener.close()
    kill_daemons()


@pytest.fixture(scope="module")
def uncontained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, subprocess.CompletedProcess, Path,
                                                                            Listener]]:
    root = tmp_path_factory.mktemp("sandbox-off")
    run_dir, proc, listener = sandbox_run(root, "all")
    yield run_dir, proc, root, listener
    listener.close()
    kill_daemons()


# -- real runs ---------------------------------------------------------------------------------------------------


@needs_full
def test_contained_attacks_are_blocked_and_verdicts_stay(contained) -> None:
    run_dir, proc, root, listener = contained
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = verdicts(run_dir)
    assert set(got) == {"aa_honest", *ATTACKS}
    for name in ("aa_honest", *ATTACKS):
        if name != "zz_daemon":
            assert got[name]["status"] in CORRECT, (name, got[name]["error"])
    assert got["zz_daemon"]["status"] == "incorrect"  # still, seconds after the harness exited
    for name, tried in ATTACKS.items():
        lines = attempts(run_dir, name)
        for attack in tried:  # the daemon does start: it is killed with its evaluation (below)
            assert lines[attack].startswith("succeeded" if name == "zz_daemon" else "blocked"), (name, lines)
    build = attempts(run_dir, "write_outside", "compile")  # the build's worker is contained too
    assert build["write_outside_build"].startswith("blocked") and build["write_own_build"].startswith("succeeded")
    assert attempts(run_dir, "write_outside")["write_own_evaluate"].startswith("succeeded")
    assert attempts(run_dir, "zz_daemon", "compile")["daemon_build"].startswith("succeeded")  # and was killed
    assert planted(root) == [] and not (root / "out" / "baselines.json").exists()  # (no baseline is measured)
    assert listener.received == []
    assert daemons() == []  # killed with its evaluation's cgroup, not merely unable to write
    for name, verdict in got.items():
        record = SandboxRecord.model_validate(verdict["sandbox"])
        assert record.uncontained == [] and record.missing == {}, (name, record)
        assert record.cgroup and record.netns and record.caps_dropped and record.landlock_scopes and record.seccomp
    assert "NOT contained" not in proc.stderr


@needs_full
def test_every_attack_works_without_the_sandbox(uncontained) -> None:
    """The same fixtures with every layer off: each attack succeeds (so each one above was stopped by the sandbox)."""
    run_dir, proc, root, listener = uncontained
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = verdicts(run_dir)
    for name, tried in ATTACKS.items():
        lines = attempts(run_dir, name)
        for attack in tried:
            assert lines[attack].startswith("succeeded"), (name, lines)
    assert attempts(run_dir, "write_outside", "compile")["write_outside_build"].startswith("succeeded")
    assert {p.name for p in planted(root)} == {"PLANTED-build", "PLANTED-evaluate"}
    assert (root / "out" / "baselines.json").exists()
    assert b"sbx-tcp\n" in listener.received
    daemon = got["zz_daemon"]  # rewritten after the harness exited: the attack of issue 12
    assert daemon["status"] == "ok" and daemon["speedup"] == 3.0
    record = SandboxRecord.model_validate(got["aa_honest"]["sandbox"])
    assert record.contained == [] and set(record.missing) == {"cgroup", "netns", "caps", "landlock", "seccomp"}
    assert "NOT contained" in proc.stderr  # one warning line, up front
    assert proc.stderr.count("kbeval: warning: candidates are NOT contained") == 1


# -- layer by layer -------------------------------------------------------------------------------------------

PRIMITIVES = textwrap.dedent("""
    import ctypes, json, os, resource, signal, socket, sys
    from pathlib import Path
    from kernelbench_eval.isolation import sandbox
    from kernelbench_eval.containment import SandboxSpec
    victim, port, udp_port = (int(a) for a in sys.argv[1:4])
    outside, own = sys.argv[4:6]
    layers = [name for name in sys.argv[6].split(",") if name]
    record = sandbox.apply(SandboxSpec(writable=[own], layers=layers))
    def blocked(action):
        try:
            action()
        except OSError:
            return True
        return False
    def ptrace():
        libc = ctypes.CDLL(None, use_errno=True)
        libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        if libc.ptrace(16, victim, None, None) != 0:
            raise OSError(ctypes.get_errno(), "ptrace")
        os.waitpid(victim, 0x40000000)
        libc.ptrace(17, victim, None, None)
    def udp():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"x", ("127.0.0.1", udp_port))
    tried = {
        "signals": [lambda: os.kill(victim, signal.SIGCONT)],
        "scheduling": [lambda: os.sched_setaffinity(victim, os.sched_getaffinity(0)),
                       lambda: resource.prlimit(victim, resource.RLIMIT_CORE, resource.getrlimit(resource.RLIMIT_CORE)),
                       ],
        "memory": [lambda: open(f"/proc/{victim}/mem", "rb").close()],
        "ptrace": [ptrace],
        "writes": [lambda: Path(outside, "PLANTED").write_text("x")],
        "network": [lambda: socket.create_connection(("127.0.0.1", port), timeout=2).close(), udp],
    }
    own_ok = not blocked(lambda: Path(own, "mine").write_text("x"))
    print(json.dumps({"record": record.model_dump(mode="json"), "own_ok": own_ok,
                      "blocked": {c: all(blocked(a) for a in acts) for c, acts in tried.items()},
                      "any": {c: any(blocked(a) for a in acts) for c, acts in tried.items()}}))
""")
# A victim like the checker: this test's own privileges (root here), non-dumpable, waiting.
VICTIM = "import ctypes, time; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); time.sleep(120)"


def try_primitives(tmp_path: Path, layers: list[str]) -> dict:
    victim = subprocess.Popen([sys.executable, "-c", VICTIM])
    listener = Listener()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    outside, own = tmp_path / "outside", tmp_path / "own"
    outside.mkdir(exist_ok=True)
    own.mkdir(exist_ok=True)
    try:
        time.sleep(0.3)  # the victim has made itself non-dumpable
        proc = subprocess.run([sys.executable, "-c", PRIMITIVES, str(victim.pid), str(listener.port),
                               str(udp.getsockname()[1]), str(outside), str(own), ",".join(layers)],
                              env=dict(os.environ, PYTHONPATH=pythonpath()), capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.splitlines()[-1])
    finally:
        victim.kill()
        victim.wait()
        listener.close()
        udp.close()


@needs_full
@pytest.mark.parametrize("layers", [["netns"], ["caps"], ["landlock"], ["seccomp"],
                                    ["netns", "caps", "landlock", "seccomp"]])
def test_each_layer_stops_what_its_record_claims(tmp_path: Path, layers: list[str]) -> None:
    got = try_primitives(tmp_path, layers)
    record = SandboxRecord.model_validate(got["record"])
    assert set(record.missing) == {"netns", "caps", "landlock", "seccomp"} - set(layers) and got["own_ok"]
    blocked = sorted(c for c, stopped in got["blocked"].items() if stopped)
    assert blocked == sorted(c for c in record.contained if c != "survival"), got
    assert record.contained, "every layer contains some class"


@needs_full
def test_without_layers_every_primitive_works(tmp_path: Path) -> None:
    """The primitives above are real attacks: with no layer, not one of them is refused (as root)."""
    got = try_primitives(tmp_path, [])
    assert not any(got["any"].values()), got
    assert (tmp_path / "outside" / "PLANTED").exists()


@needs_full
def test_a_cgroup_leaf_kills_what_escaped_group_and_token(tmp_path: Path) -> None:
    """setsid + double fork + execve with an empty environment: `cgroup.kill` still gets it."""
    mark = f"kbeval-leaf-test-{os.getpid()}"
    sleeper = f"{sys.executable} -c 'import time; time.sleep(300)' {mark}"
    script = f"(setsid env -i {sleeper} &) ; exec sleep 300"
    proc = subprocess.Popen(["sh", "-c", "read go; " + script], stdin=subprocess.PIPE, start_new_session=True)
    leaf = cgroups.Leaf()
    leaf.add(proc.pid)
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    proc.stdin.close()

    def escaped() -> list[str]:
        """The daemon once it is Python (before, `setsid` or `env` show the mark too, still in the group)."""
        return [e for e in os.listdir("/proc") if e.isdigit() and _cmd(e).startswith(sys.executable)
                and mark in _cmd(e)]

    deadline = time.monotonic() + 60  # a busy machine is slow to start Python
    while not escaped() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert escaped(), "the escapee did not start"
    os.killpg(proc.pid, signal.SIGKILL)  # what the harness did before: the escapee has its own session
    time.sleep(0.2)
    assert escaped()
    assert leaf.kill() and not leaf.path.exists()
    assert escaped() == []
    proc.wait()


def _cmd(pid: str) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    return ""


def test_a_timed_out_build_leaves_no_record_to_trust(tmp_path: Path) -> None:
    """build/forge_then_hang.py signs a record in its own build folder (it can read the key), then times out:
    the folder is removed, so no later run finds that record (with the folder kept, it verified)."""
    problem = Problem("sbx", SBX / "problems" / "sbx.py", "0" * 64)
    cand = make_candidate(problem, SBX / "build" / "forge_then_hang.py")
    cache, log = tmp_path / "cache", tmp_path / "compile.log"
    got = compile_candidate(cand, "cpu", cache, log, 20)
    assert got.record.timed_out and "FORGED" in log.read_text()
    build = build_dir(cache, cand, "cpu")
    assert not (build / RECORD_NAME).exists()
    assert verified(build, keys.load_key(cache)) is None


@needs_full
@pytest.mark.parametrize("forked", [True, False])
def test_forked_and_cold_workers_confine_themselves_before_candidate_code(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forked: bool) -> None:
    """A cold worker (no fork server) confines itself before it imports torch, whose import starts a thread:
    single-threaded, every layer covers the whole process either way."""
    monkeypatch.setenv("KBEVAL_FORKSERVER", "1" if forked else "0")
    outside, work = tmp_path / "outside", tmp_path / "work"
    outside.mkdir()
    module = tmp_path / "writer.py"
    module.write_text(f"open({str(outside / 'PLANTED')!r}, 'w').close()\n")
    confined = sandbox.spec([work], "cpu", "build")
    with WorkerProcess(work, tmp_path / "log", sandbox=confined, role="candidate") as worker:
        reply = worker.request(ImportRequest(path=str(module)), 120)
        record = worker.sandbox_record
    assert not reply.ok and "Permission denied" in (reply.error or "")
    assert not (outside / "PLANTED").exists()
    assert record is not None and record.uncontained == [] and record.landlock_all_threads, record


# -- probes, records, settings -------------------------------------------------------------------------------


@needs_full
def test_the_probe_finds_every_layer_here() -> None:
    record = sandbox.probe()
    assert record.missing == {} and record.uncontained == []
    assert record.landlock_abi >= 6 and record.landlock_fs and record.landlock_net and record.landlock_scopes
    assert record.cgroup and record.netns and record.caps_dropped and record.seccomp and record.no_new_privs
    assert not record.seccomp_signals  # Landlock scopes signals here: seccomp need not refuse them


def test_the_probe_records_layers_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sandbox.OFF_VAR, "netns,seccomp,cgroup")
    record = sandbox.probe()
    assert record.missing["netns"] == record.missing["seccomp"] == record.missing["cgroup"] == "turned off"
    assert not (record.netns or record.seccomp or record.cgroup)
    assert {"network", "scheduling", "survival"} <= set(record.uncontained)
    monkeypatch.setenv(sandbox.OFF_VAR, "all")
    assert sandbox.probe().contained == []


def test_the_warning_is_one_line_once(capsys: pytest.CaptureFixture[str]) -> None:
    partial = SandboxRecord(landlock_fs=True, landlock_scopes=True, seccomp=True, missing={"netns": "EPERM"}).settle()
    assert partial.uncontained == ["network", "survival"]
    sandbox.warn(partial)
    sandbox.warn(partial)
    sandbox.warn(SandboxRecord(**{layer: True for layers in CONTAINMENT.values() for layer in layers}).settle())
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "NOT contained against network, survival" in err and "netns: EPERM" in err


def test_a_verdict_records_what_held_in_every_worker() -> None:
    build = SandboxRecord(cgroup=True, netns=True, caps_dropped=True, landlock_abi=7, landlock_fs=True,
                          landlock_scopes=True, seccomp=True).settle()
    run = SandboxRecord(cgroup=False, netns=True, caps_dropped=True, landlock_abi=6, landlock_fs=True,
                        landlock_scopes=True, seccomp=True, missing={"cgroup": "cgroup v2: EACCES"}).settle()
    merged = build.weakest(run)
    assert merged.landlock_abi == 6 and not merged.cgroup and merged.missing == {"cgroup": "cgroup v2: EACCES"}
    assert merged.uncontained == ["survival"] and build.weakest(None) is build


def test_turning_layers_off_never_reaches_a_candidate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Only the harness reads KBEVAL_SANDBOX_OFF: workers get an allow-listed environment and a spec it built."""
    assert sandbox.OFF_VAR not in worker_env({sandbox.OFF_VAR: "all", "PATH": "/bin"})
    monkeypatch.setenv(sandbox.OFF_VAR, "landlock")
    spec = sandbox.spec([tmp_path / "w"], "cpu", "build")
    assert "landlock" not in spec.layers and (tmp_path / "w").is_dir()
    monkeypatch.setenv(sandbox.SPEC_VAR, spec.model_dump_json())
    code = ("import os; from kernelbench_eval.isolation import sandbox; r = sandbox.enter_from_env(); "
            f"print(r is not None, {sandbox.SPEC_VAR!r} in os.environ)")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=pythonpath()),
                         capture_output=True, text=True, timeout=60).stdout
    assert out.split() == ["True", "False"]  # applied, then gone from the candidate's environment


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_seccomp_filter_assembles(machine: str) -> None:
    code = seccomp.build(4242, signals=True, machine=machine)
    assert len(code) % 8 == 0 and 40 < len(code) // 8 < 256
    with pytest.raises(OSError, match="unsupported"):
        seccomp.build(4242, signals=False, machine="riscv64")


# -- GPU --------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_candidates_build_and_pass_inside_the_sandbox(tmp_path: Path) -> None:
    """A load_inline CUDA kernel and a Triton kernel build and are judged `ok` inside every layer, outputs reach
    the checker by CUDA IPC (the candidate stays in the checker's PID namespace), and the attacks still fail."""
    for name in ("problems", "candidates/sbx", "candidates/tiny_relu_cuda", "candidates/tiny_linear_relu"):
        (tmp_path / name).mkdir(parents=True)
    shutil.copy(SBX / "problems" / "sbx.py", tmp_path / "problems")
    shutil.copy(FIXTURES / "attack_problems_gpu" / "tiny_relu_cuda.py", tmp_path / "problems")
    shutil.copy(FIXTURES / "problems" / "tiny_linear_relu.py", tmp_path / "problems")
    shutil.copy(FIXTURES / "attacks_gpu" / "tiny_relu_cuda" / "honest_cuda.py", tmp_path / "candidates/tiny_relu_cuda")
    shutil.copy(FIXTURES / "candidates_triton" / "tiny_linear_relu" / "triton_honest.py",
                tmp_path / "candidates/tiny_linear_relu")
    for name in ("aa_honest", "signal_ref", "read_ref_mem", "write_outside"):
        shutil.copy(SBX / "candidates" / "sbx" / f"{name}.py", tmp_path / "candidates/sbx")
    shutil.copytree(SBX / "lib", tmp_path / "lib")
    env = dict(os.environ, KBEVAL_CACHE_DIR=str(tmp_path / "cache"), COLUMNS="200")
    env.pop(sandbox.OFF_VAR, None)
    proc = subprocess.run([sys.executable, "-m", "kernelbench_eval", "run", "--device", "cuda", "--problems",
                           str(tmp_path / "problems"), "--candidates", str(tmp_path / "candidates"), "--timeout", "120",
                           "--trials", "2", "--no-compile-baseline", "--out", str(tmp_path / "out"), "--run-id", "g"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = {v["candidate"]: v for v in map(json.loads, (tmp_path / "out/g/verdicts.jsonl").read_text().splitlines())}
    for name, verdict in got.items():
        assert verdict["status"] in CORRECT, (name, verdict["error"])
        assert verdict["timing"]["exchange"] == "cuda_ipc", (name, verdict["timing"]["exchange"])
        record = SandboxRecord.model_validate(verdict["sandbox"])
        assert record.uncontained == [] and record.missing == {}, (name, record)
    lines = attempts(tmp_path / "out/g", "signal_ref") | attempts(tmp_path / "out/g", "read_ref_mem")
    lines |= attempts(tmp_path / "out/g", "write_outside")
    assert all(lines[a].startswith("blocked") for a in ("signal_ref", "read_ref_mem", "write_outside_evaluate")), lines
    assert planted(tmp_path) == []
    print(json.dumps({n: v["sandbox"] for n, v in got.items()}, indent=1))
