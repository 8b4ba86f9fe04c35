"""The reference cannot be slowed by the candidate it is timed against, and the schedule cannot be precomputed.

One real CPU run of the command line over `fixtures/attacks_reference` (candidates that stop, pin or crowd out the
reference's worker while it is timed, an honest control, and one that precomputes), then the pieces of
`judge.refguard` and the one-call-at-a-time protocol on processes and numbers this test controls. No assertion
here rests on how fast anything ran: the attacks are caught by what the harness finds (a stopped or rescheduled
reference), or shown harmless by what they could see or do (the candidates log it). The run is not sandboxed:
the guard must stand on its own where a platform refuses the sandbox.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import FIXTURES, kbeval, read_verdicts
from timed import assert_timed_sanely

from kernelbench_eval.budgets import Budgets
from kernelbench_eval.building.compile import compile_candidate
from kernelbench_eval.discover.corpus import Problem, make_candidate, sha256_file
from kernelbench_eval.judge import measure as measure_module
from kernelbench_eval.judge import refguard
from kernelbench_eval.judge import timing_stage as timed_module
from kernelbench_eval.judge.baselines import BaselineStore
from kernelbench_eval.judge.judging import ReferenceSide, Secrets, judge
from kernelbench_eval.judge.measure import Deadline, TimedModel, measure
from kernelbench_eval.judge.reference_timing import ReferenceTiming
from kernelbench_eval.judge.refguard import (
    MAX_GAP_S,
    Guard,
    StandIn,
    check_reference,
    sched_of,
    snapshot,
    stop_group,
    threads,
)
from kernelbench_eval.messages import TimeReply
from kernelbench_eval.records import RunSettings

PROBLEMS = FIXTURES / "attack_problems"
ATTACKS = FIXTURES / "attacks_reference"
SANDBOX_OFF = "KBEVAL_SANDBOX_OFF"


@pytest.fixture(scope="module")
def guarded_run(tmp_path_factory: pytest.TempPathFactory, build_cache: Path) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("refguard")
    before = os.environ.get(SANDBOX_OFF)
    os.environ[SANDBOX_OFF] = "all"  # the guard on its own: the sandbox's seccomp and Landlock would refuse the
    try:  # attacks' signals and re-pinning outright (tests/test_sandbox.py), and a platform may refuse the sandbox
        proc = kbeval("run", "--device", "cpu", "--problems", str(PROBLEMS), "--candidates", str(ATTACKS),
                      "--trials", "2", "--timeout", "120", "--threads", "1", "--timing-budget", "5", "--max-speedup",
                      "0", "--no-compile-baseline", "--out", str(out), "--run-id", "r", cache=build_cache, check=False)
    finally:
        if before is None:
            os.environ.pop(SANDBOX_OFF, None)
        else:
            os.environ[SANDBOX_OFF] = before
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    verdicts = read_verdicts(out / "r")
    for v in verdicts.values():
        v["log_text"] = (out / "r" / v["log"]).read_text(errors="replace") if v.get("log") else ""
    return verdicts


def _reference_reasons(v: dict) -> list[str]:
    """What the guard says when something was done to the reference (`judge.refguard`)."""
    said = ("found stopped", "rescheduled", "alone with the candidate stopped", "did not stop")
    return [s for s in said if s in (v["error"] or "")]


@pytest.mark.slow  # the guarded run: every reference attack judged end to end
def test_a_candidate_that_stops_the_reference_is_caught(guarded_run):
    """stop_reference SIGSTOPs the reference's worker in pulses: it is found stopped (and continued) before a block."""
    v = guarded_run["stop_reference"]
    assert "stop_reference:" in v["log_text"], "the attack never ran: this test would prove nothing"
    assert v["status"] == "suspicious" and v["correct"], (v["status"], v["error"])
    assert "found stopped" in v["error"], v["error"]


@pytest.mark.slow  # the guarded run: every reference attack judged end to end
def test_a_candidate_that_pins_the_reference_is_caught(guarded_run):
    """pin_reference pins the reference's threads to CPU 0 after each of its blocks: found, undone, and said."""
    v = guarded_run["pin_reference"]
    assert v["status"] == "suspicious" and v["correct"], (v["status"], v["error"])
    assert "rescheduled (CPUs 0," in v["error"], v["error"]


@pytest.mark.slow  # the guarded run: every reference attack judged end to end
def test_threads_spinning_while_the_candidate_waits_do_not_slow_the_reference(guarded_run):
    """spin_while_waiting's threads are stopped with it for the reference's blocks (every thread: see
    test_every_thread_is_stopped_before_the_reference_runs), so the reference beside it is the reference alone."""
    v = guarded_run["spin_while_waiting"]
    assert v["correct"], (v["status"], v["error"])
    assert re.search(r"spin: [1-9]\d* products", v["log_text"]), "the spinners never ran: this test would prove nothing"
    assert v["timing"]["ref_alone_check"] in ("agrees", "refreshed"), v["timing"]
    assert not _reference_reasons(v), v["error"]


@pytest.mark.slow  # the guarded run: every reference attack judged end to end
def test_honest_control_and_the_reference_check(guarded_run):
    honest = guarded_run["honest"]
    assert_timed_sanely(honest, "honest")
    timing = honest["timing"]
    assert timing["ref_alone_check"] in ("agrees", "refreshed"), timing  # never "disturbed" for honest code
    assert timing["ref_alone_ms"] > 0 and timing["ref_alone_ratio"] > 0
    assert not _reference_reasons(honest), honest["error"]


@pytest.mark.slow  # the guarded run: every reference attack judged end to end
def test_one_call_at_a_time_leaves_nothing_to_precompute_end_to_end(guarded_run):
    v = guarded_run["precompute"]
    assert v["correct"], (v["status"], v["error"])
    assert "precompute: saw" not in v["log_text"]


# -- the schedule, one call at a time (a block of ten calls on the CPU: what a GPU block is) ---------------


def test_a_precomputing_candidate_sees_no_future_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """With ten-call blocks, precompute would find the block's schedule in its caller's frame; sent one call at a
    time, it finds only its own call, and pays for every call (it says in its log when it saw more)."""
    monkeypatch.setattr(measure_module, "CPU_BLOCK_CALLS", 10)
    problem = Problem("mm_relu", PROBLEMS / "mm_relu.py", sha256_file(PROBLEMS / "mm_relu.py"))
    settings = RunSettings(device="cpu", trials=1, reps=30, max_reps=60, timing_budget=2.0, warmup=2,
                           compile_baseline=False, max_speedup=0, threads=1)
    ref = ReferenceSide(problem, settings, Secrets.draw(1), tmp_path / "ref.log", Budgets.of(120, 120),
                        BaselineStore(tmp_path / "baselines.json")).open()
    try:
        assert ref.error is None, ref.error
        path = ATTACKS / "mm_relu" / "precompute.py"
        build = compile_candidate(make_candidate(problem, path), "cpu", tmp_path / "cache", tmp_path / "c.log", 120)
        assert build.record.ok, build.record.error
        findings = judge(ref, build, path, tmp_path / "precompute.log", 120)
    finally:
        ref.close()
    assert findings.correct, (findings.status, findings.error)
    assert findings.timing is not None and findings.timing.checked_calls >= 30
    assert "precompute: saw" not in (tmp_path / "precompute.log").read_text(errors="replace")


class _Recorder:
    """A lane's worker that answers every `time` request with one call of 1 ms, keeping the requests."""

    def __init__(self) -> None:
        self.requests: list = []
        self.polls: list[float] = []
        self.proc = None

    def call(self, req, timeout, poll=0.0):  # noqa: ANN001, ANN201 (a WorkerProcess stand-in)
        self.requests.append(req)
        self.polls.append(poll)
        return TimeReply(ok=True, samples_ms=[1.0] * len(req.schedule), device_ms=[1.0] * len(req.schedule))

    def call_each(self, requests, timeout, poll=0.0):  # noqa: ANN001, ANN201
        return [self.call(req, timeout, poll) for req in requests]


class _Slow(_Recorder):
    """A worker whose every timed call takes `seconds` of the harness's time."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def call(self, req, timeout, poll=0.0):  # noqa: ANN001, ANN201
        if req.schedule:
            time.sleep(self.seconds)
        return super().call(req, timeout, poll)


def test_workers_are_sent_one_call_at_a_time():
    worker = _Recorder()
    settings = RunSettings(device="cuda", reps=30, max_reps=30, timing_budget=60, warmup=1)
    result = measure([TimedModel(worker)], ["a", "b"], settings, Deadline(60), calls_per_block=10)  # type: ignore[arg-type]
    timed = [r for r in worker.requests if r.schedule]
    assert result.blocks == 3 and len(timed) == 30
    assert all(len(r.schedule) == 1 for r in timed)
    assert [r.first for r in timed[:10]] == list(range(10))  # where each call goes in its block's kept outputs
    assert set(worker.polls) == {0.0}  # no lane's cores kept here: the harness sleeps on the pipe


def test_timed_calls_are_awaited_by_polling_where_the_harness_has_its_own_core(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(measure_module.cores, "harness_may_poll", lambda: True)
    worker = _Recorder()
    settings = RunSettings(device="cuda", reps=10, max_reps=10, timing_budget=60, warmup=1)
    measure([TimedModel(worker)], ["a"], settings, Deadline(60), calls_per_block=10)  # type: ignore[arg-type]
    polls = dict(zip((bool(r.schedule) for r in worker.requests), worker.polls, strict=True))
    assert polls == {False: 0.0, True: measure_module.POLL_S}  # the warm-up sleeps, every timed call polls
    worker = _Recorder()
    measure([TimedModel(worker)], ["a"], settings.model_copy(update={"device": "cpu"}), Deadline(60), 10)  # type: ignore[arg-type]
    assert set(worker.polls) == {0.0}  # on the CPU, a polling harness would take the timed model's core



# -- the alone re-check in the interleaved cadence (`refguard.StandIn`) -------------------------------------


def test_measure_records_how_long_each_model_waited_between_its_blocks():
    """ABBA over three blocks (ref cand | cand ref | ref cand): the reference waits through the candidate's first
    two blocks (20 ms each here), the candidate through the reference's next two (10 ms each); what the reference
    waited is what the re-check stands in for."""
    ref = TimedModel(_Slow(0.001))  # type: ignore[arg-type]
    cand = TimedModel(_Slow(0.002))  # type: ignore[arg-type]
    settings = RunSettings(device="cuda", reps=30, max_reps=30, timing_budget=60, warmup=1)
    assert measure([ref, cand], ["a"], settings, Deadline(60), calls_per_block=10).blocks == 3
    assert len(ref.idle_s) == 2 and len(cand.idle_s) == 2
    assert ref.idle_s[0] >= 0.04 and cand.idle_s[1] >= 0.02


def test_the_stand_in_spins_through_each_recorded_wait_in_turn(monkeypatch: pytest.MonkeyPatch):
    def no_sleep(seconds: float) -> None:
        raise AssertionError("the stand-in slept: a sleeping host is not a candidate's turn")

    monkeypatch.setattr(refguard.time, "sleep", no_sleep)
    stand_in = StandIn([0.03, 0.0])
    begun = time.perf_counter()
    stand_in()
    first = time.perf_counter() - begun
    stand_in()
    stand_in()  # the recorded waits again, in their order
    assert first >= 0.03 and time.perf_counter() - begun >= 0.06 and stand_in.turn == 3
    assert StandIn([]).gaps == [0.0] and StandIn([5.0, -1.0]).gaps == [MAX_GAP_S, 0.0]  # bounded, never negative


def test_the_recheck_stands_in_for_the_candidates_turns():
    """`timing_stage` hands the alone re-check the waits the reference had beside this candidate."""
    seen: dict = {}

    settings = RunSettings(device="cpu", timing_budget=4)
    alone = [1.0 + 0.01 * (i % 7) for i in range(60)]

    class _Timing(ReferenceTiming):
        def time_alone(self, budget: float | None = None, between=None) -> list[float]:  # noqa: ANN001
            seen["budget"], seen["between"] = budget, between
            return list(self.alone)

    timing = _Timing(None, None, settings, 60)  # type: ignore[arg-type]
    timing.start(alone)
    ref = SimpleNamespace(settings=settings, timing=timing)
    held = SimpleNamespace(before_reference=lambda: None, release=lambda: False, broken=False)
    interleaved = TimedModel(_Recorder(), event_ms=[3 * x for x in alone], idle_s=[0.01, 0.002])  # type: ignore[arg-type]
    timed = timed_module.Interleaved(interleaved, interleaved, 6, 60, [], 1.0, held)  # type: ignore[arg-type]
    agreement = timed_module._check_reference(SimpleNamespace(ref=ref, deadline=Deadline(60)), timed)  # type: ignore[arg-type]
    assert agreement is not None and agreement.outcome == "disturbed"
    assert isinstance(seen["between"], StandIn) and seen["between"].gaps == [0.01, 0.002] and seen["budget"] == 2

# -- the guard on processes this test starts ----------------------------------------------------------------

_BUSY = "import threading, time\n" \
        "def spin():\n    while True:\n        sum(range(1000))\n" \
        "for _ in range(2):\n    threading.Thread(target=spin, daemon=True).start()\n" \
        "while True:\n    time.sleep(0.01)\n"


def _start(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def _worker(proc: subprocess.Popen) -> SimpleNamespace:
    return SimpleNamespace(proc=proc)


@pytest.fixture
def pair():
    cand, ref = _start(_BUSY), _start("import time\nwhile True:\n    time.sleep(0.01)\n")
    time.sleep(0.5)  # threads started
    yield cand, ref
    for proc in (cand, ref):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _states(pid: int) -> set[str]:
    return {Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()[0] for t in threads(pid)}


def test_every_thread_is_stopped_before_the_reference_runs(pair):
    cand, _ = pair
    assert len(threads(cand.pid)) == 3 and _states(cand.pid) & {"R", "S"}
    assert stop_group(cand.pid)
    assert _states(cand.pid) <= {"T", "t"}  # all of them, not only the one that took the signal
    os.killpg(cand.pid, signal.SIGCONT)


def test_a_stopped_or_rescheduled_reference_is_found_and_put_back(pair):
    cand, ref = pair
    opened = snapshot(ref.pid)
    guard = Guard(_worker(cand), _worker(ref), opened)  # type: ignore[arg-type]
    guard.before_reference()
    guard.release()
    assert guard.reasons() == []  # nothing done to it: nothing said
    os.kill(ref.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while _states(ref.pid) != {"T"} and time.monotonic() < deadline:  # the stop is taken when it is scheduled
        time.sleep(0.001)
    cpus = sorted(os.sched_getaffinity(ref.pid))
    os.sched_setaffinity(ref.pid, {cpus[0]})  # a change wherever there are two CPUs or more
    os.setpriority(os.PRIO_PROCESS, ref.pid, 5)  # a change everywhere
    guard.before_reference()
    try:
        time.sleep(0.05)
        assert _states(ref.pid) != {"T"}  # running again
        assert os.sched_getaffinity(ref.pid) == set(cpus)
        assert sched_of(ref.pid) == opened[ref.pid] or guard.broken  # a plain user cannot lower a nice value back
        reasons = " ".join(guard.reasons())
        assert "found stopped" in reasons and "rescheduled" in reasons and "nice 5" in reasons, reasons
        assert _states(cand.pid) <= {"T", "t"}
    finally:
        guard.release()


def test_the_reference_alone_decides_between_a_disturbed_reference_and_a_changed_machine(pair):
    """Numbers, not clocks: the interleaved reference 3x its alone time is `disturbed` when the reference is fast
    alone right after, and the machine `refreshed` when it is as slow alone; a near-1 ratio re-measures nothing."""
    cand, ref = pair
    guard = Guard(_worker(cand), _worker(ref), snapshot(ref.pid))  # type: ignore[arg-type]
    alone = [1.0 + 0.01 * (i % 7) for i in range(100)]
    slow = [3 * x for x in alone]

    def never() -> list[float]:
        raise AssertionError("re-measured although the times agreed")

    agreement, kept = check_reference([x * 1.05 for x in alone], alone, "cpu", guard, never)
    assert agreement.outcome == "agrees" and kept is alone
    try:
        agreement, kept = check_reference(slow, alone, "cpu", guard, lambda: list(alone))
        assert agreement.outcome == "disturbed" and kept is alone and agreement.ratio == pytest.approx(3, rel=0.05)
        assert guard.held  # the candidate stayed stopped while the reference was timed alone
        assert "alone with the candidate stopped" in agreement.reason(3.0)
        fresh = list(slow)
        agreement, kept = check_reference(slow, alone, "cpu", guard, lambda: fresh)
        assert agreement.outcome == "refreshed" and kept is fresh  # later candidates are compared with it
        agreement, kept = check_reference(alone, slow, "cpu", guard, lambda: list(alone))
        assert agreement.outcome == "refreshed"  # a stale, slow baseline is replaced, nobody blamed
    finally:
        guard.release()


def _ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def test_the_sandboxs_cgroup_freezes_what_left_the_process_group(tmp_path: Path):
    """A child in a session of its own is out of reach of a group stop, not of its cgroup's freeze."""
    from kernelbench_eval.isolation import cgroups

    try:
        leaf = cgroups.Leaf()
    except OSError as exc:
        pytest.skip(f"no cgroup v2 leaf here: {exc}")
    pid_file = tmp_path / "child"
    code = ("import os, sys\nif os.fork() == 0:\n    os.setsid()\n"
            f"    open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n    while True:\n        pass\n"
            "import time\nwhile True:\n    time.sleep(0.01)\n")
    cand = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()\n" + code],
                            stdin=subprocess.PIPE, start_new_session=True)
    ref = _start("import time\nwhile True:\n    time.sleep(0.01)\n")
    try:
        leaf.add(cand.pid)  # before it forks: its child is born in the leaf
        cand.stdin.write(b"go\n")
        cand.stdin.flush()
        deadline = time.monotonic() + 10
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.01)
        child = int(pid_file.read_text())
        guard = Guard(SimpleNamespace(proc=cand, leaf=leaf), _worker(ref), snapshot(ref.pid))  # type: ignore[arg-type]
        guard.hold()
        assert guard.by_leaf and guard.reasons() == []
        before = _ticks(child)
        time.sleep(1.0)
        assert _ticks(child) - before <= 1  # frozen: at most the tick it was caught in
        guard.release()
        deadline = time.monotonic() + 10
        while _ticks(child) - before <= 2 and time.monotonic() < deadline:  # it spins again
            time.sleep(0.05)
        assert _ticks(child) - before > 2
    finally:
        leaf.kill()
        os.killpg(ref.pid, signal.SIGKILL)
        ref.wait()
        cand.wait()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin to one")
def test_what_an_earlier_candidate_left_is_put_back_before_the_next_starts():
    """A pinning attack that pins the reference after its last block (before it is killed) left the reference
    pinned for the next candidate, and an honest control was called `suspicious` for it: the reference is put
    back as it was opened before each candidate starts, blaming nobody."""
    from kernelbench_eval.judge.refguard import sched_of, settle_reference, snapshot

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        opened = snapshot(proc.pid)
        os.sched_setaffinity(proc.pid, {min(os.sched_getaffinity(0))})  # what the attacker left
        assert sched_of(proc.pid) != opened[proc.pid]
        assert settle_reference(proc.pid, opened)
        assert sched_of(proc.pid) == opened[proc.pid]
    finally:
        proc.kill()
        proc.wait()


class _Logged(_Recorder):
    """A worker that writes its name into a shared log at each timed call."""

    def __init__(self, name: str, log: list[str]) -> None:
        super().__init__()
        self.name, self.log = name, log

    def call(self, req, timeout, poll=0.0):  # noqa: ANN001, ANN201
        if req.schedule:
            self.log.append(self.name)
        return super().call(req, timeout, poll)


@pytest.mark.parametrize("device, checked, expected", [
    ("cpu", True, "CR|CR|CR|CR"),  # the check runs in the reference's process: the candidate goes first every time
    ("cpu", False, "RC|CR|RC|CR"),  # no check between blocks: ABBA
    ("cuda", True, "RC|CR|RC|CR"),  # on a GPU the L2 is flushed before every call: ABBA
])
def test_who_goes_first_in_each_block(device: str, checked: bool, expected: str):
    """On the CPU, with ABBA and the check (in the reference's process) after every block, identical copies came
    out slow (median 0.89 over 12, 0.94-0.96 with the candidate first): there the candidate goes first in every
    block; elsewhere, and with no check between blocks, ABBA."""
    log: list[str] = []
    marks: list[int] = []
    ref, cand = TimedModel(_Logged("R", log)), TimedModel(_Logged("C", log))  # type: ignore[arg-type]
    settings = RunSettings(device=device, reps=4, max_reps=4, timing_budget=60, warmup=1)
    after = (lambda block, schedule: marks.append(len(log))) if checked else None
    blocks = measure([ref, cand], ["a"], settings, Deadline(60), calls_per_block=1, after_block=after).blocks
    assert blocks == 4
    assert "|".join("".join(log[i:i + 2]) for i in range(0, len(log), 2)) == expected
    assert marks == ([2, 4, 6, 8] if checked else [])
