"""How compiles and evaluations overlap: compiles run `jobs` wide, and each evaluation lane (one GPU) takes the
next compiled candidate the moment it is free.

Why a queue and not problem-by-problem order: a compile takes a minute, an evaluation seconds, so waiting
for one problem's compiles would leave GPUs idle. A lane prefers candidates of the problem it evaluated last
(its reference session stays open, and opening one costs a reference run and maybe a baseline), and
otherwise takes the oldest ready one. A lane is one thread that evaluates one candidate at a time, so two
timings never share a GPU. Nothing here knows what a candidate or a lane is: the pipeline passes functions.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

Item = TypeVar("Item")
Built = TypeVar("Built")


class ReadyQueue(Generic[Item, Built]):
    """Compiled items waiting for a lane; `take` blocks until one is ready or none will ever come."""

    def __init__(self, expected: int, key: Callable[[Item], Hashable], hold: bool = False) -> None:
        self._ready: list[tuple[Item, Built]] = []
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
            self._cond.notify_all()

    def take(self, prefer: Hashable | None = None) -> tuple[Item, Built] | None:
        with self._cond:
            while True:
                if self._ready and not (self._hold and self._pending):
                    at = next((i for i, (item, _) in enumerate(self._ready) if self._key(item) == prefer), 0)
                    return self._ready.pop(at)
                if not self._pending and not self._ready:
                    return None
                self._cond.wait()


def drive(items: Sequence[Item], build: Callable[[Item], Built | None], jobs: int,
          lanes: Sequence[Callable[[Item, Built], None]], key: Callable[[Item], Hashable],
          hold: bool = False) -> None:
    """Build every item (`jobs` at a time) and hand each built one to a free lane; return when all are done.

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

    def lane_loop(evaluate: Callable[[Item, Built], None]) -> None:
        last: Hashable | None = None
        while (job := queue.take(prefer=last)) is not None:
            try:
                evaluate(*job)
            except BaseException as exc:
                errors.append(exc)
                return
            last = key(job[0])

    threads = [threading.Thread(target=lane_loop, args=(lane,), name=f"kbeval-lane-{n}", daemon=True)
               for n, lane in enumerate(lanes)]
    for thread in threads:
        thread.start()
    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="kbeval-compile") as pool:
        for item in items:
            pool.submit(build_one, item)
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
