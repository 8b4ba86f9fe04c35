"""What timing asks of the CUDA runtime and the device beyond torch's API: the runtime library itself (for the
calls torch does not expose), resetting persisting L2 lines, a launch's pending error, the device's peak
memory bandwidth and the floor under an event pair. Nothing here initialises CUDA at import."""

from __future__ import annotations

import ctypes

import torch


def memory_bandwidth_gbs() -> float | None:
    """Peak DRAM bandwidth from the device's memory clock and bus width (double data rate), if reported."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    clock_khz = getattr(props, "memory_clock_rate", 0)
    bus_bits = getattr(props, "memory_bus_width", 0)
    if not clock_khz or not bus_bits:
        return None
    return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9


def _cudart() -> ctypes.CDLL | None:
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


_CUDART: list[ctypes.CDLL | None] = []


def cudart() -> ctypes.CDLL | None:
    """The CUDA runtime torch loaded, for the calls torch does not expose; None where it cannot be found."""
    if not _CUDART:
        _CUDART.append(_cudart())
    return _CUDART[0]


def reset_persisting_l2() -> None:
    """Demote persisting L2 lines, so a candidate's access-policy window cannot keep its data warm."""
    lib = cudart()
    if lib is not None:
        lib.cudaCtxResetPersistingL2Cache()


def last_launch_error() -> str | None:
    """The runtime's pending error (a launch that failed without raising), cleared; None when there is none."""
    lib = cudart()
    if lib is None:
        return None
    code = lib.cudaGetLastError()
    if code == 0:
        return None
    lib.cudaGetErrorName.restype = ctypes.c_char_p
    return f"{lib.cudaGetErrorName(code).decode()} ({code})"


def event_overhead_ms(reps: int = 50) -> float:
    """Median time of an empty event pair: the floor under every CUDA-event measurement."""
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end))
    return sorted(samples)[len(samples) // 2]
