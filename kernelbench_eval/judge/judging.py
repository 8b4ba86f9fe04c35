"""Judging: check a compiled candidate against its problem's reference, then time both side by side.

    ref = ReferenceSide(problem, settings, seeds, ...).open()   # once per problem and lane
    findings = judge(ref, build, path, log, timeout)             # once per candidate

`reference_side` holds the checker (the reference's worker: inputs, expected outputs, comparisons),
`candidate_run` the candidate's single worker and its trials, `timing_stage` the interleaved timing stage.
"""

from __future__ import annotations

from pathlib import Path

from kernelbench_eval.building.compile import Compiled
from kernelbench_eval.common import memory
from kernelbench_eval.common.kbmethod import per_call
from kernelbench_eval.common.precision import precision_reason
from kernelbench_eval.judge.candidate_run import CandidateRun, count_launches
from kernelbench_eval.judge.reference_side import ReferenceSide, Secrets, describe_problem
from kernelbench_eval.judge.timing_stage import TimedResult, time_candidate
from kernelbench_eval.records import Findings

__all__ = ["ReferenceSide", "Secrets", "apply_timed", "describe_problem", "judge"]


def judge(ref: ReferenceSide, build: Compiled, path: Path, log: Path, timeout: float) -> Findings:
    """Check every trial, then (only when all pass) time the candidate against the reference."""
    with CandidateRun(ref, build, path, log, timeout) as run:
        if run.start() and run.check_trials():
            timed = time_candidate(run)
            if timed is not None:
                apply_timed(run.findings, timed)
                if ref.settings.account_launches:
                    launches = count_launches(run)
                    run.findings.kernels, run.findings.kernels_warning = launches.kernels, launches.warning
        run.findings.problem_warning = ref.warning
        run.findings.distributions = ref.distributions or None  # the trials' (`worker.draws`)
        run.findings.distributions_note = ref.distributions_note
        _doubt_precision(run)
        _excuse_a_shortfall_of_the_harness(run)
        if run.worker is not None:
            run.findings.memory = ref.lender.memory_record(run.peak_bytes())
        if baseline := ref.baselines.baseline:
            run.findings.baseline_conditions = baseline.conditions
            run.findings.baseline_remeasured = ref.baselines.remeasured
            if baseline.compiled:
                run.findings.compile_runtime_ms = per_call(ref.settings.timing, baseline.compiled_samples)
        if run.findings.timing is not None:
            run.findings.timing.phases = {k: round(v, 4) for k, v in run.phases.items()}
        return run.findings


def apply_timed(found: Findings, timed: TimedResult) -> None:
    """The timing stage's result into the verdict: correct (every timed call was), its figures, its doubts."""
    found.correct, found.timing = True, timed.timing
    found.runtime_ms, found.runtime_stats = timed.runtime_ms, timed.runtime_stats
    found.ref_runtime_ms, found.ref_runtime_stats = timed.ref_runtime_ms, timed.ref_runtime_stats
    found.speedup = found.speedup_vs_eager = timed.speedup
    found.speedup_vs_eager_ci = timed.timing.speedup_ci
    found.speedup_vs_compile, found.speedup_vs_compile_ci = timed.speedup_vs_compile, timed.speedup_vs_compile_ci
    if timed.doubts:
        found.status, found.error = "suspicious", "suspicious: " + "; ".join(timed.doubts)


def _doubt_precision(run: CandidateRun) -> None:
    """A correct candidate far less precise than the reference against the float64 truth is `suspicious`, with
    both errors (`precision.reduced_precision`), unless the run allows it (`--allow-reduced-precision`)."""
    found, settings = run.findings, run.ref.settings
    check = found.precision_check
    if check is not None:
        check.timed_error = run.timed_error
    if not found.correct or check is None or settings.allow_reduced_precision:
        return
    reason = precision_reason(check.candidate_error, check.reference_error, settings.precision, check.output,
                              check.timed_error)
    if reason:
        found.status = "suspicious"
        found.error = (found.error + "; " if found.error else "suspicious: ") + reason


def _excuse_a_shortfall_of_the_harness(run: CandidateRun) -> None:
    """A candidate that ran out of memory asking for no more than an input set or the reference's own call takes
    (its outputs and what it allocates beyond them), where even the checker's least resident plan was over the
    budget, is `skipped` with the sizes: the harness did not leave it the room its own protocol needs (a copy of
    the inputs in the candidate's process) or the reference has, so running out says nothing of the candidate
    (an identical copy of 45_Average_Pooling_2D on an 80 GB card: 16 GiB asked for its copy of the 17.2 GB input,
    the checker holding 53 GB). Asking for more, or running out where the plan fit, stays the candidate's
    `runtime_error` (issue 34)."""
    found, plan = run.findings, run.ref.lender.residency
    error = found.error or ""
    if found.status != "runtime_error" or plan is None or plan.fits or not memory.names_memory(error):
        return
    asked, room = memory.asked_bytes(error), max(plan.input_bytes, plan.output_bytes + plan.transient_bytes)
    if asked is None or asked > room:
        return
    found.status = "skipped"
    found.error = (f"skipped: judging this problem needs about {memory.gb(plan.need_bytes)} (the checker and a "
                   f"candidate at the reference's footprint), over the {memory.gb(plan.budget_bytes)} budget; the "
                   f"candidate ran out asking for {memory.gb(asked)}, no more than an input set or the reference's "
                   f"own call takes ({memory.gb(room)}): {error}")
