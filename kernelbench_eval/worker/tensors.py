"""What both worker roles need: torch imported late, tensor descriptions, the sentinel fill, device names."""

from __future__ import annotations

import os
from typing import Any

from kernelbench_eval.common.memory import names_memory
from kernelbench_eval.messages import Slot, TensorMeta


def _torch() -> Any:
    import torch

    return torch


def _sync(device: str) -> None:
    if device == "cuda":
        _torch().cuda.synchronize()


def _device_name(device: str) -> str:
    torch = _torch()
    if device == "cuda":
        return torch.cuda.get_device_name()
    import platform

    return f"{platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


def _memory_bytes(device: str) -> int | None:
    """The device's total memory (the host's for the CPU); None where it is not reported."""
    if device == "cuda":
        return int(_torch().cuda.get_device_properties(_torch().cuda.current_device()).total_memory)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        return None


def free_memory(device: str) -> int | None:
    """Bytes free on the device now (CUDA: the driver's count, other processes' use excluded; CPU: the host's
    available memory); None where it is not reported."""
    if device == "cuda":
        return int(_torch().cuda.mem_get_info()[0])
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is an allocation that failed (CUDA's, or the host's)."""
    oom = getattr(_torch(), "OutOfMemoryError", None)
    return isinstance(exc, MemoryError) or (oom is not None and isinstance(exc, oom)) or (
        isinstance(exc, RuntimeError) and names_memory(str(exc)))


def peak_memory(device: str, reset: bool = False) -> int:
    """This process's peak memory so far (CUDA: the allocator's, on the device, `reset` starting it again at what
    is held now; CPU: the peak resident size, which cannot be reset)."""
    if device == "cuda":
        torch = _torch()
        if reset:
            torch.cuda.reset_peak_memory_stats()
        return int(torch.cuda.max_memory_allocated())
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _nbytes(x: Any) -> int:
    torch = _torch()
    return x.numel() * x.element_size() if isinstance(x, torch.Tensor) else 0


def fill_free_memory(device: str, byte: int, hint_bytes: int) -> None:
    """Write `byte` over memory the allocator will hand out next, so reads of uninitialised memory show.

    A large block (several times the inputs) and a spread of small ones are filled and freed back to
    the allocator's cache, where `torch.empty` in the model will find them.
    """
    torch = _torch()
    size = max(4 * hint_bytes, 64 << 20)
    if device == "cuda":
        torch.cuda.synchronize()
        size = min(size, torch.cuda.mem_get_info()[0] // 4)  # the checker and the model need the rest
    blocks = [torch.full((size,), byte, dtype=torch.uint8, device=device)]
    blocks += [torch.full((s,), byte, dtype=torch.uint8, device=device) for s in (512, 4096, 65536, 524288) * 16]
    _sync(device)
    del blocks


def _describe(x: Any) -> str:
    torch = _torch()
    if isinstance(x, torch.Tensor):
        return f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}"
    return repr(x)


def _meta(x: Any) -> TensorMeta:
    torch = _torch()
    if not isinstance(x, torch.Tensor):
        return TensorMeta(type_name=type(x).__qualname__, exact_tensor=False)
    return TensorMeta(
        type_name=type(x).__qualname__,
        exact_tensor=type(x) is torch.Tensor,
        device=str(x.device),
        dtype=str(x.dtype),
        shape=list(x.shape),
    )


def as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def fits(metas: list[TensorMeta], slots: list[Slot]) -> bool:
    """Whether outputs described by `metas` can be copied into `slots` as they are (no cast, no reshape)."""
    return len(metas) == len(slots) and all(
        m.exact_tensor and m.dtype == s.dtype and m.shape == s.shape for m, s in zip(metas, slots, strict=True))


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:400]}"
