"""The reference cannot be slowed by the candidate it is timed against, nor can that go unnoticed.

The candidate's process runs as the same user as the reference's worker (the checker), so it can signal it,
pin its threads, lower its priority, or crowd the cores while the reference is timed, and a slower reference is
a faster speedup. Two layers, each standing on its own:

- **Prevention** (`Guard`). The candidate is frozen for every block of the reference and for every check,
  and runs only for its own blocks: its whole cgroup where the sandbox gave it one (`cgroup.freeze`: every
  process it started, those in sessions of their own included), else its process group (SIGSTOP). Either
  way the harness waits until everything has stopped: a stop signal is taken by one thread first (the main
  one, woken from its read), and on a busy host another thread ran on for a millisecond after `killpg`
  returned, long enough to stop the reference. Before each reference block the reference is sent SIGCONT
  and its threads' CPU affinity, nice value and scheduling policy are compared with those it was opened
  with: a stop, a pinning or a lower priority that outlives the candidate's pause is found and undone. What
  is found is evidence by itself (no honest candidate touches another process), so the verdict is
  `suspicious`, saying what; what cannot be undone marks the reference broken, and the next candidate gets
  a fresh one.
- **Evidence** (`check_reference`). What stopping cannot stop (work queued on a GPU before the stop, a process
  that left the group, a trick not thought of) shows in time: the reference timed interleaved is compared
  with the reference timed alone (the eager baseline, measured when the problem was opened, before any
  candidate was alive). On a disagreement beyond noise (the ratio's 95 % interval entirely past SLACK), the
  reference is timed alone again right then, with the candidate stopped throughout, in the cadence it was timed
  beside the candidate (`StandIn`: where the candidate's turn was, the harness keeps a core busy as long; on a
  loaded 2-core box a reference called between another process's calls ran 1.86x slower than back to back, and
  honest code was blamed). Still slower interleaved
  than alone now: it was slowed only beside the candidate: `disturbed` (`timing_stage` measures again from scratch,
  and only a second `disturbed` makes the verdict `suspicious`, so one burst of host load cannot decide). As
  slow alone as interleaved: the machine changed (host load, issue 13), the alone time is replaced by the new
  one for the problem's later candidates, and the candidate is not blamed. A re-measured alone time is kept
  in memory only: the stored baseline is only ever the one measured before any candidate ran, so nothing
  measured beside a candidate's live process becomes a baseline.

Out of reach without the sandbox's cgroup: a process that left the group (setsid) is not stopped and, while
it keeps at it, is not told apart from host load.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kernelbench_eval.common.stats import per_call_ms, ratio_ci
from kernelbench_eval.isolation.linux import threads
from kernelbench_eval.isolation.process import WorkerProcess

STOP_WAIT_S = 1.0  # every thread of a group is scheduled once within this, even on a loaded host
SLACK = {"cpu": 1.5, "cuda": 1.25}  # interleaved / alone beyond this (95 % interval) is more than noise; the CPU
# has no cache flush between the lanes' calls, so the reference interleaved pays for what the candidate evicted


@dataclass(frozen=True)
class Sched:
    """How the kernel schedules one thread: what a same-user process can change about another."""

    cpus: frozenset[int]
    nice: int
    policy: int

    def describe(self) -> str:
        return f"CPUs {_cpus(self.cpus)}, nice {self.nice}, policy {_POLICIES.get(self.policy, self.policy)}"


_POLICIES = {getattr(os, n): n.removeprefix("SCHED_") for n in ("SCHED_OTHER", "SCHED_BATCH", "SCHED_IDLE",
                                                                  "SCHED_FIFO", "SCHED_RR") if hasattr(os, n)}


def sched_of(tid: int) -> Sched | None:
    try:
        return Sched(frozenset(os.sched_getaffinity(tid)), os.getpriority(os.PRIO_PROCESS, tid),
                     os.sched_getscheduler(tid))
    except OSError:
        return None


def snapshot(pid: int) -> dict[int, Sched]:
    """Every thread of `pid` as the kernel schedules it now (taken when a reference is opened)."""
    found = {tid: sched_of(tid) for tid in threads(pid)}
    return {tid: s for tid, s in found.items() if s is not None}


def _state(pid: int, tid: int) -> str:
    try:
        return Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"  # gone


def _group(pid: int) -> list[int]:
    """`pid` and its descendants still in its process group (what killpg reaches), from /proc's child lists."""
    members, todo = [], [pid]
    while todo:
        member = todo.pop()
        try:
            stat = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if member != pid and int(stat[2]) != pid:
            continue  # left the group (setsid): killpg does not reach it
        members.append(member)
        for tid in threads(member):
            with contextlib.suppress(OSError, ValueError):
                todo += [int(c) for c in Path(f"/proc/{member}/task/{tid}/children").read_text().split()]
    return members


def stop_group(pid: int, wait_s: float = STOP_WAIT_S) -> bool:
    """SIGSTOP the group led by `pid` and wait until every thread of it has stopped; False if some did not."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGSTOP)
    end = time.monotonic() + wait_s
    while [m for m in _group(pid) if not _stopped(m)]:
        if time.monotonic() > end:
            return False
        time.sleep(0.0001)
    return True


def _stopped(pid: int) -> bool:
    """Every thread of `pid` stopped; one inside the kernel (D) counts once another has taken the stop: the
    group stop is then pending for it, and it stops before it runs a user instruction again."""
    states = [_state(pid, t) for t in threads(pid)]
    begun = any(s in "Tt" for s in states)
    return all(s in "TtZXx" or (s == "D" and begun) for s in states)


def resume_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGCONT)


class Guard:
    """The candidate stopped whenever anything but its own block runs; the reference found as it was opened."""

    def __init__(self, candidate: WorkerProcess, reference: WorkerProcess, opened: dict[int, Sched]) -> None:
        self.cand = _pid(candidate)
        self.ref = _pid(reference)
        self.leaf = getattr(candidate, "leaf", None)  # its cgroup (the sandbox's): frozen whole where there is one
        self.by_leaf = False  # the last hold froze the leaf (else it stopped the process group)
        self.opened = opened  # the reference's threads when its problem was opened (a new one inherits the main's)
        self.stop_wait = STOP_WAIT_S
        self.held = False
        self.found: dict[str, str] = {}  # what was done to the reference, by kind (each said once)
        self.broken = False  # something could not be undone: the reference must be opened afresh

    def hold(self) -> None:
        """The candidate's group stopped, every thread of it, and the reference running as it was opened: done
        before the reference is asked anything while the candidate could have touched it (idempotent)."""
        if not self.held and self.cand:
            self.by_leaf = self.leaf is not None and self.leaf.freeze(True, self.stop_wait)
            if not self.by_leaf and not stop_group(self.cand, self.stop_wait):
                self.found.setdefault("unstoppable", "a thread of the candidate's process group did not stop "
                                      f"within {STOP_WAIT_S:g} s of SIGSTOP")
                self.stop_wait = 0.05  # said once; not a second's wait before every block
            self.held = True
            self._reference_as_opened()

    def release(self) -> bool:
        """Let the candidate run again; True if it had been held (so it is waking up now)."""
        woken = self.held and bool(self.cand)
        if woken:
            if self.by_leaf:
                self.leaf.freeze(False)
            else:
                resume_group(self.cand)
        self.held = False
        return woken

    def before_reference(self) -> None:
        """Right before a reference block: the candidate stopped, the reference running and scheduled as opened
        (checked again even when the candidate was already stopped: cheap, and nothing else is trusted)."""
        if self.held:
            self._reference_as_opened()
        self.hold()

    def _reference_as_opened(self) -> None:
        """SIGCONT the reference, and put back how its threads are scheduled; what was found is evidence."""
        if not self.ref:
            return
        if _state(self.ref, self.ref) in "Tt":
            self.found.setdefault("stopped", "the reference's worker was found stopped (SIGSTOP) before its block")
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.ref, signal.SIGCONT)
        main = self.opened.get(self.ref)
        for tid in threads(self.ref) if main else []:
            now, then = sched_of(tid), self.opened.get(tid, main)
            if now is not None and now != then:
                self.found.setdefault("sched", f"the reference's thread {tid} was rescheduled ({now.describe()}; "
                                      f"opened with {then.describe()})")
                self.broken |= not _restore(tid, then)

    def reasons(self) -> list[str]:
        return list(self.found.values())


def settle_reference(pid: int, opened: dict[int, Sched]) -> bool:
    """Every thread of the reference put back as it was opened, before a candidate starts, blaming nobody: what an
    earlier candidate did in its last moments (after its last block, before it was killed) is not the next one's
    doing (an honest control was called `suspicious` for a thread a pinning attack had pinned). False when a
    thread could not be put back (the reference must then be opened afresh)."""
    main = opened.get(pid)
    restored = True
    for tid in threads(pid) if main else []:
        now, then = sched_of(tid), opened.get(tid, main)
        if now is not None and now != then:
            restored &= _restore(tid, then)
    return restored


def _restore(tid: int, sched: Sched) -> bool:
    try:
        if os.sched_getscheduler(tid) != sched.policy:
            os.sched_setscheduler(tid, sched.policy, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, tid, sched.nice)
        os.sched_setaffinity(tid, sched.cpus)
    except OSError:  # lowering a nice value back needs a privilege a plain user lacks
        return False
    return sched_of(tid) == sched


class StandIn:
    """What stands in the candidate's place while the reference is timed alone again: before each of the
    reference's blocks, the harness keeps one core busy for as long as the reference waited beside the candidate
    (its idle gaps there, in turn). Host load then treats the reference as it did interleaved: the scheduler owes
    the other processes the same time, its caches and threads go cold as long. What stays different is only what
    the candidate's own code did, which SLACK bounds. It spins rather than sleeps: on a loaded 2-core box a
    reference called after a sleep ran as fast as back to back, after another process's call it did not."""

    def __init__(self, gaps_s: list[float]) -> None:
        self.gaps = [min(max(g, 0.0), MAX_GAP_S) for g in gaps_s] or [0.0]
        self.turn = 0

    def __call__(self) -> None:
        end = time.perf_counter() + self.gaps[self.turn % len(self.gaps)]
        self.turn += 1
        while time.perf_counter() < end:
            pass


MAX_GAP_S = 1.0  # a slow candidate's turn is stood in for at most this long per block


@dataclass
class Agreement:
    """The interleaved reference against the reference alone, and what was concluded."""

    outcome: str  # "agrees", "refreshed" (the machine changed; the alone time was re-measured) or "disturbed"
    alone_ms: float
    ratio: float  # interleaved / alone, per call
    ci: tuple[float, float]

    def reason(self, interleaved_ms: float) -> str:
        return (f"the reference took {interleaved_ms:.3g} ms per call timed beside the candidate but "
                f"{self.alone_ms:.3g} ms alone with the candidate stopped, measured right after "
                f"({self.ratio:.3g}x, 95 % interval {self.ci[0]:.3g}..{self.ci[1]:.3g}): something slowed the "
                "reference while the candidate's process ran")


def check_reference(interleaved: list[float], alone: list[float], device: str, guard: Guard,
                    time_alone: Callable[[], list[float]]) -> tuple[Agreement, list[float]]:
    """Compare the reference's interleaved calls with its alone time, re-measuring alone on a disagreement.

    Returns the agreement and the alone samples to use from now on (the new ones when the machine changed).
    """
    slack = SLACK.get(device, SLACK["cpu"])
    low, high = ratio_ci(interleaved, alone)
    ratio = per_call_ms(interleaved) / per_call_ms(alone)
    if low <= slack and high >= 1 / slack:
        return Agreement("agrees", per_call_ms(alone), ratio, (low, high)), alone
    guard.before_reference()  # stopped for the whole measurement, the reference as it was opened
    fresh = time_alone()
    low, high = ratio_ci(interleaved, fresh)
    ratio = per_call_ms(interleaved) / per_call_ms(fresh)
    if low > slack:
        return Agreement("disturbed", per_call_ms(fresh), ratio, (low, high)), alone
    return Agreement("refreshed", per_call_ms(fresh), ratio, (low, high)), fresh


def _pid(worker: WorkerProcess) -> int | None:
    return getattr(getattr(worker, "proc", None), "pid", None)


def _cpus(cpus: frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus)) if len(cpus) <= 8 else f"{len(cpus)} CPUs"
