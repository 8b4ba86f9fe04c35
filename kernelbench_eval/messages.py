"""The messages between the harness and its worker processes, one pydantic model each.

A request goes to a worker as one JSON line on its stdin; its reply comes back on a private pipe, validated
through `WorkerReply`, so a torn or forged reply fails loudly. What lands on disk is in `records`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from kernelbench_eval.containment import SandboxRecord
from kernelbench_eval.measured import PrecisionCheck
from kernelbench_eval.records import Device, KernelCount, KernelRow


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
    precision: PrecisionCheck | None = None  # trial 0: both errors against the float64 truth (`judge.truth`)


class WorkerRequest(BaseModel):
    """A command sent to a worker on its stdin, one JSON object a line."""

    op: Literal["import", "load", "prepare", "expect", "open_exchange", "close_exchange", "put", "attach", "take",
                "run", "compare", "time", "export", "compare_timed", "profile", "warmup", "park", "exit"]
    # load: module file and class to build (`model` names it in the worker: "main", or "compiled" for the
    # torch.compile baseline); prepare (reference): problem file, one input set per seed
    path: str | None = None
    class_name: str | None = None
    model: str = "main"
    init_file: str | None = None
    init_seed: int | None = None
    device: Device | None = None  # load: the model's; prepare: where the input sets are drawn (`draw_inputs`)
    dims: dict[str, int | float] = Field(default_factory=dict)
    threads: int | None = None
    problem: str | None = None  # warmup: the problem file whose Model/get_inputs shape the call
    precision: str | None = None  # prepare/load/warmup: cast inputs and model (`precision.py`); None is fp32
    compile_mode: str | None = None  # load: wrap the model in torch.compile (the compile baseline)
    trial_seeds: list[int] = Field(default_factory=list)
    timing_seeds: list[int] = Field(default_factory=list)
    inputs_dir: str | None = None  # prepare: where init.pt goes (inputs stay in the worker's memory)
    save_inputs: bool = False  # prepare: also save each input set there (`kbeval profile`; seeds not secret)
    inputs_file: str | None = None  # profile: the inputs to profile one forward on
    # exchange: its size and where a shared file may go; put/take: an input set's name and its slots
    size: int = 0
    shm_dir: str | None = None
    exchange: ExchangeInfo | None = None
    name: str | None = None
    slots: list[Slot] = Field(default_factory=list)
    # run (candidate): the set to run on, the slots its outputs go to; `sentinel` fills free memory first
    sentinel: int | None = None
    atol: float = 0.0  # expect: the tolerances every later comparison uses
    rtol: float = 0.0
    # compare (checker): which trial, what the candidate said of its outputs, where they lie
    trial: int = 0
    outputs: list[TensorMeta] = Field(default_factory=list)
    # time: one call per (base set, scale, seed) of `schedule` on rotating inputs from `input_sets`
    input_sets: list[str] = Field(default_factory=list)
    schedule: list[tuple[int, float, int]] = Field(default_factory=list)
    warmup: int = 0
    warmup_seconds: float = 0.0
    graph: bool = False
    first: int = 0  # the index in its block of this request's call: calls are sent one at a time (`measure`)
    placement: int = 0  # time: which of the worker's input placements this call uses (`refill.Rotation`)
    cover_s: float = 0.0  # time (CUDA): the launch cover before each call, the same for every model (`measure`)
    # time (CUDA): answer once the call is launched and described; its times come with the next reply, and the
    # block ends with a request of no calls, answered once the last call's device work is done (`measure.overlaps`)
    overlap: bool = False
    # time (with a warm-up, so once a measurement): how its calls are timed, the harness's way or KernelBench's
    method: str = "kbeval"
    # expect (checker): the memory budget, bytes (None: the device's free memory, `memory.SHARE` of it), and the
    # share of it this checker may plan with (lanes on one device share it)
    memory_budget: int | None = None
    memory_share: float = 1.0
    # attach (candidate) / take: live input buffers its timed calls use (`memory` plan); take: drop every set held
    placements: int = 0
    drop: bool = False
    # export (candidate) / compare_timed (checker): calls of the last block, and their slots
    calls: list[int] = Field(default_factory=list)
    layout: list[list[Slot]] = Field(default_factory=list)
    metas: list[list[TensorMeta]] = Field(default_factory=list)


class MemoryPlan(BaseModel):
    """The checker's plan under the memory budget (`judge/memory.py`), and the sizes it was made from."""

    trial_inputs: bool
    expected: bool
    timing_sets: int
    placements: int
    need_bytes: int
    budget_bytes: int
    fits: bool
    resident_bytes: int  # what it keeps between candidates
    input_bytes: int
    output_bytes: int
    transient_bytes: int


class WorkerReply(BaseModel):
    """A worker's answer on its private reply pipe; never parsed from the candidate's stdout."""

    ok: bool
    error_kind: Literal["load_error", "runtime_error", "compile_error"] | None = None
    error: str | None = None
    outputs: list[TensorMeta] = Field(default_factory=list)
    expected: list[list[TensorMeta]] = Field(default_factory=list)  # expect: per trial, the reference's outputs
    metas: list[list[TensorMeta]] = Field(default_factory=list)  # export, time: per call, the outputs
    slots: list[Slot] = Field(default_factory=list)
    placed: list[list[Slot]] = Field(default_factory=list)  # time (candidate): per call, where its outputs lie
    exchange: ExchangeInfo | None = None
    check: CheckResult | None = None
    warning: str | None = None
    samples_ms: list[float] = Field(default_factory=list)
    device_ms: list[float] = Field(default_factory=list)  # start to after a device-wide synchronise
    gate_ms: list[float] = Field(default_factory=list)  # CUDA: each call's flush (its launch cover), timed
    launch_ms: list[float] = Field(default_factory=list)  # time: each call's host time (its warm-up calls' too)
    graph_error: str | None = None
    replaced: list[str] = Field(default_factory=list)  # time: timing functions the process's code replaced
    late: bool = False  # time: an answered call's device work was done before the worker began to wait for it
    overwrote: list[int] = Field(default_factory=list)  # time (candidate): calls of the block whose outputs, left
    # in place, a later call's outputs lie over: they may have been written over before the check (`timed`)
    launch_error: str | None = None
    mutated_inputs: bool = False
    device_name: str | None = None
    torch_version: str | None = None
    input_shapes: list[str] = Field(default_factory=list)
    input_bytes: int = 0
    memory_bandwidth_gbs: float | None = None
    event_overhead_ms: float | None = None
    memory_bytes: int | None = None  # load: the device's memory (the host's for the CPU), for the lanes' budget
    kernels: KernelCount | None = None  # profile: launch accounting
    kernel_rows: list[KernelRow] = Field(default_factory=list)  # profile: per-kernel table
    sandbox: SandboxRecord | None = None  # a candidate's worker, first line: what it confined itself with
    seconds: float = 0.0
    residency: MemoryPlan | None = None  # expect: what the checker keeps resident under the memory budget
    distributions: list[str] = Field(default_factory=list)  # expect: each trial's input distribution (`draws`)
    distributions_note: str | None = None  # expect: the distributions the reference refused, and why
    truth_note: str | None = None  # expect: why no float64 truth judges the trials, when none does
    stateful: bool = False  # expect: the reference's outputs change from call to call on the same inputs
    peak_bytes: int | None = None  # every reply but a timed call's: the worker's peak memory so far

