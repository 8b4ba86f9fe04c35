"""Overlapped timed calls (`measure.overlaps`, `worker/timed.py`), on the CPU with stand-in workers: when the harness
asks a worker to answer a call as soon as it is launched, how the block then ends, what the worker does after its
reply, and how a block whose outputs stay in place is measured again when a model hands out one buffer twice. The
device path runs in `tests/test_judge_units.py` (GPU). No assertion here depends on how fast anything ran."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from conftest import serve_requests

from kernelbench_eval.judge import timing_stage as timed_module
from kernelbench_eval.judge.measure import LATE_SHARE, OVERLAP_MS, Deadline, TimedModel, measure, overlaps
from kernelbench_eval.messages import TimeReply
from kernelbench_eval.records import RunSettings
from kernelbench_eval.requests import ExitRequest, ExportRequest, Request, TimeRequest, parse_request
from kernelbench_eval.worker import main as worker_main
from kernelbench_eval.worker import percall
from kernelbench_eval.worker.candidate import CandidateWorker
from kernelbench_eval.worker.placing import ExchangeOutputs

CUDA = RunSettings(device="cuda", reps=30, max_reps=30, timing_budget=60, warmup=1)


def _model(*per_call_ms: float) -> TimedModel:
    model = TimedModel(None)  # type: ignore[arg-type]
    model.event_ms += list(per_call_ms)
    return model


def test_calls_overlap_only_in_long_gpu_calls_of_blocks_of_several_and_while_few_were_late():
    long, short = OVERLAP_MS * 2, OVERLAP_MS / 2
    assert overlaps([_model(long, long), _model(long, long)], CUDA, 2)
    assert not overlaps([_model(long, long), _model(short, short)], CUDA, 2)  # both sides, or neither
    assert not overlaps([_model(long)], CUDA, 1)  # a block of one call: its reply ends the block
    assert not overlaps([_model(long, long)], CUDA.model_copy(update={"device": "cpu"}), 2)
    assert overlaps([_model(short, short, long, long)], CUDA, 2)  # the last block decides
    late = _model(*[long] * 20)
    late.late = int(LATE_SHARE * 40)  # of 40 calls in all: a host stall now and then
    assert overlaps([late, _model(*[long] * 20)], CUDA, 10)
    late.late += 1  # more than that: calls shorter than the round trip, or a host that cannot keep up
    assert not overlaps([late, _model(*[long] * 20)], CUDA, 10)


class _Overlapping:
    """A worker that answers as an overlapping one does: an overlapped call's times come with the next reply, and
    a request of no calls answers with what is owed. Each call takes `ms`; the calls in `late_at` (counted from 0
    over the whole measurement) report that the device was done before the worker waited for it."""

    def __init__(self, ms: float, late_at: frozenset[int] = frozenset()) -> None:
        self.ms, self.late_at, self.proc = ms, late_at, None
        self.requests: list[TimeRequest] = []
        self.owed: list[int] = []  # answered calls whose times no reply carried yet
        self.calls = 0

    def call(self, req: TimeRequest, timeout: float, poll: float = 0.0) -> TimeReply:
        self.requests.append(req)
        done = self.owed
        if req.schedule and not req.overlap:
            done = done + [self.calls]
        self.owed = [self.calls] if req.schedule and req.overlap else []
        self.calls += len(req.schedule)
        times = [self.ms] * len(done)
        return TimeReply(ok=True, samples_ms=times, device_ms=times, late=any(c in self.late_at for c in done),
                         metas=[[]] if req.schedule else [], placed=[[]] if req.schedule else [])

    def call_each(self, requests: list[TimeRequest], timeout: float, poll: float = 0.0) -> list[TimeReply]:
        return [self.call(req, timeout, poll) for req in requests]


def test_an_overlapped_block_ends_with_a_request_of_no_calls_and_keeps_every_call_in_order():
    """The first block is answered call by call (nothing known yet of how long calls take); once both models'
    calls were long, each call is answered at its launch and the block ends with a request of no calls, whose
    reply brings the last call's times. Every call is timed once, in order, and the replies kept for the check
    are the calls', not the block end's."""
    ref, cand = _Overlapping(1.0), _Overlapping(2.0)
    models = [TimedModel(ref), TimedModel(cand)]  # type: ignore[arg-type]
    result = measure(models, ["a"], CUDA, Deadline(60), calls_per_block=10)
    assert result.blocks == 3
    for worker, model, ms in ((ref, models[0], 1.0), (cand, models[1], 2.0)):
        timed = [r for r in worker.requests if r.schedule]
        assert [r.overlap for r in timed] == [False] * 10 + [True] * 20
        ends = [r for r in worker.requests[1:] if not r.schedule]  # (the first request is the warm-up)
        assert [r.first for r in ends] == [10, 10]  # one a block, once blocks overlap
        assert list(model.event_ms) == [ms] * 30 and model.overlapped == 20
        assert len(model.last) == 10 and all(reply.placed for reply in model.last)


def test_late_calls_end_overlapping_for_every_model_once_they_are_more_than_a_stall_now_and_then():
    """A worker that found the device done before it began to wait: that call's device-wide time carries host
    time. One such call (a host stall) changes nothing; a block of them ends the overlap for every model for the
    rest of the measurement (the clock check compares both sides' wall time alike)."""
    settings = CUDA.model_copy(update={"reps": 50, "max_reps": 50})
    ref, cand = _Overlapping(1.0, late_at=frozenset({12})), _Overlapping(1.0)
    measure([TimedModel(ref), TimedModel(cand)], ["a"], settings, Deadline(60), calls_per_block=10)  # type: ignore[arg-type]
    for worker in (ref, cand):
        assert [r.overlap for r in worker.requests if r.schedule] == [False] * 10 + [True] * 40
    ref, cand = _Overlapping(1.0, late_at=frozenset(range(10, 20))), _Overlapping(1.0)
    measure([TimedModel(ref), TimedModel(cand)], ["a"], settings, Deadline(60), calls_per_block=10)  # type: ignore[arg-type]
    for worker in (ref, cand):
        assert [r.overlap for r in worker.requests if r.schedule] == [False] * 10 + [True] * 10 + [False] * 30


class _Worker(CandidateWorker):
    """A CPU worker whose `time` op leaves a call pending as an overlapped CUDA one does."""

    settles: list[str] = []

    def op_time(self, req: TimeRequest) -> TimeReply:
        if not req.schedule:
            return super().op_time(req)
        self.pending = SimpleNamespace()  # type: ignore[assignment]
        return self._with_times(TimeReply(ok=True))

    OPS = {**CandidateWorker.OPS, "time": op_time}

    def settle_answered(self) -> None:
        if self.pending is not None:
            self.pending = None
            if "settled" in self.settles:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            self.settles.append("settled")
            self.settled.event_ms.append(1.5)
            self.settled.device_ms.append(1.6)


def test_the_worker_settles_an_answered_call_after_its_reply_and_reports_a_failure_then_in_the_next(
        monkeypatch: pytest.MonkeyPatch):
    """`serve` writes the reply first, reads the next request, and only then waits for the call's device work; the
    times go out with that request's reply (here the block's end). A failure while waiting (the kernel faulted) is
    that reply's error, whatever the request was: the harness never takes an answered call for a finished one."""
    _Worker.settles = []
    events = _Worker.settles

    def read(line: str | bytes) -> Request[Any]:
        req = parse_request(line)
        events.append(f"read {req.op}{'' if getattr(req, 'schedule', None) else ' (no calls)'}")
        return req

    monkeypatch.setitem(worker_main.ROLES, "candidate", _Worker)
    monkeypatch.setattr(worker_main, "parse_request", read)
    monkeypatch.setattr(worker_main, "poll_readable", lambda fd, seconds: None)
    lines = [TimeRequest(schedule=[(0, 1.0, 1)], overlap=True), TimeRequest(first=1),
             TimeRequest(schedule=[(0, 1.0, 2)], overlap=True), ExportRequest(), ExitRequest()]
    replies = [TimeReply.model_validate_json(line) for line in serve_requests(monkeypatch, lines)]
    assert [r.samples_ms for r in replies[:3]] == [[], [1.5], []]  # the block's end brings the answered call's
    assert events[:3] == ["read time", "read time (no calls)", "settled"]  # waited for once the next was read
    assert replies[1].device_ms == [1.6]
    assert not replies[3].ok and "illegal memory access" in (replies[3].error or "")


def test_a_block_end_reports_what_was_settled_and_leaves_the_timing_scope_alone():
    """The request of no calls neither refills nor leaves the exchange's pool: it only carries the times owed
    (entering and leaving the scope costs host time between blocks)."""
    worker = CandidateWorker()
    worker._enter_timing(None)
    scope = worker.timing_scope
    worker.settled = percall.Block(event_ms=[2.0], device_ms=[2.1], gate_ms=[0.1], late=True)
    worker.outputs = ExchangeOutputs(None, None, "cpu")  # type: ignore[arg-type]
    worker.outputs.overwrote = [3]
    reply = worker.op_time(TimeRequest(first=5))
    assert (reply.samples_ms, reply.device_ms, reply.gate_ms, reply.late) == ([2.0], [2.1], [0.1], True)
    assert reply.overwrote == [3] and worker.timing_scope is scope and worker.settled.event_ms == []
    worker.leave_timing()


def test_a_block_whose_outputs_a_later_call_overwrote_is_measured_again_in_blocks_of_one_call(
        monkeypatch: pytest.MonkeyPatch):
    """The earlier call's outputs were gone before the check through no fault of the answer: the measurement
    starts over, a call a block (each compared before the next runs), and only that one counts."""
    tried: list[int] = []

    def blocks(run: object, calls: int) -> str:
        tried.append(calls)
        if calls > 1:
            raise timed_module._Overwritten
        return "measured"

    monkeypatch.setattr(timed_module, "_measure_blocks", blocks)
    run = SimpleNamespace(block_calls=5)
    assert timed_module._measure_once(run) == "measured"  # type: ignore[arg-type]
    assert tried == [5, 1] and run.block_calls == 1  # a second measurement of this candidate too
