"""Stage 4, the harness side of timing: models timed interleaved, a stopping rule, clocks no candidate can reach.

Each `TimedModel` is one model in its worker (the reference, its torch.compile, or a candidate). Blocks of
calls alternate between them (ABBA order), all on the same schedule of rotating inputs, so clock drift
and thermal state hit every one alike. Measurement stops when every model's time per call
(`stats.per_call_ms`) is stable (relative standard error under the target) after the minimum number of
calls, or when the time budget or the call cap is reached. Every block is also timed by the harness's own
clock, for the cross-checks in `plausibility`.
(Not to be confused with an evaluation lane, `lanes.py`: one GPU judging one candidate at a time.)

A worker is sent one call at a time, each with its inputs' (base set, scale, seed), and the next only once it
has answered: the schedule of a block is drawn here, from the system's randomness, and never crosses to a
worker ahead of its call, so nothing in a candidate's process (its caller's frame, the request, a pipe's
buffer) tells it what the next call will be or how many are left to come. Precomputing later calls'
outputs during one call is impossible, and batching them is too.
"""

from __future__ import annotations

import contextlib
import gc
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from kernelbench_eval.common import kbmethod
from kernelbench_eval.common.memory import DEVICE_BLOCK_BYTES, KEPT_BYTES
from kernelbench_eval.common.stats import WINDOW, Samples
from kernelbench_eval.isolation import cores, linux
from kernelbench_eval.isolation.process import WorkerProcess
from kernelbench_eval.messages import Slot, TimeReply
from kernelbench_eval.records import RunSettings
from kernelbench_eval.requests import TimeRequest

Call = tuple[int, float, int]  # one timed call's inputs: base set, common scale, seed of the per-element factors
BLOCK_CALLS = 10
CPU_BLOCK_CALLS = 1  # on the CPU, the models alternate call by call: host load changes within a 10-call block
OVERLAP_MS = 0.5  # CUDA: both models' calls at least this long, a worker answers before its call ends (`overlaps`)
LATE_SHARE = 0.1  # ...while at most this share of the calls so far found the device done before it was waited for
SCALE_RANGE = (0.75, 1.25)
POLL_S = 0.05  # a timed call's reply is awaited by polling this long (`cores.harness_may_poll`), then by sleeping
COVER_MARGIN = 1.25  # CUDA: the launch cover is this many times the slower model's recent host time per call...
COVER_EXTRA_S = 20e-6  # ...plus this (the start event's own launch), at most MAX_COVER_S
MAX_COVER_S = 0.01
COVER_CALLS = 20  # the recent calls that size it


@dataclass
class TimedModel:
    """One model as it is timed: its worker, its per-call samples, and the harness's own clocks on it."""

    worker: WorkerProcess
    model: str = "main"  # which of the worker's models is timed ("compiled": the torch.compile baseline)
    before: Callable[[], None] | None = None  # right before its warm-up and each block, outside their wall clock
    layout: list[list[Slot]] = field(default_factory=list)  # where a candidate's worker puts each call's outputs
    event_ms: Samples = field(default_factory=Samples)
    device_ms: Samples = field(default_factory=Samples)
    gate_ms: Samples = field(default_factory=Samples)  # CUDA: each call's flush before its start event
    launch_ms: Samples = field(default_factory=Samples)  # host time per call (CUDA: launching its work)
    wall_ms: float = 0.0
    block_gaps: Samples = field(default_factory=Samples)  # per block: wall per call minus reported per call
    graph_error: str | None = None
    flush: str | None = None  # CUDA: how its flush was written (`TimeReply.flush`)
    replaced: set[str] = field(default_factory=set)  # timing functions its process replaced (`percall.replaced`)
    cpu_ms: float = 0.0  # CPU time the worker's process used during its blocks, from the kernel's accounting
    idle_s: list[float] = field(default_factory=list)  # per block after the first: seconds since its previous ended
    ended: float | None = None  # perf_counter when its last block ended
    last: list[TimeReply] = field(default_factory=list)  # the last block's replies: its outputs, where they lie
    overlapped: int = 0  # calls answered as soon as they were launched (`overlaps`)
    late: int = 0  # calls whose device work was done before its worker began to wait for it
    warm_launch_ms: Samples = field(default_factory=Samples)  # its warm-up calls' host times (the first cover)

    def cores_used(self) -> float:
        return self.cpu_ms / self.wall_ms if self.wall_ms else 0.0

    def __post_init__(self) -> None:
        self.event_ms, self.device_ms, self.gate_ms, self.block_gaps, self.launch_ms = (
            Samples(x) for x in (self.event_ms, self.device_ms, self.gate_ms, self.block_gaps, self.launch_ms))

    def per_call(self) -> float:
        """What one call costs (`stats.per_call_ms`): every call of a window paid for, a slow window outvoted."""
        return self.event_ms.per_call()

    def wall_per_call(self) -> float:
        return self.wall_ms / len(self.event_ms)

    def unexplained(self) -> float:
        """Wall time per call not covered by the device-wide times this model reported (median over blocks,
        so one block slowed by a garbage collection or a preemption does not decide)."""
        return self.block_gaps.median()

    def add_block(self, replies: list[TimeReply], wall_ms: float) -> None:
        """One block: a reply per call (each sent alone), and the harness's wall clock over all of them."""
        self.wall_ms += wall_ms
        device = [d for reply in replies for d in reply.device_ms]
        self.event_ms += [s for reply in replies for s in reply.samples_ms]
        self.device_ms += device
        self.gate_ms += [g for reply in replies for g in reply.gate_ms]
        self.launch_ms += [h for reply in replies for h in reply.launch_ms]
        if device:
            self.block_gaps.append((wall_ms - sum(device)) / len(device))
        for reply in replies:
            self.graph_error, self.flush = self.graph_error or reply.graph_error, reply.flush or self.flush
            self.replaced.update(reply.replaced)

    def paired_gaps(self, other: TimedModel) -> Samples:
        """Per block, this model's unexplained wall time per call minus `other`'s in the same block: the two
        ran back to back, so host load that hit the block hit both, and cancels."""
        return Samples(mine - theirs for mine, theirs in zip(self.block_gaps, other.block_gaps, strict=False))

    def latency_ms(self) -> Samples:
        """Per call, the other basis: the longer of its host time and its device time, what a caller issuing one
        call after another pays per call (host launch work included)."""
        return Samples(max(e, h) for e, h in zip(self.event_ms, self.launch_ms, strict=False))

    def device_tail(self) -> float:
        return Samples(d - e for d, e in zip(self.device_ms, self.event_ms, strict=True)).median()


@dataclass
class Measurement:
    timed: list[TimedModel]
    blocks: int
    seconds: float
    last_schedule: list[Call]


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return max(self.end - time.monotonic(), 0.1)


def block_calls(output_bytes: int, device: str = "cpu") -> int:
    """Calls per block: as many as fit the kept-output budget (KEPT_BYTES; on a GPU DEVICE_BLOCK_BYTES, which the
    memory plan counts), at most BLOCK_CALLS. On a GPU a block of outputs over KEPT_BYTES holds a divisor of the
    window (`stats.WINDOW`), so that it never straddles two windows: the switch between the two models'
    processes (0.15 ms) and a block's round trips are then paid once a block, not once a call, and its calls can
    be answered as they are launched (`overlaps`). 71_Conv2d's 520 MB outputs: five calls a block, not one."""
    copied = max(1, min(BLOCK_CALLS, KEPT_BYTES // max(output_bytes, 1)))
    if device != "cuda" or copied > 1:
        return copied
    fits = max(1, DEVICE_BLOCK_BYTES // max(output_bytes, 1))
    return max(d for d in range(1, WINDOW + 1) if WINDOW % d == 0 and d <= fits)


def measure(timed: list[TimedModel], input_sets: list[str], settings: RunSettings, deadline: Deadline,
            calls_per_block: int, after_block: Callable[[int, list[Call]], None] | None = None) -> Measurement:
    """Time every model, block by block in alternating order, until the stopping rule (`kbmethod.measured`) is met."""
    with _no_full_collections():
        return _measure(timed, input_sets, kbmethod.measured(settings), deadline, calls_per_block, after_block)


def block_order(timed: list[TimedModel], blocks: int, device: str, checked: bool) -> list[TimedModel]:
    """Who goes first in block `blocks`: ABBA (clock drift and heat hit both alike), except on the CPU when every
    block is checked. The check runs in the first model's process (the reference's checker): with ABBA that process
    ran its call, the check and its next call back to back in every other block, and identical copies came out
    slow (12 of 19_ReLU, 20_LeakyReLU, 22_Tanh, 32_HardTanh: median 0.89; 0.97-1.04 with the check left out). The
    candidate first in every block: median 0.94-0.96; the rest is the candidate's freezing (docs/benchmarks.md)."""
    if device == "cpu" and checked and len(timed) == 2:
        return timed[::-1]
    return timed if blocks % 2 == 0 else timed[::-1]


def _measure(timed: list[TimedModel], input_sets: list[str], settings: RunSettings, deadline: Deadline,
             calls_per_block: int, after_block: Callable[[int, list[Call]], None] | None) -> Measurement:
    rng = secrets.SystemRandom()  # the schedule is the harness's secret until each block is sent
    if settings.device == "cpu":  # pairs of calls a few microseconds apart see the same host load
        calls_per_block = min(calls_per_block, CPU_BLOCK_CALLS)
    for one in timed:
        if one.before:
            one.before()
        warmed = _request(one, TimeRequest(input_sets=input_sets, model=one.model,
                                            warmup=max(settings.warmup, 1), warmup_seconds=settings.warmup_seconds,
                                            graph=settings.cuda_graph, method=settings.timing), deadline)
        one.warm_launch_ms = Samples(warmed.launch_ms)
    started = time.monotonic()
    blocks, schedule, overlap = 0, [], False
    poll = POLL_S if settings.device == "cuda" and cores.harness_may_poll() else 0.0
    while True:
        schedule = [(rng.randrange(len(input_sets)), rng.uniform(*SCALE_RANGE), rng.randrange(1 << 62))
                    for _ in range(kbmethod.calls(settings, calls_per_block, len(timed[0].event_ms)))]
        cover = cover_s(timed) if settings.device == "cuda" else 0.0
        for one in block_order(timed, blocks, settings.device, after_block is not None):
            if one.before:
                one.before()
            requests = [TimeRequest(input_sets=input_sets, model=one.model, schedule=[call], first=i,
                                    graph=settings.cuda_graph, layout=one.layout[i:i + 1], overlap=overlap,
                                    placement=(blocks * calls_per_block + i) // WINDOW, cover_s=cover)
                        for i, call in enumerate(schedule)]
            if overlap:  # the last call's times, once its device work has ended: the block ends with them
                requests.append(TimeRequest(input_sets=input_sets, model=one.model, first=len(schedule)))
            cpu_before = process_cpu_ms(one.worker)
            begun = time.perf_counter_ns()
            if one.ended is not None:
                one.idle_s.append(begun / 1e9 - one.ended)
            replies = one.worker.call_each(requests, deadline.left(), poll)
            one.last = replies[:len(schedule)]
            one.overlapped += len(schedule) if overlap else 0
            one.add_block(replies, (time.perf_counter_ns() - begun) / 1e6)
            one.ended = time.perf_counter_ns() / 1e9
            one.cpu_ms += process_cpu_ms(one.worker) - cpu_before
            one.late += sum(1 for reply in replies if reply.late)
        if after_block:
            after_block(blocks, schedule)
        blocks += 1
        if _done(timed, settings, time.monotonic() - started):
            return Measurement(timed, blocks, time.monotonic() - started, schedule)
        overlap = overlaps(timed, settings, calls_per_block) and not kbmethod.is_kernelbench(settings.timing)


def cover_s(timed: list[TimedModel]) -> float:
    """The launch cover of the next block's calls (`flush.repeats_for`), one for every model: COVER_MARGIN times
    the slowest of their recent host times per call (their warm-ups' before the first block), plus COVER_EXTRA_S.

    Why the same for every model: the cover is wall time before each start event, which the clock check
    (`plausibility`) sees; equal, it cancels between the two. A model that reports a longer host time than it
    had only lengthens both covers (wall time, no advantage); one that reports less leaves its own launches
    uncovered, inside its own timed events."""
    recent = [max(one.launch_ms[-COVER_CALLS:] or one.warm_launch_ms or [0.0]) for one in timed]
    return min(MAX_COVER_S, COVER_MARGIN * max(recent, default=0.0) / 1e3 + COVER_EXTRA_S)


def overlaps(timed: list[TimedModel], settings: RunSettings, calls_per_block: int) -> bool:
    """Whether the next block's calls are answered as soon as they are launched (`TimeRequest.overlap`).

    Each call's reply, the harness's reading of it and the next request then pass while the device still
    computes the call, not with it idle (0.28 ms a call on 71_Conv2d); the call's times come with the next reply.
    Decided here for every model alike, so that the wall time the clock check compares (`plausibility`) hides
    the same host work on both sides: on a GPU, in blocks of several calls, while every model's calls of the last
    block took OVERLAP_MS or more (the round trip fits inside a call), and while few calls were `late` (their
    worker found the device done before it began to wait: the call's device-wide time then carries host time).
    A stall of the host's now and then makes a late call; a model whose calls are shorter than the round trip
    makes them all late, and ends the overlap within a block."""
    calls = sum(len(one.event_ms) for one in timed)
    return (settings.device == "cuda" and calls_per_block > 1 and sum(one.late for one in timed) <= LATE_SHARE * calls
            and all(Samples(one.event_ms[-calls_per_block:]).median() >= OVERLAP_MS for one in timed))


_frozen = 0  # measurements under way in this process (one per lane)
_frozen_lock = threading.Lock()


@contextlib.contextmanager
def _no_full_collections() -> Iterator[None]:
    """While any lane measures, what this process held before is out of the collector's sight: a full collection
    (about 0.1 s with torch loaded) inside a block lands on one model's wall clock. Young objects are still
    collected; everything is seen again once the last lane is done."""
    global _frozen
    with _frozen_lock:
        if _frozen == 0:
            gc.freeze()
        _frozen += 1
    try:
        yield
    finally:
        with _frozen_lock:
            _frozen -= 1
            if _frozen == 0:
                gc.unfreeze()


def _done(timed: list[TimedModel], settings: RunSettings, elapsed: float) -> bool:
    calls = len(timed[0].event_ms)
    if calls >= settings.max_reps:
        return True
    if elapsed >= settings.timing_budget:
        return calls >= min(settings.reps, BLOCK_CALLS)
    return calls >= settings.reps and all(one.event_ms.rse_per_call() <= settings.target_rse for one in timed)


def _request(one: TimedModel, req: TimeRequest, deadline: Deadline, poll: float = 0.0) -> TimeReply:
    return one.worker.call(req, deadline.left(), poll)


def process_cpu_ms(worker: WorkerProcess) -> float:
    """User plus system CPU time of everything a worker ran, as the kernel accounts it: its cgroup leaf's
    `cpu.stat` where the sandbox made one (every process in it, a helper it forked to compute part of the
    output included, and those gone since), else, for a worker that runs candidate code, its process tree from
    /proc (`cgroups.tree_cpu_ms`, a scan of /proc: 1.6 ms on a host of 90 processes), else (the harness's own
    worker: the checker, a baseline) its own entry. Only the worker's own entry was counted before: a forked
    helper's cores were invisible to the cores rule."""
    from kernelbench_eval.isolation.cgroups import tree_cpu_ms

    leaf = getattr(worker, "leaf", None)
    used = leaf.cpu_ms() if leaf is not None else None
    if used is not None:
        return used
    pid = getattr(getattr(worker, "proc", None), "pid", None)
    if pid is None:
        return 0.0
    return tree_cpu_ms(pid) if getattr(worker, "sandbox", None) is not None else linux.cpu_time_ms(pid)
