"""Evaluation lanes: one per GPU, each judging one compiled candidate at a time on its own device.

A lane pins every worker it starts to its GPU through CUDA_VISIBLE_DEVICES, so a candidate that poisons its
CUDA context (an illegal address, a hung kernel) can only hurt its own, short-lived process on that GPU,
never another lane. A lane keeps the references of the problems it judged last open (up to `MAX_OPEN`,
while their inputs and expected outputs take at most `MEMORY_SHARE` of the device's memory; least recently
used closed first): when candidates of several problems arrive interleaved (a cold run, as their builds
finish), a candidate of a problem still open skips the reference run. References not in use are parked
(their checker frees what only a timing needed). Lanes are plain objects so that the Ray backend can host
the same class in an actor; everything they take and return pickles.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from kernelbench_eval.budgets import Budgets
from kernelbench_eval.building.compile import Compiled, compile_candidate
from kernelbench_eval.building.jitwarmup import WarmupSpec
from kernelbench_eval.common.memory import names_memory
from kernelbench_eval.discover.corpus import Candidate, Problem
from kernelbench_eval.isolation import cores
from kernelbench_eval.isolation import gpus as gpu_env
from kernelbench_eval.judge.baselines import BaselineStore
from kernelbench_eval.judge.judging import ReferenceSide, Secrets, judge
from kernelbench_eval.records import Findings, RunSettings


@dataclass(frozen=True)
class LaneSpec:
    label: str  # "cuda:1", "cpu:0": recorded in each verdict as `lane`
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class LaneConfig:
    """What every lane of a run shares. Not the seeds: each lane draws its own, so they never travel."""

    settings: RunSettings
    baselines: Path
    budgets: Budgets


MAX_OPEN = 3  # references a lane keeps open at most
MEMORY_SHARE = 0.25  # of the device's memory, for the inputs and expected outputs of the references kept open


@dataclass
class Prepared:
    """A reference opened ahead of its candidates: what the pipeline records about it."""

    warning: str | None = None  # about the problem, from its reference (when it was opened now)
    baseline_key: str | None = None


@dataclass
class LaneResult:
    findings: Findings
    warning: str | None = None  # about the problem, from its reference
    baseline_key: str | None = None  # the baselines.json entry used


def lane_specs(device: str, gpus: list[str] | None, count: int | None = None) -> list[LaneSpec]:
    """The lanes of a run: one per GPU named in `gpus` (default: every visible GPU), or `count` CPU lanes.

    GPU names are what CUDA_VISIBLE_DEVICES takes (an index or a UUID). On the CPU a second lane only makes
    sense for throughput tests: parallel CPU timings share cores.
    """
    if device == "cpu":
        return [LaneSpec(f"cpu:{n}") for n in range(max(1, count or len(gpus or []) or 1))]
    if not gpus:
        gpus = gpu_env.visible() or [str(n) for n in range(max(1, torch.cuda.device_count()))]
    return [LaneSpec(f"cuda:{gpu}", gpu_env.pinned_to(gpu)) for gpu in gpus[: count or len(gpus)]]


HARNESS_THREADS = 1  # torch's intra-op threads in the process that hosts lanes (`EvalLane`)


class EvalLane:
    def __init__(self, spec: LaneSpec, config: LaneConfig, memory_share: float = 1.0) -> None:
        self.spec, self.config = spec, config
        self.memory_share = memory_share  # of its device's memory budget: lanes on one device split it
        # The lane's own torch work is bookkeeping (the bootstrap intervals of `stats`). A pool sized for the
        # whole machine before `cores.reserve` narrowed this process onto the lanes' cores made those intervals
        # 0.55 s of each 71_Conv2d candidate on an H200 host, in a script that had used torch before starting
        # the run (`kbeval` itself sizes the pool later and did not show it: docs/benchmarks.md); its idle
        # threads spin on the timed workers' cores. Models run in the workers, which size their own pools.
        torch.set_num_threads(HARNESS_THREADS)
        self.store = BaselineStore(config.baselines)
        self.seeds = Secrets.draw(config.settings.trials)
        self.refs: OrderedDict[str, ReferenceSide] = OrderedDict()  # open references, least recently used first

    def evaluate(self, problem: Problem, path: Path, compiled: Compiled, ref_log: Path, log: Path) -> LaneResult:
        """The findings on one compiled candidate, judged on this lane's device."""
        ref, opened = self._reference_for(problem, ref_log)
        if ref.error:
            return LaneResult(Findings(status="skipped", error=ref.error, lane=self.spec.label))
        findings = judge(ref, compiled, path, log, self.config.budgets.candidate)
        return LaneResult(findings.model_copy(update={"lane": self.spec.label}), ref.warning if opened else None,
                          ref.baselines.key)

    def prepare(self, problem: Problem, ref_log: Path) -> Prepared:
        """Open `problem`'s reference (and measure its baselines) before any of its candidates is ready."""
        ref, opened = self._reference_for(problem, ref_log)
        return Prepared(ref.warning if opened else None, ref.baselines.key)

    def holds(self) -> list[str]:
        """The problems whose references are open here, most recently used first."""
        return list(reversed(self.refs))

    def _reference_for(self, problem: Problem, ref_log: Path) -> tuple[ReferenceSide, bool]:
        """`problem`'s reference, opened now unless it is open (and sound); True when it was opened now."""
        ref = self.refs.get(problem.problem_id)
        if ref is not None and ref.problem == problem and not ref.broken:
            self.refs.move_to_end(problem.problem_id)
            self._park_all_but(ref)
            ref.unpark()  # in use again
            return ref, False
        if ref is not None:
            self.refs.pop(problem.problem_id).close()
        self._park_all_but(None)
        self._evict(room_for_one=True)
        ref = self._open(problem, ref_log)
        plan = ref.lender.residency
        if self.refs and (ref.error and names_memory(ref.error) or plan and not plan.fits):  # others hold it
            ref.close()  # the references kept open hold memory this one needs: theirs back first, then once more
            self.close()
            ref = self._open(problem, ref_log)
        self.refs[problem.problem_id] = ref
        self._evict()
        return ref, True

    def _open(self, problem: Problem, ref_log: Path) -> ReferenceSide:
        cfg = self.config
        return ReferenceSide(problem, cfg.settings, self.seeds, ref_log, cfg.budgets, self.store,
                             dict(self.spec.env), self.memory_share).open()

    def _park_all_but(self, active: ReferenceSide | None) -> None:
        for ref in self.refs.values():
            if ref is not active:
                ref.park()

    def _evict(self, room_for_one: bool = False) -> None:
        """Close the least recently used references until at most MAX_OPEN are open (one fewer, to make room
        for one) and those kept fit the memory share; the most recent one always stays."""
        def too_many() -> bool:
            held = sum(ref.lender.footprint() for ref in self.refs.values())
            budget = max((ref.lender.memory_bytes or 0 for ref in self.refs.values()), default=0) * MEMORY_SHARE
            return len(self.refs) + room_for_one > MAX_OPEN or bool(budget and held > budget)

        while self.refs and (room_for_one or len(self.refs) > 1) and too_many():
            self.refs.popitem(last=False)[1].close()

    def close(self) -> None:
        while self.refs:
            self.refs.popitem(last=False)[1].close()

    def has_build(self, compiled: Compiled) -> bool:
        return True  # every build of this host is in its cache


class LaneHandle(Protocol):
    """A lane as the pipeline sees it: an `EvalLane` here, or one living in a Ray actor."""

    def evaluate(self, problem: Problem, path: Path, compiled: Compiled, ref_log: Path, log: Path) -> LaneResult: ...

    def prepare(self, problem: Problem, ref_log: Path) -> Prepared | None: ...

    def holds(self) -> list[str]: ...

    def has_build(self, compiled: Compiled) -> bool:
        """Whether this lane can judge `compiled` without fetching the build (`schedule` prefers those)."""
        ...

    def close(self) -> None: ...


class LocalBackend:
    """Compiles in subprocesses of this host and evaluates on its own GPUs (one thread per lane)."""

    name = "local"

    def compile(self, cand: Candidate, device: str, cache_dir: Path, log: Path, timeout: float,
                warm: WarmupSpec | None = None) -> Compiled:
        return compile_candidate(cand, device, cache_dir, log, timeout, warm)

    def lanes(self, config: LaneConfig, gpus: list[str] | None, count: int | None) -> list[LaneHandle]:
        specs = lane_specs(config.settings.device, gpus, count)
        if config.settings.device == "cuda":  # the timed processes on cores no build shares (`cores`)
            cores.reserve([spec.env for spec in specs])
        sharing = Counter(tuple(sorted(spec.env.items())) for spec in specs)  # lanes per device
        return [EvalLane(spec, config, 1.0 / sharing[tuple(sorted(spec.env.items()))]) for spec in specs]

    def close(self) -> None:
        pass
