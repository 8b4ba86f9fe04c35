"""The messages between the harness and its worker processes: the values they carry, and one reply model per kind.

A request (`requests`: one model per op) goes to a worker as one JSON line on its stdin; its reply comes back on a
private pipe, validated through the model its request names (`Request.reply`), so a torn or forged reply fails
loudly, and a field belongs to its op by type. Every reply has the fields of `Reply` (ok, error, seconds, peak
memory); an error reply has only those. A worker plays one role (`Role`: `ROLE_VAR` in its environment says which)
and answers only its role's ops (`worker.main.ROLES`). What lands on disk is in `records`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kernelbench_eval.containment import SandboxRecord
from kernelbench_eval.measured import PrecisionCheck
from kernelbench_eval.records import KernelCount, KernelRow

Role = Literal["checker", "candidate"]  # the reference's worker, or a worker judged against it (or a build's)
ROLE_VAR = "KBEVAL_WORKER_ROLE"  # a worker's role, set in its environment when it is spawned (`isolation.spawn`)


class TensorMeta(BaseModel):
    """What a worker saw of one output before it was moved to the CPU and saved."""

    type_name: str
    exact_tensor: bool
    device: str | None = None
    dtype: str | None = None
    shape: list[int] | None = None


class Slot(BaseModel):
    """Where one tensor lies in an exchange buffer (offset, dtype, shape), or a plain value passed as is."""

    offset: int = 0
    dtype: str | None = None  # None: not a tensor, `value` holds it
    shape: list[int] = Field(default_factory=list)
    value: Any = None


class ExchangeInfo(BaseModel):
    """How a candidate reaches the buffer the checker lends it: a CUDA IPC handle (hex) or a shared file."""

    kind: Literal["cuda_ipc", "shm"]
    handle: str
    size: int = Field(ge=0)
    # CUDA: where the area the candidate's timed calls allocate from begins (`carve`); 0: no such area
    pool_offset: int = Field(default=0, ge=0)
    calls: int = Field(default=1, ge=1)  # timed calls a block holds the outputs of, in place or in slots


class CheckResult(BaseModel):
    """One comparison of a candidate's outputs with the reference's, made in the checker."""

    passed: bool
    max_abs_diff: float | None = None
    mean_abs_diff: float | None = None
    error: str | None = None
    precision: PrecisionCheck | None = None  # trial 0: both errors against the float64 truth (`worker.truthcheck`)


class MemoryPlan(BaseModel):
    """The checker's plan under the memory budget (`common/memory.py`), and the sizes it was made from."""

    trial_inputs: bool
    expected: bool
    timing_sets: int
    placements: int
    need_bytes: int
    budget_bytes: int
    fits: bool
    lean: bool = False  # the candidate reads its input sets in the exchange (`memory`)
    resident_bytes: int  # what it keeps between candidates
    input_bytes: int
    output_bytes: int
    transient_bytes: int


# -- replies ------------------------------------------------------------------------------------------------------


class Reply(BaseModel):
    """A worker's answer on its private reply pipe; never parsed from the candidate's stdout. Alone: the reply of
    an op that returns nothing, and every error reply."""

    model_config = ConfigDict(extra="forbid")

    ok: bool
    error_kind: Literal["load_error", "runtime_error", "compile_error"] | None = None
    error: str | None = None
    seconds: float = 0.0  # the op's own time in the worker
    peak_bytes: int | None = None  # every reply but a timed call's: the worker's peak memory so far


class SandboxReply(Reply):
    """A candidate's worker's first line, before any request: what it confined itself with."""

    sandbox: SandboxRecord | None = None  # (None: no report, which the harness refuses)


class ImportReply(Reply):  # import, warmup
    torch_version: str | None = None


class LoadReply(Reply):
    device_name: str | None = None
    torch_version: str | None = None
    memory_bytes: int | None = None  # the device's memory (the host's for the CPU), for the lanes' budget
    memory_bandwidth_gbs: float | None = None  # CUDA
    event_overhead_ms: float | None = None  # CUDA


class ProfileReply(Reply):
    kernels: KernelCount | None = None  # launch accounting
    kernel_rows: list[KernelRow] = Field(default_factory=list)  # the per-kernel table


class PrepareReply(Reply):
    input_shapes: list[str] = Field(default_factory=list)
    torch_version: str | None = None
    input_bytes: int = 0  # one input set's


class ExpectReply(Reply):
    expected: list[list[TensorMeta]] = Field(default_factory=list)  # per trial, the reference's outputs
    warning: str | None = None
    residency: MemoryPlan | None = None  # what the checker keeps resident under the memory budget
    distributions: list[str] = Field(default_factory=list)  # each trial's input distribution (`draws`)
    distributions_note: str | None = None  # the distributions the reference refused, and why
    truth_note: str | None = None  # why no float64 truth judges the trials, when none does
    stateful: bool = False  # the reference's outputs change from call to call on the same inputs


class ExchangeReply(Reply):  # open_exchange
    exchange: ExchangeInfo | None = None  # (every field of a reply has a default: an error reply has none)


class PutReply(Reply):
    slots: list[Slot] = Field(default_factory=list)  # where the input set lies in the exchange


class CheckReply(Reply):  # compare, compare_timed
    check: CheckResult | None = None


class RunReply(Reply):
    outputs: list[TensorMeta] = Field(default_factory=list)
    mutated_inputs: bool = False
    launch_error: str | None = None  # CUDA: a launch that failed without raising


class ExportReply(Reply):
    metas: list[list[TensorMeta]] = Field(default_factory=list)  # per call, its outputs


class TimeReply(Reply):
    metas: list[list[TensorMeta]] = Field(default_factory=list)  # per call, its outputs
    placed: list[list[Slot]] = Field(default_factory=list)  # per call, where its outputs lie (a candidate's: read)
    samples_ms: list[float] = Field(default_factory=list)
    device_ms: list[float] = Field(default_factory=list)  # start to after a device-wide synchronise
    gate_ms: list[float] = Field(default_factory=list)  # CUDA: each call's flush (its launch cover), timed
    launch_ms: list[float] = Field(default_factory=list)  # each call's host time (its warm-up calls' too)
    graph_error: str | None = None
    flush: str | None = None  # CUDA: how the flush before each call was written (`flushkernel.describe`)
    replaced: list[str] = Field(default_factory=list)  # timing functions the process's code replaced
    late: bool = False  # an answered call's device work was done before the worker began to wait for it
    # a candidate's calls of the block whose outputs, left in place, a later call's outputs lie over: they may
    # have been written over before the check (`timing_stage`)
    overwrote: list[int] = Field(default_factory=list)
