"""Workers forked from the fork server, on the CPU, as real processes: they must behave as cold workers do.

Every test asserts the worker really was forked (a `ForkedChild`), so a silent fallback to a cold start
cannot make it pass.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT, pythonpath

from kernelbench_eval.common.exchange import output_layout
from kernelbench_eval.isolation import forkclient, forkpool
from kernelbench_eval.isolation.forkclient import ForkedChild
from kernelbench_eval.isolation.process import WorkerFailure, WorkerProcess
from kernelbench_eval.messages import Role
from kernelbench_eval.requests import (
    AttachRequest,
    CompareRequest,
    ExpectRequest,
    ImportRequest,
    LoadRequest,
    OpenExchangeRequest,
    PrepareRequest,
    PutRequest,
    RunRequest,
    TakeRequest,
)

PROBLEM = FIXTURES / "problems" / "tiny_linear_relu.py"
HONEST = FIXTURES / "candidates" / "tiny_linear_relu" / "py_honest.py"
TIMEOUT = 60.0


@pytest.fixture(autouse=True)
def forking_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(forkclient.SWITCH_VAR, raising=False)


@pytest.fixture
def pids_to_clean() -> Iterator[list[int]]:
    """Processes a test's candidate started: killed at the end whatever the test concluded."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def module(folder: Path, name: str, body: str) -> Path:
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return path


@contextmanager
def forked(workdir: Path, extra_env: dict[str, str] | None = None,
           time_limit: float | None = None, role: Role = "candidate") -> Iterator[WorkerProcess]:
    """A started worker that must have come from the fork server; closed (killed with its group) at the end."""
    with WorkerProcess(workdir, workdir / "worker.log", extra_env, time_limit=time_limit, role=role) as worker:
        assert isinstance(worker.proc, ForkedChild), "the fork server was not used"
        yield worker


def import_request(path: Path, class_name: str | None = None) -> ImportRequest:
    return ImportRequest(path=str(path), class_name=class_name)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_dead(pids: list[int], seconds: float = 10.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def read_pids(path: Path) -> list[int]:
    deadline = time.monotonic() + 10
    while not path.exists() or not path.read_text().endswith("\n"):
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)
    return [int(p) for p in path.read_text().split()]


def test_import_load_run_round_trip(tmp_path: Path) -> None:
    """A forked checker makes the inputs and expected outputs; a forked candidate takes a trial's inputs from
    the exchange it lends, runs, puts its outputs back; the checker finds them equal to its own."""
    def load(worker: WorkerProcess, path: Path, name: str) -> None:
        loaded = worker.request(LoadRequest(path=str(path), class_name=name, device="cpu", threads=1,
                                            init_file=str(tmp_path / "init.pt"), init_seed=3), TIMEOUT)
        assert loaded.ok, loaded.error

    with forked(tmp_path, role="checker") as ref, forked(tmp_path) as cand:
        assert ref.request(PrepareRequest(path=str(PROBLEM), trial_seeds=[7], inputs_dir=str(tmp_path)),
                           TIMEOUT).ok
        load(ref, PROBLEM, "Model")
        expected = ref.call(ExpectRequest(trial_seeds=[7], atol=1e-2, rtol=1e-2), TIMEOUT).expected
        assert expected[0][0].shape == [8, 16]
        exchange = ref.call(OpenExchangeRequest(size=1 << 16, shm_dir=str(tmp_path)), TIMEOUT).exchange
        assert cand.call(import_request(HONEST, "ModelNew"), TIMEOUT).ok
        load(cand, HONEST, "ModelNew")
        cand.call(AttachRequest(exchange=exchange), TIMEOUT)
        slots = ref.call(PutRequest(name="trial0"), TIMEOUT).slots
        cand.call(TakeRequest(name="trial0", slots=slots), TIMEOUT)
        out_slots = output_layout(expected[0])[0]
        ran = cand.call(RunRequest(name="trial0", slots=out_slots), TIMEOUT)
        check = ref.call(CompareRequest(trial=0, slots=out_slots, outputs=ran.outputs), TIMEOUT).check
        assert check is not None and check.passed and check.max_abs_diff == 0.0, check
    assert ref.proc is not None and ref.proc.returncode == 0  # asked to exit, it exited cleanly


@pytest.mark.parametrize(("body", "message"), [
    ("import ctypes\nctypes.string_at(0)\n", "killed by signal SIGSEGV"),
    ("import sys\nprint('bye', flush=True)\nsys.exit(0)\n", "exited with code 0 without a verdict"),
], ids=["segfault", "exit"])
def test_a_worker_dying_without_a_verdict_is_crashed(tmp_path: Path, body: str, message: str) -> None:
    path = module(tmp_path, "dies", body)
    with forked(tmp_path) as worker, pytest.raises(WorkerFailure) as failure:
        worker.request(import_request(path), TIMEOUT)
    assert (failure.value.status, failure.value.message) == ("crashed", message)
    if "bye" in body:
        assert "bye" in (tmp_path / "worker.log").read_text()  # its output still reached its log


def test_hang_is_killed_at_the_timeout_with_its_group(tmp_path: Path, pids_to_clean: list[int]) -> None:
    path = module(tmp_path, "hangs", """
        import os, subprocess, sys, time
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open("pids.tmp", "w") as f:
            f.write(f"{os.getpid()} {helper.pid}\\n")
        os.rename("pids.tmp", "pids")
        time.sleep(600)
    """)
    with forked(tmp_path, time_limit=2) as worker, pytest.raises(WorkerFailure) as failure:
        worker.request(import_request(path), 2.0)
    pids = read_pids(tmp_path / "pids")
    pids_to_clean.extend(pids)
    assert failure.value.status == "timeout"
    assert pids[0] == worker.proc.pid
    assert wait_dead(pids) == []


def test_setsid_grandchildren_carrying_the_token_are_killed(tmp_path: Path, pids_to_clean: list[int]) -> None:
    """Escapes from the group: an exec'd process and a bare fork, each in a session of its own."""
    path = module(tmp_path, "escapes", """
        import os, subprocess, sys, time
        execd = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        done_read, done_write = os.pipe()
        forked = os.fork()
        if forked == 0:
            os.setsid()
            os.write(done_write, b"x")
            time.sleep(600)
            os._exit(0)
        os.read(done_read, 1)  # it has left the group
        with open("pids.tmp", "w") as f:
            f.write(f"{execd.pid} {forked}\\n")
        os.rename("pids.tmp", "pids")

        class ModelNew:
            pass
    """)
    with forked(tmp_path) as worker:
        assert worker.request(import_request(path, "ModelNew"), TIMEOUT).ok
        pids = read_pids(tmp_path / "pids")
        pids_to_clean.extend(pids)
        token = f"{forkclient.TOKEN_VAR}={worker._token}".encode()
        for pid in [worker.proc.pid, *pids]:  # what the harness looks for after the group is gone
            assert token in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"), pid
            assert os.getsid(pid) != os.getsid(worker.proc.pid) or pid == worker.proc.pid
    assert wait_dead(pids) == []


def test_environment_and_state_are_the_workers_own(tmp_path: Path) -> None:
    """Fork-safe variables and the token are applied in the child; any other variable gets a server of its own."""
    path = module(tmp_path, "reports", """
        import json, os, random, sys
        import torch
        keys = ("TORCH_EXTENSIONS_DIR", "CUDA_LAUNCH_BLOCKING", "KBEVAL_WORKER_TOKEN", "KBEVAL_TEST_OTHER",
                "PYTHONUNBUFFERED")
        report = {k: os.environ.get(k) for k in keys}
        report |= {"cwd": os.getcwd(), "path0": sys.path[0], "random": random.random(),
                   "torch": torch.rand(1).item(), "fds": sorted(os.listdir("/proc/self/fd")),
                   "pgid": os.getpgid(0), "pid": os.getpid(), "cuda": torch.cuda.is_initialized(),
                   "argv": sys.argv, "main_has_worker": hasattr(sys.modules["__main__"], "CandidateWorker"),
                   "preloaded": "torch.utils.cpp_extension" in sys.modules}
        with open(f"report-{os.getpid()}.json", "w") as f:
            json.dump(report, f)
    """)
    reports = []
    for extra in ({"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "CUDA_LAUNCH_BLOCKING": "1"},
                  {"KBEVAL_TEST_OTHER": "x"}):
        with forked(tmp_path, extra) as worker:
            assert worker.request(import_request(path), TIMEOUT).ok
            report = json.loads((tmp_path / f"report-{worker.proc.pid}.json").read_text())
            assert report["KBEVAL_WORKER_TOKEN"] == worker._token
            assert {k: report[k] for k in extra} == extra
            reports.append(report)
    first, second = reports
    assert first["KBEVAL_TEST_OTHER"] is None and second["TORCH_EXTENSIONS_DIR"] is None
    assert first["cwd"] == first["path0"] == str(tmp_path)
    assert first["PYTHONUNBUFFERED"] == "1"
    assert first["pgid"] == first["pid"]  # a session and group of its own
    assert first["random"] != second["random"] and first["torch"] != second["torch"]  # reseeded after the fork
    assert not first["cuda"]
    assert first["preloaded"]  # imported by the server: an extension's load no longer pays for it (0.37 s)
    assert first["main_has_worker"] and first["argv"][0].endswith("worker/main.py")  # as `python -m ...worker`
    assert first["argv"][1] == "--reply-fd"
    assert "Warning" not in (tmp_path / "worker.log").read_text()
    assert len(first["fds"]) <= 5, first["fds"]  # 0, 1, 2, the reply pipe, and the listing's own fd
    assert len(forkpool.servers()) >= 2  # KBEVAL_TEST_OTHER may matter at import time: its own server


def test_no_socket_path_to_replace(tmp_path: Path) -> None:
    """The server is reached through a socketpair the harness made: no path in its argv, none on disk.

    (A socket path in the server's command line let a candidate rename its own socket over it and answer
    every later spawn itself: tests/test_defence_cpu.py, fork_hijack.)
    """
    with forked(tmp_path) as worker:
        assert type(worker.proc).__name__ == "ForkedChild"
        server = forkpool.servers()[0]
        argv = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes().split(b"\0")
        fds = [os.readlink(f"/proc/{server.proc.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{server.proc.pid}/fd")]
    assert b"--socket" not in argv and b"--control-fd" in argv
    assert any(target.startswith("socket:") for target in fds)  # the control socket


def test_server_and_workers_die_with_the_harness(tmp_path: Path) -> None:
    server_pid, worker_pid, kind, alive_before = _kill_a_harness_with_its_server_and_worker(tmp_path)
    assert kind == "ForkedChild"  # the worker really came from the server
    assert alive_before == (True, True)  # both were running when the harness was killed...
    assert wait_dead([server_pid, worker_pid]) == []  # ...and neither outlived it


def _kill_a_harness_with_its_server_and_worker(tmp_path: Path) -> tuple[int, int, str, tuple[bool, bool]]:
    """Start a harness with a fork server and one worker, then SIGKILL the harness.

    Returns the server's and the worker's pids, the worker's kind, whether each was alive just before the
    kill; the caller judges what became of them.
    """
    harness = f"""
import os, sys, time
from pathlib import Path
from kernelbench_eval.isolation import forkpool
from kernelbench_eval.isolation.process import WorkerProcess
w = WorkerProcess(Path({str(tmp_path)!r}), Path({str(tmp_path)!r}) / "log", role="candidate")
w.start()
server = forkpool.servers()[0]
print(server.proc.pid, w.proc.pid, type(w.proc).__name__, flush=True)
time.sleep(600)
"""
    env = dict(os.environ, PYTHONPATH=pythonpath())
    proc = subprocess.Popen([sys.executable, "-c", harness], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        server, worker, kind = proc.stdout.readline().split()
        alive_before = (alive(int(server)), alive(int(worker)))
    finally:
        proc.kill()
        proc.wait()
    return int(server), int(worker), kind, alive_before


def _first_reply_seconds(workdir: Path) -> tuple[float, str]:
    started = time.perf_counter()
    with WorkerProcess(workdir, workdir / "latency.log", role="candidate") as worker:
        assert worker.request(import_request(HONEST, "ModelNew"), TIMEOUT).ok
        return time.perf_counter() - started, type(worker.proc).__name__


def test_start_to_first_reply_latency(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Printed, not asserted: a forked worker (server already warm) against a cold interpreter."""
    _first_reply_seconds(tmp_path)  # the server's own start is paid once per harness, not per worker
    forked_runs = [_first_reply_seconds(tmp_path) for _ in range(3)]
    monkeypatch.setenv(forkclient.SWITCH_VAR, "0")
    cold_runs = [_first_reply_seconds(tmp_path) for _ in range(2)]
    assert {kind for _, kind in forked_runs} == {"ForkedChild"}
    assert {kind for _, kind in cold_runs} == {"Popen"}
    forked_s = sorted(s for s, _ in forked_runs)[1]
    cold_s = sorted(s for s, _ in cold_runs)[0]
    print(f"\nstart to first reply: forked {forked_s * 1000:.0f} ms, cold {cold_s * 1000:.0f} ms")


_COUNTING_HARNESS = """
import json, os, sys, threading
from kernelbench_eval.isolation import forkclient, forkpool
starts, spawns = [], []
real_start, real_spawn = forkpool.ForkServer.start, forkclient.spawn

def start(self):
    starts.append(threading.current_thread().name)
    real_start(self)

def spawn(*args, **kwargs):
    child = real_spawn(*args, **kwargs)
    spawns.append(type(child).__name__)
    return child

forkpool.ForkServer.start, forkclient.spawn = start, spawn

def report():
    with open(os.environ["KBEVAL_TEST_REPORT"], "w") as out:
        json.dump({"starts": starts, "spawns": spawns}, out)

import atexit
atexit.register(report)
sys.argv = ["kbeval", *sys.argv[1:]]
from kernelbench_eval.cli.entry import main
main()
"""


def test_a_run_starts_its_fork_server_first_and_only_once(tmp_path: Path) -> None:
    """`kbeval run` starts the server before anything needs it (`workerenv.prestart`), and every worker of the run
    (compiles, the reference, candidates) comes from that one server: no variable a worker sets (MAX_JOBS, the
    extension folder) may make a second one."""
    cands = tmp_path / "candidates" / "tiny_linear_relu"
    cands.mkdir(parents=True)
    for name in ("py_honest.py", "py_wrong_shape.py"):
        (cands / name).write_bytes((FIXTURES / "candidates" / "tiny_linear_relu" / name).read_bytes())
    report = tmp_path / "report.json"
    env = dict(os.environ, PYTHONPATH=pythonpath(), KBEVAL_CACHE_DIR=str(tmp_path / "cache"),
               KBEVAL_TEST_REPORT=str(report), COLUMNS="200")
    env.pop(forkclient.SWITCH_VAR, None)
    env.pop("MAX_JOBS", None)  # the run sets it after the server started
    args = ["run", "--device", "cpu", "--problems", str(FIXTURES / "problems"), "--candidates",
            str(tmp_path / "candidates"), "--trials", "1", "--no-compile-baseline", "--reps", "5",
            "--timing-budget", "1", "--jobs", "2", "--out", str(tmp_path / "out"), "--run-id", "r"]
    proc = subprocess.run([sys.executable, "-c", _COUNTING_HARNESS, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdicts = {json.loads(line)["candidate"]: json.loads(line)["status"]
                for line in (tmp_path / "out" / "r" / "verdicts.jsonl").read_text().splitlines()}
    assert verdicts["py_wrong_shape"] == "incorrect" and verdicts["py_honest"] in ("ok", "suspicious")
    counted = json.loads(report.read_text())
    assert counted["starts"] == ["kbeval-forkserver-start"]  # once, and by the prestart, not by a first worker
    assert len(counted["spawns"]) >= 5 and set(counted["spawns"]) == {"ForkedChild"}  # 2 compiles, ref, 2 cands


@pytest.mark.parametrize(("code", "status", "said"), [("None", 0, ""), ("3", 3, ""), ("'bye'", 1, "bye")])
def test_kbeval_leaves_as_an_interpreter_would(tmp_path: Path, code: str, status: int, said: str) -> None:
    """`entry.leave` skips the interpreter's teardown only: threads are joined (a thread pool never shut down
    included), atexit handlers run and output is flushed first, and the exit status is what sys.exit gives."""
    script = f"""
import atexit, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from kernelbench_eval.cli.entry import leave
out = Path({str(tmp_path)!r})
ThreadPoolExecutor(2).submit(lambda: None).result()
threading.Thread(target=lambda: (time.sleep(0.5), (out / "thread").write_text("joined"))).start()
atexit.register(lambda: (out / "atexit").write_text("ran"))
sys.stdout.write("buffered")
leave({code})
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=pythonpath()))
    assert proc.returncode == status and proc.stdout == "buffered" and proc.stderr.strip() == said
    assert (tmp_path / "thread").read_text() == "joined" and (tmp_path / "atexit").read_text() == "ran"


def test_a_forked_worker_runs_its_own_exit_handlers_but_not_torchs_library_teardown(tmp_path: Path) -> None:
    """torch's operator libraries are not torn down one by one at a worker's exit (`skip_library_finalizers`:
    a tenth of a second or more per worker); what the candidate registers, atexit or weakref.finalize, runs."""
    cand = module(tmp_path, "registers", f"""
        import atexit, weakref
        from pathlib import Path
        class Thing:
            pass
        thing = Thing()
        atexit.register(lambda: Path({str(tmp_path)!r}, "atexit").write_text("ran"))
        weakref.finalize(thing, lambda: Path({str(tmp_path)!r}, "finalize").write_text("ran"))
        """)
    with forked(tmp_path) as worker:
        assert worker.request(import_request(cand), TIMEOUT).ok
    assert (tmp_path / "atexit").read_text() == "ran" and (tmp_path / "finalize").read_text() == "ran"


def test_only_torchs_library_finalizers_are_skipped() -> None:
    import weakref

    import torch  # noqa: F401  (its import registers the libraries' finalizers)

    from kernelbench_eval.isolation.teardown import skip_library_finalizers

    class Thing:
        pass

    thing = Thing()
    mine = weakref.finalize(thing, lambda: None)
    assert skip_library_finalizers() > 0  # torch registers one per operator library
    assert mine.atexit and mine.alive
    left = [f for f in list(weakref.finalize._registry) if f.atexit and f.peek()
            and getattr(f.peek()[1], "__name__", "") == "_del_library"]
    assert left == []


def test_the_server_preloads_load_inlines_module_without_touching_cuda() -> None:
    """Importing torch.utils.cpp_extension asks torch.cuda.is_available() (cudaGetDeviceCount) on a CUDA build of
    torch, which made every forked worker's first CUDA call fail. Here a CUDA build is stood in for (the CPU
    build never asks) and the device count call is recorded: `preload` imports the module without it."""
    code = textwrap.dedent("""
        import json, sys, torch
        calls = []
        torch.cuda._is_compiled = lambda: True
        torch.version.cuda = "12.0"
        torch._C._cuda_getDeviceCount = lambda: calls.append("count") or 1
        from kernelbench_eval.isolation import forkserver
        asked = torch.cuda.is_available
        if sys.argv[1] == "preload":
            forkserver.preload()
        else:
            import torch.utils.cpp_extension
        print(json.dumps({"calls": calls, "restored": torch.cuda.is_available is asked,
                          "loaded": "torch.utils.cpp_extension" in sys.modules}))
    """)
    env = dict(os.environ, PYTHONPATH=pythonpath(), CUDA_HOME="/usr/local/cuda")
    plain, preloaded = (json.loads(subprocess.run([sys.executable, "-c", code, how], env=env, capture_output=True,
                                                  text=True, check=True).stdout.splitlines()[-1])
                        for how in ("plain", "preload"))
    assert plain["calls"] == ["count"]  # the stand-in works: a plain import asks the device count
    assert preloaded == {"calls": [], "restored": True, "loaded": True}
