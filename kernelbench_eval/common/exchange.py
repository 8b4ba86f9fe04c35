"""The one buffer a candidate and the reference's worker share: inputs go in, outputs come back, on the device.

Why: a candidate's outputs must be compared in a process it cannot reach, and copying a 2 GB output through
files and host memory for every trial and timed call cost tens of seconds per candidate. The reference's
worker (the *checker*) allocates this buffer and lends it to one candidate: it writes a set of inputs in,
the candidate copies them out into tensors of its own, runs, and copies its outputs in; the checker compares
them where they lie. On a GPU the buffer is a plain `cudaMalloc` allocation exported by CUDA IPC (never a
caching-allocator block, whose segment could hold the expected outputs); elsewhere, or where IPC fails, a
shared file mapping. The candidate sees the buffer and nothing else of the checker's memory.

Layouts (where each tensor sits) are computed by the harness from the reference's output metadata, so this
module imports torch lazily: the harness process never needs CUDA.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

from kernelbench_eval.messages import ExchangeInfo, Slot, TensorMeta

ALIGN = 256  # bytes: every tensor starts on a boundary any dtype and vectorised kernel is happy with
_IPC_HANDLE_BYTES = 64
_ITEM_BYTES = {"torch.float64": 8, "torch.float32": 4, "torch.float16": 2, "torch.bfloat16": 2, "torch.int64": 8,
               "torch.int32": 4, "torch.int16": 2, "torch.int8": 1, "torch.uint8": 1, "torch.bool": 1,
               "torch.complex64": 8, "torch.complex128": 16}


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def item_bytes(dtype: str) -> int:
    return _ITEM_BYTES.get(dtype, 8)


def output_layout(metas: list[TensorMeta], calls: int = 1) -> list[list[Slot]]:
    """Slots for `calls` sets of outputs shaped like `metas`, one after the other."""
    layout, offset = [], 0
    for _ in range(calls):
        slots = []
        for meta in metas:
            numel = 1
            for size in meta.shape or []:
                numel *= size
            slots.append(Slot(offset=offset, dtype=meta.dtype, shape=list(meta.shape or [])))
            offset += _aligned(numel * item_bytes(meta.dtype or ""))
        layout.append(slots)
    return layout


def layout_bytes(slots: list[Slot]) -> int:
    ends = [s.offset + _aligned(_numel(s.shape) * item_bytes(s.dtype or "")) for s in slots if s.dtype]
    return max(ends, default=0)


def slot_bytes(slot: Slot) -> int:
    return _numel(slot.shape) * item_bytes(slot.dtype or "")


def _numel(shape: list[int]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


class Exchange:
    """A byte buffer on `device` with typed views at slots; created by the checker, attached by a candidate."""

    def __init__(self, info: ExchangeInfo, buffer: Any, closer: Any = None) -> None:
        self.info = info
        self.buffer = buffer  # torch.uint8 tensor over the whole buffer
        self._closer = closer
        self._views: dict[tuple[int, str | None, tuple[int, ...]], Any] = {}

    # -- creation and attachment ---------------------------------------------------------------------

    @classmethod
    def create(cls, device: str, size: int, shm_dir: str | None, prefer_ipc: bool = True) -> Exchange:
        size = max(_aligned(size), ALIGN)
        if device == "cuda" and prefer_ipc:
            return _create_cuda(size)
        return _create_shm(size, shm_dir or "/dev/shm", device)

    @classmethod
    def attach(cls, info: ExchangeInfo, device: str) -> Exchange:
        if info.kind == "cuda_ipc":
            return _attach_cuda(info)
        return _attach_shm(info, device)

    def close(self) -> None:
        if self._closer is not None:
            self._closer()
            self._closer = None
        self.buffer = None
        self._views.clear()

    # -- typed access --------------------------------------------------------------------------------

    def view(self, slot: Slot) -> Any:
        """The typed tensor at `slot`, made once per slot: a timed call's hand-over reuses it (building views
        cost a candidate's worker 0.04 ms per call more than the checker's own copy, on a 2-core CPU host)."""
        key = (slot.offset, slot.dtype, tuple(slot.shape))
        if key not in self._views:
            self._views[key] = self._make_view(slot)
        return self._views[key]

    def _make_view(self, slot: Slot) -> Any:
        import torch

        dtype = getattr(torch, (slot.dtype or "torch.uint8").removeprefix("torch."))
        nbytes = slot_bytes(slot)
        if slot.offset < 0 or slot.offset + nbytes > self.info.size:
            raise ValueError(f"slot at {slot.offset} (+{nbytes} bytes) outside the {self.info.size}-byte exchange")
        return self.buffer[slot.offset:slot.offset + nbytes].view(dtype).view(slot.shape)

    def write(self, values: list[Any]) -> list[Slot]:
        """Put tensors (and plain values) in, one after the other; the slots say where."""
        import torch

        slots, offset = [], 0
        for value in values:
            if not isinstance(value, torch.Tensor):
                slots.append(Slot(value=value))
                continue
            slot = Slot(offset=offset, dtype=str(value.dtype), shape=list(value.shape))
            self.view(slot).copy_(value)
            slots.append(slot)
            offset += _aligned(value.numel() * value.element_size())
        return slots

    def aliases(self, device: str) -> bool:
        """Whether its views are memory a model on `device` can take as inputs (CUDA IPC on a GPU, a file mapping on
        the CPU); otherwise what is read out of it must be copied to the device."""
        return (self.info.kind == "cuda_ipc") == (device == "cuda")

    def views(self, slots: list[Slot]) -> list[Any]:
        """What `write` put in, where it lies (plain values as they were): no copy."""
        return [self.view(s) if s.dtype else s.value for s in slots]

    def read(self, slots: list[Slot], device: str) -> list[Any]:
        """Private copies of what `write` put in (plain values as they were)."""
        import torch

        return [torch.empty(s.shape, dtype=self.view(s).dtype, device=device).copy_(self.view(s)) if s.dtype
                else s.value for s in slots]


# -- shared file mapping (any device; the CPU path and the fallback when CUDA IPC is refused) ---------------


def _create_shm(size: int, directory: str, device: str) -> Exchange:
    import tempfile

    import torch

    where = directory if os.path.isdir(directory) and os.access(directory, os.W_OK) else tempfile.gettempdir()
    fd, path = tempfile.mkstemp(prefix="kbeval-exchange-", dir=where)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    buffer = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
    info = ExchangeInfo(kind="shm", handle=path, size=size)
    return Exchange(info, buffer, lambda: Path(path).unlink(missing_ok=True))


def _attach_shm(info: ExchangeInfo, device: str) -> Exchange:
    import torch

    if Path(info.handle).stat().st_size < info.size:
        raise ValueError("the exchange file is smaller than announced")
    return Exchange(info, torch.from_file(info.handle, shared=True, size=info.size, dtype=torch.uint8))


# -- CUDA IPC over raw cudaMalloc ------------------------------------------------------------------------


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_ubyte * _IPC_HANDLE_BYTES)]  # c_char would stop at the first NUL


class _DeviceArray:
    """A raw device pointer dressed as a CUDA array, so torch can view it without owning it."""

    def __init__(self, pointer: int, size: int) -> None:
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (pointer, False), "version": 3,
                                         "strides": None, "stream": None}


def _cudart() -> Any:
    from kernelbench_eval.common.cudart import cudart

    lib = cudart()
    if lib is None:
        raise OSError("the CUDA runtime library could not be found")
    return lib


def _check(code: int, what: str) -> None:
    if code != 0:
        lib = _cudart()
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        raise OSError(f"{what}: {lib.cudaGetErrorString(code).decode()} ({code})")


def _create_cuda(size: int) -> Exchange:
    import torch

    torch.cuda.init()
    lib = _cudart()
    pointer = ctypes.c_void_p()
    _check(lib.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(size)), "cudaMalloc")
    handle = _IpcHandle()
    try:
        _check(lib.cudaIpcGetMemHandle(ctypes.byref(handle), pointer), "cudaIpcGetMemHandle")
    except OSError:
        lib.cudaFree(pointer)
        raise
    buffer = torch.as_tensor(_DeviceArray(pointer.value or 0, size), device="cuda")
    info = ExchangeInfo(kind="cuda_ipc", handle=bytes(handle.reserved).hex(), size=size)

    def free() -> None:
        torch.cuda.synchronize()
        lib.cudaFree(pointer)

    return Exchange(info, buffer, free)


def _attach_cuda(info: ExchangeInfo) -> Exchange:
    import torch

    raw = bytes.fromhex(info.handle)
    if len(raw) != _IPC_HANDLE_BYTES:
        raise ValueError("malformed CUDA IPC handle")
    torch.cuda.init()
    lib = _cudart()
    handle = _IpcHandle()
    ctypes.memmove(ctypes.byref(handle), raw, _IPC_HANDLE_BYTES)
    pointer = ctypes.c_void_p()
    lib.cudaIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), _IpcHandle, ctypes.c_uint]
    _check(lib.cudaIpcOpenMemHandle(ctypes.byref(pointer), handle, 1), "cudaIpcOpenMemHandle")  # lazy peer access
    buffer = torch.as_tensor(_DeviceArray(pointer.value or 0, info.size), device="cuda")

    def close() -> None:
        torch.cuda.synchronize()
        lib.cudaIpcCloseMemHandle(pointer)

    return Exchange(info, buffer, close)
