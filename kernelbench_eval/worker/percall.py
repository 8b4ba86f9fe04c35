"""Per-call timing, run inside a worker process next to the model it times (the harness side is `measure`).

The clocks are bound when this module is imported, which the worker does before any candidate code
runs, so a candidate that later patches `time.perf_counter_ns` does not change what we read. A candidate
can still patch this module (it shares the process), which is why the harness cross-checks every block
against its own wall clock.

Each timed call gets inputs it has never seen (`refill.Rotation`: fixed buffers refilled from a fresh mix of
the problem's own draws), so caching by pointer or by value cannot replay an old answer. Every call's outputs
are kept, so that the checker can compare every timed call in full with the reference's output for the same
call. Then the
L2 is flushed (persisting lines reset too), the whole device synchronised, and the call timed twice
over: events on the current stream (the precise number) and up to a second event recorded after a
device-wide synchronise (which also counts work the candidate left running on other streams).

The flush is also the call's cover: it keeps the GPU busy for the cover the harness asks (FLUSH_COVER_S at
least; it writes twice the L2 first), so the host has launched the call's kernels before the start event fires,
and the events time the GPU's work, not how fast this process's core woke up. It is one kernel that holds
every SM (`flushkernel`), and the host waits for the refill before it calls the model: work the call puts on a
stream of its own, which does not wait for the start event, cannot run until the flush has all but ended
(issue 36, class 6).
A block's first call has more cover: the GPU switches from the other model's process to this one first
(about 0.14 ms on an H100). Making that switch before the block instead, outside its wall clock, was tried:
the walls fell by 0.3 ms, but the cover left fell short of the host's launch in the workers, and the times
of 71_Conv2d's candidates rose 1-3 % (docs/benchmarks.md, "Where a timed call's wall goes").
Without it a 19 us SiLU measured 36-67 us in the workers, differently in each process (docs/benchmarks.md,
"Identical copies"). The flush's own time (`gate_ms`) is reported: where the flush cannot hold every SM (the
driver would not load its kernel), work a candidate slipped onto another stream runs beside it and slows it.

On a GPU a call is `launch`ed (refill, flush, events, the call's kernels queued) and then `settle`d (every stream
waited for, the call timed, its outputs kept): `time_block` does both in turn; a worker answering a call as soon
as it is launched (`worker/timed.py`) settles it after its reply.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kernelbench_eval.common.cudart import reset_persisting_l2
from kernelbench_eval.worker import flush
from kernelbench_eval.worker.refill import Rotation

_perf_counter_ns = time.perf_counter_ns
# A timed CUDA call measures with the C event type's own methods (no Python code can replace a method of a C
# type) and the driver-level synchronise, bound here, before any candidate code runs.
_EventBase = getattr(torch._C, "_CudaEventBase", None)
_device_sync = getattr(torch._C, "_cuda_synchronize", None)
_current_stream = torch.cuda.current_stream
# The public names a candidate would patch to bend its times, as they were then: `replaced()` reports changes.
_WATCHED = {"time.perf_counter": (time, "perf_counter"), "time.perf_counter_ns": (time, "perf_counter_ns"),
            "time.monotonic": (time, "monotonic"), "time.monotonic_ns": (time, "monotonic_ns"),
            "torch.cuda.synchronize": (torch.cuda, "synchronize"), "torch.cuda.Event": (torch.cuda, "Event"),
            "torch.cuda.Event.record": (torch.cuda.Event, "record"),
            "torch.cuda.Event.elapsed_time": (torch.cuda.Event, "elapsed_time"),
            "torch.cuda.Event.synchronize": (torch.cuda.Event, "synchronize")}
_ORIGINALS = {label: getattr(owner, name) for label, (owner, name) in _WATCHED.items()}


@dataclass
class Block:
    """What one timing request measured: per-call times, plus the outputs kept for a later check."""

    event_ms: list[float] = field(default_factory=list)
    device_ms: list[float] = field(default_factory=list)
    gate_ms: list[float] = field(default_factory=list)  # CUDA: each call's flush, from before it to the start event
    launch_ms: list[float] = field(default_factory=list)  # host time of each call (CUDA: launching its work)
    kept: list[list[torch.Tensor | None]] = field(default_factory=list)
    late: bool = False  # a call's device work was done before its settling began (`settle`)

    def extend(self, other: Block) -> None:
        """`other`'s times after these (its kept outputs stay with it)."""
        self.event_ms += other.event_ms
        self.device_ms += other.device_ms
        self.gate_ms += other.gate_ms
        self.launch_ms += other.launch_ms
        self.late = self.late or other.late


def keep(out: object) -> list[torch.Tensor | None]:
    """A private copy of a call's outputs, so a model reusing its output buffer is still checked per call."""
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return [o.detach().clone() if isinstance(o, torch.Tensor) else None for o in outs]


# (call index in the block, its output) -> what is left to do once the device is idle (copies), which returns
# what to keep of the call. The first half is host work only (describing and locating the outputs): a long call
# runs it while the device still computes (`EARLY_MS`).
Keeper = Callable[[int, object], Callable[[], list]]
EARLY_MS = 0.5  # a call at least this long (the model's last one) leaves the host time for its keeper's first half


def time_block(model: Callable[..., object], rotation: Rotation, schedule: list[tuple[int, float, int]],
               device: str, replay: Callable[[], object] | None = None, keeper: Keeper | None = None,
               placement: int = 0, cover_s: float = 0.0) -> Block:
    """Time one call per (base set, scale) in `schedule`, keeping a copy of every call's outputs.

    `replay`, when given, is a captured CUDA graph of the model on the rotation's buffers, timed instead.
    `keeper` replaces the private copy (a candidate's worker copies straight into the exchange instead); on a
    GPU its first half runs right after a long call returns (`EARLY_MS`), while the device still computes.
    """
    keeper = keeper or (lambda _, out: lambda: keep(out))
    if device == "cuda":
        return _time_cuda(model, rotation, schedule, replay, keeper, 0 if replay else placement, cover_s)
    block = Block()
    for i, (k, scale, seed) in enumerate(schedule):
        inputs = rotation.fill(k, scale, seed)
        start = _perf_counter_ns()
        out = model(*inputs)
        elapsed = (_perf_counter_ns() - start) / 1e6
        block.event_ms.append(elapsed)
        block.device_ms.append(elapsed)
        block.launch_ms.append(elapsed)
        block.kept.append(keeper(i, out)())
    return block


_WARM_SEEDS = itertools.count(1 << 40)  # never the same warm-up input twice in a process (timed seeds are secret)


def warm_up(model: Callable[..., object], rotation: Rotation, count: int, seconds: float, device: str
            ) -> list[float]:
    """Untimed calls, stopping at `count` or after `seconds`, whichever comes first; returns the host time of each
    call after the first (what the harness sizes the first block's launch cover by: `measure.cover_s`).

    Each gets inputs this process has not seen: a second measurement (`timing_stage`, attempt 2) warming up on the
    first's inputs again handed a caching candidate repeats it could answer from memory (untimed, but noise in
    what it shows)."""
    deadline = _perf_counter_ns() + int(seconds * 1e9)
    done, launches = 0, []
    while done < count and _perf_counter_ns() < deadline:  # on every placement: buffers a model keys by its
        # inputs' addresses are made here, outside the exchange's pool, not in a timed call (`carve`)
        inputs = rotation.fill(done % len(rotation.bases), 1.0, next(_WARM_SEEDS), done % len(rotation.placements))
        _sync(device)
        started = _perf_counter_ns()
        model(*inputs)
        if done:  # the first call initialises what later calls reuse
            launches.append((_perf_counter_ns() - started) / 1e6)
        _sync(device)
        done += 1
    return launches


def replaced() -> list[str]:
    """The timing functions this process's code replaced since import. Our numbers came from the copies bound
    before, so this is evidence of intent, not of a wrong number (a candidate that read this module can patch
    it too: the harness's wall clock is the check no code in this process can reach)."""
    return [label for label, (owner, name) in _WATCHED.items() if getattr(owner, name, None) is not _ORIGINALS[label]]


def _time_cuda(model: Callable[..., object], rotation: Rotation, schedule: list[tuple[int, float, int]],
               call: Callable[[], object] | None, keeper: Keeper, placement: int, cover_s: float) -> Block:
    block = Block()
    for i, one in enumerate(schedule):
        settle(launch(model, rotation, one, i, keeper, call, placement, cover_s=cover_s), block)
    _device_sync()
    return block


@dataclass
class Launched:
    """A timed call whose kernels are queued and may still run: what `settle` needs to time and keep it."""

    key: int  # the model's id, for its `_LAST_MS` and `_LATE` entries
    index: int  # its call index in the request
    out: object
    keeper: Keeper
    finish: Callable[[], list] | None  # the keeper's second half, when its first ran right after the launch
    launch_ms: float = 0.0  # host time from the call's start to its return (its launches, and any host work)


def launch(model: Callable[..., object], rotation: Rotation, call: tuple[int, float, int], index: int,
           keeper: Keeper, replay: Callable[[], object] | None = None, placement: int = 0,
           early: bool | None = None, cover_s: float = 0.0) -> Launched:
    """Refill, flush and launch one timed call between its events, without waiting for the device.

    The flush lasts as long as `cover_s` asks (`flush.write`): the harness sizes that cover from
    both models' host launch times, the same for both, so that every kernel of the call is queued before its
    start event fires and the events time the device's work alone (the runtime's stated basis).

    The keeper's first half (describing and locating the outputs: host work only) runs at once when `early`,
    while the device computes; by default, when the model's last call took EARLY_MS or more and its keeper never
    outran the device. A worker that answers before settling (`overlap`) passes True."""
    assert _EventBase is not None and _device_sync is not None
    before, start, end, _ = _events()
    _device_sync()  # the whole device, so no work of the previous call leaks in
    inputs = rotation.fill(*call, placement)
    reset_persisting_l2()
    stream = _current_stream()
    _EventBase.record(before, stream)
    # one kernel holding every SM, still running while the host launches the call (launch cost hides behind it)
    flush.write(cover_s, stream)
    _EventBase.record(start, stream)
    _EventBase.synchronize(before)  # the refill done, the flush under way: only now may the call launch anything
    started = _perf_counter_ns()
    out = replay() if replay else model(*inputs)
    launched_ms = (_perf_counter_ns() - started) / 1e6
    _EventBase.record(end, _current_stream())
    key = id(model)
    if early is None:
        early = key not in _LATE and _LAST_MS.get(key, 0.0) >= EARLY_MS
    return Launched(key, index, out, keeper, keeper(index, out) if early else None, launched_ms)


def settle(launched: Launched, block: Block) -> bool:
    """Wait for everything the call left on the device (every stream), time it into `block` and keep its outputs.

    Returns whether the device was done with the call's own stream before this began (`late`): the device-wide
    time then carries host time, so such a model's keeper waits for the device from then on."""
    before, start, end, after = _events()
    late = launched.finish is not None and bool(_EventBase.query(end))
    if late:
        _LATE.add(launched.key)
    _device_sync()  # waits for work on every stream, not only the current one
    _EventBase.record(after, _current_stream())
    block.kept.append((launched.finish or launched.keeper(launched.index, launched.out))())
    _EventBase.synchronize(after)  # a keeper need not synchronise (the checker's copies do not)
    block.event_ms.append(_EventBase.elapsed_time(start, end))
    block.device_ms.append(_EventBase.elapsed_time(start, after))
    block.gate_ms.append(_EventBase.elapsed_time(before, start))
    block.launch_ms.append(launched.launch_ms)
    _LAST_MS[launched.key] = block.event_ms[-1]
    return late


_EVENTS: list[Any] = []
_LAST_MS: dict[int, float] = {}  # by model: its last timed call's time
_LATE: set[int] = set()  # models whose keeper once outran the device: theirs waits for the device from then on


def _events() -> list[Any]:
    """The four events every timed call records (before its flush, start, end, after a device-wide synchronise),
    made once per process rather than four times a call (each call synchronises before they are recorded again)."""
    if not _EVENTS:
        _EVENTS.extend(_EventBase(enable_timing=True) for _ in range(4))
    return _EVENTS


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
