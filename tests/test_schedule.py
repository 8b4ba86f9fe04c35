"""The scheduler's ordering and lanes, with fake builds and fake lanes (threads that only record and sleep)."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field

import pytest

from kernelbench_eval.schedule import PATIENCE, ReadyQueue, drive


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


def _queue(*items: str) -> ReadyQueue:
    queue = ReadyQueue(len(items), key=problem)
    for item in items:
        queue.finish(item, f"built {item}")
    return queue


def _on(*held: str):
    """A lane whose node holds the builds of `held`."""
    return lambda item, built: item in held


def test_a_lane_takes_a_build_its_node_holds_before_an_older_one_it_would_fetch() -> None:
    queue = _queue("p0/c0", "p0/c1", "p0/c2")
    assert queue.take(prefer="p0", near=_on("p0/c2"))[0] == "p0/c2"
    assert queue.take(prefer="p0", near=_on())[0] == "p0/c0"  # nothing near: the oldest
    assert queue.take(prefer=None, near=None)[0] == "p0/c1"


def test_the_problem_a_lane_has_open_comes_before_where_the_build_is() -> None:
    queue = _queue("p0/c0", "p1/c0", "p1/c1")
    assert queue.take(prefer="p0", near=_on("p1/c0", "p1/c1"))[0] == "p0/c0"  # a fetch is cheaper than a switch
    assert queue.take(prefer="p2", near=_on("p1/c1"))[0] == "p1/c1"  # no candidate of its problem: the near one


def test_a_build_no_lane_holds_is_taken_after_patience_runs_out() -> None:
    """Near builds keep arriving; the far one is passed over PATIENCE times, then taken next."""
    queue = _queue("p0/far")
    near = [f"p0/n{n}" for n in range(PATIENCE + 3)]
    taken = []
    for item in near:
        queue.finish(item, f"built {item}")
        taken.append(queue.take(prefer="p0", near=_on(*near))[0])
    assert taken[:PATIENCE] == near[:PATIENCE]  # passed over PATIENCE times
    assert taken[PATIENCE] == "p0/far"  # then first, though near ones are ready
    assert "p0/far" not in taken[PATIENCE + 1:]


def test_drive_passes_each_lane_its_own_locality() -> None:
    """One lane whose node holds the odd builds: it judges those first, then the rest, oldest first."""
    log = Log()
    items = [f"p0/c{n}" for n in range(8)]
    held = set(items[1::2])
    drive(items, fake_build(log, {}), jobs=1, lanes=[fake_lane(log, "a", 0.0)], key=problem, hold=True,
          near=[lambda item, built: item in held])
    assert [item for _, item, _, _ in log.runs] == items[1::2] + items[0::2]  # one lane: appended in order
