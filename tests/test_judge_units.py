"""The judging core, driven directly (no CLI, no compile): the exchange, the checker, one candidate's run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernelbench_eval.budgets import Budgets
from kernelbench_eval.building.compile import compile_candidate
from kernelbench_eval.common.exchange import ALIGN, Exchange, output_layout
from kernelbench_eval.discover.corpus import Problem, make_candidate, sha256_file
from kernelbench_eval.judge.baselines import BaselineStore
from kernelbench_eval.judge.judging import ReferenceSide, Secrets, judge
from kernelbench_eval.messages import Slot, TensorMeta
from kernelbench_eval.records import RunSettings
from kernelbench_eval.worker.draws import draw_inputs

PROBLEM = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)

    def forward(self, x, mask):
        return torch.relu(self.fc(x)).masked_fill(mask, float("-inf")), x.sum(dim=1)


def get_inputs():
    return [torch.rand(8, 16) * 2 - 1, torch.rand(8, 16) > 0.7]


def get_init_inputs():
    return [16]
'''
HONEST = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)

    def forward(self, x, mask):
        return torch.relu(self.fc(x)).masked_fill(mask, float("-inf")), x.sum(dim=1)
'''
# -inf where the reference has +inf: same positions, wrong sign
WRONG_SIGN = HONEST.replace('float("-inf")', 'float("inf")')
# right for the trials, then stale answers once timed calls start (its 11th call onwards)
STALE = HONEST.replace("    def forward(self, x, mask):\n", '''    calls = 0

    def forward(self, x, mask):
        ModelNew.calls += 1
        if ModelNew.calls > 11:
            x = torch.zeros_like(x)
''')


def test_exchange_round_trip_and_bounds(tmp_path: Path):
    exchange = Exchange.create("cpu", 4096, str(tmp_path))
    try:
        values = [torch.arange(6, dtype=torch.float32).reshape(2, 3), 7, torch.tensor([True, False])]
        slots = exchange.write(values)
        assert slots[1].value == 7 and slots[0].offset == 0 and slots[2].offset % ALIGN == 0
        attached = Exchange.attach(exchange.info, "cpu")  # another mapping of the same bytes
        back = attached.read(slots, "cpu")
        assert torch.equal(back[0], values[0]) and back[1] == 7 and torch.equal(back[2], values[2])
        back[0].add_(1)  # a private copy: the shared buffer is untouched
        assert torch.equal(exchange.view(slots[0]), values[0])
        with pytest.raises(ValueError, match="outside"):
            exchange.view(Slot(offset=4000, dtype="torch.float32", shape=[100]))
    finally:
        exchange.close()
    assert not Path(exchange.info.handle).exists()


def test_a_lean_plan_reads_input_sets_where_they_lie_and_puts_outputs_after_them(tmp_path: Path):
    """Lean memory plan (`memory`): the candidate's input set is a view of the exchange (no copy) where the exchange
    is memory of the model's device, a copy where it is not; the outputs' slots follow the input set instead of
    taking its place, and the exchange holds both."""
    from kernelbench_eval.judge.lending import SLACK_BYTES
    from kernelbench_eval.messages import MemoryPlan

    exchange = Exchange.create("cpu", 4096, str(tmp_path))
    try:
        slots = exchange.write([torch.arange(6, dtype=torch.float32), 3])
        attached = Exchange.attach(exchange.info, "cpu")
        assert attached.aliases("cpu") and not attached.aliases("cuda")  # a file mapping: host memory
        seen = attached.views(slots)
        assert seen[1] == 3 and torch.equal(seen[0], torch.arange(6, dtype=torch.float32))
        exchange.view(slots[0]).fill_(9)  # the checker's bytes are what it reads: no copy was made
        assert torch.equal(seen[0], torch.full((6,), 9.0))
    finally:
        exchange.close()
    problem = Problem("p", tmp_path / "p.py", "0" * 64)
    ref = ReferenceSide(problem, RunSettings(device="cpu"), Secrets.draw(1), tmp_path / "log", Budgets.of(60, 60),
                        BaselineStore(tmp_path / "b"))
    try:
        lender = ref.lender
        lender.learn_inputs(1 << 20)
        plan = dict(trial_inputs=False, expected=False, timing_sets=1, placements=1, need_bytes=1, budget_bytes=1,
                    fits=False, resident_bytes=0, input_bytes=1 << 20, output_bytes=4096, transient_bytes=0)
        lender.learn_outputs([[TensorMeta(type_name="Tensor", exact_tensor=True, dtype="torch.float32",
                                          shape=[1024])]], MemoryPlan(**plan))
        assert [s.offset for s in lender.timed_layout(2)[1]] == [4096]  # outputs where the input set was
        assert lender._slots(2) == (1 << 20) + SLACK_BYTES  # one of them at a time
        lender.learn_outputs(lender.metas, MemoryPlan(**plan, lean=True))
        area = lender._slots(0)
        assert area >= (1 << 20) and [s.offset for s in lender.timed_layout(2)[1]] == [area + 4096]
        assert lender._slots(2) == area + 2 * 4096
    finally:
        ref.close()


def test_output_layout_places_calls_one_after_another():
    metas = [TensorMeta(type_name="Tensor", exact_tensor=True, dtype="torch.float32", shape=[3, 5]),
             TensorMeta(type_name="Tensor", exact_tensor=True, dtype="torch.int64", shape=[1])]
    layout = output_layout(metas, calls=2)
    offsets = [s.offset for call in layout for s in call]
    assert offsets == [0, ALIGN, 2 * ALIGN, 3 * ALIGN] and layout[1][0].shape == [3, 5]


def _judge(tmp_path: Path, source: str, name: str, times: int = 1, device: str = "cpu", problem: str = PROBLEM
           ) -> tuple:
    """`times` > 1: the same build judged that many times against one reference (the last findings returned)."""
    problem_path = tmp_path / "masked.py"
    problem_path.write_text(problem)
    candidate = tmp_path / f"{name}.py"
    candidate.write_text(source)
    settings = RunSettings(device=device, trials=2, reps=20, timing_budget=1.0, warmup=2, compile_baseline=False,
                           max_speedup=0, threads=1)
    problem = Problem("masked", problem_path, sha256_file(problem_path))
    ref = ReferenceSide(problem, settings, Secrets.draw(settings.trials), tmp_path / "ref.log", Budgets.of(60, 60),
                        BaselineStore(tmp_path / "baselines.json")).open()
    build = compile_candidate(make_candidate(problem, candidate), device, tmp_path / "cache", tmp_path / "c.log", 120)
    assert build.record.ok, build.record.error
    try:
        assert ref.error is None, ref.error
        for _ in range(times - 1):
            judge(ref, build, candidate, tmp_path / f"{name}.log", 60)
        return ref, judge(ref, build, candidate, tmp_path / f"{name}.log", 60)
    finally:
        ref.close()


def test_honest_candidate_is_checked_and_timed_with_inf_outputs(tmp_path: Path):
    """-inf in the reference's output is judged (same positions, same sign), not a reason to skip the problem."""
    ref, findings = _judge(tmp_path, HONEST, "honest")
    assert findings.correct and findings.status in ("ok", "suspicious"), findings.error
    assert findings.trials_passed == 2 and findings.max_abs_diff == 0.0
    timing = findings.timing
    assert timing is not None and timing.exchange == "shm" and timing.checked_calls >= 20
    assert {"spawn", "load", "trials", "timing", "checks"} <= set(timing.phases)
    assert not ref.checker.workdir.exists()  # closed with the reference


def test_a_second_session_widens_the_interval_by_what_moved_between_sessions(tmp_path: Path):
    """The reference's time per call in each candidate's session is kept; from the second session on, the
    speedup's interval is the session's bootstrap widened by how much that time moved between sessions."""
    ref, findings = _judge(tmp_path, HONEST, "honest", times=2)
    timing = findings.timing
    sessions = ref.timing.session_ms
    assert timing is not None and len(sessions) <= 2 and all(ms > 0 for ms in sessions)
    if findings.status != "ok":  # doubted on a busy host: its session was not recorded, its speedup may be gone
        return
    assert sessions[-1] == findings.ref_runtime_ms  # an undoubted session is recorded
    assert timing.between_df == len(sessions) - 1 if len(sessions) > 1 else timing.between_df is None
    if timing.between_df:
        (low, high), (within_low, within_high) = findings.speedup_vs_eager_ci, timing.speedup_ci_within
        assert low <= within_low <= findings.speedup_vs_eager <= within_high <= high


def test_a_doubted_session_widens_its_own_interval_but_is_not_recorded():
    """A candidate that disturbed the reference (or whose timing was doubted otherwise) gets the spread with its
    session counted, but the problem's record stays as it was for the candidates judged after it."""
    from kernelbench_eval.judge.reference_timing import ReferenceTiming

    def reference(sessions: list[float]) -> ReferenceTiming:
        timing = ReferenceTiming(None, None, RunSettings(device="cpu"), 60)  # type: ignore[arg-type]
        timing.session_ms = sessions
        return timing

    timing = reference([1.0, 1.01])
    assert timing.add_session(1.5, doubted=True)[1] == 2 and timing.session_ms == [1.0, 1.01]
    sd, df = timing.add_session(1.02, doubted=False)
    assert df == 2 and timing.session_ms == [1.0, 1.01, 1.02] and sd < 0.02
    assert reference([]).add_session(1.0, doubted=False) is None  # one session: no term yet


def test_wrong_sign_of_inf_is_incorrect(tmp_path: Path):
    _, findings = _judge(tmp_path, WRONG_SIGN, "wrong_sign")
    assert findings.status == "incorrect" and findings.error.startswith("trial 0:"), findings.error
    assert "Inf" in findings.error or "outside" in findings.error


def test_stale_timed_calls_are_caught_in_full(tmp_path: Path):
    _, findings = _judge(tmp_path, STALE, "stale")
    assert findings.status == "incorrect" and findings.trials_passed == 2, findings.error
    assert "timed call" in findings.error and "every timed call is checked" in findings.error


def _drawn(device: str, get_inputs) -> tuple[list, list]:  # noqa: ANN001
    first, again = draw_inputs(get_inputs, 1234, device), draw_inputs(get_inputs, 1234, device)
    return first, again


@pytest.mark.parametrize("device", ["meta", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])])
def test_input_sets_are_drawn_on_the_device_when_the_problem_allows(device: str):
    """A GPU run draws its sets on the GPU (no seconds of CPU random numbers); "meta" stands in for it on a CPU."""
    first, again = _drawn(device, lambda: [torch.rand(64, 8), torch.randint(0, 5, (3,)), 7])
    assert [x.device.type for x in first[:2]] == [device, device] and first[2] == 7
    assert first[0].shape == (64, 8) and first[1].dtype == torch.int64
    if device != "meta":  # one seed, one set
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
        other = draw_inputs(lambda: [torch.rand(64, 8)], 4321, device)
        assert not torch.equal(other[0], first[0])


@pytest.mark.parametrize("device", ["meta", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])])
def test_input_sets_fall_back_to_the_cpu_from_the_same_seed(device: str):
    """A get_inputs that fails on the device, or makes a tensor elsewhere on purpose, is drawn on the CPU, as
    before: the set is the CPU generator's for that seed, whatever the device attempt consumed."""
    import numpy as np

    def with_numpy() -> list:
        return [torch.from_numpy(np.asarray(torch.rand(4, 4).tolist(), dtype=np.float32))]

    def pinned_cpu() -> list:
        return [torch.rand(4, 4, device="cpu"), torch.rand(2)]

    for get_inputs in (with_numpy, pinned_cpu):
        first, again = _drawn(device, get_inputs)
        assert all(x.device.type == "cpu" for x in first), get_inputs.__name__
        torch.manual_seed(1234)
        assert torch.equal(first[0], get_inputs()[0]) and torch.equal(first[0], again[0])


def test_a_lane_keeps_two_problems_open_and_parks_the_one_not_in_use(tmp_path: Path):
    """Real checkers: a problem prepared ahead of its candidates is reused by them (same checker process), and
    the other open one is parked meanwhile (its checker stays up, holding its sets)."""
    from kernelbench_eval.run.lanes import EvalLane, LaneConfig, LaneSpec

    problems = []
    for name in ("masked", "masked_too"):
        path = tmp_path / f"{name}.py"
        path.write_text(PROBLEM)
        problems.append(Problem(name, path, sha256_file(path)))
    settings = RunSettings(device="cpu", trials=1, reps=10, timing_budget=1.0, warmup=1, compile_baseline=False,
                           max_speedup=0, threads=1)
    lane = EvalLane(LaneSpec("cpu:0"), LaneConfig(settings, tmp_path / "baselines.json", Budgets.of(60, 60)))
    candidate = tmp_path / "honest.py"
    candidate.write_text(HONEST)
    build = compile_candidate(make_candidate(problems[0], candidate), "cpu", tmp_path / "cache", tmp_path / "c.log",
                              120)
    try:
        for problem in problems:
            lane.prepare(problem, tmp_path / f"{problem.problem_id}.log")
        assert lane.holds() == ["masked_too", "masked"]
        first = lane.refs["masked"]
        assert first.checker.pid is not None and first.lender.memory_bytes and first.lender.footprint() > 0
        pid = first.checker.pid
        result = lane.evaluate(problems[0], candidate, build, tmp_path / "ref.log", tmp_path / "honest.log")
        assert result.findings.correct, result.findings.error
        assert lane.refs["masked"].checker.pid == pid  # the prepared checker judged it: not opened again
        assert lane.refs["masked_too"].checker.parked and not lane.refs["masked"].checker.parked
        assert lane.holds() == ["masked", "masked_too"]
        parked_pid = lane.refs["masked_too"].checker.pid
        again = lane.evaluate(problems[1], candidate, build, tmp_path / "ref.log", tmp_path / "honest2.log")
        assert again.findings.correct, again.findings.error  # a parked checker still has its sets and outputs
        assert lane.refs["masked_too"].checker.pid == parked_pid and lane.refs["masked"].checker.parked
    finally:
        lane.close()
    assert lane.holds() == [] and not first.checker.workdir.exists()


# reports each timed call's outputs at an offset the checker must not read: past the exchange's end, or off an
# element boundary (a float32 view there raised in the checker itself)
MISPLACED = HONEST + '''

import sys

_worker = getattr(sys.modules.get("__main__"), "CandidateWorker", None)
if _worker is not None:
    _orig_time = _worker.OPS["time"]

    def _op_time(wself, req):
        reply = _orig_time(wself, req)
        for call in reply.placed:
            for slot in call:
                slot.offset = OFFSET(wself.exchange.info.size)
        return reply

    _worker.OPS["time"] = _op_time
'''


@pytest.mark.parametrize("offset", ["lambda size: size", "lambda size: 2"])
def test_outputs_reported_where_the_exchange_cannot_hold_them_fail_the_call(tmp_path: Path, offset: str):
    """Where a timed call's outputs lie is the candidate's word: only an offset inside the exchange, on an
    element boundary, is read; anything else fails the call in the harness, never the checker."""
    _, findings = _judge(tmp_path, MISPLACED.replace("OFFSET", f"({offset})"), "misplaced")
    assert findings.status == "incorrect" and findings.trials_passed == 2, findings.error
    assert "where the exchange cannot hold them" in findings.error, findings.error


# outputs of 288 MB: over half the kept-output budget, so they stay in place, ten calls to a block (71_Conv2d's
# 520 MB: five)
BIG = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2


def get_inputs():
    return [torch.rand(4, 18_000_000) * 2 - 1]


def get_init_inputs():
    return []
"""
BIG_FRESH = BIG.replace("class Model(", "class ModelNew(").split("def get_inputs")[0]
BIG_REUSING = BIG_FRESH.replace("        return torch.relu(x) * 2", """        if not hasattr(self, "out"):
            self.out = torch.empty_like(x)
        return torch.clamp(x, min=0, out=self.out).mul_(2)""")
# the same buffer, but made in its eighth call (the first timed block's second), in the exchange's pool
BIG_LATE_BUFFER = BIG_FRESH.replace("        return torch.relu(x) * 2", """\
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == 8:
            self.out = torch.empty_like(x)
        if hasattr(self, "out"):
            return torch.clamp(x, min=0, out=self.out).mul_(2)
        return torch.relu(x) * 2""")
# over a millisecond a call on an H100 or H200: long enough for the calls to be answered as they are launched
SLOW = BIG.replace("        return torch.relu(x) * 2", """        for _ in range(10):
            x = torch.tanh(x)
        return x""")
SLOW_FRESH = SLOW.replace("class Model(", "class ModelNew(").split("def get_inputs")[0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(("problem", "source", "in_place"), [(BIG, BIG_FRESH, True), (BIG, BIG_REUSING, False),
                                                             (PROBLEM, HONEST, False)])
def test_timed_outputs_are_compared_where_the_call_put_them(tmp_path: Path, problem: str, source: str,
                                                            in_place: bool, monkeypatch: pytest.MonkeyPatch):
    """On a GPU, with outputs in place asked for (`carve.IN_PLACE_VAR`), where outputs are large, a timed call's
    fresh outputs are compared where it put them, in the exchange's pool area (no copy), ten calls to a block; a
    buffer the model made in its first trial and hands out every call lies outside it and is copied, as are small
    outputs. Correct either way."""
    from kernelbench_eval.common.carve import IN_PLACE_VAR

    monkeypatch.setenv(IN_PLACE_VAR, "1")
    _, findings = _judge(tmp_path, source, "pooled", device="cuda", problem=problem)
    assert findings.correct and findings.timing is not None, findings.error
    assert findings.timing.exchange == "cuda_ipc" and findings.timing.block_calls == 10
    calls = findings.timing.in_place_calls
    assert (calls > 0) if in_place else (calls == 0), calls


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_buffer_made_in_a_timed_block_and_handed_out_again_is_measured_again_a_call_a_block(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """With outputs in place asked for (`carve.IN_PLACE_VAR`): its eighth call's outputs lay in place when its
    ninth wrote over them, before the block was checked: the worker says so and the candidate is measured again in
    blocks of one call, each compared before the next runs. Without that, the eighth call would be `incorrect`
    for an answer that was right."""
    from kernelbench_eval.common.carve import IN_PLACE_VAR

    monkeypatch.setenv(IN_PLACE_VAR, "1")
    _, findings = _judge(tmp_path, BIG_LATE_BUFFER, "late_buffer", device="cuda", problem=BIG)
    assert findings.correct and findings.timing is not None, findings.error
    assert findings.timing.block_calls == 1 and findings.timing.in_place_calls > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_long_calls_are_answered_as_they_are_launched_and_every_one_is_still_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """With outputs in place (blocks of several calls for large outputs), over OVERLAP_MS a call on both sides,
    blocks after the first are overlapped (`measure.overlaps`): each reply goes out while the device computes, the
    block ends once the last call's work is done, and every timed call is compared in full, in place."""
    from kernelbench_eval.common.carve import IN_PLACE_VAR

    monkeypatch.setenv(IN_PLACE_VAR, "1")
    _, findings = _judge(tmp_path, SLOW_FRESH, "slow", device="cuda", problem=SLOW)
    timing = findings.timing
    assert findings.correct and timing is not None, findings.error
    assert findings.runtime_ms > 0.5 and timing.overlapped_calls >= 10 and timing.block_calls == 10
    assert timing.checked_calls == findings.runtime_stats.calls and timing.in_place_calls == timing.checked_calls
