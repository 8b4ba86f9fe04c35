"""Evaluation lanes: one per GPU, each judging one compiled candidate at a time on its own device.

A lane pins every worker it starts to its GPU through CUDA_VISIBLE_DEVICES, so a candidate that poisons its
CUDA context (an illegal address, a hung kernel) can only hurt its own, short-lived process on that GPU,
never another lane. A lane keeps the reference session of the problem it judged last open: the next
candidate of that problem skips the reference run. Lanes are plain objects so that the Ray backend can host
the same class in an actor; everything they take and return pickles.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from kernelbench_eval import gpus as gpu_env
from kernelbench_eval.baselines import BaselineStore
from kernelbench_eval.compile import Compiled, compile_candidate
from kernelbench_eval.discover import Candidate, Problem
from kernelbench_eval.judge import ReferenceSide, Secrets, judge
from kernelbench_eval.models import Findings, RunSettings
from kernelbench_eval.warmup import WarmupSpec


@dataclass(frozen=True)
class LaneSpec:
    label: str  # "cuda:1", "cpu:0": recorded in each verdict as `lane`
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class LaneConfig:
    """What every lane of a run shares. Not the seeds: each lane draws its own, so they never travel."""

    settings: RunSettings
    baselines: Path
    timeout: float
    compile_timeout: float


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


class EvalLane:
    def __init__(self, spec: LaneSpec, config: LaneConfig) -> None:
        self.spec, self.config = spec, config
        self.store = BaselineStore(config.baselines)
        self.seeds = Secrets.draw(config.settings.trials)
        self.ref: ReferenceSide | None = None

    def evaluate(self, problem: Problem, path: Path, compiled: Compiled, ref_log: Path, log: Path) -> LaneResult:
        """The findings on one compiled candidate, judged on this lane's device."""
        opened = self._reference_for(problem, ref_log)
        ref = self.ref
        assert ref is not None
        if ref.error:
            return LaneResult(Findings(status="skipped", error=ref.error, lane=self.spec.label))
        findings = judge(ref, compiled, path, log, self.config.timeout)
        findings.lane = self.spec.label
        return LaneResult(findings, ref.warning if opened else None, ref.baseline_key)

    def _reference_for(self, problem: Problem, ref_log: Path) -> bool:
        """Open `problem`'s reference unless it is the one open (and sound); True when it was opened now."""
        if self.ref and self.ref.problem == problem and not self.ref.broken:
            return False
        self.close()
        cfg = self.config
        self.ref = ReferenceSide(problem, cfg.settings, self.seeds, ref_log, cfg.timeout, cfg.compile_timeout,
                                 self.store, dict(self.spec.env)).open()
        return True

    def close(self) -> None:
        if self.ref:
            self.ref.close()
            self.ref = None

    def holds(self, compiled: Compiled) -> bool:
        return True  # every build of this host is in its cache


class LaneHandle(Protocol):
    """A lane as the pipeline sees it: an `EvalLane` here, or one living in a Ray actor."""

    def evaluate(self, problem: Problem, path: Path, compiled: Compiled, ref_log: Path, log: Path) -> LaneResult: ...

    def holds(self, compiled: Compiled) -> bool:
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
        return [EvalLane(spec, config) for spec in lane_specs(config.settings.device, gpus, count)]

    def close(self) -> None:
        pass
