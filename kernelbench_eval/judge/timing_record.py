"""What one interleaved measurement says (`timing_stage`): the speedup we stand behind, its interval, why it is
doubted, and the `Timing` record a verdict shows, built from named groups of figures (each field of `Timing`
is written once, by the group it belongs to)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernelbench_eval.common import kbmethod
from kernelbench_eval.common.stats import chained_speedup_ci, finite, speedup_ci
from kernelbench_eval.judge.candidate_run import CandidateRun
from kernelbench_eval.judge.measure import TimedModel, cover_s
from kernelbench_eval.judge.plausibility import Assessment, speedup_reason
from kernelbench_eval.judge.refguard import Agreement, Guard
from kernelbench_eval.judge.sessions import rerun_interval, unresolved, widened
from kernelbench_eval.measured import Timing, TimingStats

PerCall = Callable[[list[float]], float]


@dataclass
class Interleaved:
    """One interleaved measurement of the candidate against the reference."""

    ref: TimedModel
    cand: TimedModel
    blocks: int
    checks: int
    clocks: list[int | None]
    seconds: float
    guard: Guard
    in_place: int = 0  # calls whose outputs were compared where the candidate's call put them
    calls_per_block: int = 1
    agreement: Agreement | None = None


@dataclass(frozen=True)
class TimedResult:
    """What the timing stage settles about a candidate whose every timed call was right: its figures, and why they
    are doubted, if they are. `judging` assembles the verdict from it."""

    timing: Timing
    runtime_ms: float
    runtime_stats: TimingStats
    ref_runtime_ms: float
    ref_runtime_stats: TimingStats
    speedup: float | None
    speedup_vs_compile: float | None = None
    speedup_vs_compile_ci: tuple[float, float] | None = None
    doubts: tuple[str, ...] = ()  # each a reason the verdict is `suspicious`


def record(run: CandidateRun, timed: Interleaved, verdict: Assessment, attempts: int) -> TimedResult:
    """The measurement's result: the speedup (None where a doubt leaves no time to stand behind), its interval
    widened by what moves between sessions, the doubts, and the record of how it was timed."""
    ref, cand, settings = timed.ref, timed.cand, run.ref.settings
    method, mean = settings.timing, kbmethod.is_kernelbench(settings.timing)  # KernelBench's: every time a mean

    def per_call(samples: list[float]) -> float:
        return kbmethod.per_call(method, samples)

    ref_ms, agreement = per_call(ref.event_ms), timed.agreement
    speedup = ref_ms / verdict.runtime_ms if verdict.speedup_trusted and verdict.runtime_ms > 0 else None
    shifted = _shifted(cand.event_ms, verdict.runtime_ms, per_call)
    within = speedup_ci(ref.event_ms, shifted, mean=mean) if speedup else None
    reason = speedup_reason(speedup, settings.max_speedup, within)  # a claim implausible even within its session
    reasons = verdict.reasons + ([reason] if reason else []) + timed.guard.reasons()
    if agreement is not None and agreement.outcome == "disturbed":
        reasons.append(agreement.reason(ref_ms))
    between = run.ref.timing.add_session(ref_ms, doubted=bool(reasons))
    shorter = min(ref_ms, verdict.runtime_ms)  # the call whose absolute floor weighs most (`stats.prior_sd`)
    interval = widened(within, speedup, between, shorter, settings.device) if speedup and within else None
    stats, ref_stats = TimingStats.from_samples(cand.event_ms, mean), TimingStats.from_samples(ref.event_ms, mean)
    timing = Timing(candidate=stats, reference=ref_stats, speedup=speedup, speedup_ci=interval, attempts=attempts,
                    speedup_ci_within=within,
                    speedup_rerun_interval=rerun_interval(interval, speedup) if interval and speedup else None,
                    between_sd=between[0] if between else None, between_df=between[1] if between else None,
                    unresolved=unresolved(interval, within, between, shorter, settings.device) if speedup else None,
                    **_basis(timed, per_call, method, settings.device, speedup is not None),
                    **_calls(run, timed, method), **_device(run, timed), **_reference_alone(agreement))
    versus_compile, versus_compile_ci = None, None
    base = run.ref.baselines.baseline
    if speedup and base and base.compiled:
        versus_compile = per_call(base.compiled_samples) / per_call(base.eager_samples) * speedup
        versus_compile_ci = widened(chained_speedup_ci(base.compiled_samples, base.eager_samples, ref.event_ms,
                                                       shifted, mean), versus_compile, between, shorter,
                                    settings.device)
    return TimedResult(timing=timing, runtime_ms=verdict.runtime_ms, runtime_stats=stats, ref_runtime_ms=ref_ms,
                       ref_runtime_stats=ref_stats, speedup=speedup, speedup_vs_compile=versus_compile,
                       speedup_vs_compile_ci=versus_compile_ci, doubts=tuple(reasons))


def _basis(timed: Interleaved, per_call: PerCall, method: str, device: str, sped: bool) -> dict[str, Any]:
    """What the runtimes are (`basis`), and the other basis beside them: the latency with host launch work."""
    ref, cand = timed.ref, timed.cand
    mean, cuda = kbmethod.is_kernelbench(method), device == "cuda"
    latency, ref_latency = cand.latency_ms(), ref.latency_ms()
    return dict(
        basis=kbmethod.basis(method, device, len(cand.event_ms)) if mean else "device" if cuda else "wall",
        latency_ms=per_call(latency) if latency else None,
        ref_latency_ms=per_call(ref_latency) if ref_latency else None,
        latency_speedup=per_call(ref_latency) / per_call(latency) if sped and latency else None,
        launch_ms=cand.launch_ms.median() if cand.launch_ms else None,
        ref_launch_ms=ref.launch_ms.median() if ref.launch_ms else None,
        cover_ms=cover_s([ref, cand]) * 1e3 if cuda and not mean else None)


def _calls(run: CandidateRun, timed: Interleaved, method: str) -> dict[str, Any]:
    """How the calls went: how many, how steady, what the harness's own clock saw around them."""
    ref, cand = timed.ref, timed.cand
    return dict(
        blocks=timed.blocks, checked_calls=timed.checks, seconds=timed.seconds, block_calls=timed.calls_per_block,
        rse=finite(kbmethod.rse(method, cand.event_ms)), ref_rse=finite(kbmethod.rse(method, ref.event_ms)),
        wall_ms_per_call=cand.wall_per_call(), ref_wall_ms_per_call=ref.wall_per_call(),
        unexplained_ms=cand.unexplained() - ref.unexplained(), exchange=run.exchange_kind,
        event_overhead_ms=run.ref.timing.event_overhead_ms, floor_ms=run.ref.timing.floor_ms())


def _device(run: CandidateRun, timed: Interleaved) -> dict[str, Any]:
    """The GPU's figures (None on the CPU): work after the call, the flush, the clocks, the blocks' cadence."""
    ref, cand, settings = timed.ref, timed.cand, run.ref.settings
    cuda = settings.device == "cuda"
    busy = (sum(cand.device_ms) + sum(ref.device_ms)) / 1e3 / timed.seconds if cuda and timed.seconds else None
    return dict(
        device_tail_ms=cand.device_tail() if cuda else None, ref_device_tail_ms=ref.device_tail() if cuda else None,
        gate_ms=cand.gate_ms.median() if cand.gate_ms else None,
        ref_gate_ms=ref.gate_ms.median() if ref.gate_ms else None,
        sm_clock_mhz=(timed.clocks[0], timed.clocks[-1]) if timed.clocks else None,
        cuda_graph=settings.cuda_graph and cand.graph_error is None, graph_error=cand.graph_error,
        device_busy=busy, flush=cand.flush, in_place_calls=timed.in_place if cuda else None,
        overlapped_calls=cand.overlapped if cuda else None, late_calls=cand.late if cuda else None)


def _reference_alone(agreement: Agreement | None) -> dict[str, Any]:
    """The interleaved reference against itself timed alone (`refguard`)."""
    return dict(ref_alone_ms=agreement.alone_ms if agreement else None,
                ref_alone_ratio=agreement.ratio if agreement else None,
                ref_alone_check=agreement.outcome if agreement else None)


def _shifted(samples: list[float], runtime_ms: float, per_call: PerCall) -> list[float]:
    """Samples moved so their time per call (`per_call`) is the runtime we stand behind (device-wide when work
    escaped)."""
    shift = runtime_ms - per_call(samples)
    return [s + shift for s in samples] if shift else samples
