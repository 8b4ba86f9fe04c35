"""KernelBench's `cuda_event` timing as the worker runs it (`--timing kernelbench`, `kernelbench-2025`; what it is
and what stays the harness's: `common/kbmethod.py`), with the event type and clocks bound at import, before any
candidate code runs, as `percall` does."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from kernelbench_eval.common.kbmethod import CURRENT, DISCARD
from kernelbench_eval.worker import percall

if TYPE_CHECKING:
    from kernelbench_eval.worker.refill import Rotation

THRASH_SHAPE = (32, 1024, 1024)  # int64: the 256 MB KernelBench writes before each trial (`clear_l2_cache`)

_perf_counter_ns = time.perf_counter_ns
_EventBase = getattr(torch._C, "_CudaEventBase", None)
_device_sync = getattr(torch._C, "_cuda_synchronize", None)
_current_stream = torch.cuda.current_stream
_empty = torch.empty
_SEEDS = itertools.count(1 << 41)  # the discarded trial's inputs: never a timed call's (those seeds are secret)



def warm_up(model: Callable[..., object], rotation: Rotation, count: int, method: str, device: str) -> list[float]:
    """KernelBench's warm-up: `count` calls, each followed by a synchronise (`percall.warm_up`, never stopped by
    time); then, in the current method, the allocator's cache emptied and the discarded trials run. Returns the
    warm-up calls' host times, as `percall.warm_up` does."""
    launches = percall.warm_up(model, rotation, count, 1e9, device)
    if method == CURRENT:
        if device == "cuda":
            torch.cuda.empty_cache()
        drop: percall.Keeper = lambda _, out: list  # noqa: E731 (nothing kept: it is not checked)
        time_block(model, rotation, [(0, 1.0, next(_SEEDS)) for _ in range(DISCARD[method])], device, drop, method)
    return launches


def time_block(model: Callable[..., object], rotation: Rotation, schedule: list[tuple[int, float, int]],
               device: str, keeper: percall.Keeper, method: str) -> percall.Block:
    """One trial of KernelBench's method per call of `schedule`, each on freshly refilled inputs (the first
    placement only: KernelBench's inputs stay where they are), each call's outputs kept by `keeper` once it is
    timed. On the CPU, the host clock around the call (`percall.time_block`)."""
    if device != "cuda":
        return percall.time_block(model, rotation, schedule, device, None, keeper)
    assert _EventBase is not None and _device_sync is not None
    block = percall.Block()
    for i, call in enumerate(schedule):
        inputs = rotation.fill(*call, 0)  # before the synchronise: done, and cached or not, as the method leaves it
        _device_sync()
        before, start, end, after = (_EventBase(enable_timing=True) for _ in range(4))  # new events a trial
        if method == CURRENT:
            _EventBase.record(before, _current_stream())
            _empty(THRASH_SHAPE, dtype=torch.int64, device="cuda").fill_(42)  # made, written and freed
        _EventBase.record(start, _current_stream())
        began = _perf_counter_ns()
        out = model(*inputs)
        launched_ms = (_perf_counter_ns() - began) / 1e6
        _EventBase.record(end, _current_stream())
        _device_sync()  # every stream, as KernelBench's
        _EventBase.record(after, _current_stream())  # what ran on other streams: the device-wide time
        block.kept.append(keeper(i, out)())
        _EventBase.synchronize(after)
        block.event_ms.append(_EventBase.elapsed_time(start, end))
        block.device_ms.append(_EventBase.elapsed_time(start, after))
        block.launch_ms.append(launched_ms)
        if method == CURRENT:
            block.gate_ms.append(_EventBase.elapsed_time(before, start))
    _device_sync()
    return block
