"""Issue 37: an interrupt (SIGINT, SIGTERM, SIGHUP) in any phase stops the run within seconds, kills every
process it started, records nothing for a candidate not judged to the end, says how to resume, and `--resume`
then gives the verdicts an uninterrupted run gives.

The phases are reached by events, never by timing: the corpus is written with marker files that make one
candidate's import hang (a build that never ends, with a child process of its own, as a compiler would be) or
the reference's forward slow; the test waits for the log that shows the phase has begun, then signals the whole
process group, as a terminal's Ctrl-C does. Removing the markers lets the resumed run finish.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import pythonpath

from kernelbench_eval import interrupts
from kernelbench_eval.run.schedule import ReadyQueue

FAST = ("--device", "cpu", "--no-compile-baseline", "--trials", "1", "--reps", "10", "--timing-budget", "1",
        "--warmup", "1", "--jobs", "2")

PROBLEM = '''import os
import time

import torch
import torch.nn as nn

SLOW = {slow!r}


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)

    def forward(self, x):
        if os.path.exists(SLOW):
            time.sleep(0.3)
        return torch.relu(self.fc(x))


batch_size = 8
n = 16


def get_inputs():
    return [torch.rand(batch_size, n) * 2 - 1]


def get_init_inputs():
    return [n]
'''

HONEST = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)

    def forward(self, x):
        return torch.relu(self.fc(x))
'''

WRONG = HONEST.replace("torch.relu(self.fc(x))", "torch.relu(self.fc(x)) + 1.0")

# Its "build" hangs while the marker exists, with a child of its own (as ninja and the compiler are).
HANGS = '''import os
import subprocess
import time

if os.path.exists({hang!r}):
    child = subprocess.Popen(["sleep", "600"])
    print(f"CHILDPID={{child.pid}}", flush=True)
    time.sleep(600)

''' + HONEST

EXPECTED = {"honest_a": True, "honest_b": True, "wrong": False, "hangs": True}  # candidate -> correct


def write_corpus(root: Path) -> tuple[Path, Path, Path, Path]:
    """Problems, candidates and the two markers (present: the build hangs, the reference is slow)."""
    hang, slow = root / "hang.marker", root / "slow.marker"
    (root / "p").mkdir()
    (root / "c" / "tiny").mkdir(parents=True)
    (root / "p" / "tiny.py").write_text(PROBLEM.format(slow=str(slow)))
    for name, source in (("honest_a", HONEST), ("honest_b", HONEST.replace("nn.Linear(n, n)", "nn.Linear(n, n, "
                                                                                            "bias=True)")),
                         ("wrong", WRONG), ("hangs", HANGS.format(hang=str(hang)))):
        (root / "c" / "tiny" / f"{name}.py").write_text(source)
    return root / "p", root / "c", hang, slow


def start(root: Path, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, KBEVAL_CACHE_DIR=str(root / "cache"), COLUMNS="200", PYTHONPATH=pythonpath(),
               TMPDIR=str(root / "tmp"))
    (root / "tmp").mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "kernelbench_eval", *args], cwd=root, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def wait_for(what: str, found: callable, proc: subprocess.Popen[str], limit: float = 300) -> None:
    deadline = time.monotonic() + limit
    while not found():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"kbeval ended (exit {proc.returncode}) before {what}:\n{out}\n{err}")
        assert time.monotonic() < deadline, f"never reached: {what}"
        time.sleep(0.05)


def verdicts(run_dir: Path) -> list[dict]:
    path = run_dir / "verdicts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def children_of(pid: int) -> list[int]:
    """Processes still naming `pid` as their harness (the fork servers: `--parent PID`) or as parent."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().split(")")[-1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if (ppid == pid or (b"--parent" in cmd and cmd[cmd.index(b"--parent") + 1] == str(pid).encode())) \
                and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


PHASES = {
    # phase: (markers present, the sign it has begun)
    "building": ("hang", lambda run: "CHILDPID=" in _read(run / "logs" / "tiny" / "hangs.compile.log")),
    "baselines": ("slow", lambda run: (run / "logs" / "tiny" / "_reference.eval.log").exists()
                  and not any((run / "logs" / "tiny").glob("[!_]*.eval.log"))),
    "judging": ("slow", lambda run: any((run / "logs" / "tiny").glob("[!_]*.eval.log"))),
}


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


@dataclass(frozen=True)
class Outcome:
    """What an interrupted run left and what `--resume` then made of it."""

    returncode: int
    message: str  # the one "interrupted by" line
    recorded: dict[str, bool]  # candidate -> correct, as recorded before the resume
    final: dict[str, bool]  # ... after it
    wrong_status: str  # the wrong candidate's final status


def interrupt_then_resume(root: Path, phase: str, sig: signal.Signals) -> Outcome:
    """Interrupt a run in `phase` with `sig`, check that it wound down (code, one line, no process or temp folder
    left, nothing judged before the signal recorded in an earlier phase), then resume it; what the tests judge."""
    problems, candidates, hang, slow = write_corpus(root)
    marker, begun = PHASES[phase]
    (hang if marker == "hang" else slow).write_text("")
    run_dir = root / "r" / "run"
    proc = start(root, "run", *FAST, "--problems", str(problems), "--candidates", str(candidates),
                 "--out", str(root / "r"), "--run-id", "run")
    wait_for(f"the {phase} phase", lambda: begun(run_dir), proc)
    child = int(_read(run_dir / "logs" / "tiny" / "hangs.compile.log").split("CHILDPID=")[1].split()[0]) \
        if phase == "building" else None
    sent = time.monotonic()
    os.killpg(proc.pid, sig)
    out, err = proc.communicate(timeout=120)
    took = time.monotonic() - sent

    assert took < 30, f"took {took:.1f} s to stop"
    assert "Traceback" not in out + err, err
    lines = [line for line in err.splitlines() if "interrupted by" in line]
    assert len(lines) == 1, err
    recorded = verdicts(run_dir)
    for v in recorded:  # whatever was recorded was judged to the end
        assert v["status"] not in ("crashed", "skipped", "timeout", "runtime_error", "compile_error"), v
    assert not any((root / "tmp").glob("kbeval-run-*")), "the run's private temp folder was left behind"
    assert children_of(proc.pid) == [], "processes of the interrupted run still alive"
    if child is not None:
        assert not alive(child), "the hanging build's child process survived the interrupt"

    hang.unlink(missing_ok=True)
    slow.unlink(missing_ok=True)
    resumed = start(root, "run", "--resume", str(run_dir))
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, (out, err)
    final = verdicts(run_dir)
    assert sorted(v["candidate"] for v in final) == sorted(EXPECTED), final  # each exactly once
    for name, correct in EXPECTED.items():  # the two-line files say what the verdicts say
        assert _read(run_dir / "tiny" / f"{name}.txt").startswith(f"Evaluation: {correct}")
    return Outcome(proc.returncode, lines[0], {v["candidate"]: v["correct"] for v in recorded},
                   {v["candidate"]: v["correct"] for v in final},
                   {v["candidate"]: v["status"] for v in final}["wrong"])


@pytest.mark.parametrize("phase", list(PHASES))
def test_ctrl_c_in_each_phase_records_nothing_false_and_resume_finishes(tmp_path: Path, phase: str) -> None:
    outcome = interrupt_then_resume(tmp_path, phase, signal.SIGINT)
    assert outcome.returncode == 130 and "interrupted by SIGINT" in outcome.message
    assert f"kbeval run --resume {tmp_path / 'r' / 'run'}" in outcome.message
    assert outcome.recorded.items() <= EXPECTED.items()  # nothing false was recorded
    assert outcome.recorded == {} or phase == "judging"  # before judging, nothing was judged to the end
    assert outcome.final == EXPECTED and outcome.wrong_status == "incorrect"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
@pytest.mark.parametrize("phase", list(PHASES))
def test_sigterm_and_sighup_in_each_phase(tmp_path: Path, phase: str, sig: signal.Signals) -> None:
    outcome = interrupt_then_resume(tmp_path, phase, sig)
    assert outcome.returncode == 128 + sig and f"interrupted by {sig.name}" in outcome.message
    assert f"kbeval run --resume {tmp_path / 'r' / 'run'}" in outcome.message
    assert outcome.recorded.items() <= EXPECTED.items()  # nothing false was recorded
    assert outcome.recorded == {} or phase == "judging"
    assert outcome.final == EXPECTED and outcome.wrong_status == "incorrect"


def test_a_stopped_queue_hands_out_nothing_more() -> None:
    """Once stopped, a lane waiting for work (or finding some ready) gets None and leaves."""
    stop = [False]
    queue: ReadyQueue[str, str] = ReadyQueue(["a", "b"], key=lambda item: item, stopped=lambda: stop[0])
    queue.finish("a", "built")
    stop[0] = True
    assert queue.take() is None  # "a" is ready, "b" still building: neither keeps a lane


def test_after_a_stop_a_dead_worker_is_the_stop_not_the_candidates_crash(tmp_path: Path) -> None:
    """A worker killed by the stop raises `Interrupted`, never a `WorkerFailure` a verdict could be made of;
    and no worker starts once a stop was asked for."""
    from kernelbench_eval.isolation.process import WorkerFailure, WorkerProcess
    from kernelbench_eval.requests import ImportRequest

    source = tmp_path / "m.py"
    source.write_text(HONEST)
    ask = ImportRequest(path=str(source), class_name="ModelNew")
    worker = WorkerProcess(tmp_path, tmp_path / "log", role="candidate")
    try:
        with worker:
            worker.call(ask, timeout=120)
            interrupts.request(signal.SIGINT)  # kills every tracked worker: this one
            with pytest.raises(interrupts.Interrupted):
                worker.call(ask, timeout=120)
        with pytest.raises(interrupts.Interrupted):
            WorkerProcess(tmp_path, tmp_path / "log2", role="candidate").start()
    except WorkerFailure as exc:  # pragma: no cover - the failure this test exists to rule out
        raise AssertionError(f"a killed worker became a failure: {exc}") from exc
    finally:
        interrupts.reset()


def test_resume_with_another_cache_is_one_line_and_no_progress(tmp_path: Path) -> None:
    """A run resumed with a cache that did not seal its manifest (deleted, or another --cache-dir) is refused
    before any progress is drawn: one line, exit 2."""
    problems, candidates, _, _ = write_corpus(tmp_path)
    (candidates / "tiny" / "hangs.py").unlink()
    first = start(tmp_path, "run", *FAST, "--problems", str(problems), "--candidates", str(candidates),
                  "--out", str(tmp_path / "r"), "--run-id", "run", "--problem", "tiny")
    first.communicate(timeout=600)
    assert first.returncode == 0
    (candidates / "tiny" / "more.py").write_text(HONEST)  # something left to judge
    resumed = start(tmp_path, "run", "--resume", str(tmp_path / "r" / "run"), "--cache-dir",
                    str(tmp_path / "other-cache"))
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 2, (out, err)
    assert [line for line in err.splitlines() if line.strip()] == [err.strip()], err  # one line
    assert "refusing to resume" in err and "building" not in err and "judging" not in err, err
