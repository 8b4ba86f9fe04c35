"""The lanes' cores lent to the builds while no lane works (`isolation/lending.py`): real process trees in
sessions of their own, their threads' affinity read back from the kernel. Nothing here reads a clock: waits
for the keeper have a generous deadline and pass as soon as it has acted."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelbench_eval.isolation import lending
from kernelbench_eval.isolation.linux import threads

CPUS = sorted(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(len(CPUS) < 2, reason="needs two cores to lend one")
LANES, BUILDS = frozenset(CPUS[-1:]), frozenset(CPUS[:-1])
# a build worker's shape: a session leader, pinned to the builds' cores, with a child that has a thread of its own
TREE = """
import os, sys, threading, time
os.sched_setaffinity(0, {builds})
if os.fork() == 0:
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
    time.sleep(600)
print("ready", flush=True)
time.sleep(600)
"""
MODEL = """
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    return [torch.ones(4)]


def get_init_inputs():
    return []
"""


@pytest.fixture
def tree() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", TREE.format(builds=set(BUILDS))], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def masks(session: int) -> set[frozenset[int]]:
    tids = lending.sessions_threads({session})
    assert len(tids) >= 3  # the leader, its child and the child's thread
    return {frozenset(os.sched_getaffinity(tid)) for tid in tids}


def eventually(check, deadline_s: float = 60.0) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.01)
    return False


def test_every_thread_of_a_lent_session_gets_the_lanes_cores_and_gives_them_back_while_a_lane_works(
        tree: subprocess.Popen[str]):
    lender = lending.Lender(LANES, BUILDS, every_s=0.01)
    try:
        assert masks(tree.pid) == {BUILDS}
        with lender.lent(tree.pid):
            assert eventually(lambda: masks(tree.pid) == {BUILDS | LANES})
            with lender.working():
                assert masks(tree.pid) == {BUILDS}  # taken back before the lane's work begins, not eventually
                with lender.working():  # a second lane: still nothing lent
                    pass
                time.sleep(0.2)  # the keeper (every 0.01 s) had its chances: it waits while a lane works
                assert masks(tree.pid) == {BUILDS}
            assert eventually(lambda: masks(tree.pid) == {BUILDS | LANES})
        with lender.working():  # no longer lent: left alone
            assert masks(tree.pid) == {BUILDS | LANES}
    finally:
        lender.close()


def test_taking_back_sweeps_again_until_a_sweep_moves_nothing(monkeypatch: pytest.MonkeyPatch):
    """A process forked during a sweep carries its parent's old mask and shows only to the next sweep."""
    lender = lending.Lender(LANES, BUILDS, every_s=3600)
    lender.close()  # the keeper out of the way: only the taking back runs
    scans = iter([[1], [1, 2], [1, 2], [1, 2]])  # the second scan finds a child forked during the first
    moved: list[list[int]] = []
    on: dict[int, frozenset[int]] = {}

    def move(tids: list[int], cpus: frozenset[int]) -> int:
        moved.append(tids)
        changed = [t for t in tids if on.get(t) != cpus]
        on.update(dict.fromkeys(tids, cpus))
        return len(changed)

    monkeypatch.setattr(lending, "sessions_threads", lambda sessions: next(scans))
    monkeypatch.setattr(lending, "move", move)
    with lender.lent(7), lender.working():
        pass
    assert moved == [[1], [1, 2], [1, 2]] and on == {1: BUILDS, 2: BUILDS}


def test_switched_off_nothing_is_lent(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(lending.ENV, "off")
    assert lending.open_lender((LANES, BUILDS)) is None
    assert lending.open_lender(None) is None
    monkeypatch.setenv(lending.ENV, "on")
    try:
        assert isinstance(lending.open_lender((LANES, BUILDS)), lending.Lender)
    finally:
        lending.close()


def test_a_lane_takes_the_cores_back_before_it_opens_a_reference_or_judges(tree: subprocess.Popen[str],
                                                                         tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch):
    """The wiring: `EvalLane.prepare` and `evaluate` run inside `working` (a real lender, a real lent tree)."""
    from kernelbench_eval.records import Findings, RunSettings
    from kernelbench_eval.run import lanes

    seen: list[set[frozenset[int]]] = []

    class Ref:
        error = warning = baseline_key = None

    def reference_for(problem: object, log: Path) -> tuple[Ref, bool]:
        seen.append(masks(tree.pid))
        return Ref(), True

    def judge(*args: object) -> Findings:
        seen.append(masks(tree.pid))
        return Findings(status="ok")

    monkeypatch.setattr(lanes, "judge", judge)
    lender = lending.open_lender((LANES, BUILDS))
    assert lender is not None
    try:
        lane = lanes.EvalLane(lanes.LaneSpec("cpu:0"),
                              lanes.LaneConfig(RunSettings(device="cpu"), tmp_path / "b.json", 60, 60))
        monkeypatch.setattr(lane, "_reference_for", reference_for)
        with lending.lent(tree.pid):
            for step in (lambda: lane.prepare(None, tmp_path / "r.log"),  # type: ignore[arg-type]
                         lambda: lane.evaluate(None, tmp_path, None, tmp_path / "r.log", tmp_path / "c.log")):  # type: ignore[arg-type]
                assert eventually(lambda: masks(tree.pid) == {BUILDS | LANES})  # lent while the lane idles
                step()
    finally:
        lending.close()
    assert seen == [{BUILDS}] * 3  # prepare's reference; evaluate's reference and its judging


def test_a_build_worker_is_lent_as_a_session_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`compile_candidate` lends its worker (a session leader, alive while lent) for as long as it builds."""
    from kernelbench_eval.build import compile as build
    from kernelbench_eval.discover.corpus import Problem, make_candidate, sha256_file

    lent: list[tuple[int, int, bool]] = []

    class Recorder:
        def __init__(self, session: int) -> None:
            self.session = session

        def __enter__(self) -> None:
            lent.append((self.session, os.getsid(self.session), bool(threads(self.session))))

        def __exit__(self, *exc: object) -> None:
            pass

    monkeypatch.setattr(lending, "lent", Recorder)
    (tmp_path / "p.py").write_text(MODEL)
    (tmp_path / "c.py").write_text(MODEL.replace("class Model", "class ModelNew"))
    problem = Problem("p", tmp_path / "p.py", sha256_file(tmp_path / "p.py"))
    compiled = build.compile_candidate(make_candidate(problem, tmp_path / "c.py"), "cpu", tmp_path / "cache",
                                       tmp_path / "c.log", 120)
    assert compiled.record.ok, compiled.record.error
    assert len(lent) == 1 and lent[0][0] == lent[0][1] and lent[0][2]
