"""The lanes' cores lent to the builds while no lane is at work, and taken back before one is.

Why: a CUDA run keeps one core per lane and one for the harness (`cores.split`) so that no compiler shares a
core with a timed process. But the lanes idle through much of a cold run (the first builds, and whenever
every built candidate is judged while the rest still compile), and with many distinct candidates the builds
are bound by CPU: 2 of 16 cores then sat idle beside sixteen nvcc builds sharing 14.

How: every build worker is a session of its own (`forkchild`, `process`), and what it starts (ninja, nvcc,
cicc, cc1plus) stays in it. The harness sets the affinity of each thread of those sessions from outside
(`sched_setaffinity`; seccomp forbids that call only to the candidates, and only on others). A lane about
to open a reference, measure baselines or judge (`working`) first takes the cores back: a sweep moves every
thread of every lent session onto the builds' cores, and sweeps again until one moves nothing, since a
process forked during a sweep carries its parent's old mask and shows only to the next. Lending is lazy: a
keeper thread widens what runs narrow (a build worker pins itself to the builds' cores as it starts,
`cores.pin_self`) every LEND_EVERY_S while no lane works, and waits while one does, so nothing of it runs
beside a timed process. KBEVAL_LEND_CORES=off keeps the lanes' cores to the lanes.

A build that leaves its session (setsid) is out of reach both ways; it could set its own affinity anyway.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from kernelbench_eval.isolation.linux import stat_fields, threads

ENV = "KBEVAL_LEND_CORES"
LEND_EVERY_S = 0.5  # how soon a build started while the lanes idle gets their cores
SWEEP_ROUNDS = 20  # taking back: sweeps until one moves nothing, at most this many
_SESSION = 3  # index of the session id in `stat_fields` (proc(5) field 6)


def sessions_threads(sessions: set[int]) -> list[int]:
    """Every thread of every process whose session is one of `sessions`."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if int(stat_fields(entry.name)[_SESSION]) not in sessions:
                continue
        except (OSError, ValueError, IndexError):  # gone
            continue
        found += threads(entry.name)
    return found


def move(tids: list[int], cpus: frozenset[int]) -> int:
    """Put each thread on `cpus`; how many were elsewhere (gone or refused ones are skipped)."""
    moved = 0
    for tid in tids:
        try:
            if os.sched_getaffinity(tid) != cpus:
                os.sched_setaffinity(tid, cpus)
                moved += 1
        except OSError:
            continue
    return moved


class Lender:
    """The lanes' cores lent to the sessions of the running builds whenever no lane is `working`."""

    def __init__(self, lanes: frozenset[int], builds: frozenset[int], every_s: float = LEND_EVERY_S) -> None:
        self.builds, self.all = builds, builds | lanes
        self.every_s = every_s
        self._sessions: set[int] = set()
        self._working = 0
        self._closed = False
        self._cond = threading.Condition()
        self._keeper = threading.Thread(target=self._keep, name="kbeval-lender", daemon=True)
        self._keeper.start()

    @contextlib.contextmanager
    def lent(self, session: int) -> Iterator[None]:
        """While inside, the build whose session leader is `session` may get the lanes' cores."""
        with self._cond:
            self._sessions.add(session)
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._sessions.discard(session)

    @contextlib.contextmanager
    def working(self) -> Iterator[None]:
        """A lane at work: no build runs on the lanes' cores until every lane is done."""
        with self._cond:
            self._working += 1
            if self._working == 1:
                self._take_back()
        try:
            yield
        finally:
            with self._cond:
                self._working -= 1
                self._cond.notify_all()

    def _take_back(self) -> None:
        for _ in range(SWEEP_ROUNDS):
            if not self._sessions or not move(sessions_threads(self._sessions), self.builds):
                return

    def _keep(self) -> None:
        with self._cond:
            while not self._closed:
                self._cond.wait_for(lambda: self._closed or (not self._working and bool(self._sessions)))
                if self._closed:
                    return
                move(sessions_threads(self._sessions), self.all)  # under the lock: no lane starts meanwhile
                self._cond.wait(self.every_s)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._keeper.join(timeout=5)


_lender: Lender | None = None


def open_lender(kept: tuple[frozenset[int], frozenset[int]] | None) -> Lender | None:
    """Lend the lanes' cores of `kept` (`cores.reserve`'s split) from now on, unless KBEVAL_LEND_CORES=off."""
    global _lender
    close()
    if kept is not None and os.environ.get(ENV, "on").lower() not in ("off", "0", "no"):
        _lender = Lender(*kept)
    return _lender


def close() -> None:
    global _lender
    if _lender is not None:
        _lender.close()
        _lender = None


def working() -> contextlib.AbstractContextManager[None]:
    return _lender.working() if _lender is not None else contextlib.nullcontext()


def lent(session: int) -> contextlib.AbstractContextManager[None]:
    return _lender.lent(session) if _lender is not None else contextlib.nullcontext()
