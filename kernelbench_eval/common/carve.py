"""A candidate's timed calls allocate inside the exchange, so their outputs need no copy to reach the checker.

Why: copying each timed call's outputs into the exchange cost a 1.5 ms kernel of 71_Conv2d (a 520 MB output)
0.34 ms of GPU and 0.08 ms of host time per call, about a quarter of the call's wall time. While timed, a
candidate's worker allocates through a `torch.cuda.MemPool` whose raw allocator carves its segments from the
exchange's pool area (`ExchangeInfo.pool_offset` to its end), so the tensor a call returns already lies where
the checker reads. The worker reports where (`TimeReply.placed`); the harness takes only an offset from it
(dtype and shape stay the reference's), inside the exchange, and the checker compares what lies there: memory
the checker lent and never writes while timed, so pointing elsewhere can only show the wrong bytes. An
output that is not there (allocated before the call, not contiguous, a view) is copied into its slot, as
before.

Outputs stay in place where they are large (over half the kept-output budget, `measure.block_calls`:
71_Conv2d's 520 MB among them), in blocks of several calls (five of 71's), each call's held by the worker until
the block is checked, so the allocator never hands their memory to a later call. A model that hands out one
buffer again (a `self.out`) would still write over an earlier call's outputs before the check: the worker looks
for every output over memory an earlier call of the block left in place and says so, and the harness then
measures again in blocks of one call, each compared before the next runs. Buffers a model keeps are made in the
warm-up, outside the pool (`percall.warm_up` takes every input placement), so their outputs are copied anyway.
Smaller outputs are copied into their slots, as before (at most 256 MB a call).

The raw allocator is a pair of ctypes callbacks (no compiled shim to build, sign and trust). The caching
allocator asks it only for new segments, so it runs in the warm-up, not per timed call. A segment that does not
fit the area comes from `cudaMalloc`, as it would without the pool.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from typing import Any

from kernelbench_eval.common.cudart import cudart

SEGMENT_ALIGN = 2 << 20  # the caching allocator's large-segment granularity
POOL_SPARE = 2  # beyond a block's outputs, the pool area holds this many calls' more: intermediates land there too
POOL_MIN_BYTES = 64 << 20
POOL_SHARE = 0.25  # of the device's memory, at most, for the whole exchange
# Off unless asked for: on an H200, identical copies of KernelBench convolutions (level 1 57, 79, level 2 5, 100 at
# their current sizes) timed with every allocation of their calls in the pool area ran 1.2-1.9x slower than the
# reference (speedups 0.52-0.81), and 0.999-1.001 with it off (docs/benchmarks.md, "In-place outputs"): memory
# mapped from the checker's process is no place for a convolution's workspace. A run that wants the saved copies
# for models whose calls allocate nothing but their outputs sets KBEVAL_IN_PLACE=1.
IN_PLACE_VAR = "KBEVAL_IN_PLACE"


def in_place_enabled() -> bool:
    return os.environ.get(IN_PLACE_VAR) == "1"


def pool_bytes(slots: int, call_outputs: int, memory: int | None, calls: int = 1) -> int:
    """The pool area's size (0: none) beside `slots` bytes of exchange, for blocks of `calls` calls of
    `call_outputs` bytes each."""
    area = max((calls + POOL_SPARE) * call_outputs, POOL_MIN_BYTES)
    return area if memory and slots + area <= POOL_SHARE * memory else 0


_Alloc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
_Free = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)


class Carver:
    """Bump allocation over [start, end): segments handed out in order, never reused (the caching allocator
    above keeps them); what does not fit falls back to `cudaMalloc`. Pure arithmetic apart from the fallback,
    so the area's bookkeeping is testable without a GPU."""

    def __init__(self, start: int, end: int, fallback: Callable[[int], int] | None = None,
                 release: Callable[[int], None] | None = None) -> None:
        self.start, self.end, self.next = start, end, start
        self.fallback, self.release = fallback, release
        self.carved = self.fell_back = 0

    def alloc(self, size: int) -> int:
        begin = -(-self.next // SEGMENT_ALIGN) * SEGMENT_ALIGN
        if size > 0 and begin + size <= self.end:
            self.next = begin + size
            self.carved += 1
            return begin
        self.fell_back += 1
        return self.fallback(size) if self.fallback else 0

    def free(self, pointer: int) -> None:
        if not self.start <= pointer < self.end and self.release:
            self.release(pointer)

    def within(self, pointer: int, nbytes: int) -> bool:
        return self.start <= pointer and pointer + nbytes <= self.end


class ExchangePool:
    """The MemPool a candidate's timed calls allocate from, over the exchange's pool area."""

    def __init__(self, buffer: Any, pool_offset: int) -> None:
        import torch

        lib = cudart()
        base = buffer.data_ptr()
        self.base = base

        def fallback(size: int) -> int:
            pointer = ctypes.c_void_p()
            return (pointer.value or 0) if lib is not None and lib.cudaMalloc(
                ctypes.byref(pointer), ctypes.c_size_t(size)) == 0 else 0

        def release(pointer: int) -> None:
            if lib is not None:
                lib.cudaFree(ctypes.c_void_p(pointer))

        self.carver = carver = Carver(base + pool_offset, base + buffer.numel(), fallback, release)
        # the callbacks must outlive the pool (ctypes frees a callback's trampoline with the Python object), and
        # hold the carver themselves: the pool may free its segments while this object is torn down at exit
        self._alloc = _Alloc(lambda size, device, stream: carver.alloc(size))
        self._free = _Free(lambda pointer, size, device, stream: carver.free(pointer or 0))
        allocator = torch._C._cuda_customAllocator(ctypes.cast(self._alloc, ctypes.c_void_p).value,
                                                   ctypes.cast(self._free, ctypes.c_void_p).value)
        self.pool = torch.cuda.MemPool(allocator)

    def allocating(self) -> Any:
        """A context in which this thread's allocations come from the pool: the worker holds it over a whole
        timing request (warm-up and calls), outside the timed window, so entering it costs no call anything."""
        import torch

        return torch.cuda.use_mem_pool(self.pool)

    def offset_of(self, tensor: Any, nbytes: int) -> int | None:
        """Where `tensor`'s bytes begin in the exchange when all of them lie in the pool area, else None."""
        pointer = tensor.data_ptr()
        return pointer - self.base if self.carver.within(pointer, nbytes) else None
