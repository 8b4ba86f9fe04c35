"""How compiles and evaluations overlap: compiles run `jobs` wide, and each evaluation lane (one GPU) takes the
next compiled candidate the moment it is free.

Why a queue and not problem-by-problem order: a compile takes a minute, an evaluation seconds, so waiting
for one problem's compiles would leave GPUs idle. A lane keeps the references of the problems it judged
last open (`holds`, most recent first) and takes a ready candidate of those first, in that order (opening a
reference costs a reference run and maybe a baseline), else the oldest ready one. A lane with nothing ready
opens, ahead of its candidates, a problem no lane has opened yet whose compiles are still running
(`prepare`): its reference run and baselines (eager, torch.compile) are timed while the GPU would idle,
not when its first candidate arrives. Among the candidates of the preferred problem (or all, when it has
none), a lane that says where it is (`near`: on a cluster, whether its node already holds the candidate's
build) prefers one it can judge without fetching the build, but never for long: a candidate passed over that
way `PATIENCE` times is taken next in its turn, so no build that sits on no lane's node waits for the end of
the run. The problem comes first because a switch of reference costs seconds of reference runs, a fetch only
the transfer of one build. A lane is one thread that does one thing at a time, so two timings never share a
GPU. Nothing here knows what a candidate or a lane is: the pipeline passes functions.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

Item = TypeVar("Item")
Built = TypeVar("Built")
Near = Callable[[Item, Built], bool]  # whether a lane can judge this built item without fetching its build
PATIENCE = 8  # times a ready item may be passed over for a nearer one before it is taken first
STOP_POLL = 0.25  # seconds between looks at `stopped` while a lane waits for work


@dataclass
class LaneJobs(Generic[Item, Built]):
    """One lane's work: `evaluate` a built item; optionally the keys it `holds` open (most recent first) and
    how to `prepare` a key (open it ahead of its items). A plain function is a lane that holds its last key."""

    evaluate: Callable[[Item, Built], None]
    holds: Callable[[], Sequence[Hashable]] | None = None
    prepare: Callable[[Hashable], None] | None = None
    near: Near | None = None


@dataclass(frozen=True)
class Prepare:
    """What `take` hands an idle lane that may prepare: open this key now."""

    key: Hashable


class ReadyQueue(Generic[Item, Built]):
    """Compiled items waiting for a lane; `take` blocks until one is ready (or a key to prepare), or none will
    ever come."""

    def __init__(self, items: Sequence[Item], key: Callable[[Item], Hashable], hold: bool = False,
                 stopped: Callable[[], bool] = lambda: False) -> None:
        self._ready: list[tuple[Item, Built]] = []
        self._passed: list[int] = []  # per ready entry: times it was passed over for a nearer one
        self._pending: Counter[Hashable] = Counter(key(item) for item in items)  # compiles not finished, per key
        self._left = len(items)
        self._opened: set[Hashable] = set()  # keys a lane has taken or prepared: nothing to prepare there
        self._key = key
        self._hold = hold  # release nothing until every compile is done (CPU: compilers and timers share cores)
        self._stopped = stopped  # once true, nothing more is handed out (an interrupt: `interrupts`)
        self._cond = threading.Condition()

    def finish(self, item: Item, built: Built | None) -> None:
        """One compile is done; `built` None means there is nothing to evaluate (its verdict is recorded)."""
        with self._cond:
            self._left -= 1
            self._pending[self._key(item)] -= 1
            if built is not None:
                self._ready.append((item, built))
                self._passed.append(0)
            self._cond.notify_all()

    def take(self, prefer: Sequence[Hashable] = (), prepare: bool = False,
             near: Near | None = None) -> tuple[Item, Built] | Prepare | None:
        """A ready item of the first key in `prefer` that has one, else of any key (see `_choose` for which);
        with `prepare`, a key to open when none is ready (never with `hold`); None when everything is done."""
        with self._cond:
            while True:
                if self._stopped():
                    return None
                if self._ready and not (self._hold and self._left):
                    at = self._choose(prefer, near)
                    del self._passed[at]
                    item, built = self._ready.pop(at)
                    self._opened.add(self._key(item))
                    return item, built
                if not self._left and not self._ready:
                    return None
                if prepare and not self._hold:
                    waiting = next((k for k, n in self._pending.items() if n > 0 and k not in self._opened), None)
                    if waiting is not None:
                        self._opened.add(waiting)
                        return Prepare(waiting)
                self._cond.wait(STOP_POLL)

    def _choose(self, prefer: Sequence[Hashable], near: Near | None) -> int:
        """The index to take: the oldest of the first preferred key that has one (else of all), the oldest near
        one among those unless an older one has run out of patience; older ones passed over lose patience."""
        turn: Sequence[int] = range(len(self._ready))
        for k in prefer:
            mine = [i for i, (item, _) in enumerate(self._ready) if self._key(item) == k]
            if mine:
                turn = mine
                break
        if near is None:
            return turn[0]
        for i in turn:
            if self._passed[i] >= PATIENCE:
                return i
        chosen = next((i for i in turn if near(*self._ready[i])), turn[0])
        for i in turn:
            if i >= chosen:
                break
            self._passed[i] += 1
        return chosen


def drive(items: Sequence[Item], build: Callable[[Item], Built | None], jobs: int,
          lanes: Sequence[Callable[[Item, Built], None] | LaneJobs[Item, Built]], key: Callable[[Item], Hashable],
          hold: bool = False, stopped: Callable[[], bool] = lambda: False) -> None:
    """Build every item (`jobs` at a time) and hand each built one to a free lane; return when all are done.

    A lane that raises stops (the others go on with the rest) and its exception is raised at the end: a
    harness bug must not pass silently, nor leave the run hanging. Once `stopped()` is true no build starts and
    no lane takes more work, so the run ends as soon as the work in hand does.
    """
    queue: ReadyQueue[Item, Built] = ReadyQueue(items, key, hold, stopped)
    errors: list[BaseException] = []

    def build_one(item: Item) -> None:
        built = None
        try:
            if not stopped():
                built = build(item)
        except BaseException as exc:
            errors.append(exc)
        finally:
            queue.finish(item, built)

    def lane_loop(lane: LaneJobs[Item, Built]) -> None:
        last: list[Hashable] = []
        while (job := queue.take(lane.holds() if lane.holds else last, lane.prepare is not None,
                                 lane.near)) is not None:
            try:
                if isinstance(job, Prepare):
                    assert lane.prepare is not None
                    lane.prepare(job.key)
                    continue
                lane.evaluate(*job)
            except BaseException as exc:
                errors.append(exc)
                return
            last = [key(job[0])]

    jobs_of = [lane if isinstance(lane, LaneJobs) else LaneJobs(lane) for lane in lanes]
    threads = [threading.Thread(target=lane_loop, args=(lane,), name=f"kbeval-lane-{n}", daemon=True)
               for n, lane in enumerate(jobs_of)]
    for thread in threads:
        thread.start()
    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="kbeval-compile") as pool:
        for item in items:
            pool.submit(build_one, item)
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
