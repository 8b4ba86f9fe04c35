"""What judging measured of a candidate besides its status: its timing (the calls' statistics and every
cross-check), the memory it and the reference used, its precision against the float64 truth.

Apart from `records` (the verdicts, settings, manifests and build records that hold these) so that each file
keeps to one job; `records` is where they are read from a verdict.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from kernelbench_eval.common.stats import Samples


class TimingStats(BaseModel):
    """Summary of per-call times in milliseconds. `per_call_ms` is the figure a runtime is reported as (the median
    of 10-call window means, `stats.per_call_ms`); the rest describe single calls (their median, spread)."""

    per_call_ms: float | None = None  # None in records made before it existed
    median_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    iqr_ms: float
    calls: int

    @classmethod
    def from_samples(cls, samples_ms: list[float], mean: bool = False) -> TimingStats:
        """The record of a `stats.Samples` summary (ValueError when there are none); `mean`: the reported figure
        is the calls' mean (KernelBench's method, `kbmethod`)."""
        samples = Samples(samples_ms)
        return cls(per_call_ms=samples.mean() if mean else samples.per_call(), **samples.summary())


class Timing(BaseModel):
    """How a candidate was timed: its lane and the reference's, interleaved, and every cross-check."""

    candidate: TimingStats
    reference: TimingStats
    # what runtime_ms, ref_runtime_ms, compile_runtime_ms and the speedups measure: "device" (CUDA: the call's device
    # time, its host launch work hidden behind a cover as long as the slower model's launches) or "wall" (CPU: the
    # call's time), each the median of 10-call window means; or, under --timing kernelbench*, KernelBench's method
    # named and described ("kernelbench-cuda-event (mean of 100 calls after 3 warm-ups, ...)", `kbmethod.basis`)
    basis: str = "device"
    # the other basis: per call, the longer of the host time and the device time (host launch work included)
    latency_ms: float | None = None
    ref_latency_ms: float | None = None
    latency_speedup: float | None = None
    launch_ms: float | None = None  # median host time per call (CUDA: launching its work)
    ref_launch_ms: float | None = None
    cover_ms: float | None = None  # CUDA: the launch cover before each call at the end (the same for both)
    unresolved: str | None = None  # why the speedup's interval cannot tell 10 % apart, when it cannot
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None  # within the session, widened by the between-session term
    speedup_ci_within: tuple[float, float] | None = None  # from this session's calls alone (the bootstrap)
    # where another session's speedup for the same source would land, 95 % (`stats.rerun_interval`)
    speedup_rerun_interval: tuple[float, float] | None = None
    between_sd: float | None = None  # sd of the reference's log time per call over this problem's sessions so far
    between_df: int | None = None  # its degrees of freedom (sessions - 1)
    blocks: int
    checked_calls: int
    attempts: int = 1  # 2 when a first measurement's clocks disagreed and it was measured again
    rse: float | None  # None: too few windows of calls to say (`stats.rse_per_call`)
    ref_rse: float | None
    wall_ms_per_call: float  # the harness's own clock, outside the candidate's reach
    ref_wall_ms_per_call: float
    unexplained_ms: float  # wall time per call the candidate's timer did not account for, beyond the reference's
    device_tail_ms: float | None = None  # device-wide time after the call's own end event (other streams)
    ref_device_tail_ms: float | None = None
    gate_ms: float | None = None  # CUDA: median time of the flush before each call (its launch cover)
    ref_gate_ms: float | None = None
    event_overhead_ms: float | None = None
    sm_clock_mhz: tuple[int | None, int | None] | None = None  # before and after
    cuda_graph: bool = False
    graph_error: str | None = None
    floor_ms: float | None = None  # input bytes over peak memory bandwidth
    seconds: float = 0.0
    # where one candidate's evaluation spent its wall time: spawn, load, trials, timing, checks (seconds)
    phases: dict[str, float] = Field(default_factory=dict)
    device_busy: float | None = None  # share of the timing stage's wall time the timed calls kept the device busy
    exchange: str | None = None  # how outputs reached the checker: "cuda_ipc" (on the GPU) or "shm"
    flush: str | None = None  # CUDA: how the flush before each of the candidate's calls was written (`flushkernel`)
    # timed calls whose outputs the checker read where the candidate's call had put them (`carve`), no copy
    in_place_calls: int | None = None
    block_calls: int | None = None  # timed calls a block held: several where outputs stay in place (`carve`)
    # CUDA: timed calls answered as soon as they were launched, their device work waited for after (`measure.overlaps`)
    overlapped_calls: int | None = None
    late_calls: int | None = None  # timed calls whose device work was done before its worker began to wait for it
    # the reference timed alone (`judge.refguard`): its time per call, interleaved / alone, and what was concluded:
    # "agrees", "refreshed" (the machine changed: re-measured alone), "disturbed" (slowed beside the candidate)
    ref_alone_ms: float | None = None
    ref_alone_ratio: float | None = None
    ref_alone_check: str | None = None


class PrecisionCheck(BaseModel):
    """Trial 0's outputs against the float64 truth (`worker.truthcheck`, `precision.reduced_precision`): the candidate's
    and the reference's norm-wise relative errors, for the output where the candidate's is largest beside the
    reference's; or, when there are none, why (`note`: the reference cannot run in float64, ...)."""

    candidate_error: float | None = None
    reference_error: float | None = None
    output: int = 0
    timed_error: float | None = None  # the largest over the timed calls, the reference's output standing in for
    # the truth (`truth.stand_in`): a candidate precise only on the trials shows here
    note: str | None = None


class MemoryRecord(BaseModel):
    """Memory, as judging one candidate used it (`common/memory.py`): the budget's plan and each worker's peak
    (CUDA: the allocator's peak on the device; CPU: the process's peak resident size)."""

    budget_bytes: int  # what the checker and a candidate may use together
    need_bytes: int  # the peak the plan counted on
    fits: bool  # False: even the least resident plan was over the budget
    trial_inputs_resident: bool  # else each trial's input set was drawn again from its seed
    expected_resident: bool  # else each trial's expected outputs were computed again by the reference
    timing_sets: int  # base sets the timed calls rotated through
    placements: int  # live input buffers per worker
    lean: bool = False  # the candidate read its input sets in the exchange, keeping no copy (`common/memory.py`)
    reference_peak_bytes: int | None = None
    candidate_peak_bytes: int | None = None
