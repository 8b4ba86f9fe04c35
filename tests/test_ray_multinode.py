"""`--backend ray` on a real Ray cluster on this machine (`ray start` per node, each with its own temp dir
and build cache, so nothing is shared but what Ray carries): builds made on the builder node are judged on
the judge node, and losing either node mid-work costs only the work in flight there.

Every process a node started carries this test's token in its environment; that is how the test kills a
node (its raylet, its workers and their children) and, whatever happens, cleans up all it started,
without `ray stop` (which would stop every Ray on the machine).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT, kbeval, pythonpath

from kernelbench_eval.building import artifacts, relocate
from kernelbench_eval.building.compile import build_lock, compile_candidate
from kernelbench_eval.building.signed import adopt
from kernelbench_eval.discover.corpus import Problem, make_candidate

pytestmark = pytest.mark.slow  # a Ray cluster of separate nodes on one host: over a minute

PROBLEMS = FIXTURES / "problems"
SOURCES = FIXTURES / "candidates" / "tiny_linear_relu"
GATED = '''import os, pathlib, time
STAGE = "compile" if "kbeval-compile-" in os.getcwd() else "eval"
GATE = pathlib.Path({gates!r}) / STAGE
if GATE.exists():  # this stage waits here until the test has killed the node running it
    (GATE.parent / f"{{STAGE}}-started-{{os.getpid()}}").touch()
    while GATE.exists():
        time.sleep(0.2)
'''


def beside_python(name: str) -> str:
    """An executable of this environment: the one next to `sys.executable` (a venv's `bin/`, found whether or
    not the venv is activated), else whatever PATH finds."""
    here = Path(sys.executable).parent / name
    return str(here) if os.access(here, os.X_OK) else (shutil.which(name) or name)


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tagged(token: str) -> list[int]:
    """Processes whose environment carries `token` (readable for this user's processes only)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if f"KBEVAL_TEST_NODE={token}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = _port()
        self.address = f"127.0.0.1:{self.port}"
        self.tokens: dict[str, str] = {}

    def start(self, name: str, resources: dict[str, float], head: bool = False) -> Path:
        """One node, with its own temp dir and build cache (returned); names it for `built_on` and `lane`."""
        token = self.tokens[name] = uuid.uuid4().hex
        cache = self.root / f"cache-{name}"
        ports = ["--node-manager-port", "--object-manager-port", "--metrics-export-port",
                 "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port"]
        cmd = [beside_python("ray"), "start", "--num-cpus", "1", "--node-name", name, "--resources",
               json.dumps(resources), "--temp-dir", str(self.root / f"ray-{name}"), "--disable-usage-stats",
               "--object-store-memory", str(100 * 1024 * 1024)]
        cmd += [arg for flag in ports for arg in (flag, str(_port()))]
        cmd += (["--head", "--port", str(self.port), "--include-dashboard", "false"] if head
                else ["--address", self.address])
        env = dict(os.environ, KBEVAL_CACHE_DIR=str(cache), KBEVAL_TEST_NODE=token, PYTHONPATH=pythonpath())
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return cache

    def kill(self, name: str) -> None:
        """SIGKILL every process of one node, until none is left (a node lost, not stopped)."""
        for _ in range(50):
            pids = _tagged(self.tokens[name])
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        raise AssertionError(f"node {name} outlived SIGKILL: {_tagged(self.tokens[name])}")

    def stop(self) -> None:
        for name in reversed(list(self.tokens)):
            self.kill(name)


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # nodes and driver alike, whatever ~/.ray/auth_token holds
    root = Path(tempfile.mkdtemp(prefix="kbr-", dir="/tmp"))  # short: Ray's socket paths live under it
    nodes = Cluster(root)
    try:
        yield nodes
    finally:
        nodes.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_executables_are_found_beside_python_without_an_activated_venv(monkeypatch, tmp_path):
    """`ray start` used to be looked up on PATH only: FileNotFoundError: 'ray' when the venv is not activated."""
    pytest.importorskip("ray")
    venv_bin = Path(sys.executable).parent
    if not os.access(venv_bin / "ray", os.X_OK):
        pytest.skip(f"no ray executable in {venv_bin}")
    monkeypatch.setenv("PATH", str(tmp_path))  # as if the venv's bin/ were not on PATH
    assert shutil.which("ray") is None
    assert beside_python("ray") == str(venv_bin / "ray")
    (tmp_path / "onlyonpath").write_text("#!/bin/sh\n")
    (tmp_path / "onlyonpath").chmod(0o755)
    assert beside_python("onlyonpath") == str(tmp_path / "onlyonpath")  # PATH is still the fallback


def _build(root: Path) -> Path:
    build = root / "builds" / "0123abcd-2.13.0-cpu"
    (build / "ext" / "relu").mkdir(parents=True)
    (build / "compile.json").write_text('{"ok": true}')
    (build / "ext" / "relu" / "relu.so").write_bytes(bytes(range(256)) * 64)
    (build / "ext" / "relu" / "lock").write_text("")  # load_inline's lock: means nothing on another node
    os.utime(build / "ext" / "relu" / "relu.so", (1_700_000_000.25, 1_700_000_000.25))  # ninja compares these
    return build


def test_a_packed_build_unpacks_elsewhere_whole_without_its_locks(tmp_path):
    data = artifacts.pack(_build(tmp_path / "a"))
    dest = tmp_path / "b" / "builds" / "0123abcd-2.13.0-cpu"
    dest.mkdir(parents=True)
    (dest / "torn.o").write_text("a half-finished build of this node")
    artifacts.unpack(data, dest)
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == [
        "compile.json", "ext/relu/relu.so"]
    assert (dest / "ext" / "relu" / "relu.so").read_bytes() == bytes(range(256)) * 64
    assert (dest / "ext" / "relu" / "relu.so").stat().st_mtime == 1_700_000_000.25


def test_an_altered_build_is_refused_and_nothing_is_placed(tmp_path):
    data = artifacts.pack(_build(tmp_path / "a"))
    altered = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(data)) as src, tarfile.open(fileobj=altered, mode="w:gz") as out:
        for member in src.getmembers():
            body = src.extractfile(member).read()
            if member.name.endswith(".so"):
                body = body[:-1] + b"!"  # same size, one byte changed, manifest kept
            out.addfile(member, io.BytesIO(body))
    dest = tmp_path / "b" / "build"
    with pytest.raises(artifacts.ArtifactError, match="relu.so"):
        artifacts.unpack(altered.getvalue(), dest)
    assert not dest.exists() and not list(dest.parent.iterdir())  # no partial build, no leftovers
    with pytest.raises(artifacts.ArtifactError):
        artifacts.unpack(b"not a tar", dest)


# --- a build carried to another path loads there without a rebuild (`relocate`) ------------------------


def test_ninja_command_hashes_are_ninjas(tmp_path):
    """Our hash of a command equals the one ninja logged for it, at every length the hash treats apart."""
    lengths = [1, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 24, 31, 32, 33, 47, 48, 49, 60, 95, 96, 97, 143, 144, 200, 301]
    commands = {f"o{n}": ":" if n == 1 else ": " + "x" * (n - 2) for n in lengths}
    (tmp_path / "build.ninja").write_text("".join(f"rule r_{out}\n  command = {cmd}\nbuild {out}: r_{out}\n"
                                                  for out, cmd in commands.items()))
    subprocess.run([beside_python("ninja"), "-C", str(tmp_path)], check=True, capture_output=True)
    log = (tmp_path / ".ninja_log").read_text().splitlines()
    hasher = relocate.LOG_HASHES[int(log[0].removeprefix("# ninja log v"))]
    logged = {fields[3]: int(fields[4], 16) for fields in (line.split("\t") for line in log[1:])}
    assert logged == {out: hasher(cmd.encode()) for out, cmd in commands.items()}
    # ninja 1.11 (log v5, MurmurHash64A), as it logged these commands
    padding = " && echo long-command-padding-to-exceed-forty-eight-bytes-of-text"
    for out, digest in (("a.txt", 0xE38281E0975B7C59), ("bb.txt", 0x5F0952E7C387FF84), ("c", 0xCD2D54CD29F320D0)):
        assert relocate.murmur64a(f'printf "%s" {out} > {out}{padding}'.encode()) == digest


def _ninja_text(folder: Path) -> str:
    """What `load_inline` writes for <build>/ext/NAME: a build.ninja naming its source by absolute path, an
    object with gcc-style deps, a library; `cp` stands in for the compiler."""
    return ("rule compile\n  command = cp $in $out && printf '%s: %s\\n' $out $in > $out.d\n  depfile = $out.d\n"
            f"  deps = gcc\nrule link\n  command = cp $in $out\nbuild main.o: compile {folder}/main.cpp\n"
            "build fake.so: link main.o\ndefault fake.so\n")


def _ninja_project(build: Path) -> Path:
    folder = build / "ext" / "fake"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "build.ninja").write_text(_ninja_text(folder))
    return folder


def _dry_run(folder: Path) -> str:
    return subprocess.run([beside_python("ninja"), "-C", str(folder), "-n", "-d", "explain"], capture_output=True,
                          text=True, check=True).stdout + "\n"


def test_a_build_unpacked_under_another_root_is_not_rebuilt(tmp_path):
    made = tmp_path / "a" / "builds" / "b1"
    folder = _ninja_project(made)
    (folder / "main.cpp").write_text("int x;\n")
    subprocess.run([beside_python("ninja"), "-C", str(folder)], check=True, capture_output=True)
    data = artifacts.pack(made)
    shutil.rmtree(tmp_path / "a")  # another node: the path it was made at does not exist there
    moved = tmp_path / "another-node-cache" / "builds" / "b1"
    assert artifacts.unpack(data, moved) == made
    assert relocate.relocate(moved, made)
    assert (moved / "ext" / "fake" / "build.ninja").read_text() == _ninja_text(moved / "ext" / "fake")  # kept
    assert "no work to do" in _dry_run(moved / "ext" / "fake")
    # the same without `relocate` (build.ninja as load_inline writes it there): ninja rebuilds
    unrelocated = tmp_path / "third" / "builds" / "b1"
    artifacts.unpack(data, unrelocated)
    _ninja_project(unrelocated)
    assert "no work to do" not in _dry_run(unrelocated / "ext" / "fake")


def _an_mtime_a_tar_moves_later(scratch: Path) -> int:
    """An mtime (ns) that a plain tar round trip (a float mtime) brings back later than it was."""
    scratch.mkdir()
    (scratch / "f").write_text("x")
    for ns in range(1_700_000_000_000_000_001, 1_700_000_000_000_000_001 + 1000 * 997, 997):
        os.utime(scratch / "f", ns=(ns, ns))
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(scratch / "f", arcname="f")
        with tarfile.open(fileobj=io.BytesIO(buf.getvalue())) as tar:
            tar.extractall(scratch / "out", filter="data")
        if (scratch / "out" / "f").stat().st_mtime_ns > ns:
            return ns
    raise AssertionError("no mtime that a tar moves later")


def test_a_carried_build_keeps_its_mtimes_to_the_nanosecond(tmp_path):
    """ninja logs an output with its command's start time, read from a file it stamps, and rebuilds when an
    input is newer than that. A source written in the same filesystem tick as that stamp has exactly the logged
    time (often, for `load_inline`, which writes its sources just before running ninja), and a tar's float
    mtime can bring it back a few hundred nanoseconds later. Forced here (source and record set to one such
    time): `unpack` must restore every mtime exactly for the build to be clean where it lands."""
    made = tmp_path / "a" / "builds" / "b1"
    folder = _ninja_project(made)
    (folder / "main.cpp").write_text("int x;\n")
    subprocess.run([beside_python("ninja"), "-C", str(folder)], check=True, capture_output=True)
    ns = _an_mtime_a_tar_moves_later(tmp_path / "scratch")
    os.utime(folder / "main.cpp", ns=(ns, ns))
    log = (folder / ".ninja_log").read_text().splitlines()
    entries = [line.split("\t") for line in log[1:]]
    (folder / ".ninja_log").write_text("\n".join([log[0]] + ["\t".join(e[:2] + [str(ns)] + e[3:]) if e[3] == "main.o"
                                                           else "\t".join(e) for e in entries]) + "\n")
    assert "no work to do" in _dry_run(folder)  # as ninja leaves it when the two share a tick
    packed = {p.relative_to(made): p.stat().st_mtime_ns for p in made.rglob("*") if p.is_file()}
    data = artifacts.pack(made)
    moved = tmp_path / "b" / "builds" / "b1"
    assert artifacts.unpack(data, moved) == made
    assert {p.relative_to(moved): p.stat().st_mtime_ns for p in moved.rglob("*") if p.is_file()} == packed
    assert relocate.relocate(moved, made)
    assert "no work to do" in _dry_run(moved / "ext" / "fake")


def test_a_manifest_with_bad_mtimes_is_refused(tmp_path):
    made = tmp_path / "a" / "build"
    made.mkdir(parents=True)
    (made / "x.so").write_bytes(b"lib")
    data = artifacts.pack(made)
    for mtimes in ({}, {"x.so": 1.5}, {"x.so": -1}, {"x.so": "1"}, None):
        manifest = artifacts.manifest_of(data) | {"mtimes": mtimes}
        blob = json.dumps(manifest).encode()
        altered = io.BytesIO()
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as src, \
                tarfile.open(fileobj=altered, mode="w:gz") as out:
            for member in src.getmembers():
                body = blob if member.name == artifacts.MANIFEST else src.extractfile(member).read()
                member.size = len(body)
                out.addfile(member, io.BytesIO(body))
        dest = tmp_path / "b" / "build"
        with pytest.raises(artifacts.ArtifactError, match="mtime"):
            artifacts.unpack(altered.getvalue(), dest)
        assert not dest.exists()


def test_relocated_triton_groups_name_the_new_place(tmp_path):
    old, new = tmp_path / "a" / "triton", tmp_path / "b" / "triton"
    (new / "KEY").mkdir(parents=True)
    group = new / "KEY" / "__grp__k.json"
    group.write_text(json.dumps({"child_paths": {"k.cubin": f"{old}/KEY/k.cubin", "x": "/elsewhere/x"}}))
    (new / "KEY" / "__grp__broken.json").write_text("{not json")
    relocate.rewrite_triton(new, old, new)
    assert json.loads(group.read_text())["child_paths"] == {"k.cubin": f"{new}/KEY/k.cubin", "x": "/elsewhere/x"}


FAKE_CXX = """#!/bin/sh
for arg in "$@"; do case "$arg" in -c|-o) echo "$*" >> {calls}; exit 1;; esac; done
exec {real} "$@"
"""


@pytest.mark.slow
def test_a_relocated_cpp_build_loads_without_a_compiler_run(build_cache, tmp_path):
    """A real `load_inline` build, carried to another cache path and signed there, loads with a compiler that
    refuses to compile (only answers torch's version probe) and is still intact afterwards."""
    problem = PROBLEMS / "tiny_linear_relu.py"
    prob = Problem("tiny_linear_relu", problem, hashlib.sha256(problem.read_bytes()).hexdigest())
    cand = make_candidate(prob, SOURCES / "cpp_honest.py")
    built = compile_candidate(cand, "cpu", build_cache, tmp_path / "compile.log", 600)
    assert built.record.ok, built.record
    with build_lock(built.build_dir):
        data = artifacts.pack(built.build_dir)
    calls = tmp_path / "compiler-calls"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "c++").write_text(FAKE_CXX.format(calls=calls, real=shutil.which("c++")))
    (tmp_path / "bin" / "c++").chmod(0o755)

    def carried(root: Path, relocated: bool) -> subprocess.CompletedProcess:
        build = root / "builds" / built.build_dir.name
        with build_lock(build, verify=False):
            made_at = artifacts.unpack(data, build)
            if relocated:
                assert relocate.relocate(build, made_at)
            adopt(build, built.record)
        assert compile_candidate(cand, "cpu", root, tmp_path / "again.log", 60).cached  # verifies here
        env = {k: v for k, v in os.environ.items() if k != "CXX"} | {
            "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "TORCH_EXTENSIONS_DIR": str(build / "ext")}
        code = f"import runpy; runpy.run_path({str(cand.path)!r})['ext'].relu_loop"
        with build_lock(build):  # as a judge loads it
            return subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True)

    loaded = carried(tmp_path / "node-b-cache", relocated=True)
    assert loaded.returncode == 0, loaded.stderr
    assert not calls.exists(), calls.read_text()  # no compile ran
    with build_lock(tmp_path / "node-b-cache" / "builds" / built.build_dir.name):
        pass  # still as signed: a load changed nothing
    refused = carried(tmp_path / "node-c-cache", relocated=False)  # the same, not relocated: it recompiles
    assert refused.returncode != 0 and calls.exists()


def _candidates(folder: Path, gates: Path | None = None, jit_events: Path | None = None) -> Path:
    cands = folder / "tiny_linear_relu"
    cands.mkdir(parents=True)
    for name in ("py_honest.py", "py_wrong_shape.py"):
        shutil.copyfile(SOURCES / name, cands / name)
    if jit_events:  # a Triton-like candidate (faked on the CPU): warmed up where it is built
        fake = (FIXTURES / "candidates_warmup" / "fake_triton.py").read_text()
        (cands / "fake_triton.py").write_text(fake.replace("__EVENTS__", str(jit_events)).replace("__MODE__", "honest"))
    if gates:
        (cands / "py_gated.py").write_text(GATED.format(gates=str(gates)) + (SOURCES / "py_honest.py").read_text())
    return folder


def _args(cluster: Cluster, candidates: Path, out: Path, run_id: str) -> list[str]:
    return ["run", "--device", "cpu", "--problems", str(PROBLEMS), "--candidates", str(candidates),
            "--timeout", "60", "--trials", "2", "--no-compile-baseline", "--lanes", "1", "--jobs", "2",
            "--backend", "ray", "--address", cluster.address, "--ray-build-resource", "builder",
            "--ray-judge-resource", "judge", "--out", str(out), "--run-id", run_id]


def _verdicts(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "verdicts.jsonl").read_text().splitlines()]


def _lose_mid(cluster: Cluster, gates: Path, stage: str, node: str, replacement: str, run: subprocess.Popen,
              resources: dict[str, float]) -> None:
    """Wait until `stage` of the gated candidate runs on `node`, kill that node, start `replacement`, go on."""
    deadline = time.monotonic() + 300
    while not list(gates.glob(f"{stage}-started-*")):
        assert run.poll() is None and time.monotonic() < deadline, f"the gated {stage} never started"
        time.sleep(0.5)
    cluster.kill(node)
    cluster.start(replacement, resources)
    (gates / stage).unlink()


@pytest.mark.usefixtures("landlock_off")  # nodes inherit it: the fake JIT logs beside the test
def test_builds_travel_to_the_judge_node_and_a_lost_node_costs_only_its_work(cluster, tmp_path):
    """Phase 1: built on one node, judged on another. Phase 2: the builder dies mid-compile, then the judge
    mid-evaluation; replacements join; every candidate still gets exactly one verdict."""
    cluster.start("head", {}, head=True)  # the driver's node (it holds the cluster): nothing runs here
    builder_cache = cluster.start("builder1", {"builder": 1})
    judge_cache = cluster.start("judge1", {"judge": 1})
    driver_cache = tmp_path / "driver-cache"  # no node's: every build the judge uses has travelled

    events = tmp_path / "jit-events"
    kbeval(*_args(cluster, _candidates(tmp_path / "c1", jit_events=events), tmp_path / "out", "placed"),
           cache=driver_cache)
    verdicts = {v["candidate"]: v for v in _verdicts(tmp_path / "out" / "placed")}
    assert sorted(verdicts) == ["fake_triton", "py_honest", "py_wrong_shape"]
    assert verdicts["py_honest"]["correct"] and verdicts["py_wrong_shape"]["status"] == "incorrect"
    for v in verdicts.values():
        assert v["built_on"].startswith("builder1/") and v["lane"].startswith("ray:judge1/"), v
    built = {p.parent.name for p in (builder_cache / "builds").glob("*/compile.json")}
    fetched = {p.parent.name for p in (judge_cache / "builds").glob("*/compile.json")}
    assert len(built) == 3 and fetched == built  # each build made once, then carried to the judge's cache
    # the JIT candidate: compiled by its warm-up on the builder, its cache carried and relocated, judged from it
    assert verdicts["fake_triton"]["correct"] and events.read_text().splitlines() == ["compile jit", "eval hit"]
    (group,) = judge_cache.glob("builds/*/triton/FAKEKEY/__grp__relu.json")
    assert json.loads(group.read_text())["child_paths"] == {"relu.bin": str(group.parent / "relu.bin")}
    assert not (driver_cache / "builds").exists()  # the driver keeps its keys and run seals, never a build
    log = tmp_path / "out" / "placed" / "logs" / "tiny_linear_relu" / "py_honest.eval.log"
    assert log.exists()  # logs came back as bytes into the driver's run folder

    gates = tmp_path / "gates"
    gates.mkdir()
    (gates / "compile").touch()
    (gates / "eval").touch()
    run = subprocess.Popen([sys.executable, "-m", "kernelbench_eval",
                            *_args(cluster, _candidates(tmp_path / "c2", gates), tmp_path / "out", "lost")],
                           cwd=ROOT, env=dict(os.environ, KBEVAL_CACHE_DIR=str(driver_cache), COLUMNS="200"),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _lose_mid(cluster, gates, "compile", "builder1", "builder2", run, {"builder": 1})
        _lose_mid(cluster, gates, "eval", "judge1", "judge2", run, {"judge": 1})
        out, _ = run.communicate(timeout=480)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, out
    lost = _verdicts(tmp_path / "out" / "lost")
    assert sorted(v["candidate"] for v in lost) == ["py_gated", "py_honest", "py_wrong_shape"]  # each once
    gated = next(v for v in lost if v["candidate"] == "py_gated")
    assert gated["built_on"].startswith("builder2/") and gated["lane"].startswith("ray:judge2/"), gated
    assert gated["correct"], gated
