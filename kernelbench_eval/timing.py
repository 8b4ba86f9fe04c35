"""Per-call timing, run inside a worker process next to the model it times.

The clocks are bound when this module is imported, which the worker does before any candidate code
runs, so a candidate that later patches `time.perf_counter_ns` does not change what we read.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

_perf_counter_ns = time.perf_counter_ns
_L2_FLUSH_FACTOR = 2  # write twice the L2 so nothing of the previous call stays cached


def time_calls(call: Callable[[], object], device: str, warmup: int, reps: int) -> list[float]:
    """Milliseconds of `reps` calls after `warmup` untimed ones; CUDA events on GPU, host clock on CPU."""
    for _ in range(warmup):
        call()
    if device == "cuda":
        return _time_cuda(call, reps)
    return _time_cpu(call, reps)


def _time_cpu(call: Callable[[], object], reps: int) -> list[float]:
    samples = []
    for _ in range(reps):
        start = _perf_counter_ns()
        call()
        samples.append((_perf_counter_ns() - start) / 1e6)
    return samples


def _time_cuda(call: Callable[[], object], reps: int) -> list[float]:
    flush = l2_flush_buffer()
    pairs = []
    for _ in range(reps):
        flush.zero_()
        torch.cuda.synchronize()  # the whole device, so work on side streams cannot leak across calls
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        torch.cuda.synchronize()
        pairs.append((start, end))
    return [start.elapsed_time(end) for start, end in pairs]


def l2_flush_buffer() -> torch.Tensor:
    """A byte buffer of twice the device's L2, written before each timed call to evict the last one's data."""
    l2_bytes = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0)
    return torch.empty(max(l2_bytes, 1 << 20) * _L2_FLUSH_FACTOR, dtype=torch.uint8, device="cuda")
