"""Launch accounting: what actually ran during one forward, the candidate's own kernels or library ones.

A "fused CUDA kernel" candidate that calls `torch.matmul` and a tiny custom kernel, or none at all, is
correct and maybe fast, but it is not what it claims. `kernels_of` profiles one forward (after a warm-up)
with `torch.profiler` and the Python tracer (`with_stack=True`) and sorts what ran:

- **custom**: a call into a native module the candidate loaded from outside the installed packages (a
  `load_inline`/`load` extension: the tracer records it as `<built-in method NAME of ... object at ADDR>`,
  matched by name and address against the functions of those modules, never by name alone), an operator of a
  non-library namespace (`TORCH_LIBRARY(myext, ...)`), or a Triton `@triton.jit` launch. While it profiles,
  each such function, wherever a module refers to it, is called inside a `kbeval::extension::NAME` range
  (`marks.extensions_marked`): some builds' Python tracer records no C call at all.
- **library**: the outermost `aten::` (and other torch-namespace) operators outside any custom call, and
  whatever runs inside torch.compile's code (`marks.inductor_marked`), custom-looking or not.

On the CPU there are no kernels to count, so each outermost call is one unit and time is its wall time in
the profiler (an aten op nested inside an extension call, like the `torch::empty` that allocates its
output, belongs to that custom call). On CUDA, each device kernel is attributed through its launch: the
runtime launch event with the kernel's correlation id, and the CPU events above it; a kernel whose launch
cannot be found is sorted by its name (`at::`, cuBLAS, cuDNN, CUTLASS patterns are library). Shares are of
device time on CUDA and of profiled op time on the CPU.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from kernelbench_eval.judge.marks import (
    EXTENSION_MARK,
    INDUCTOR_MARK,
    extension_functions,
    extensions_marked,
    identities,
    inductor_marked,
    live_modules,
)
from kernelbench_eval.records import KernelCount, KernelRow

LIBRARY_NAMESPACES = frozenset({"aten", "prim", "prims", "c10d", "_c10d_functional", "profiler", "quantized",
                                "mkldnn", "onednn", "cudnn", "_quantized", "torchvision", "inductor", "autograd",
                                "c10", "at", "torch", "cuda"})
_PYBIND_CALL = re.compile(r"^<built-in (?:method|function) (\w+)(?: of .* object at (0x[0-9a-f]+))?>$")
_TRITON_FRAME = re.compile(r"triton/runtime/(jit|autotuner)\.py\(\d+\): (run|__call__)")
_LIBRARY_KERNEL = re.compile(r"at::|aten|cublas|cudnn|cutlass|xmma|gemm|gemv|sgemm|hgemm|cutensor|nccl|"
                             r"Memcpy|Memset|elementwise_kernel|reduce_kernel|triton_(poi|red|per|tem)_",
                             re.IGNORECASE)
FORWARD = "kbeval::forward"  # marks the profiled call; what ran outside it is not the model's
MARKS = "kbeval::"  # FORWARD and the `marks` ranges: each also shows as a GPU annotation, which is no kernel
NO_CUSTOM_WARNING = "no custom kernel ran: every kernel of one forward came from PyTorch's libraries"


@dataclass
class Counted:
    count: KernelCount
    rows: list[KernelRow]


def kernels_of(model: Any, inputs: list[Any], device: str) -> KernelCount:
    """Custom against library kernels (GPU) or calls (CPU) of one forward of `model` on `inputs`."""
    return profile_model(model, inputs, device).count


def warning_for(count: KernelCount | None) -> str | None:
    """The verdict's `kernels_warning`: set when nothing the candidate wrote ran."""
    return NO_CUSTOM_WARNING if count is not None and count.custom == 0 else None


def profile_model(model: Any, inputs: list[Any], device: str, warmup: int = 1, python_tracer: bool = True
                  ) -> Counted:
    """Profile one forward after `warmup` untimed calls (at least one: lazy init and JIT stay out).
    `python_tracer` False stands for a build whose tracer records no C calls (the marks must then do)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch.no_grad():
        for _ in range(max(1, warmup)):
            model(*inputs)
        _sync(device)
        modules = live_modules()  # once, after the warm-up loaded what the model loads: gc's walk is the cost
        extensions = extension_functions(modules)
        # The first traced session pays one-off costs (tracer start, first op under the profiler): trace two,
        # keep the second.
        for _ in range(2):
            with extensions_marked(modules, extensions), inductor_marked(), \
                    profile(activities=activities, with_stack=python_tracer) as prof:
                torch.zeros(1)  # the first op recorded pays the session's start-up: not one of the model's
                with record_function(FORWARD):
                    model(*inputs)
                    _sync(device)
    events = list(prof.events())
    cpu = torch.autograd.DeviceType.CPU  # device kernels stay; CPU events only from inside the forward
    events = [e for e in events if e.device_type != cpu
              or (e.name != FORWARD and any(a.name == FORWARD for a in _ancestors(e)))]
    functions = identities(extensions)
    units = _cuda_units(events, functions) if device == "cuda" else _cpu_units(events, functions)
    return _summarise(units, device)


def is_custom_event(name: str, functions: set[tuple[str, str | None]]) -> bool:
    """A CPU event that is the candidate's own: an extension call, a custom-namespace op, a Triton launch."""
    if name in (FORWARD, INDUCTOR_MARK):
        return False
    if name.startswith(EXTENSION_MARK):
        return True
    match = _PYBIND_CALL.match(name)
    if match:
        return (match.group(1), match.group(2)) in functions
    if _TRITON_FRAME.search(name):
        return True
    namespace, sep, _ = name.partition("::")
    return bool(sep) and namespace.isidentifier() and namespace not in LIBRARY_NAMESPACES


def _is_library_event(name: str) -> bool:
    if name == INDUCTOR_MARK:
        return True
    namespace, sep, _ = name.partition("::")
    return bool(sep) and namespace in LIBRARY_NAMESPACES


def _ancestors(event: Any) -> list[Any]:
    chain, parent = [], event.cpu_parent
    while parent is not None:
        chain.append(parent)
        parent = parent.cpu_parent
    return chain


Unit = tuple[str, str, float]  # (kind, display name, microseconds)


def _cpu_units(events: list[Any], functions: set[tuple[str, str | None]]) -> list[Unit]:
    """Outermost custom calls, and outermost library ops outside them, with their wall time."""
    units: list[Unit] = []
    for event in events:
        name = event.name
        custom = is_custom_event(name, functions)
        if not custom and not _is_library_event(name):
            continue
        above = _ancestors(event)
        if any(is_custom_event(a.name, functions) or _is_library_event(a.name) for a in above):
            continue
        units.append(("custom" if custom else "library", _display(name), event.time_range.elapsed_us()))
    return units


def _cuda_units(events: list[Any], functions: set[tuple[str, str | None]]) -> list[Unit]:
    """Every device kernel: custom when it was launched under a custom call (the profiler links each CPU
    event to the kernels it launched), library when under anything else, by name when unlinked."""
    from torch.autograd import DeviceType

    launched_by: dict[str, bool] = {}  # kernel name -> launched under a custom call (any launch of it)
    for event in events:
        if event.device_type != DeviceType.CPU or not getattr(event, "kernels", None):
            continue
        chain = [event, *_ancestors(event)]
        custom = (not any(a.name == INDUCTOR_MARK for a in chain)  # torch.compile's kernels are PyTorch's
                  and any(is_custom_event(a.name, functions) for a in chain))
        for kernel in event.kernels:
            launched_by[kernel.name] = launched_by.get(kernel.name, False) or custom
    units: list[Unit] = []
    for event in events:
        if event.device_type != DeviceType.CUDA or event.name.startswith(MARKS):  # our ranges' GPU annotations
            continue
        custom = launched_by.get(event.name)
        if custom is None:
            custom = not _LIBRARY_KERNEL.search(event.name)
        units.append(("custom" if custom else "library", event.name, event.time_range.elapsed_us()))
    return units


def _display(name: str) -> str:
    if name == INDUCTOR_MARK:
        return "torch.compile (inductor)"
    match = _PYBIND_CALL.match(name)
    if match or name.startswith(EXTENSION_MARK):
        return f"{match.group(1) if match else name.removeprefix(EXTENSION_MARK)} (extension)"
    frame = _TRITON_FRAME.search(name)
    return "triton launch" if frame else name


def _summarise(units: list[Unit], device: str) -> Counted:
    total_us = sum(us for _, _, us in units)
    custom_us = sum(us for kind, _, us in units if kind == "custom")
    grouped: dict[tuple[str, str], list[float]] = defaultdict(list)
    for kind, name, us in units:
        grouped[(kind, name)].append(us)
    rows = [KernelRow(name=name, kind=kind, calls=len(times), total_ms=sum(times) / 1e3,  # type: ignore[arg-type]
                      mean_ms=sum(times) / len(times) / 1e3, share=sum(times) / total_us if total_us else 0.0)
            for (kind, name), times in grouped.items()]
    rows.sort(key=lambda r: (-r.total_ms, r.name))
    count = KernelCount(custom=sum(1 for u in units if u[0] == "custom"),
                        library=sum(1 for u in units if u[0] == "library"),
                        custom_share=custom_us / total_us if total_us else 0.0, device=device)  # type: ignore[arg-type]
    return Counted(count=count, rows=rows)


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
