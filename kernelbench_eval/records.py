"""The records that land on disk or travel inside a message, one pydantic model each.

Everything the harness writes (verdicts, run manifests, baselines, build records) is validated through these
models, so a torn, forged or stale record fails loudly instead of being half-trusted. The requests and replies
between the harness and its workers are in `messages`.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kernelbench_eval.containment import SandboxRecord
from kernelbench_eval.discover.names import sample_of
from kernelbench_eval.measured import MemoryRecord, PrecisionCheck, Timing, TimingStats
from kernelbench_eval.statuses import Status

Device = Literal["cpu", "cuda"]
TimingMethod = Literal["kbeval", "kernelbench", "kernelbench-2025"]  # the harness's own, or KernelBench's (`kbmethod`)


def now_utc() -> str:
    """The time stamp every record carries (`created_at`, `measured_at`, `finished_at`): UTC, to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class RunSettings(BaseModel):
    """Everything that changes a verdict. Its key decides whether a recorded verdict can be reused."""

    model_config = ConfigDict(frozen=True)

    device: Device
    trials: int = Field(5, ge=1)
    atol: float = Field(1e-2, ge=0)
    rtol: float = Field(1e-2, ge=0)
    warmup: int = Field(10, ge=0)
    warmup_seconds: float = Field(1.0, ge=0)
    reps: int = Field(100, ge=1)  # timed calls per lane, at least, when the budget allows
    max_reps: int = Field(2000, ge=1)
    target_rse: float = Field(0.01, gt=0)  # stop once the median's relative standard error is below this
    timing_budget: float = Field(10.0, gt=0)  # seconds of timing per candidate, beyond which we stop
    cuda_graph: bool = False
    compile_baseline: bool = True
    max_speedup: float = Field(10.0, ge=0)  # a faster claim is `suspicious` (0: no limit)
    dims: dict[str, int | float] = Field(default_factory=dict)
    threads: int | None = None
    precision: Literal["fp32", "fp16", "bf16"] = "fp32"  # dtype of inputs and models (`precision.py`)
    smoke: bool = False  # `--smoke` chose the sizes and timing above; kept so a resume shows it, not in the keys
    account_launches: bool = False  # profile one more forward of each correct candidate (`kernels`); costs seconds
    allow_reduced_precision: bool = False  # a candidate far less precise than the reference stays `ok` (`precision`)
    timing: TimingMethod = "kbeval"  # how calls are timed: the harness's own method, or KernelBench's (`kbmethod`)

    def key(self) -> str:
        return _digest(self._payload(exclude={"smoke"}))  # the fields it set are in the key

    def timing_key(self) -> str:
        """What changes a baseline's timing: inputs, threads and the timing loop, not the tolerances."""
        return _digest(self._payload(exclude={"trials", "atol", "rtol", "max_speedup", "compile_baseline",
                                              "smoke", "allow_reduced_precision"}))

    def _payload(self, exclude: set[str] | None = None) -> dict:
        """The settings that make the key; fp32 is left out, so runs made before `precision` keep their keys."""
        payload = self.model_dump(mode="json", exclude=exclude)
        if payload.get("precision") == "fp32":
            del payload["precision"]
        if payload.get("timing") == "kbeval":  # the harness's own: the keys of runs made before KernelBench's
            del payload["timing"]
        for name in ("account_launches", "allow_reduced_precision"):
            if not payload.get(name, True):  # off: the keys of runs made before it existed
                del payload[name]
        return payload


def _digest(payload: object) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


class Conditions(BaseModel):
    """What a baseline was measured beside: its own spread and the machine's other work (`judge.conditions`
    decides from these whether it may be reused)."""

    eager_rse: float | None = None  # relative standard error of eager's time per call (None: too few calls)
    compiled_rse: float | None = None  # the same for torch.compile's (None: not measured)
    others_cores: float | None = None  # cores other work kept busy meanwhile (None: /proc/stat unreadable)
    cores: int = 1  # the machine's CPUs, as /proc/stat counts them
    threads: int = 1  # threads the timed model used
    seconds: float = 0.0  # how long the eager measurement took


class Baseline(BaseModel):
    """One problem's eager and torch.compile times on one machine: an entry of `results/baselines.json`."""

    problem: str
    source_sha256: str
    device_name: str
    torch_version: str
    timing_key: str
    eager: TimingStats
    eager_samples: list[float]
    compile_mode: str = "default"
    compiled: TimingStats | None = None
    compiled_samples: list[float] = Field(default_factory=list)
    compile_error: str | None = None
    measured_at: str = ""
    conditions: Conditions | None = None  # None: stored before conditions were recorded (measured again)

    def key(self) -> str:
        return baseline_key(self.source_sha256, self.device_name, self.torch_version, self.timing_key)


def baseline_key(source_sha256: str, device_name: str, torch_version: str, timing_key: str) -> str:
    return _digest([source_sha256, device_name, torch_version, timing_key])


class RunManifest(BaseModel):
    """`run.json`: how a run was started, so `--resume` continues it with the same settings.

    It holds no seeds: those are drawn afresh by each harness process and never written anywhere a
    candidate could read them.
    """

    run_id: str
    settings: RunSettings
    problems_dir: str  # absolute, so a resume works from any folder (older runs: see run.setup.manifest_dirs)
    candidates_dir: str
    only: list[str] | None = None  # `--problem` filter: a resume judges the same problems
    torch_version: str
    created_at: str


class KernelCount(BaseModel):
    """What ran during one forward of a model (`launches.py`): its own kernels against library ones."""

    custom: int  # kernels (GPU) or calls (CPU) of the candidate's own extensions, Triton or custom ops
    library: int  # aten / cuBLAS / cuDNN kernels (GPU) or outermost aten ops (CPU)
    custom_share: float  # of device time (GPU) or of profiled CPU op time (CPU), 0..1
    device: Device = "cpu"


class KernelRow(BaseModel):
    """One line of `kbeval profile`'s per-kernel table."""

    name: str
    kind: Literal["custom", "library"]
    calls: int
    total_ms: float
    mean_ms: float
    share: float  # of the model's profiled time


class Findings(BaseModel):
    """What judging settles about one candidate: every field of its verdict but who, where and when.

    One typed path from a candidate's evaluation (or its failed build, or the static checks) to its
    `Verdict`, which extends this with the run's identifiers.
    """

    status: Status
    compiled: bool = False
    compile_cached: bool = False
    compile_seconds: float | None = None
    correct: bool = False
    runtime_ms: float = -1.0
    ref_runtime_ms: float | None = None
    speedup: float | None = None  # the same as speedup_vs_eager, under the name the seeds used
    speedup_vs_eager: float | None = None
    speedup_vs_eager_ci: tuple[float, float] | None = None
    speedup_vs_compile: float | None = None
    speedup_vs_compile_ci: tuple[float, float] | None = None
    compile_runtime_ms: float | None = None
    baseline_conditions: Conditions | None = None  # what the baselines used here were measured beside
    baseline_remeasured: str | None = None  # why the stored baselines were not reused (this run measured them)
    runtime_stats: TimingStats | None = None
    ref_runtime_stats: TimingStats | None = None
    timing: Timing | None = None
    problem_warning: str | None = None
    lane: str | None = None  # the evaluation lane (GPU) that judged it: "cuda:1", "cpu:0", "ray:NODE/cuda:0"
    built_on: str | None = None  # Ray runs: the node that built it ("NAME/node-id-prefix")
    duplicate_of: str | None = None  # same bytes as this candidate of the same problem: judged once, reused
    max_abs_diff: float | None = None
    mean_abs_diff: float | None = None
    trials_passed: int = 0
    mutates_inputs: bool = False  # it changed its inputs in place (judged on the untouched reference anyway)
    device_name: str | None = None
    precision: str | None = None  # fp32 / fp16 / bf16 (`--precision`); None in runs made before it existed
    problem_group: str | None = None  # the problem's folder under the problems dir ("level2"), None at its top
    kernels: KernelCount | None = None  # launch accounting of one forward, for correct candidates
    kernels_warning: str | None = None  # set when none of the work ran in the candidate's own kernels
    sandbox: SandboxRecord | None = None  # what contained its processes (None: none ran, or an older run)
    memory: MemoryRecord | None = None  # the memory budget's plan and the workers' peaks (None: not judged)
    # each trial's input distribution (`worker.draws`: normal, shifted, heavy_tailed, row_scaled; normal where the
    # reference refused one) and what was refused; None: not judged, or a run made before they existed
    distributions: list[str] | None = None
    distributions_note: str | None = None
    precision_check: PrecisionCheck | None = None  # trial 0 against the float64 truth
    error: str | None = None

    def disqualified(self, status: Status, error: str) -> Findings:
        """These findings for a candidate found out after the fact (say, tampering): no time, no speedup."""
        return self.model_copy(update=dict(status=status, error=error, correct=False, runtime_ms=-1.0, speedup=None,
                                           speedup_vs_eager=None, speedup_vs_compile=None, speedup_vs_eager_ci=None,
                                           speedup_vs_compile_ci=None))


class Verdict(Findings):
    """One line of `verdicts.jsonl`: the judgement of one candidate under one set of settings."""

    run_id: str
    problem: str
    candidate: str
    source_sha256: str
    settings_key: str
    device: Device
    torch_version: str
    trials: int = 0
    log: str | None = None
    wall_seconds: float = 0.0
    finished_at: str = ""
    sample: int | None = None  # KernelBench's sample index: S of a file level_{L}_problem_{P}_sample_{S}_kernel.py

    @model_validator(mode="after")
    def _sample_from_name(self) -> Verdict:
        """The index discovery gives the candidate (`Candidate.sample`): the one its file name carries, if any."""
        self.sample = sample_of(self.candidate) if self.sample is None else self.sample
        return self

    def findings(self) -> Findings:
        return Findings.model_validate(self.model_dump(include=set(Findings.model_fields)))


class CompileRecord(BaseModel):
    """`compile.json` in a build directory: the outcome of importing (and so building) one source."""

    ok: bool
    status: Status | None = None  # compile_error / load_error / timeout / crashed when not ok
    error: str | None = None
    timed_out: bool = False
    seconds: float = 0.0  # the whole build: import (extension compile) and warm-up
    warmup_seconds: float | None = None  # the build-stage warm-up call's part (`warmup.py`); None: none ran
    torch_version: str = ""
    sandbox: SandboxRecord | None = None  # what contained the build's worker
