"""What the checker lends candidates: an exchange buffer sized for an input set or a timing block's outputs, the
input sets fed through it, and how many of each the checker's memory plan lets it keep.

Apart from `reference` because sizing is its own reckoning (outputs copied or left in place, blocks of how many
calls, CUDA IPC or a shared file) that the timing, the baselines and every candidate ask of the same numbers,
learnt once, as the reference is opened.
"""

from __future__ import annotations

from pathlib import Path

from kernelbench_eval.common.carve import SEGMENT_ALIGN, in_place_enabled, pool_bytes
from kernelbench_eval.common.exchange import layout_bytes, output_layout
from kernelbench_eval.isolation.process import WorkerFailure, WorkerProcess
from kernelbench_eval.judge.checker import Checker
from kernelbench_eval.judge.measure import Deadline, block_calls
from kernelbench_eval.messages import ExchangeInfo, MemoryPlan, Slot, TensorMeta
from kernelbench_eval.records import MemoryRecord, RunSettings
from kernelbench_eval.requests import AttachRequest, CloseExchangeRequest, OpenExchangeRequest, PutRequest, TakeRequest

SLACK_BYTES = 64 * 256  # alignment padding for the input sets' tensors in the exchange


class Lender:
    """The exchange's sizes for one problem and lane, and the checker's side of lending it."""

    def __init__(self, checker: Checker, settings: RunSettings, sets: int, timing_sets: int) -> None:
        self.checker, self.settings = checker, settings
        self.sets, self.default_timing_sets = sets, timing_sets  # input sets drawn: all, and the timing's
        self.metas: list[list[TensorMeta]] = []  # per trial, the expected outputs' structure
        self.input_bytes = 0  # of one input set
        self.memory_bytes: int | None = None  # the device's (the host's on the CPU), as the checker reports it
        self.residency: MemoryPlan | None = None  # what the checker keeps resident (`memory`), once expected
        self.ipc = settings.device == "cuda"  # lend the exchange by CUDA IPC until that is refused once
        self.ipc_refused: str | None = None  # why, when it was

    # what the checker says as the reference is opened, step by step: the sizes everything here is reckoned from

    def learn_inputs(self, input_bytes: int) -> None:
        self.input_bytes = input_bytes

    def learn_device(self, memory_bytes: int | None) -> None:
        self.memory_bytes = memory_bytes

    def learn_outputs(self, metas: list[list[TensorMeta]], residency: MemoryPlan | None) -> None:
        self.metas, self.residency = metas, residency

    def refuse_ipc(self, why: str) -> None:
        """CUDA IPC was refused here: shared memory from now on, for every candidate."""
        self.ipc, self.ipc_refused = False, why

    # -- sizes -----------------------------------------------------------------------------------------------

    def footprint(self) -> int:
        """Bytes its checker keeps while open: the input sets and expected outputs its memory plan keeps."""
        if self.residency is not None:
            return self.residency.resident_bytes
        return self.input_bytes * self.sets + self.output_bytes() * len(self.metas)

    @property
    def placements(self) -> int:
        """Live input buffers per worker in the timed calls, as the memory plan allows (0: the worker's own)."""
        return self.residency.placements if self.residency else 0

    def timing_sets(self) -> list[str]:
        """The base sets the timed calls rotate through: as many as the memory plan keeps."""
        count = self.residency.timing_sets if self.residency else self.default_timing_sets
        return [f"timing{k}" for k in range(count)]

    def output_bytes(self) -> int:
        return layout_bytes(output_layout(self.metas[0])[0]) if self.metas else 0

    def calls_per_block(self, in_place: bool = True) -> int:
        """Calls a timing block holds (`measure.block_calls`): with `in_place`, as this lane's candidates are timed
        (large outputs left in place where CUDA IPC lends the exchange and the device has room for its pool
        area), so that the reference alone keeps their cadence; else as where outputs are copied: on a GPU in blocks
        the memory plan counted (`memory.block_bytes`), one call's where even its least resident plan is over the
        budget."""
        calls, area = self._in_place_block() if in_place else (0, 0)
        if area:
            return calls
        over = self.residency is not None and not self.residency.fits
        return block_calls(self.output_bytes(), "cpu" if over else self.settings.device)

    def _in_place_block(self) -> tuple[int, int]:
        """(calls, pool area bytes) of the largest in-place block the device has room for; (0, 0): none (outputs
        small enough to copy, no CUDA IPC, the CPU, or no room). Room is the device's share (`carve.POOL_SHARE`)
        and what the memory plan left spare: the area is raw device memory of the checker's, beyond the exchange
        the plan counted (KernelBench's 23_Softmax at its current size: 19 GB, the difference between fitting an
        H200 and running out)."""
        if (block_calls(self.output_bytes()) > 1 or not self.ipc or self.settings.device != "cuda"
                or not in_place_enabled()):
            return 0, 0
        plan = self.residency
        spare = plan.budget_bytes - plan.need_bytes if plan else None
        for calls in sorted({block_calls(self.output_bytes(), "cuda"), 1}, reverse=True):  # the most that fit
            area = pool_bytes(self._slots(calls), self.output_bytes(), self.memory_bytes, calls)
            if area and (spare is None or area <= spare):
                return calls, area
        return 0, 0

    @property
    def lean(self) -> bool:  # the candidate reads its input sets where they lie in the exchange (`memory`)
        return bool(self.residency and self.residency.lean)

    def timed_layout(self, calls: int) -> list[list[Slot]]:
        """Where a block's outputs go in the exchange: from its start, or (lean) after the input set."""
        shift = self._input_area() if self.lean else 0
        return [[s.model_copy(update={"offset": s.offset + shift}) if s.dtype else s for s in slots]
                for slots in output_layout(self.metas[0], calls)]

    def _input_area(self) -> int:
        return -(-(self.input_bytes + SLACK_BYTES) // SEGMENT_ALIGN) * SEGMENT_ALIGN

    def _slots(self, calls: int) -> int:
        if self.lean:
            return self._input_area() + self.output_bytes() * calls
        return max(self.input_bytes + SLACK_BYTES, self.output_bytes() * calls)

    # -- lending ---------------------------------------------------------------------------------------------

    def lend(self, shm_dir: Path, pool: bool = True) -> ExchangeInfo:
        """A fresh exchange buffer for one candidate, big enough for an input set or a block's outputs; on a GPU,
        with `pool`, where outputs are large, followed by the area its timed calls allocate from (`carve`: outputs
        compared where the call put them, in blocks of several calls). `calls` says how many a block holds."""
        copied = self.calls_per_block(in_place=False)
        calls, area = self._in_place_block() if pool else (0, 0)
        calls = calls if area else copied
        slots = self._slots(calls)
        offset = -(-slots // SEGMENT_ALIGN) * SEGMENT_ALIGN if area else 0
        req = OpenExchangeRequest(size=offset + area if area else slots, shm_dir=str(shm_dir), prefer_ipc=self.ipc)
        exchange = self.checker.call(req).exchange
        assert exchange is not None
        if area and exchange.kind == "cuda_ipc":
            exchange.pool_offset, exchange.calls = offset, calls
        else:
            exchange.calls = copied
        return exchange

    def reclaim(self) -> None:
        if self.checker.worker is not None and not self.checker.broken:
            self.checker.call(CloseExchangeRequest())

    def put(self, name: str) -> list[Slot]:
        return self.checker.call(PutRequest(name=name)).slots

    def attach(self, worker: WorkerProcess, info: ExchangeInfo, shm_dir: Path, deadline: Deadline) -> ExchangeInfo:
        """Attach a candidate's `worker` to the exchange lent it (`info`); the one it is attached to. Where CUDA IPC
        is refused, shared memory from then on, for every candidate (this one lent again)."""
        try:
            worker.call(AttachRequest(exchange=info, placements=self.placements), deadline.left())
        except WorkerFailure as exc:
            if info.kind != "cuda_ipc":
                raise
            self.refuse_ipc(exc.message)
            info = self.lend(shm_dir)
            worker.call(AttachRequest(exchange=info, placements=self.placements), deadline.left())
        return info

    def kind_of(self, info: ExchangeInfo) -> str:
        """How an exchange was lent, as its verdict says (`timing.exchange`)."""
        if info.kind == "shm" and self.ipc_refused:
            return f"shm (CUDA IPC refused: {self.ipc_refused[:200]})"
        return info.kind

    def feed(self, worker: WorkerProcess, names: list[str], deadline: Deadline, drop: bool = False) -> None:
        """Give `worker` (attached to the lent exchange) its own copies of these input sets; `drop`: it lets go of
        those it held first (a candidate holds one trial's set at a time, then the timing's: `memory`)."""
        for i, name in enumerate(names):
            worker.call(TakeRequest(name=name, slots=self.put(name), drop=drop and i == 0, in_place=self.lean),
                        deadline.left())


def memory_record(lender: Lender, candidate_peak: int | None) -> MemoryRecord | None:
    """The memory plan a lender lent under and both workers' peaks, for a verdict."""
    plan = lender.residency
    if plan is None:
        return None
    return MemoryRecord(budget_bytes=plan.budget_bytes, need_bytes=plan.need_bytes, fits=plan.fits,
                        trial_inputs_resident=plan.trial_inputs, expected_resident=plan.expected,
                        timing_sets=plan.timing_sets, placements=plan.placements, lean=plan.lean,
                        reference_peak_bytes=lender.checker.peak_bytes, candidate_peak_bytes=candidate_peak)
