"""Issue 35 item 4: KernelBench's `cuda_event` method (`--timing kernelbench`, `kernelbench-2025`, `kbmethod`), with
the harness's checks on. The worker's loop on a fake clock, the harness's loop with stand-in workers, the settings
and baseline keys, and one CPU run end to end. No assertion here depends on how fast anything ran; the CUDA path is
tests/test_kbmethod_gpu.py."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import FIXTURES, kbeval, read_verdicts

from kernelbench_eval.common import kbmethod
from kernelbench_eval.common.stats import per_call_ms, speedup_ci
from kernelbench_eval.judge.baselines import BaselineStore
from kernelbench_eval.judge.measure import Deadline, TimedModel, measure
from kernelbench_eval.measured import Timing, TimingStats
from kernelbench_eval.messages import TimeReply
from kernelbench_eval.records import Baseline, RunSettings, Verdict, baseline_key
from kernelbench_eval.requests import TimeRequest
from kernelbench_eval.results.compare import compare_runs
from kernelbench_eval.worker import kbtiming, percall
from kernelbench_eval.worker.reference import CheckerWorker
from kernelbench_eval.worker.refill import Rotation


class _Clocked:
    """A model that advances a fake clock by the next of `ms` per call (then by 1 ms), counting its calls."""

    def __init__(self, clock: list[int], ms: list[float]) -> None:
        self.clock, self.ms, self.calls = clock, list(ms), 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.clock[0] += int((self.ms.pop(0) if self.ms else 1.0) * 1e6)
        return x * 2


@pytest.mark.parametrize(("method", "discarded"), [(kbmethod.CURRENT, 1), (kbmethod.JAN2025, 0)])
def test_the_worker_loop_warms_up_discards_and_times_each_call(monkeypatch, method, discarded):
    """WARMUP calls, then (current method) the discarded trial, then one timed call per scheduled call, each on
    freshly refilled inputs, its time the clock's around the call and its outputs kept."""
    clock = [0]
    monkeypatch.setattr(percall, "_perf_counter_ns", lambda: clock[0])
    warm = [5.0] * (kbmethod.WARMUP + discarded)  # slow first calls: none of them may reach the samples
    model = _Clocked(clock, [*warm, 1.0, 2.0, 3.0, 6.0])
    rotation = Rotation([[torch.ones(4)], [torch.full((4,), 3.0)]])
    kbtiming.warm_up(model, rotation, kbmethod.WARMUP, method, "cpu")
    assert model.calls == kbmethod.WARMUP + discarded
    schedule = [(0, 1.0, 11), (1, 1.0, 12), (0, 0.8, 13), (1, 1.2, 14)]
    block = kbtiming.time_block(model, rotation, schedule, "cpu", lambda _, out: lambda: [out.clone()], method)
    assert model.calls == kbmethod.WARMUP + discarded + len(schedule)
    assert block.event_ms == [1.0, 2.0, 3.0, 6.0] and kbmethod.per_call(method, block.event_ms) == 3.0
    for (k, scale, seed), kept in zip(schedule, block.kept, strict=True):
        assert torch.equal(kept[0], rotation.fill(k, scale, seed, 0)[0] * 2)  # the call's own inputs, refilled


def test_the_worker_takes_the_method_from_its_measurements_warm_up():
    """The warm-up request names the method (the timed calls, one a request, do not): KernelBench's warm-up and
    discarded trial run, and the measurement's calls are timed its way until the next warm-up names another."""
    worker = CheckerWorker()
    model = _Clocked([0], [])
    worker.models["main"], worker.sets["timing0"] = model, [torch.ones(4)]
    worker.op_time(TimeRequest(input_sets=["timing0"], warmup=3, method="kernelbench"))
    assert model.calls == kbmethod.WARMUP + 1 and worker.timing_method == "kernelbench"
    reply = worker.op_time(TimeRequest(input_sets=["timing0"], schedule=[(0, 1.0, 5)]))
    assert model.calls == kbmethod.WARMUP + 2 and len(reply.samples_ms) == 1 and len(reply.metas) == 1
    worker.op_time(TimeRequest(input_sets=["timing0"], warmup=2, warmup_seconds=60))
    assert model.calls == kbmethod.WARMUP + 4 and worker.timing_method == "kbeval"
    worker.leave_timing()


def test_kernelbench_reports_the_mean_and_an_interval_of_the_ratio_of_means():
    slow_window = [1.0] * 45 + [10.0] * 5  # the harness's median of windows outvotes it; KernelBench's mean does not
    assert kbmethod.per_call(kbmethod.CURRENT, slow_window) == pytest.approx(1.9)
    assert kbmethod.per_call(kbmethod.OWN, slow_window) == per_call_ms(slow_window) == 1.0
    assert TimingStats.from_samples(slow_window, mean=True).per_call_ms == pytest.approx(1.9)
    low, high = speedup_ci([2.0] * 50, slow_window, mean=True)
    assert low <= 2.0 / 1.9 <= high  # around the ratio of the means, wherever the medians lie
    assert kbmethod.rse(kbmethod.JAN2025, [1.0] * 50) == 0.0 and kbmethod.rse(kbmethod.JAN2025, [1.0]) == float("inf")


class _Worker:
    """A stand-in worker: each timed call takes `ms`; it records every request."""

    def __init__(self, ms: float) -> None:
        self.ms, self.proc, self.requests = ms, None, []

    def call(self, req: TimeRequest, timeout: float, poll: float = 0.0) -> TimeReply:
        self.requests.append(req)
        times = [self.ms] * len(req.schedule)
        return TimeReply(ok=True, samples_ms=times, device_ms=times, metas=[[]] * len(req.schedule),
                         placed=[[]] * len(req.schedule))

    def call_each(self, requests: list[TimeRequest], timeout: float, poll: float = 0.0) -> list[TimeReply]:
        return [self.call(req, timeout, poll) for req in requests]


def test_the_harness_times_exactly_reps_calls_after_kernelbenchs_warm_up_and_never_overlaps():
    """KernelBench's trials are --reps calls whatever their spread or the time budget (its own stopping rule is
    none), in the harness's blocks, the last one cut to what is left; the warm-up is its 3 calls and names the
    method, which the worker keeps for the measurement; no overlapped answers (its calls are synchronised one by
    one). The harness's own method is left as it was."""
    settings = RunSettings(device="cuda", timing="kernelbench", reps=25, max_reps=2000, timing_budget=1e-6,
                           warmup=10, cuda_graph=True)
    ref, cand = _Worker(1.0), _Worker(0.5)
    models = [TimedModel(ref), TimedModel(cand)]  # type: ignore[arg-type]
    result = measure(models, ["a"], settings, Deadline(60), calls_per_block=10)
    assert result.blocks == 3 and [len(m.event_ms) for m in models] == [25, 25]
    for worker in (ref, cand):
        warm, *timed = worker.requests
        assert warm.warmup == kbmethod.WARMUP and warm.method == "kernelbench" and not warm.schedule
        assert [len(r.schedule) for r in timed] == [1] * 25  # one call a request, as always
        assert [r.first for r in timed] == [*range(10), *range(10), *range(5)]
        assert not any(r.overlap or r.graph for r in worker.requests)
    own = RunSettings(device="cuda", reps=25, max_reps=25, timing_budget=60, warmup=1)
    worker = _Worker(1.0)
    measure([TimedModel(worker)], ["a"], own, Deadline(60), calls_per_block=10)  # type: ignore[arg-type]
    assert {r.method for r in worker.requests} == {"kbeval"} and worker.requests[0].warmup == 1
    assert len([r for r in worker.requests if r.schedule]) == 30  # whole blocks, past --max-reps, as before


def test_the_method_is_checked_named_and_in_every_key():
    with pytest.raises(ValueError, match="--timing: 'cuda_event'"):
        kbmethod.check("cuda_event")
    with pytest.raises(ValueError, match="--cuda-graph"):
        kbmethod.check("kernelbench-2025", cuda_graph=True)
    kbmethod.check("kernelbench")
    assert kbmethod.basis("kernelbench", "cuda", 100).startswith("kernelbench-cuda-event (mean of 100 calls after 3")
    assert "no flush" in kbmethod.basis("kernelbench-2025", "cuda", 100)
    assert "only CUDA" in kbmethod.basis("kernelbench", "cpu", 10)
    own, current, jan = (RunSettings(device="cpu", timing=m) for m in kbmethod.METHODS)
    assert "timing" not in own._payload()  # the harness's own: the keys of runs made before the option
    assert len({s.key() for s in (own, current, jan)}) == len({s.timing_key() for s in (own, current, jan)}) == 3


def test_baselines_of_different_methods_never_mix(tmp_path):
    """A baseline measured by one method is never read for a run of another (`Baseline.key` holds `timing_key`)."""
    store = BaselineStore(tmp_path / "baselines.json")
    own = RunSettings(device="cpu").timing_key()
    stats = TimingStats.from_samples([1.0, 1.1])
    store.put(Baseline(problem="p", source_sha256="abc", device_name="cpu", torch_version="2.13.0", timing_key=own,
                       eager=stats, eager_samples=[1.0, 1.1]))
    assert store.get(baseline_key("abc", "cpu", "2.13.0", own)) is not None
    for method in (kbmethod.CURRENT, kbmethod.JAN2025):
        other = RunSettings(device="cpu", timing=method).timing_key()
        assert store.get(baseline_key("abc", "cpu", "2.13.0", other)) is None


def test_a_cpu_run_under_kernelbenchs_method_says_so_and_keeps_its_checks(tmp_path, build_cache):
    """`kbeval run --timing kernelbench` on the CPU: the honest candidate is correct and timed by the method
    (--reps calls, every one checked, the runtime their mean), the verdict names the method, and the wrong one is
    still `incorrect`. Pure PyTorch candidates: nothing to compile."""
    cands = tmp_path / "candidates" / "tiny_linear_relu"
    cands.mkdir(parents=True)
    for name in ("py_honest", "py_wrong_shape"):
        shutil.copy(FIXTURES / "candidates" / "tiny_linear_relu" / f"{name}.py", cands)
    kbeval("run", "--device", "cpu", "--problems", str(FIXTURES / "problems"), "--candidates", str(cands.parent),
           "--out", str(tmp_path / "out"), "--run-id", "kb", "--timing", "kernelbench", "--reps", "20",
           "--trials", "2", "--timeout", "120", "--no-compile-baseline", cache=build_cache)
    verdicts = read_verdicts(tmp_path / "out" / "kb")
    honest, wrong = verdicts["py_honest"], verdicts["py_wrong_shape"]
    assert honest["correct"] and honest["status"] in ("ok", "suspicious") and honest["runtime_ms"] > 0
    assert wrong["status"] == "incorrect" and not wrong["correct"]
    basis = honest["timing"]["basis"]
    assert basis.startswith("kernelbench-host-clock (mean of 20 calls after 3 warm-ups") and "discarded" in basis
    assert honest["runtime_stats"]["calls"] == honest["ref_runtime_stats"]["calls"] == 20
    assert honest["timing"]["checked_calls"] == 20  # every timed call compared in full
    assert honest["runtime_ms"] == pytest.approx(honest["runtime_stats"]["mean_ms"])
    assert honest["ref_runtime_ms"] == pytest.approx(honest["ref_runtime_stats"]["mean_ms"])
    assert honest["timing"]["ref_alone_check"] is not None  # the reference still checked against itself alone
    if honest["speedup"]:
        assert honest["speedup"] == pytest.approx(honest["ref_runtime_ms"] / honest["runtime_ms"])
        low, high = honest["speedup_vs_eager_ci"]
        assert low <= honest["speedup"] <= high
    settings = json.loads((tmp_path / "out" / "kb" / "run.json").read_text())["settings"]
    assert settings["timing"] == "kernelbench" and honest["settings_key"] == RunSettings(**settings).key()


def _timed_verdict(runtime_ms: float, basis: str | None) -> Verdict:
    stats = TimingStats.from_samples([runtime_ms] * 20)
    timing = None if basis is None else Timing(
        candidate=stats, reference=stats, basis=basis, blocks=20, checked_calls=20, rse=None, ref_rse=None,
        wall_ms_per_call=runtime_ms, ref_wall_ms_per_call=runtime_ms, unexplained_ms=0.0)
    return Verdict(run_id="r", problem="p", candidate="c", source_sha256="s", settings_key="k", device="cpu",
                   torch_version="2.13.0", status="ok", correct=True, runtime_ms=runtime_ms, ref_runtime_ms=1.0,
                   timing=timing)


def test_compare_never_sets_times_of_two_methods_against_each_other():
    """A run timed by KernelBench's method against one timed by the harness's: each runtime shown with its method,
    no `slower` or `faster` (a regression is not a change of method); the same method with other counts compares."""
    own, kernelbench = _timed_verdict(1.0, "wall"), _timed_verdict(3.0, kbmethod.basis("kernelbench", "cpu", 100))
    [change] = compare_runs([own], [kernelbench])
    assert change.kind == "timing_changed" and not change.regression
    assert "(wall) -> 3 ms (kernelbench-host-clock)" in change.detail
    assert compare_runs([_timed_verdict(1.0, None)], [own]) == []  # runs from before `basis`: the device's
    fewer = _timed_verdict(3.0, kbmethod.basis("kernelbench", "cpu", 20))
    assert [c.kind for c in compare_runs([fewer], [kernelbench])] == []  # the same method, --reps apart
