"""Cores kept for the lanes on a GPU host: the timed processes never share a core with a build.

Why: a GPU run times candidates while other candidates compile (by design: the GPU would idle otherwise), and
nvcc fills every core it is given. A timed worker that shares its core with a compiler waits for it between
calls; the wait lands on whichever process got that core, not on both models alike, so the clock check
(`plausibility`) saw an honest 0.1 ms Python candidate's host time per call 0.15 ms above the reference's
and called it `suspicious` (H100, `bench/identical.py`, docs/benchmarks.md). Here the harness, each lane's
checker and candidate (and the torch.compile baseline) run on cores of their own, the builds on the rest.

Only where there are cores to spare (MIN_CPUS or more), and only for a CUDA run: on a small CPU box the
builds and the timing take turns anyway (a CPU run evaluates only after the last compile). Each worker pins
itself, first thing (`pin_self`), from KBEVAL_CPUS in its environment; a candidate may move itself (its own
loss), never another process (`seccomp`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from kernelbench_eval.isolation.linux import threads

ENV = "KBEVAL_CPUS"
MIN_CPUS = 8
_started_on: frozenset[int] | None = None  # this process's cores before its first reservation narrowed them
_one_lane = False  # the last reservation kept cores for one lane: the harness's core is then its own


def split(lanes: int, cpus: Iterable[int]) -> tuple[frozenset[int], frozenset[int]] | None:
    """(the lanes' cores, the builds' cores) out of `cpus`: one core per lane and one for the harness, at most a
    quarter of them; None where there are fewer than MIN_CPUS."""
    ordered = sorted(set(cpus))
    if len(ordered) < MIN_CPUS or lanes < 1:
        return None
    kept = min(lanes + 1, len(ordered) // 4)
    return frozenset(ordered[-kept:]), frozenset(ordered[:-kept])


def env_value(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def parse(value: str) -> frozenset[int] | None:
    try:
        cpus = frozenset(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        return None
    return cpus or None


def reserve(lane_envs: list[dict[str, str]], environ: os._Environ[str] | dict[str, str] = os.environ
            ) -> tuple[frozenset[int], frozenset[int]] | None:
    """Split this process's cores between the lanes and the builds (`split`): each lane's environment names the
    lanes' cores, this process's environment (which builds inherit) the builds', and every thread of this
    process (the harness, whose lane threads hold the wall clocks) moves onto the lanes'. None: not split.
    A later run in the same process splits the cores this one started with, not the lanes' it now runs on."""
    global _started_on, _one_lane
    if _started_on is None:
        _started_on = frozenset(os.sched_getaffinity(0))
    kept = split(len(lane_envs), _started_on)
    _one_lane = kept is not None and len(lane_envs) == 1
    if kept is None:
        return None
    lanes, builds = kept
    for env in lane_envs:
        env[ENV] = env_value(lanes)
    environ[ENV] = env_value(builds)
    for tid in threads():
        try:
            os.sched_setaffinity(tid, lanes)
        except OSError:  # a thread that just ended
            continue
    return kept


def usable() -> int:
    """The cores this process may run on: under `taskset` or a cpuset, fewer than the machine has."""
    return len(os.sched_getaffinity(0)) or os.cpu_count() or 1


def build_cores(environ: os._Environ[str] | dict[str, str] = os.environ) -> int:
    """How many cores the builds may use: those reserved for them, else this process's."""
    return len(parse(environ.get(ENV, "")) or ()) or usable()


def pin_self(environ: os._Environ[str] | dict[str, str] = os.environ) -> frozenset[int] | None:
    """Keep this process (the calling thread, and every thread it starts from now on) on the cores its
    environment names; what it was pinned to, or None (not asked, or refused: it runs where it was)."""
    cpus = parse(environ.get(ENV, ""))
    if cpus is None:
        return None
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:
        return None
    return cpus


def harness_may_poll() -> bool:
    """Whether the harness may wait for a timed call's reply by polling (a core busy meanwhile): only where one
    lane's cores are kept, its own core among them. With more lanes, their waits would crowd the timed workers."""
    return _one_lane
