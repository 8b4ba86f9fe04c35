"""The verdict is assembled in one place (`judging.verdict`) from the stages' frozen results: the candidate's own
run (`Checked`), the timing (`TimedResult`), the launch accounting and its memory. Pure: no worker runs here."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kernelbench_eval.budgets import Budgets
from kernelbench_eval.discover.corpus import Problem
from kernelbench_eval.judge.baselines import BaselineStore
from kernelbench_eval.judge.candidate_run import Checked, Launches
from kernelbench_eval.judge.judging import ReferenceSide, Secrets, verdict
from kernelbench_eval.judge.timing_record import TimedResult
from kernelbench_eval.measured import PrecisionCheck, Timing, TimingStats
from kernelbench_eval.messages import MemoryPlan
from kernelbench_eval.records import KernelCount, RunSettings

CHECKED = Checked(status="ok", error=None, device_name="cpu", sandbox=None, trials_passed=3, mutates_inputs=False,
                  max_abs_diff=1e-6, mean_abs_diff=1e-7, precision_check=None, timed_error=None,
                  phases=(("trials", 0.5), ("timing", 1.25)))


@pytest.fixture
def ref(tmp_path):
    side = ReferenceSide(Problem("p", tmp_path / "p.py", "0" * 64), RunSettings(device="cpu"), Secrets.draw(1),
                         tmp_path / "log", Budgets.of(60, 60), BaselineStore(tmp_path / "b"))
    yield side
    side.close()


def _timed(doubts: tuple[str, ...] = ()) -> TimedResult:
    stats = TimingStats.from_samples([2.0] * 20)
    timing = Timing(candidate=stats, reference=stats, basis="wall", blocks=20, checked_calls=20, rse=None,
                    ref_rse=None, wall_ms_per_call=2.0, ref_wall_ms_per_call=3.0, unexplained_ms=0.0,
                    speedup_ci=(1.4, 1.6))
    return TimedResult(timing=timing, runtime_ms=2.0, runtime_stats=stats, ref_runtime_ms=3.0,
                       ref_runtime_stats=stats, speedup=1.5, doubts=doubts)


def test_a_timed_candidate_gets_its_figures_and_its_phases_without_changing_the_stage_results(ref):
    timed = _timed()
    launches = Launches(KernelCount(total=2, custom=2, library=0, custom_share=1.0), None)
    found = verdict(ref, CHECKED, timed, launches)
    assert found.status == "ok" and found.correct and found.trials_passed == 3 and found.runtime_ms == 2.0
    assert found.speedup == found.speedup_vs_eager == 1.5 and found.speedup_vs_eager_ci == (1.4, 1.6)
    assert found.timing is not None and found.timing.phases == {"trials": 0.5, "timing": 1.25}
    assert found.kernels == launches.kernels and found.max_abs_diff == 1e-6
    assert timed.timing.phases == {}  # the timing stage's result is not written into


def test_an_untimed_candidate_keeps_its_outcome_and_no_figures(ref):
    failed = replace(CHECKED, status="incorrect", error="trial 1: wrong", trials_passed=1)
    found = verdict(ref, failed, None)
    assert (found.status, found.error, found.correct, found.runtime_ms, found.timing) == (
        "incorrect", "trial 1: wrong", False, -1.0, None)


def test_doubts_of_the_timing_and_of_its_precision_both_make_it_suspicious(ref):
    """An fp32 candidate computed in bf16 (relative error 4e-3 against the reference's 1e-7) with a clock doubt:
    `suspicious`, both reasons; allowed reduced precision leaves only the clock's; untimed, precision says nothing."""
    coarse = replace(CHECKED, precision_check=PrecisionCheck(candidate_error=4e-3, reference_error=1e-7),
                     timed_error=5e-3)
    found = verdict(ref, coarse, _timed(("clock mismatch",)))
    assert found.status == "suspicious" and found.error.startswith("suspicious: clock mismatch; ")
    assert "reduced precision: its error against the float64 truth is 0.004, 0.005 on a timed call" in found.error
    assert found.precision_check.timed_error == 5e-3
    assert coarse.precision_check.timed_error is None  # the check stage's record is not written into
    ref.settings = ref.settings.model_copy(update={"allow_reduced_precision": True})
    assert verdict(ref, coarse, _timed(("clock mismatch",))).error == "suspicious: clock mismatch"
    ref.settings = ref.settings.model_copy(update={"allow_reduced_precision": False})
    assert verdict(ref, coarse, None).status == "ok"


def test_running_out_where_the_harness_left_no_room_is_excused_only_then(ref):
    oom = replace(CHECKED, status="runtime_error",
                  error="CUDA out of memory. Tried to allocate 16.00 GiB (GPU 0; 79.1 GiB total)")
    plan = MemoryPlan(trial_inputs=False, expected=False, timing_sets=1, placements=1, need_bytes=90 << 30,
                      budget_bytes=70 << 30, fits=False, resident_bytes=0, input_bytes=17 << 30,
                      output_bytes=1 << 30, transient_bytes=0)
    ref.lender.residency = plan
    found = verdict(ref, oom, None)
    assert found.status == "skipped" and "ran out asking for 17.2 GB" in found.error
    ref.lender.residency = plan.model_copy(update={"fits": True})
    assert verdict(ref, oom, None).status == "runtime_error"  # the plan fit: the candidate's own doing


def test_a_gpu_measurement_fills_every_group_of_its_timing_record():
    """`timing_record.record` on a CUDA measurement (samples made up, no GPU needed): the basis, the calls, the
    device's figures and the reference-alone check each land in their fields, and the speedup is the reference's
    time over the candidate's. The GPU-only branches run here, where CI can see them."""
    from types import SimpleNamespace

    from kernelbench_eval.judge.measure import TimedModel
    from kernelbench_eval.judge.plausibility import Assessment
    from kernelbench_eval.judge.refguard import Agreement
    from kernelbench_eval.judge.timing_record import Interleaved, record

    def model(event_ms: float, launch_ms: float) -> TimedModel:
        one = TimedModel(worker=None, event_ms=[event_ms] * 20, device_ms=[event_ms + 0.01] * 20,  # type: ignore
                         gate_ms=[0.3] * 20, launch_ms=[launch_ms] * 20, block_gaps=[0.5] * 4, wall_ms=20 * 2.5)
        one.flush, one.overlapped, one.late = "one kernel holding every SM (1056 blocks)", 15, 1
        return one

    ref, cand = model(1.5, 0.2), model(1.0, 0.3)
    settings = RunSettings(device="cuda", compile_baseline=False)
    timing = SimpleNamespace(add_session=lambda ms, doubted: None, event_overhead_ms=0.005, floor_ms=lambda: 0.1)
    run = SimpleNamespace(ref=SimpleNamespace(settings=settings, timing=timing,
                                              baselines=SimpleNamespace(baseline=None)), exchange_kind="cuda_ipc")
    guard = SimpleNamespace(reasons=lambda: [])
    agreement = Agreement(outcome="agrees", alone_ms=1.49, ratio=1.01, ci=(0.99, 1.03))
    timed = Interleaved(ref, cand, blocks=4, checks=20, clocks=[1980, 1975], seconds=0.1, guard=guard,  # type: ignore
                        in_place=0, calls_per_block=5, agreement=agreement)
    result = record(run, timed, Assessment(runtime_ms=1.0), attempts=1)  # type: ignore[arg-type]
    t = result.timing
    assert result.speedup == pytest.approx(1.5) and result.doubts == ()
    assert (t.basis, t.cover_ms) == ("device", pytest.approx(1.25 * 0.3 + 0.02))
    assert t.latency_ms == pytest.approx(1.0) and t.launch_ms == pytest.approx(0.3)
    assert (t.gate_ms, t.ref_gate_ms, t.device_tail_ms) == (0.3, 0.3, pytest.approx(0.01))
    assert (t.block_calls, t.overlapped_calls, t.late_calls, t.in_place_calls) == (5, 15, 1, 0)
    assert t.sm_clock_mhz == (1980, 1975) and t.exchange == "cuda_ipc" and t.flush.startswith("one kernel")
    assert t.device_busy == pytest.approx(20 * (1.01 + 1.51) / 1e3 / 0.1)
    assert (t.ref_alone_ms, t.ref_alone_check, t.checked_calls, t.floor_ms) == (1.49, "agrees", 20, 0.1)
