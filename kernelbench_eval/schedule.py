"""How compiles and evaluations overlap: compiles run `jobs` wide, and each evaluation lane (one GPU) takes the
next compiled candidate the moment it is free.

Why a queue and not problem-by-problem order: a compile takes a minute, an evaluation seconds, so waiting
for one problem's compiles would leave GPUs idle. A lane prefers candidates of the problem it evaluated last
(its reference session stays open, and opening one costs a reference run and maybe a baseline), and
otherwise takes the oldest ready one. Among those, a lane that says where it is (`near`: on a cluster,
whether its node already holds the candidate's build) prefers one it can judge without fetching the build,
but never for long: a candidate passed over that way `PATIENCE` times is taken next in its turn, so no
build that sits on no lane's node waits for the end of the run. The problem comes first because a switch
of reference costs seconds of reference runs, a fetch only the transfer of one build.
A lane is one thread that evaluates one candidate at a time, so two timings never share a GPU. Nothing here
knows what a candidate or a lane is: the pipeline passes functions.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

Item = TypeVar("Item")
Built = TypeVar("Built")
Near = Callable[[Item, Built], bool]  # whether a lane can judge this built item without fetching its build
PATIENCE = 8  # times a ready item may be passed over for a nearer one before it is taken first


class ReadyQueue(Generic[Item, Built]):
    """Compiled items waiting for a lane; `take` blocks until one is ready or none will ever come."""

    def __init__(self, expected: int, key: Callable[[Item], Hashable], hold: bool = False) -> None:
        self._ready: list[tuple[Item, Built]] = []
        self._passed: list[int] = []  # per ready entry: times it was passed over for a nearer one
        self._pending = expected  # compiles not finished yet
        self._key = key
        self._hold = hold  # release nothing until every compile is done (CPU: compilers and timers share cores)
        self._cond = threading.Condition()

    def finish(self, item: Item, built: Built | None) -> None:
        """One compile is done; `built` None means there is nothing to evaluate (its verdict is recorded)."""
        with self._cond:
            self._pending -= 1
            if built is not None:
                self._ready.append((item, built))
                self._passed.append(0)
            self._cond.notify_all()

    def take(self, prefer: Hashable | None = None, near: Near | None = None) -> tuple[Item, Built] | None:
        with self._cond:
            while True:
                if self._ready and not (self._hold and self._pending):
                    return self._pop(self._choose(prefer, near))
                if not self._pending and not self._ready:
                    return None
                self._cond.wait()

    def _choose(self, prefer: Hashable | None, near: Near | None) -> int:
        """The index to take: the oldest of the preferred problem (else of all), the oldest near one among
        those unless an older one has run out of patience; older ones passed over for it lose patience."""
        turn = [i for i, (item, _) in enumerate(self._ready) if self._key(item) == prefer] or range(len(self._ready))
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

    def _pop(self, at: int) -> tuple[Item, Built]:
        del self._passed[at]
        return self._ready.pop(at)


def drive(items: Sequence[Item], build: Callable[[Item], Built | None], jobs: int,
          lanes: Sequence[Callable[[Item, Built], None]], key: Callable[[Item], Hashable],
          hold: bool = False, near: Sequence[Near | None] | None = None) -> None:
    """Build every item (`jobs` at a time) and hand each built one to a free lane; return when all are done.
    `near[n]`, when given, says which items lane n can judge without fetching their build.

    A lane that raises stops (the others go on with the rest) and its exception is raised at the end: a
    harness bug must not pass silently, nor leave the run hanging.
    """
    queue: ReadyQueue[Item, Built] = ReadyQueue(len(items), key, hold)
    errors: list[BaseException] = []

    def build_one(item: Item) -> None:
        built = None
        try:
            built = build(item)
        except BaseException as exc:
            errors.append(exc)
        finally:
            queue.finish(item, built)

    def lane_loop(evaluate: Callable[[Item, Built], None], close_to: Near | None) -> None:
        last: Hashable | None = None
        while (job := queue.take(prefer=last, near=close_to)) is not None:
            try:
                evaluate(*job)
            except BaseException as exc:
                errors.append(exc)
                return
            last = key(job[0])

    threads = [threading.Thread(target=lane_loop, args=(lane, near[n] if near else None), name=f"kbeval-lane-{n}",
                                daemon=True) for n, lane in enumerate(lanes)]
    for thread in threads:
        thread.start()
    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="kbeval-compile") as pool:
        for item in items:
            pool.submit(build_one, item)
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
