"""Why a measured time is not believed: the rules that turn a correct candidate into `suspicious`.

Every rule compares what the candidate's process reported with something it cannot reach: the
harness's own wall clock, the reference measured the same way in the same minutes, or physics. On a busy
host the rules must not fire on the reference's own code (`kbeval selftest`): what the reference shows in
the same blocks (its CPU use, its unexplained wall time) is the noise a candidate is measured against.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kernelbench_eval.common import kbmethod
from kernelbench_eval.common.stats import Samples
from kernelbench_eval.judge.measure import TimedModel

CLOCK_SLACK_MS = 0.1  # wall time per call a timer may miss (pipe, Python, GC) beyond the reference's...
CLOCK_SLACK_SHARE = 0.5  # ...or this share of the reported time, whichever is larger;
CLOCK_FLOOR_MS = 0.02  # but a timer that missed more than this and several times what it reported
CLOCK_FACTOR = 3.0  # is caught even on short kernels
CORES_SLACK = 0.5  # cores a candidate may keep busy beyond what the reference did in the same minutes,
CORES_SHARE = 1.3  # and beyond this many times --threads (or --threads + CORES_SLACK, whichever is larger)
GAP_Z = 3.0  # the paired gap must be this many standard errors above 0 to be more than host noise
TAIL_SLACK_MS = 0.02
TAIL_SLACK_SHARE = 0.1
GATE_SLACK_MS = 0.005  # a flush before the candidate's calls may take this much longer than the reference's...
GATE_SLACK_SHARE = 0.05  # ...or this share of it, whichever is larger
NOT_FASTER = 1.02  # a candidate under this speedup gained nothing a rule on its flush could take back (issue 36)
OVER_SLACK_MS = 0.05  # a block's calls may report this much more per call than the harness's clock saw them take...
OVER_SLACK_SHARE = 0.05  # ...or this share of their reported time (the two clocks' skew), whichever is larger


@dataclass
class Assessment:
    """What the timing of a correct candidate supports: the time we report, and why it may be doubted."""

    runtime_ms: float  # the time we stand behind (device-wide when work escaped the call's own events)
    reasons: list[str] = field(default_factory=list)
    speedup_trusted: bool = True


def assess(ref: TimedModel, cand: TimedModel, device: str, floor_ms: float | None, threads: int | None = None,
           method: str = kbmethod.OWN) -> Assessment:
    """The candidate's runtime and the reasons, if any, to distrust it; what a call costs is `method`'s statistic
    (`kbmethod.per_call`: KernelBench's mean, or the harness's median of window means)."""

    def per_call(samples: list[float]) -> float:
        return kbmethod.per_call(method, samples)

    result = Assessment(runtime_ms=per_call(cand.event_ms))
    cores, ref_cores = cand.cores_used(), ref.cores_used()
    if device == "cpu" and threads and too_many_cores(cores, ref_cores, threads):
        result.reasons.append(f"it kept {cores:.2g} cores busy while timed ({ref_cores:.2g} for the reference), "
                              f"counting every process it started, but the run fixes {threads} thread(s) "
                              "(--threads); the reference was held to that")
    if cand.replaced:
        result.reasons.append(f"it replaced {', '.join(sorted(cand.replaced))} in its process (timed with the "
                              "harness's own copies, bound before it loaded)")
        result.speedup_trusted = False
    over = over_reported(cand)
    if over is not None:
        result.reasons.append(
            f"its timer reported more time than its calls took: {-over:.3g} ms per call beyond the harness's wall "
            "clock in a block (slow calls forged to pass the clock check, or to widen its interval)")
        result.speedup_trusted = False
    # the slack scales with what the candidate's calls cost (the harness's own statistic, whatever the method), not
    # with their mean: a few forged slow calls raised the mean, and with it the slack, over the time hidden in all
    # the others
    explained = cand.device_ms.per_call()
    excess = cand.unexplained() - ref.unexplained()
    if excess > clock_slack(explained) and significant(cand.paired_gaps(ref)):
        result.reasons.append(
            f"clock mismatch: the harness's wall clock saw {excess:.3g} ms per call more than the timer in the "
            f"candidate's process reported ({explained:.3g} ms); its clock or events were tampered with or work "
            "was hidden from them")
        result.speedup_trusted = False
    if device == "cuda":
        tail = cand.device_tail() - ref.device_tail()
        if tail > max(TAIL_SLACK_MS, TAIL_SLACK_SHARE * result.runtime_ms):
            result.runtime_ms = per_call(cand.device_ms) - ref.device_tail()
            result.reasons.append(
                f"work continues after the call returns ({tail:.3g} ms per call, e.g. on another CUDA stream); "
                f"timed device-wide instead: {result.runtime_ms:.3g} ms")
        slowed = flush_slowed(cand, ref) if result.runtime_ms < per_call(ref.event_ms) / NOT_FASTER else None
        if slowed is not None:  # (a candidate no faster than the reference gained nothing by work under the flush)
            result.reasons.append(
                f"the cache flush before each of its calls took {slowed * 1e3:.3g} us longer than before the "
                "reference's: work ran beside it before its timer started (on another CUDA stream?)")
            result.speedup_trusted = False
    if floor_ms and result.runtime_ms < floor_ms:
        result.reasons.append(
            f"{result.runtime_ms:.3g} ms is below the physical floor of {floor_ms:.3g} ms (its inputs' bytes "
            "read once at the GPU's peak memory bandwidth)")
    return result


def over_reported(model: TimedModel) -> float | None:
    """The most negative per-call gap of any block (reported time beyond the harness's wall clock on that block),
    when beyond the slack; None otherwise. An honest timer never reports more than the wall time its calls took."""
    if not model.block_gaps:
        return None
    worst = min(model.block_gaps)
    slack = max(OVER_SLACK_MS, OVER_SLACK_SHARE * model.device_ms.per_call())
    return worst if worst < -slack else None


def too_many_cores(cores: float, ref_cores: float, threads: int) -> bool:
    """Whether a CPU candidate kept more cores busy (CPU time of all its processes, its cgroup's: a forked helper
    counts, `measure.process_cpu_ms`, over the wall time of its blocks) than --threads allows and than the
    reference kept busy in the same blocks (host load that slows both is not the candidate's doing)."""
    return cores > max(threads * CORES_SHARE, threads + CORES_SLACK) and cores > ref_cores + CORES_SLACK


def flush_slowed(cand: TimedModel, ref: TimedModel) -> float | None:
    """How much longer (ms per call) the flush before each candidate call took than the same flush before the
    reference's, when more than noise; None otherwise.

    The flush is the harness's own work on an idle device (both workers synchronise the whole device first),
    so it takes as long in either process. A candidate that launches its work on another stream runs it while
    the flush still holds its timer back (the flush covers the launch: `percall`), and slows it; compute that
    leaves the memory bus alone slows it little, which is why this is one check among several.
    """
    if not cand.gate_ms or not ref.gate_ms:
        return None
    ref_gate = ref.gate_ms.median()
    slowed = cand.gate_ms.median() - ref_gate
    return slowed if slowed > max(GATE_SLACK_MS, GATE_SLACK_SHARE * ref_gate) else None


def clock_slack(reported_ms: float) -> float:
    """How much unexplained wall time per call is tolerated before the timer is called tampered with.

    Host noise (a pipe round trip, a garbage collection) is tens of microseconds, so small absolute gaps
    are forgiven, unless the gap is several times the time the candidate claims, which noise is not.
    """
    loose = max(CLOCK_SLACK_MS, CLOCK_SLACK_SHARE * reported_ms)
    strict = max(CLOCK_FLOOR_MS, CLOCK_FACTOR * reported_ms)
    return min(loose, strict)


def significant(paired: list[float]) -> bool:
    """Whether the candidate's unexplained wall time exceeds the reference's by more than host noise.

    Each value is one block's gap difference (candidate minus reference, run back to back). A tampered
    timer hides time in every block, so the differences sit far from 0 with a small spread; load on a busy
    host lands on either model at random, so their median is within a few standard errors of 0. Few blocks
    cannot show either: then the threshold alone decides, as before.
    """
    if len(paired) < 5:
        return True
    gaps = Samples(paired)
    return gaps.median() > GAP_Z * gaps.median_stderr()


def speedup_reason(speedup: float | None, max_speedup: float, ci: tuple[float, float] | None = None) -> str | None:
    """A speedup over the limit: its point estimate, or any part of its interval above it at the low end.

    Not the interval's low end alone (as before issue 36): slow windows in just under half of a candidate's calls
    (real sleeps, or a timer wrapper) widen the interval down under the limit while the point estimate stays at
    40-76x; a slow call is evidence against a claim, never a way to make it pass."""
    if speedup is None or not max_speedup:
        return None
    if speedup > max_speedup or (ci is not None and ci[0] > max_speedup):
        return f"speedup {speedup:.3g}x is above the {max_speedup:g}x plausibility limit (--max-speedup)"
    return None
