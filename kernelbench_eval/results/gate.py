"""A pass/fail bar over one run, for CI: every candidate must be correct and (optionally) fast enough."""

from __future__ import annotations

from dataclasses import dataclass

from kernelbench_eval.records import Verdict

BASELINES = ("eager", "compile")


class GateUsageError(ValueError):
    """The gate cannot be applied as asked (unknown baseline, a baseline the run did not measure)."""


@dataclass(frozen=True)
class GateFailure:
    problem: str
    candidate: str
    reason: str


def speedup_field(verdicts: list[Verdict], baseline: str) -> str:
    """The verdict attribute holding the speedup over BASELINE; GateUsageError when the run lacks it."""
    if baseline == "eager":
        return "speedup_vs_eager"
    if baseline == "compile":
        if not any(v.compile_runtime_ms is not None for v in verdicts):
            raise GateUsageError("this run has no torch.compile baseline (run without --no-compile-baseline); "
                                 "use --baseline eager")
        return "speedup_vs_compile"
    raise GateUsageError(f"unknown baseline {baseline!r}; use one of {', '.join(BASELINES)}")


def _first_line(text: str | None) -> str:
    stripped = (text or "").strip()
    return stripped.splitlines()[0][:160] if stripped else ""


def check_gate(verdicts: list[Verdict], require_correct: bool = True, min_speedup: float | None = None,
               baseline: str = "eager", allow_skipped: bool = False, allow_suspicious: bool = False,
               require_custom: bool = False) -> list[GateFailure]:
    """Every candidate that misses the bar, with why. The speedup bar applies to correct candidates only
    (an incorrect one has no speedup; `require_correct` is what fails it). A `suspicious` time never
    passes unless explicitly allowed; the bar is the lower end of the speedup's 95 % interval. With
    `require_custom`, a correct candidate must also have run at least one kernel of its own (`launches.py`):
    a "custom kernel" that is all library calls fails, and so does one whose launches were not counted."""
    field = speedup_field(verdicts, baseline)
    failures: list[GateFailure] = []
    for v in sorted(verdicts, key=lambda v: (v.problem, v.candidate)):
        if v.status == "skipped":
            if not allow_skipped:
                failures.append(GateFailure(v.problem, v.candidate,
                                            "skipped" + (f": {_first_line(v.error)}" if v.error else "")))
            continue
        if v.status == "suspicious" and not allow_suspicious:
            failures.append(GateFailure(v.problem, v.candidate, _first_line(v.error) or "suspicious"))
            continue
        if not v.correct:
            if require_correct:
                why = _first_line(v.error)
                failures.append(GateFailure(v.problem, v.candidate, f"not correct ({v.status})"
                                            + (f": {why}" if why else "")))
            continue
        if require_custom and (why := _custom_failure(v)):
            failures.append(GateFailure(v.problem, v.candidate, why))
            continue
        if min_speedup is not None:
            speed = getattr(v, field, None)
            interval = getattr(v, f"{field}_ci", None)
            if speed is not None and interval is not None:
                speed = interval[0]  # faster only when the whole interval clears the bar
            if speed is None:
                failures.append(GateFailure(v.problem, v.candidate, f"no {baseline} speedup recorded"))
            elif speed < min_speedup:
                failures.append(GateFailure(v.problem, v.candidate,
                                            f"speedup {speed:.3g}x (95% lower bound) < {min_speedup:g}x over "
                                            f"{baseline}"))
    return failures


def _custom_failure(v: Verdict) -> str | None:
    if v.kernels is None:
        return "no launch accounting recorded (--require-custom needs verdicts with `kernels`)"
    if v.kernels.custom == 0:
        return v.kernels_warning or f"no custom kernel ran ({v.kernels.library} library kernels)"
    return None
