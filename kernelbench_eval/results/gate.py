"""A pass/fail bar over one run, for CI: every candidate must be correct and (optionally) fast enough.

Fast enough is judged by the speedup's interval, not its point: `--min-speedup X` passes a candidate only
when the low end of its 95 % interval (`speedup_vs_eager_ci` or `speedup_vs_compile_ci`, widened by the
between-session spread) reaches X, so a run that is fast only by noise does not pass and a slow point inside a
wide interval is not the bar. A verdict with no interval (too few timed calls, an older run) is held to its
point estimate, and its failure says so. `bar()` states the bar, which the command prints.
"""

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
            which = "point estimate: no interval recorded"
            if speed is not None and interval is not None:
                speed, which = interval[0], "95% lower bound"  # faster only when the whole interval clears the bar
            if speed is None:
                failures.append(GateFailure(v.problem, v.candidate, f"no {baseline} speedup recorded"))
            elif speed < min_speedup:
                failures.append(GateFailure(v.problem, v.candidate,
                                            f"speedup {speed:.3g}x ({which}) < {min_speedup:g}x over {baseline}"))
    return failures


def bar(require_correct: bool = True, min_speedup: float | None = None, baseline: str = "eager",
        allow_skipped: bool = False, allow_suspicious: bool = False, require_custom: bool = False) -> str:
    """The bar `check_gate` applies with these settings, in words (printed with the verdict of the gate)."""
    parts = [*["correct"] * require_correct, *["not skipped"] * (not allow_skipped),
             *["not suspicious"] * (not allow_suspicious), *["a kernel of its own"] * require_custom]
    if min_speedup is not None:
        parts.append(f"speedup over {baseline} >= {min_speedup:g}x at its 95% interval's lower bound")
    return ", ".join(parts) or "none"


def _custom_failure(v: Verdict) -> str | None:
    if v.kernels is None:
        return "no launch accounting recorded (--require-custom needs verdicts with `kernels`)"
    if v.kernels.custom == 0:
        return v.kernels_warning or f"no custom kernel ran ({v.kernels.library} library kernels)"
    return None
