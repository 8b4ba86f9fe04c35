"""The scheduler's ordering and lanes, with fake builds and fake lanes (threads that only record and sleep), and a
lane's open references (`EvalLane`, with a stand-in for the reference side)."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from kernelbench_eval.budgets import Budgets
from kernelbench_eval.discover.corpus import Problem
from kernelbench_eval.records import RunSettings
from kernelbench_eval.run import lanes
from kernelbench_eval.run.lanes import EvalLane, LaneConfig, LaneSpec
from kernelbench_eval.run.schedule import PATIENCE, LaneJobs, ReadyQueue, drive


@dataclass
class Log:
    """What happened when, from every thread."""

    built: dict[str, float] = field(default_factory=dict)  # item -> build finished
    runs: list[tuple[str, str, float, float]] = field(default_factory=list)  # (lane, item, start, end)
    lock: threading.Lock = field(default_factory=threading.Lock)


def problem(item: str) -> str:
    return item.split("/")[0]


def fake_build(log: Log, seconds: dict[str, float], fail: set[str] = frozenset()):
    def build(item: str) -> str | None:
        time.sleep(seconds.get(item, 0.01))
        with log.lock:
            log.built[item] = time.monotonic()
        return None if item in fail else f"built {item}"
    return build


def fake_lane(log: Log, name: str, seconds: float = 0.05):
    def evaluate(item: str, built: str) -> None:
        assert built == f"built {item}"
        start = time.monotonic()
        time.sleep(seconds)
        with log.lock:
            log.runs.append((name, item, start, time.monotonic()))
    return evaluate


ITEMS = [f"p{p}/c{c}" for p in range(3) for c in range(4)]


def test_every_built_item_is_evaluated_once_after_its_build_and_one_at_a_time_per_lane() -> None:
    log = Log()
    seconds = {item: 0.02 * (n % 5) for n, item in enumerate(ITEMS)}
    drive(ITEMS, fake_build(log, seconds), jobs=3, lanes=[fake_lane(log, "a"), fake_lane(log, "b")], key=problem)
    assert sorted(item for _, item, _, _ in log.runs) == sorted(ITEMS)
    for _, item, start, _ in log.runs:
        assert start >= log.built[item]
    for lane in ("a", "b"):
        spans = sorted((s, e) for name, _, s, e in log.runs if name == lane)
        assert all(prev_end <= start for (_, prev_end), (start, _) in itertools.pairwise(spans))  # never two at once
    assert {name for name, *_ in log.runs} == {"a", "b"}  # both lanes did work


def test_evaluation_overlaps_compiles() -> None:
    """The first candidate is evaluated while later ones are still compiling (GPU not idle meanwhile)."""
    log = Log()
    seconds = {item: 0.3 if n else 0.01 for n, item in enumerate(ITEMS[:4])}
    drive(ITEMS[:4], fake_build(log, seconds), jobs=1, lanes=[fake_lane(log, "a")], key=problem)
    first_eval = min(start for *_, start, _ in log.runs)
    assert first_eval < max(log.built.values())


def test_hold_waits_for_every_compile() -> None:
    """On the CPU, no timing runs while compilers share the cores."""
    log = Log()
    drive(ITEMS[:5], fake_build(log, {}), jobs=2, lanes=[fake_lane(log, "a")], key=problem, hold=True)
    assert min(start for *_, start, _ in log.runs) >= max(log.built.values())


def test_failed_builds_go_to_no_lane() -> None:
    log = Log()
    drive(ITEMS[:4], fake_build(log, {}, fail={ITEMS[1]}), jobs=2, lanes=[fake_lane(log, "a")], key=problem)
    assert sorted(item for _, item, _, _ in log.runs) == sorted(set(ITEMS[:4]) - {ITEMS[1]})


def test_a_lane_stays_on_its_problem_while_it_has_candidates_ready() -> None:
    """All built up front, one lane: it finishes a problem before it opens the next (one reference each)."""
    log = Log()
    shuffled = [ITEMS[i] for i in (0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11)]
    drive(shuffled, fake_build(log, {}), jobs=4, lanes=[fake_lane(log, "a", 0.0)], key=problem, hold=True)
    order = [problem(item) for _, item, _, _ in sorted(log.runs, key=lambda run: run[2])]
    switches = sum(a != b for a, b in itertools.pairwise(order))
    assert switches == 2, order


def test_a_failing_lane_is_reported_and_the_others_finish() -> None:
    log = Log()

    def broken(item: str, built: str) -> None:
        raise RuntimeError("harness bug")

    with pytest.raises(RuntimeError, match="harness bug"):
        drive(ITEMS, fake_build(log, {}), jobs=2, lanes=[broken, fake_lane(log, "b", 0.01)], key=problem)
    assert len(log.runs) == len(ITEMS) - 1  # lane "b" judged all the rest


def test_a_failing_build_is_reported_without_a_hang() -> None:
    log = Log()

    def build(item: str) -> str:
        if item == ITEMS[2]:
            raise OSError("disk full")
        return f"built {item}"

    with pytest.raises(OSError, match="disk full"):
        drive(ITEMS[:4], build, jobs=2, lanes=[fake_lane(log, "a", 0.0)], key=problem)
    assert len(log.runs) == 3


# --- locality: a lane prefers builds its node holds, without starving the others --------------------------


def _queue(*items: str, later: tuple[str, ...] = ()) -> ReadyQueue:
    """A queue whose `items` are built (in order) and whose `later` ones are still compiling."""
    queue = ReadyQueue([*items, *later], key=problem)
    for item in items:
        queue.finish(item, f"built {item}")
    return queue


def _on(*held: str):
    """A lane whose node holds the builds of `held`."""
    return lambda item, built: item in held


def test_a_lane_takes_a_build_its_node_holds_before_an_older_one_it_would_fetch() -> None:
    queue = _queue("p0/c0", "p0/c1", "p0/c2")
    assert queue.take(prefer=["p0"], near=_on("p0/c2"))[0] == "p0/c2"
    assert queue.take(prefer=["p0"], near=_on())[0] == "p0/c0"  # nothing near: the oldest
    assert queue.take(prefer=[], near=None)[0] == "p0/c1"


def test_the_problem_a_lane_has_open_comes_before_where_the_build_is() -> None:
    queue = _queue("p0/c0", "p1/c0", "p1/c1")
    assert queue.take(prefer=["p0"], near=_on("p1/c0", "p1/c1"))[0] == "p0/c0"  # a fetch is cheaper than a switch
    assert queue.take(prefer=["p2"], near=_on("p1/c1"))[0] == "p1/c1"  # no candidate of its problem: the near one


def test_a_build_no_lane_holds_is_taken_after_patience_runs_out() -> None:
    """Near builds keep arriving; the far one is passed over PATIENCE times, then taken next."""
    near = [f"p0/n{n}" for n in range(PATIENCE + 3)]
    queue = _queue("p0/far", later=tuple(near))
    taken = []
    for item in near:
        queue.finish(item, f"built {item}")
        taken.append(queue.take(prefer=["p0"], near=_on(*near))[0])
    assert taken[:PATIENCE] == near[:PATIENCE]  # passed over PATIENCE times
    assert taken[PATIENCE] == "p0/far"  # then first, though near ones are ready
    assert "p0/far" not in taken[PATIENCE + 1:]


def test_drive_passes_each_lane_its_own_locality() -> None:
    """One lane whose node holds the odd builds: it judges those first, then the rest, oldest first."""
    log = Log()
    items = [f"p0/c{n}" for n in range(8)]
    held = set(items[1::2])
    drive(items, fake_build(log, {}), jobs=1, key=problem, hold=True,
          lanes=[LaneJobs(fake_lane(log, "a", 0.0), near=lambda item, built: item in held)])
    assert [item for _, item, _, _ in log.runs] == items[1::2] + items[0::2]  # one lane: appended in order

def test_take_prefers_the_problems_a_lane_holds_in_order_else_the_oldest() -> None:
    queue: ReadyQueue[str, str] = ReadyQueue(ITEMS, problem)
    for item in ("p0/c0", "p1/c0", "p2/c0", "p1/c1"):
        queue.finish(item, f"built {item}")
    assert queue.take(prefer=["p2", "p1"]) == ("p2/c0", "built p2/c0")
    assert queue.take(prefer=["p2", "p1"]) == ("p1/c0", "built p1/c0")  # p2 has none ready: the next held
    assert queue.take(prefer=["p9"]) == ("p0/c0", "built p0/c0")  # none of its problems: the oldest ready


def test_drive_asks_a_lane_which_problems_it_holds_before_each_take() -> None:
    """All built up front (hold): a lane holding p2 then p1 takes their candidates first, in that order."""
    log, asked = Log(), []

    def holds() -> list[str]:
        asked.append(len(log.runs))
        return ["p2", "p1"]

    lane = LaneJobs(fake_lane(log, "a", 0.0), holds=holds)
    drive(ITEMS, fake_build(log, {}), jobs=4, lanes=[lane], key=problem, hold=True)
    order = [problem(item) for _, item, _, _ in log.runs]  # one lane: in the order it ran them
    assert order == ["p2"] * 4 + ["p1"] * 4 + ["p0"] * 4
    assert asked[:len(ITEMS)] == list(range(len(ITEMS)))  # before every take


def test_an_idle_lane_prepares_problems_still_building_once_each_and_before_their_candidates() -> None:
    """Baselines are measured while the first compiles run: an idle lane opens each problem ahead of its
    candidates, each problem once over all lanes, and never one it already took candidates of. (The builds of
    p1 and p2 finish only once both are prepared, so no timing decides this.)"""
    log, prepared = Log(), []
    gate = threading.Event()
    items = [f"p{p}/c{c}" for p in range(3) for c in range(2)]

    def build(item: str) -> str:
        if not item.startswith("p0"):
            assert gate.wait(30), "p1 and p2 were never prepared"
        with log.lock:
            log.built[item] = time.monotonic()
        return f"built {item}"

    def lane(name: str) -> LaneJobs:
        def prepare(key: str) -> None:
            with log.lock:
                prepared.append((key, time.monotonic()))
                if {"p1", "p2"} <= {k for k, _ in prepared}:
                    gate.set()
        return LaneJobs(fake_lane(log, name, 0.01), holds=lambda: [], prepare=prepare)

    drive(items, build, jobs=6, lanes=[lane("a"), lane("b")], key=problem)
    keys = [key for key, _ in prepared]
    assert sorted(keys) == sorted(set(keys)) and {"p1", "p2"} <= set(keys)  # each at most once, over both lanes
    for key, at in prepared:
        if key != "p0":  # p0 builds at once: a lane may take its candidates while another prepares it
            assert at < min(log.built[item] for item in items if problem(item) == key)
    assert sorted(item for _, item, _, _ in log.runs) == sorted(items)


def test_hold_never_prepares() -> None:
    """On the CPU nothing is timed while compilers share the cores, baselines included."""
    log, prepared = Log(), []
    lane = LaneJobs(fake_lane(log, "a", 0.0), holds=lambda: [], prepare=prepared.append)
    drive(ITEMS[:6], fake_build(log, {item: 0.1 for item in ITEMS}), jobs=2, lanes=[lane], key=problem, hold=True)
    assert prepared == [] and len(log.runs) == 6


class _FakeRef:
    """Stands in for `ReferenceSide` in `EvalLane`: records openings, closings and parking."""

    events: list[tuple[str, str]] = []
    sizes: dict[str, int] = {}
    tight: set[str] = set()  # problems whose memory plan does not fit while other references are open

    def __init__(self, problem: Problem, *args: object) -> None:
        self.problem, self.broken, self.error, self.warning = problem, False, None, None
        self.parked = False
        self.baselines = SimpleNamespace(key=None)
        self.lender = SimpleNamespace(memory_bytes=1000, residency=None, footprint=self._footprint)

    def open(self) -> _FakeRef:
        self.events.append(("open", self.problem.problem_id))
        opened = sum(e[0] == "open" for e in self.events) - sum(e[0] == "close" for e in self.events)
        if self.problem.problem_id in self.tight:
            self.lender.residency = SimpleNamespace(fits=opened == 1)  # fits only with the device to itself
        return self

    def close(self) -> None:
        self.events.append(("close", self.problem.problem_id))

    def park(self) -> None:
        self.parked = True

    def unpark(self) -> None:
        self.parked = False

    def _footprint(self) -> int:
        return self.sizes.get(self.problem.problem_id, 1)


@pytest.fixture
def fake_lane_refs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> EvalLane:
    monkeypatch.setattr(lanes, "ReferenceSide", _FakeRef)
    monkeypatch.setattr(_FakeRef, "events", [])
    monkeypatch.setattr(_FakeRef, "sizes", {})
    monkeypatch.setattr(_FakeRef, "tight", set())
    monkeypatch.setenv("KBEVAL_CACHE_DIR", str(tmp_path / "cache"))
    config = LaneConfig(RunSettings(device="cpu"), tmp_path / "baselines.json", Budgets.of(10.0, 10.0))
    return EvalLane(LaneSpec("cpu:0"), config)


def _problems(tmp_path: Path, count: int) -> list[Problem]:
    return [Problem(f"p{n}", tmp_path / f"p{n}.py", f"{n:064x}") for n in range(count)]


def test_a_lane_keeps_its_last_references_open_and_closes_the_least_recently_used(fake_lane_refs, tmp_path):
    lane, (p0, p1, p2, p3) = fake_lane_refs, _problems(tmp_path, 4)
    for p in (p0, p1, p2):
        lane.prepare(p, tmp_path / "ref.log")
    assert lane.holds() == ["p2", "p1", "p0"] and lanes.MAX_OPEN == 3
    lane.prepare(p1, tmp_path / "ref.log")  # open already: used again, not reopened
    assert _FakeRef.events.count(("open", "p1")) == 1 and lane.holds() == ["p1", "p2", "p0"]
    assert [ref.parked for ref in (lane.refs["p0"], lane.refs["p2"], lane.refs["p1"])] == [True, True, False]
    lane.prepare(p3, tmp_path / "ref.log")
    assert ("close", "p0") in _FakeRef.events and lane.holds() == ["p3", "p1", "p2"]
    lane.refs["p1"].broken = True  # its checker died: opened again, never reused
    lane.prepare(p1, tmp_path / "ref.log")
    assert _FakeRef.events.count(("open", "p1")) == 2 and lane.holds()[0] == "p1"
    lane.close()
    assert lane.holds() == [] and sum(e[0] == "close" for e in _FakeRef.events) == sum(
        e[0] == "open" for e in _FakeRef.events)


def test_references_kept_open_fit_the_memory_share(fake_lane_refs, tmp_path):
    lane, (p0, p1, p2) = fake_lane_refs, _problems(tmp_path, 3)
    budget = 1000 * lanes.MEMORY_SHARE  # _FakeRef's device memory
    _FakeRef.sizes.update(p0=int(budget * 0.4), p1=int(budget * 0.4), p2=int(budget * 0.9))
    lane.prepare(p0, tmp_path / "ref.log")
    lane.prepare(p1, tmp_path / "ref.log")
    assert lane.holds() == ["p1", "p0"]  # 80 % of the share
    lane.prepare(p2, tmp_path / "ref.log")
    assert lane.holds() == ["p2"]  # alone it fits; with either other it would not
    _FakeRef.sizes["p0"] = int(budget * 5)
    lane.prepare(p0, tmp_path / "ref.log")
    assert lane.holds() == ["p0"]  # the one in use always stays open, whatever its size


def test_a_reference_whose_memory_plan_does_not_fit_beside_the_others_gets_the_device_to_itself(fake_lane_refs,
                                                                                                tmp_path):
    """Issue 34: references kept open hold device memory a large problem needs (on an H200, a parked 23_Softmax held
    18 GB while 36_RMSNorm ran out): when a new one's plan does not fit, the others are closed and it opens again."""
    lane, (p0, p1, big) = fake_lane_refs, _problems(tmp_path, 3)
    _FakeRef.tight.add(big.problem_id)
    lane.prepare(p0, tmp_path / "ref.log")
    lane.prepare(p1, tmp_path / "ref.log")
    lane.prepare(big, tmp_path / "ref.log")
    assert _FakeRef.events[2:] == [("open", "p2"), ("close", "p2"), ("close", "p0"), ("close", "p1"),
                                   ("open", "p2")]  # the first attempt and the two kept open closed, then again
    assert ("close", "p0") in _FakeRef.events and ("close", "p1") in _FakeRef.events
    assert _FakeRef.events.count(("open", "p2")) == 2 and lane.holds() == ["p2"]


def test_a_lanes_process_does_its_bookkeeping_on_one_torch_thread(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """A pool sized for the machine, its threads then narrowed onto the lanes' cores, made a lane's statistics
    0.55 s of a 2.1 s candidate on an H200 host (in a process that used torch before the run); the lane's
    process keeps torch to one thread."""
    import torch

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        monkeypatch.setenv("KBEVAL_CACHE_DIR", str(tmp_path / "cache"))
        config = LaneConfig(RunSettings(device="cpu"), tmp_path / "baselines.json", Budgets.of(10.0, 10.0))
        EvalLane(LaneSpec("cpu:0"), config)
        assert torch.get_num_threads() == lanes.HARNESS_THREADS == 1
    finally:
        torch.set_num_threads(before)
