"""The worker's device memory between requests: what it gives back, how its allocator splits, what it reports.

Why: the checker and a candidate share one device (issue 34's memory plan counts both); memory one worker's
allocator keeps cached but unused is memory the other cannot have.
"""

from __future__ import annotations

import os
import warnings

from kernelbench_eval.worker.tensors import _torch, peak_memory

# Device memory this worker's allocator may keep unused after a request: the rest goes back to the device before
# the reply, for the other worker. The checker kept 14-25 GB cached after re-drawing a trial's inputs at
# KernelBench's current sizes (19_ReLU, 53_Min on an 80 GB card), where the candidate then ran out.
SLACK_BYTES = 1 << 30
# Blocks above this size are never split, so that a freed one is a whole segment the allocator can give back
# (a 12.9 GB float64 segment holding a 6.4 GB input set kept the other half from the candidate).
MAX_SPLIT_MB = 512


# Only after these: a timing measurement's requests (warm-up, timed calls, the checks between blocks) keep what
# they cached, or its timed calls would allocate from the device again (cudaMalloc inside the timed region: the
# reference's calls took 2-3x longer beside a candidate than alone, 21_Sigmoid 0.73 [0.18, 1.88]).
GIVE_BACK_AFTER = frozenset({"load", "prepare", "expect", "compare", "run", "close_exchange", "park"})


def give_back(op: str, device: str) -> None:
    if device == "cuda" and op in GIVE_BACK_AFTER:
        cuda = _torch().cuda
        if cuda.is_initialized() and cuda.memory_reserved() - cuda.memory_allocated() > SLACK_BYTES:
            cuda.empty_cache()


def allocator_settings() -> None:
    """MAX_SPLIT_MB for this worker's CUDA allocator (before its first allocation), unless the user set one."""
    if "PYTORCH_CUDA_ALLOC_CONF" in os.environ or "PYTORCH_ALLOC_CONF" in os.environ:
        return
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (renamed in newer torch; the old name still works)
            _torch().cuda.memory._set_allocator_settings(f"max_split_size_mb:{MAX_SPLIT_MB}")
    except Exception:  # an older torch or no CUDA: the allocator's defaults
        pass


TRACE = bool(os.environ.get("KBEVAL_MEMORY_TRACE"))  # a line per request in the worker's log: what it holds


def trace(op: str, device: str) -> None:
    """`memory op=... allocated=... reserved=... peak=... free=...` (GB), for finding where a device's memory went."""
    if TRACE and device == "cuda" and _torch().cuda.is_initialized():
        cuda = _torch().cuda
        held = f"allocated={cuda.memory_allocated() / 1e9:.2f} reserved={cuda.memory_reserved() / 1e9:.2f}"
        print(f"memory op={op} {held} peak={cuda.max_memory_allocated() / 1e9:.2f} "
              f"free={cuda.mem_get_info()[0] / 1e9:.2f}", flush=True)


def peak(device: str) -> int | None:
    """The worker's peak memory so far (`peak_memory`), without starting CUDA where nothing has."""
    if device == "cuda" and not _torch().cuda.is_initialized():
        return None
    return peak_memory(device)
