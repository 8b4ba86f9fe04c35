"""The timed call's path between harness and worker, on the CPU: a block's requests pipelined one at a time
(`WorkerProcess.call_each`), the worker's timing scope held from one timed request to the next, its polling for
the next call, and the flush's size (`flush.flush_bytes`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import serve_requests

from kernelbench_eval.isolation.process import WorkerFailure, WorkerProcess
from kernelbench_eval.messages import ExportReply, ImportReply, TimeReply
from kernelbench_eval.requests import ExitRequest, ExportRequest, ImportRequest, TimeRequest
from kernelbench_eval.worker import flush
from kernelbench_eval.worker import main as worker_main


def _import(path: Path, class_name: str = "Model") -> ImportRequest:
    return ImportRequest(path=str(path), class_name=class_name)


def test_a_blocks_requests_are_answered_in_order_and_a_failure_leaves_the_pipe_in_step(tmp_path: Path):
    """`call_each` sends each request once its predecessor's reply is read, and parses that reply after. A
    failed reply is raised only once the request already sent after it has been answered: otherwise the next
    request's reply would be the stale one."""
    good = tmp_path / "good.py"
    good.write_text("class Model:\n    pass\n")
    with WorkerProcess(tmp_path, tmp_path / "worker.log", role="candidate") as worker:
        replies = worker.call_each([_import(good), ExportRequest(), _import(good)], 60)
        assert [type(r) for r in replies] == [ImportReply, ExportReply, ImportReply]  # each its own request's
        assert [bool(getattr(r, "torch_version", None)) for r in replies] == [True, False, True]
        with pytest.raises(WorkerFailure, match="no class Missing"):
            worker.call_each([_import(good), _import(good, "Missing"), _import(good)], 60)
        with pytest.raises(WorkerFailure, match="no class Other"):  # its own reply, not the drained import's
            worker.call(_import(good, "Other"), 60)
        assert worker.call(_import(good), 60).torch_version


class _Pool:
    """An exchange pool stand-in: counts how often its allocating context is entered and left."""

    def __init__(self) -> None:
        self.entered = self.left = 0

    @contextlib.contextmanager
    def allocating(self) -> Iterator[None]:
        self.entered += 1
        try:
            yield
        finally:
            self.left += 1


def test_the_timing_scope_is_held_from_one_timed_request_to_the_next_and_left_for_anything_else():
    """Entering and leaving grad mode and the exchange's pool per timed request cost each call host time with
    the device idle: the scope stays until a request of another kind, or until the pool changes."""
    worker = worker_main.CandidateWorker()
    pool, other = _Pool(), _Pool()
    assert torch.is_grad_enabled()
    worker._enter_timing(pool)  # type: ignore[arg-type]
    worker._enter_timing(pool)  # type: ignore[arg-type]
    assert (pool.entered, pool.left) == (1, 0) and not torch.is_grad_enabled()
    worker._enter_timing(other)  # type: ignore[arg-type]
    assert (pool.entered, pool.left, other.entered) == (1, 1, 1)
    worker.leave_timing()
    assert other.left == 1 and torch.is_grad_enabled()
    worker.leave_timing()  # nothing held: nothing to do
    assert other.left == 1


def test_the_worker_leaves_its_timing_scope_and_polls_for_the_next_timed_call_only_on_a_gpu(
        monkeypatch: pytest.MonkeyPatch):
    """`serve`: after a timed call's reply on a GPU, stdin is polled for the block's next call; a request that
    may allocate on the device leaves the timing scope first (its allocations must not land in the exchange's
    pool). `export` (it only describes outputs, and wakes a candidate between its blocks) keeps it."""
    seen: list[tuple[str, bool]] = []
    polls: list[float] = []

    class Worker(worker_main.CandidateWorker):
        def __init__(self) -> None:
            super().__init__()
            self.device = "cuda"

        def op_time(self, req: TimeRequest) -> TimeReply:
            self._enter_timing(None)
            seen.append(("time", self.timing_scope is not None))
            return TimeReply(ok=True)

        def op_export(self, req: ExportRequest) -> ExportReply:  # wakes a candidate between its blocks
            seen.append(("export", self.timing_scope is not None))
            return ExportReply(ok=True)

        def op_import(self, req: ImportRequest) -> ImportReply:
            seen.append(("import", self.timing_scope is not None))
            return ImportReply(ok=True)

        OPS = {**worker_main.CandidateWorker.OPS, "time": op_time, "export": op_export, "import": op_import}

    monkeypatch.setitem(worker_main.ROLES, "candidate", Worker)
    monkeypatch.setattr(worker_main, "poll_readable", lambda fd, seconds: polls.append(seconds))
    lines = [TimeRequest(), TimeRequest(), ExportRequest(), TimeRequest(), ImportRequest(path="x"), ExitRequest()]
    assert len(serve_requests(monkeypatch, lines)) == 5
    assert seen == [("time", True), ("time", True), ("export", True), ("time", True), ("import", False)]
    assert polls == [worker_main.NEXT_CALL_S[op] for op in ("time", "time", "export", "time")]


def test_the_flush_evicts_the_l2_and_covers_the_launch_on_its_own():
    """Twice the L2 always (eviction), and FLUSH_COVER_S of writing at peak bandwidth (an H100: 50 MB of L2,
    3350 GB/s), in whole 16-byte words. The refill ahead of it is no cover: the host waits for it before it calls
    the model (a stream of the candidate's own could otherwise start beside the refill)."""
    l2, bandwidth = 50 << 20, 3350.0
    cover = int(bandwidth * 1e9 * flush.FLUSH_COVER_S) // 16 * 16
    assert flush.flush_bytes(l2, bandwidth) == cover
    assert flush.flush_bytes(l2, 100.0) == 2 * l2  # a slow card: eviction decides
    assert flush.flush_bytes(0, 0.0) == 2 << 20  # no L2 reported: a megabyte, twice
    assert flush.flush_bytes(l2, 3350.001) % 16 == 0
    assert flush.evict_bytes(l2) == 2 * l2 and flush.evict_bytes(0) == 2 << 20 and flush.evict_bytes(1000) % 16 == 0


def test_the_flush_kernel_holds_the_whole_cover_and_zero_writes_it(monkeypatch):
    """Where the flush kernel loads, it is launched once per call with the harness's cover (FLUSH_COVER_S at least),
    which it holds by the device's clock; where it does not, `zero_` writes its buffer as many times as the cover
    takes at peak bandwidth (`repeats_for`)."""
    from kernelbench_eval.worker import flushkernel

    launched, buffer = [], torch.empty(300_000_000, dtype=torch.uint8, device="meta")
    monkeypatch.setattr(flush, "l2_flush_buffer", lambda: buffer)
    monkeypatch.setattr(flushkernel, "kernel", lambda: object())
    monkeypatch.setattr(flushkernel, "launch", lambda b, cover_s, stream: launched.append((b, cover_s, stream)))
    flush.write(0.42e-3, "stream")  # type: ignore[arg-type]
    flush.write(0.0, "stream")  # type: ignore[arg-type]
    assert launched == [(buffer, 0.42e-3, "stream"), (buffer, flush.FLUSH_COVER_S, "stream")]
    zeroed = []
    monkeypatch.setattr(flushkernel, "kernel", lambda: None)
    monkeypatch.setattr(flush.torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(flush, "memory_bandwidth_gbs", lambda: 3000.0)
    monkeypatch.setattr(torch.Tensor, "zero_", lambda self: zeroed.append(self) or self)
    flush.write(flush.FLUSH_COVER_S + 0.25e-3, "stream")  # type: ignore[arg-type]
    assert len(zeroed) == 1 + 3 and len(launched) == 2  # 0.1 ms a write at 3000 GB/s


def test_a_verdict_says_how_its_flush_was_written():
    """Where the flush kernel holds every SM, side-stream work waits for it (issue 36, class 6); where it is not
    loaded or falls short, the verdict says so and what it leaves open (`Timing.flush`)."""
    from kernelbench_eval.worker.flushkernel import describe_as

    assert describe_as(1056, True, None) == "one kernel holding every SM (1056 blocks)"
    assert describe_as(None, False, "cuModuleLoadData: CUDA_ERROR_INVALID_CONTEXT (201)").startswith(
        "zero_ (the flush kernel did not load: cuModuleLoadData: CUDA_ERROR_INVALID_CONTEXT (201))")
    assert "short of every warp" in describe_as(528, False, None)
    assert "other streams" in describe_as(None, False, "x") and "other streams" in describe_as(528, False, None)
