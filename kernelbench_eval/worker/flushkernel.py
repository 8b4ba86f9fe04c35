"""The flush before a timed CUDA call as one kernel that holds every SM while it runs (issue 36, class 6).

A candidate can launch its kernels on a stream of its own that does not wait for the caller's (a high-priority
one, even): they start as soon as they are queued, while the flush that covers the call's launch is still
running, before the start event. `torch.zero_` writes the flush in many short blocks, so the candidate's blocks
are scheduled between them (or ahead of them, from a higher-priority stream): a 0.3 ms matmul timed from the
start event measured what outlasted the flush. This kernel is launched with as many resident blocks as every SM
holds (the warps of an SM all taken: `full`), each writing its share of the eviction buffer (four 16-byte words
a thread a step) and then waiting on the device's clock until the launch cover has passed, so no other kernel's
block can be resident until it ends; stream priority orders pending blocks, it never evicts running ones.
Waiting on the clock, rather than writing the buffer again and again until the cover is spent (as `zero_`
must), makes the cover as long as asked and no longer: the repeated writes ran at about a third of the
bandwidth they were sized for on an H200, and a 0.42 ms cover took 1.3 ms (2026-11-28, 71_Conv2d). With the
host waiting for the refill before it calls the model (`percall.launch`), nothing the call launches can run
before the flush has all but ended.

It is PTX, compiled by the driver when first used (milliseconds, no compiler needed); where the driver cannot
be reached the flush falls back to `zero_`, and `holds_every_sm()` says so.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

BLOCK = 256  # threads a block: every SM's thread limit (1536, 2048) is a multiple of it
_WORD = 16  # bytes one thread writes at a time (a v4.u32 store)

_PTX = rb"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry kbeval_flush(.param .u64 p_buffer, .param .u64 p_words, .param .u64 p_cover_ns)
.maxntid 256, 1, 1
.maxnreg 32
{
    .reg .pred %p<4>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<16>;

    mov.u64 %rd13, %globaltimer;
    ld.param.u64 %rd1, [p_buffer];
    ld.param.u64 %rd2, [p_words];
    ld.param.u64 %rd14, [p_cover_ns];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %tid.x;
    mov.u32 %r5, %nctaid.x;
    mul.wide.u32 %rd3, %r3, %r2;
    cvt.u64.u32 %rd4, %r4;
    add.s64 %rd3, %rd3, %rd4;
    mul.wide.u32 %rd5, %r5, %r2;
    mul.lo.u64 %rd10, %rd5, 3;
    shl.b64 %rd11, %rd5, 2;
    shl.b64 %rd12, %rd5, 4;
    mov.u32 %r7, 0;
    mov.u64 %rd6, %rd3;
$L_four:
    add.s64 %rd9, %rd6, %rd10;
    setp.ge.u64 %p2, %rd9, %rd2;
    @%p2 bra $L_one;
    shl.b64 %rd7, %rd6, 4;
    add.s64 %rd8, %rd1, %rd7;
    st.global.v4.u32 [%rd8], {%r7, %r7, %r7, %r7};
    add.s64 %rd8, %rd8, %rd12;
    st.global.v4.u32 [%rd8], {%r7, %r7, %r7, %r7};
    add.s64 %rd8, %rd8, %rd12;
    st.global.v4.u32 [%rd8], {%r7, %r7, %r7, %r7};
    add.s64 %rd8, %rd8, %rd12;
    st.global.v4.u32 [%rd8], {%r7, %r7, %r7, %r7};
    add.s64 %rd6, %rd6, %rd11;
    bra.uni $L_four;
$L_one:
    setp.ge.u64 %p3, %rd6, %rd2;
    @%p3 bra $L_wait;
    shl.b64 %rd7, %rd6, 4;
    add.s64 %rd8, %rd1, %rd7;
    st.global.v4.u32 [%rd8], {%r7, %r7, %r7, %r7};
    add.s64 %rd6, %rd6, %rd5;
    bra.uni $L_one;
$L_wait:
    mov.u64 %rd15, %globaltimer;
    sub.u64 %rd15, %rd15, %rd13;
    setp.ge.u64 %p1, %rd15, %rd14;
    @%p1 bra $L_done;
    nanosleep.u32 256;
    bra.uni $L_wait;
$L_done:
    ret;
}
"""


@dataclass(frozen=True)
class Kernel:
    """The loaded flush kernel of one device: its handle, its grid (every SM's resident blocks) and whether
    those blocks take every warp of an SM."""
    lib: ctypes.CDLL
    function: ctypes.c_void_p
    grid: int
    full: bool


_KERNELS: dict[int, Kernel | None] = {}
_ERRORS: dict[int, str] = {}


def _load(device: int) -> Kernel:
    lib = ctypes.CDLL("libcuda.so.1")
    module, function = ctypes.c_void_p(), ctypes.c_void_p()
    _check(lib, lib.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(_PTX)), "cuModuleLoadData")
    _check(lib, lib.cuModuleGetFunction(ctypes.byref(function), module, b"kbeval_flush"), "cuModuleGetFunction")
    blocks = ctypes.c_int()
    _check(lib, lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(blocks), function, BLOCK,
                                                                 ctypes.c_size_t(0)), "occupancy")
    props = torch.cuda.get_device_properties(device)
    per_sm = max(1, blocks.value)
    full = per_sm * BLOCK >= getattr(props, "max_threads_per_multi_processor", 2048)
    return Kernel(lib, function, props.multi_processor_count * per_sm, full)


def _check(lib: ctypes.CDLL, code: int, what: str) -> None:
    if code:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(code, ctypes.byref(name))
        raise RuntimeError(f"{what}: {(name.value or b'?').decode()} ({code})")


def kernel() -> Kernel | None:
    """The current device's flush kernel, loaded once per process; None where the driver would not load it."""
    device = torch.cuda.current_device()
    if device not in _KERNELS:
        torch.cuda.synchronize(device)  # a runtime call: the primary context made current, for the module
        try:
            _KERNELS[device] = _load(device)
        except (OSError, AttributeError, RuntimeError) as exc:
            _KERNELS[device], _ERRORS[device] = None, str(exc)
    return _KERNELS[device]


def holds_every_sm() -> bool:
    """Whether the flush written here takes every warp of every SM while it runs (the defence above)."""
    k = kernel()
    return k is not None and k.full


def why_not() -> str | None:
    """Why the kernel could not be loaded on the current device, if it could not."""
    return _ERRORS.get(torch.cuda.current_device())


def describe() -> str:
    """How the flush before each timed call is written on the current device, as a verdict says it."""
    k = kernel()
    return describe_as(k.grid if k else None, bool(k and k.full), why_not())


def describe_as(grid: int | None, full: bool, error: str | None) -> str:
    if grid is None:
        return f"zero_ (the flush kernel did not load: {error}): work on other streams can run under it"
    if not full:
        return f"one kernel of {grid} blocks, short of every warp of every SM: work on other streams can run beside it"
    return f"one kernel holding every SM ({grid} blocks)"


def launch(buffer: torch.Tensor, cover_s: float, stream: torch.cuda.Stream) -> None:
    """Zero `buffer` (a byte buffer of whole 16-byte words, 16-byte aligned) once on `stream`, then hold every SM
    until `cover_s` has passed since each block began (the device's own clock, `%globaltimer`): the launch cover
    costs exactly its length, whatever the write's bandwidth. The kernel must be loaded (`kernel()`)."""
    k = kernel()
    assert k is not None, why_not()
    args = (ctypes.c_uint64(buffer.data_ptr()), ctypes.c_uint64(buffer.numel() // _WORD),
            ctypes.c_uint64(max(0, int(cover_s * 1e9))))
    params = (ctypes.c_void_p * 3)(*(ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in args))
    _check(k.lib, k.lib.cuLaunchKernel(k.function, k.grid, 1, 1, BLOCK, 1, 1, 0,
                                       ctypes.c_void_p(stream.cuda_stream), params, None), "cuLaunchKernel")
