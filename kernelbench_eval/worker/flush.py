"""The cache flush written before every timed CUDA call, which is also the call's launch cover (`percall`).

It evicts the last call's data (twice the L2 at least) and keeps the GPU writing for FLUSH_COVER_S at peak
bandwidth, so the host has launched the call's kernels before its start event fires. The refill ahead of it
does not count toward that cover: the host waits for the refill before it calls the model, so that nothing the
call launches on a stream of its own runs beside anything but the flush, which holds every SM (`flushkernel`).
One buffer per process, made once.
"""

from __future__ import annotations

import math

import torch

from kernelbench_eval.common.cudart import memory_bandwidth_gbs

_L2_FLUSH_FACTOR = 2  # write at least twice the L2 so nothing of the previous call stays cached
FLUSH_COVER_S = 150e-6  # and for this long at peak bandwidth: the host launches the call meanwhile

_FLUSH: list[torch.Tensor] = []


def flush_bytes(l2_bytes: int, bandwidth_gbs: float) -> int:
    """Bytes to write before a call: twice the L2 at least (eviction), and enough that the GPU stays busy for
    FLUSH_COVER_S at peak bandwidth (the cover), in whole 16-byte words (the kernel's stores)."""
    evict = max(l2_bytes, 1 << 20) * _L2_FLUSH_FACTOR
    return max(evict, int(bandwidth_gbs * 1e9 * FLUSH_COVER_S)) // 16 * 16


def l2_flush_buffer() -> torch.Tensor:
    """The byte buffer written whole before each timed call (`flush_bytes`). Made once per process."""
    if not _FLUSH:
        _FLUSH.append(torch.empty(flush_bytes(_l2_bytes(), memory_bandwidth_gbs() or 0), dtype=torch.uint8,
                                  device="cuda"))
    return _FLUSH[0]


def _l2_bytes() -> int:
    return getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0)


MAX_REPEATS = 256  # a cover of more than this many flushes (several ms) is not worth its wall time


def repeats_for(flush: torch.Tensor, cover_s: float, bandwidth_gbs: float | None = None) -> int:
    """How many times to write `flush` before a call so that the GPU stays busy for `cover_s` (at least once):
    a model whose host launches its kernels for longer than one flush (1_MLP's five modules, 0.16 ms on an H100;
    LeNet5's, 0.25 ms) otherwise leaves the GPU idle between its kernels inside the timed events, and what they
    measure is neither the device's time nor the call's (issue 35). Every write keeps every SM on the flush, as
    the first does."""
    if cover_s <= FLUSH_COVER_S:
        return 1
    one_s = flush.numel() / ((bandwidth_gbs or memory_bandwidth_gbs() or 1000.0) * 1e9)
    return min(MAX_REPEATS, 1 + math.ceil((cover_s - FLUSH_COVER_S) / max(one_s, 1e-6)))


def release_flush() -> None:
    """Drop the flush buffer (a parked checker keeps only its input sets and expected outputs)."""
    _FLUSH.clear()
