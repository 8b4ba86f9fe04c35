"""Judging: check a compiled candidate against its problem's reference, then time both side by side.

    ref = ReferenceSide(problem, settings, seeds, ...).open()   # once per problem and lane
    findings = judge(ref, build, path, log, timeout)             # once per candidate

`reference_side` holds the checker (the reference's worker: inputs, expected outputs, comparisons),
`candidate_run` the candidate's single worker and its trials, `timing_stage` the interleaved timing stage.
Each stage returns its result (`Checked`, `TimedResult`, `Launches`); `verdict` assembles the findings from them,
here and nowhere else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kernelbench_eval.building.compile import Compiled
from kernelbench_eval.common import memory
from kernelbench_eval.common.kbmethod import per_call
from kernelbench_eval.common.precision import precision_reason
from kernelbench_eval.judge.candidate_run import CandidateRun, Checked, Launches, count_launches
from kernelbench_eval.judge.lending import memory_record
from kernelbench_eval.judge.reference_side import ReferenceSide, Secrets, describe_problem
from kernelbench_eval.judge.timing_record import TimedResult
from kernelbench_eval.judge.timing_stage import time_candidate
from kernelbench_eval.measured import MemoryRecord, PrecisionCheck
from kernelbench_eval.messages import MemoryPlan
from kernelbench_eval.records import Findings, RunSettings
from kernelbench_eval.statuses import Status

__all__ = ["ReferenceSide", "Secrets", "describe_problem", "judge", "verdict"]


def judge(ref: ReferenceSide, build: Compiled, path: Path, log: Path, timeout: float) -> Findings:
    """Check every trial, then (only when all pass) time the candidate against the reference."""
    with CandidateRun(ref, build, path, log, timeout) as run:
        timed = launches = None
        if run.start() and run.check_trials():
            timed = time_candidate(run)
            if timed is not None and ref.settings.account_launches:
                launches = count_launches(run)
        used = memory_record(ref.lender, run.peak_bytes()) if run.worker is not None else None
        return verdict(ref, run.checked(), timed, launches, used)


def verdict(ref: ReferenceSide, checked: Checked, timed: TimedResult | None, launches: Launches | None = None,
            used: MemoryRecord | None = None) -> Findings:
    """The findings on one candidate from its stages' results: its own run (`checked`), the timing (`timed`: None
    when it was not timed, or a timed call was wrong), the launch accounting, its memory, and the problem's."""
    status, error = checked.status, checked.error
    if timed is not None and timed.doubts:
        status, error = "suspicious", "suspicious: " + "; ".join(timed.doubts)
    precision = checked.precision_check
    if precision is not None:
        precision = precision.model_copy(update={"timed_error": checked.timed_error})
    if timed is not None and status in ("ok", "suspicious"):
        reason = _reduced_precision(precision, ref.settings)
        if reason:
            status, error = "suspicious", (error + "; " if error else "suspicious: ") + reason
    status, error = _excuse_a_shortfall_of_the_harness(status, error, ref.lender.residency)
    baseline = ref.baselines.baseline
    figures: dict[str, Any] = {}
    if timed is not None:  # correct: every timed call was
        phases = {k: round(v, 4) for k, v in checked.phases}
        figures = dict(correct=True, timing=timed.timing.model_copy(update={"phases": phases}),
                       runtime_ms=timed.runtime_ms, runtime_stats=timed.runtime_stats,
                       ref_runtime_ms=timed.ref_runtime_ms, ref_runtime_stats=timed.ref_runtime_stats,
                       speedup=timed.speedup, speedup_vs_eager=timed.speedup,
                       speedup_vs_eager_ci=timed.timing.speedup_ci, speedup_vs_compile=timed.speedup_vs_compile,
                       speedup_vs_compile_ci=timed.speedup_vs_compile_ci)
    return Findings(
        status=status, error=error, device_name=checked.device_name, sandbox=checked.sandbox,
        trials_passed=checked.trials_passed, mutates_inputs=checked.mutates_inputs,
        max_abs_diff=checked.max_abs_diff, mean_abs_diff=checked.mean_abs_diff, precision_check=precision,
        kernels=launches.kernels if launches else None, kernels_warning=launches.warning if launches else None,
        problem_warning=ref.warning, distributions=ref.distributions or None,  # the trials' (`worker.draws`)
        distributions_note=ref.distributions_note, memory=used,
        baseline_conditions=baseline.conditions if baseline else None,
        baseline_remeasured=ref.baselines.remeasured if baseline else None,
        compile_runtime_ms=(per_call(ref.settings.timing, baseline.compiled_samples)
                            if baseline and baseline.compiled else None),
        **figures)


def _reduced_precision(check: PrecisionCheck | None, settings: RunSettings) -> str | None:
    """Why a correct candidate far less precise than the reference against the float64 truth is `suspicious`,
    with both errors (`precision.reduced_precision`), unless the run allows it (`--allow-reduced-precision`)."""
    if check is None or settings.allow_reduced_precision:
        return None
    return precision_reason(check.candidate_error, check.reference_error, settings.precision, check.output,
                            check.timed_error)


def _excuse_a_shortfall_of_the_harness(status: Status, error: str | None, plan: MemoryPlan | None
                                       ) -> tuple[Status, str | None]:
    """A candidate that ran out of memory asking for no more than an input set or the reference's own call takes
    (its outputs and what it allocates beyond them), where even the checker's least resident plan was over the
    budget, is `skipped` with the sizes: the harness did not leave it the room its own protocol needs (a copy of
    the inputs in the candidate's process) or the reference has, so running out says nothing of the candidate
    (an identical copy of 45_Average_Pooling_2D on an 80 GB card: 16 GiB asked for its copy of the 17.2 GB input,
    the checker holding 53 GB). Asking for more, or running out where the plan fit, stays the candidate's
    `runtime_error` (issue 34)."""
    text = error or ""
    if status != "runtime_error" or plan is None or plan.fits or not memory.names_memory(text):
        return status, error
    asked, room = memory.asked_bytes(text), max(plan.input_bytes, plan.output_bytes + plan.transient_bytes)
    if asked is None or asked > room:
        return status, error
    return "skipped", (f"skipped: judging this problem needs about {memory.gb(plan.need_bytes)} (the checker and a "
                       f"candidate at the reference's footprint), over the {memory.gb(plan.budget_bytes)} budget; "
                       f"the candidate ran out asking for {memory.gb(asked)}, no more than an input set or the "
                       f"reference's own call takes ({memory.gb(room)}): {text}")
