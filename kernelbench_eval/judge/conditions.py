"""The conditions a baseline was measured under, and whether they were good enough to reuse it.

A baseline is measured once and reused by every later run on the machine, so one measured beside a busy
neighbour (18 ms for a 0.3 ms op, seen on a 2-core box) would mislead every later run, and the reference's
clock check that starts from it too. So each baseline records its own spread and the other work the machine
did meanwhile, and one measured in bad conditions is measured again by the next run instead of reused; the
better of the two measurements is kept.

Bad means: eager's (or torch.compile's) time per call did not settle (its relative standard error over
RSE_FACTOR times the run's target), or, on the CPU, other work wanted the cores the timed model needed (the
model's threads plus the others' busy cores exceed the machine's by more than LOAD_SLACK). On a GPU host load
is normal (the first candidates build while baselines are measured, by design) and matters only where it
shows in the GPU times, which is the spread.
"""

from __future__ import annotations

import math
import os
import time

from kernelbench_eval.isolation import linux
from kernelbench_eval.records import Baseline, Conditions, RunSettings

RSE_FACTOR = 3.0
LOAD_SLACK = 0.5


class HostLoad:
    """Other work's share of the machine while something of ours is measured: every CPU's busy time, less the
    harness's own and its measured worker's, over the wall time."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.started = time.monotonic()
        self.busy = linux.system_busy_ms()
        self.own = self._own_ms()

    def _own_ms(self) -> float:
        own = linux.cpu_time_ms(os.getpid())
        return own + (linux.cpu_time_ms(self.pid) if self.pid else 0.0)

    def seconds(self) -> float:
        return time.monotonic() - self.started

    def others_cores(self) -> float | None:
        busy = linux.system_busy_ms()
        if busy is None or self.busy is None:
            return None
        return others_cores(busy - self.busy, self._own_ms() - self.own, self.seconds())


def others_cores(busy_ms: float, own_ms: float, seconds: float) -> float:
    """Cores kept busy by others: the machine's busy CPU time less our own, per second of wall time."""
    return max(busy_ms - own_ms, 0.0) / 1e3 / seconds if seconds > 0 else 0.0


def doubts(conditions: Conditions | None, settings: RunSettings) -> list[str]:
    """Why a baseline measured under `conditions` should not be reused (empty: reuse it)."""
    if conditions is None:
        return ["stored before baselines recorded their conditions"]
    limit = RSE_FACTOR * settings.target_rse
    found = [f"{name}'s time per call did not settle (relative standard error {_pct(rse)}, over {_pct(limit)})"
             for name, rse in (("eager", conditions.eager_rse), ("torch.compile", conditions.compiled_rse))
             if rse is not None and rse > limit]
    if conditions.eager_rse is None:
        found.append("eager was timed in too few calls to know its spread")
    if settings.device == "cpu" and contended(conditions):
        found.append(f"other work kept {conditions.others_cores:.2g} of {conditions.cores} cores busy while its "
                     f"{conditions.threads} thread(s) were timed")
    return found


def contended(conditions: Conditions) -> bool:
    """Whether the timed model's threads and the others' busy cores wanted more than the machine has."""
    others = conditions.others_cores
    return others is not None and others + conditions.threads > conditions.cores + LOAD_SLACK


def better(stored: Baseline, fresh: Baseline, settings: RunSettings) -> Baseline:
    """The baseline to keep of two: known conditions, then fewer doubts, then the lower spread; the fresh one
    on a tie."""
    def badness(baseline: Baseline) -> tuple[float, float]:
        cond = baseline.conditions
        if cond is None:
            return math.inf, math.inf
        spread = max((r for r in (cond.eager_rse, cond.compiled_rse) if r is not None), default=math.inf)
        return len(doubts(cond, settings)), spread

    return stored if badness(stored) < badness(fresh) else fresh


def _pct(value: float) -> str:
    return f"{value * 100:.2g} %"
