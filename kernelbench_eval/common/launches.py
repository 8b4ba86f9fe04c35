"""Launch accounting: what actually ran during one forward, the candidate's own kernels or library ones.

A "fused CUDA kernel" candidate that calls `torch.matmul` and a tiny custom kernel, or none at all, is
correct and maybe fast, but it is not what it claims. `kernels_of` profiles one forward (after a warm-up)
with `torch.profiler` and the Python tracer (`with_stack=True`) and sorts what ran by the binary it came from,
never by a name the candidate can give a range (`record_function("fused::gelu")` around plain PyTorch counted
as 100 % custom before, and so did an extension whose function only calls `at::addmm` and `at::gelu`):

- **custom**: a call into a native module the candidate loaded from outside the installed packages (a
  `load_inline`/`load` extension: the tracer records it as `<built-in method NAME of ... object at ADDR>`,
  matched by name and address against the functions of those modules, never by name alone), a dispatcher op
  of a non-library namespace whose kernel was registered from the candidate's own extension sources
  (`marks.registered_by`: `TORCH_LIBRARY(myext, ...)`; a range or a Python-registered op of that name is not),
  or a Triton `@triton.jit` launch (a Python frame, never a range). While it profiles, each extension function,
  wherever a module refers to it, is called inside a range named with a secret drawn for this profile
  (`marks.session_mark`): some builds' Python tracer records no C call at all, and a candidate could open a
  range of the public name itself. User ranges are otherwise transparent: neither custom nor library.
- **library**: torch-namespace operators, and whatever runs inside torch.compile's code (`marks.inductor_marked`).
  Library work called from inside an extension is library work: an aten op nested in a custom call is a
  library unit of its own, and its time is taken off the call's (allocation and view ops, `NEUTRAL_OPS`, stay
  with the call: they compute nothing).

On the CPU each such unit is one "kernel" and its time is its profiled wall time (a custom call's less the
library ops inside it). On CUDA each device kernel is attributed through its launch: the runtime launch event
with the kernel's correlation id, and the nearest attributed event above it (an aten op launches library
kernels even inside an extension; an extension's own launch has the extension call as its nearest); a kernel
whose launch cannot be found is sorted by its name (`at::`, cuBLAS, cuDNN, CUTLASS patterns are library). Shares
are of device time on CUDA and of profiled op time on the CPU.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from kernelbench_eval.common.marks import (
    EXTENSION_MARK,
    INDUCTOR_MARK,
    extension_functions,
    extension_roots,
    extensions_marked,
    identities,
    inductor_marked,
    live_modules,
    registered_by,
    session_mark,
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
# ops that allocate or re-view memory and compute nothing: inside an extension they stay with its call
NEUTRAL_OPS = frozenset(f"aten::{op}" for op in (
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "view", "reshape", "_reshape_alias",
    "as_strided", "resize_", "detach", "detach_", "alias", "t", "transpose", "permute", "expand", "select", "slice",
    "unsqueeze", "squeeze", "contiguous", "to", "lift_fresh", "resolve_conj", "resolve_neg", "size", "stride",
    "numel", "dim", "result_type", "unbind", "split", "narrow", "flatten", "unflatten", "view_as", "expand_as"))


@dataclass
class Attribution:
    """What makes an event the candidate's own in one profile: its extension functions (name, address), the
    session's secret range name, and the folders its extensions were built in (for registered ops)."""

    functions: set[tuple[str, str | None]]
    mark: str = EXTENSION_MARK
    roots: tuple[str, ...] = ()
    ops: dict[str, bool] = field(default_factory=dict)  # namespace op -> registered from the candidate's sources

    def kind(self, event: Any) -> str | None:
        """"custom", "library", or None (transparent: a range, a Python frame, a view) for one profiler event."""
        name = event.name
        if name.startswith(self.mark) and len(self.mark) > len(EXTENSION_MARK):
            return "custom"
        if name == INDUCTOR_MARK:
            return "library"
        if name.startswith(EXTENSION_MARK) or getattr(event, "is_user_annotation", False) or name == FORWARD:
            return None  # a range anyone can open: a name is no evidence
        match = _PYBIND_CALL.match(name)
        if match:
            return "custom" if (match.group(1), match.group(2)) in self.functions else None
        if _TRITON_FRAME.search(name):
            return "custom"
        namespace, sep, _ = name.partition("::")
        if not sep or not namespace.isidentifier():
            return None
        if namespace in LIBRARY_NAMESPACES:
            return None if name in NEUTRAL_OPS else "library"
        if name not in self.ops:
            self.ops[name] = registered_by(name, self.roots)
        return "custom" if self.ops[name] else None


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
        attribution = Attribution(identities(extensions), session_mark(), extension_roots(extensions))
        # The first traced session pays one-off costs (tracer start, first op under the profiler): trace two,
        # keep the second.
        for _ in range(2):
            with extensions_marked(modules, extensions, attribution.mark), inductor_marked(), \
                    profile(activities=activities, with_stack=python_tracer) as prof:
                torch.zeros(1)  # the first op recorded pays the session's start-up: not one of the model's
                with record_function(FORWARD):
                    model(*inputs)
                    _sync(device)
    events = list(prof.events())
    cpu = torch.autograd.DeviceType.CPU  # device kernels stay; CPU events only from inside the forward
    events = [e for e in events if e.device_type != cpu
              or (e.name != FORWARD and any(a.name == FORWARD for a in _ancestors(e)))]
    units = _cuda_units(events, attribution) if device == "cuda" else _cpu_units(events, attribution)
    return _summarise(units, device)


def is_custom_event(name: str, attribution: Attribution) -> bool:
    """Whether a CPU event of this name (not a user range) is the candidate's own."""
    return attribution.kind(_Named(name)) == "custom"


@dataclass
class _Named:
    name: str


def _ancestors(event: Any) -> list[Any]:
    chain, parent = [], event.cpu_parent
    while parent is not None:
        chain.append(parent)
        parent = parent.cpu_parent
    return chain


Unit = tuple[str, str, float]  # (kind, display name, microseconds)


def _owner(event: Any, kinds: dict[int, str | None]) -> Any:
    """The nearest attributed event above `event` (custom or library), or None."""
    return next((a for a in _ancestors(event) if kinds.get(id(a))), None)


def _cpu_units(events: list[Any], attribution: Attribution) -> list[Unit]:
    """Outermost custom calls and library ops, and library ops directly inside a custom call (library work the
    extension asked for), each with its wall time; a custom call's time is less the library ops inside it."""
    kinds = {id(e): attribution.kind(e) for e in events}
    picked: list[tuple[Any, str, Any]] = []  # (event, kind, the custom call it lies in)
    for event in events:
        kind = kinds[id(event)]
        if kind is None:
            continue
        owner = _owner(event, kinds)
        if owner is None:
            picked.append((event, kind, None))
        elif kind == "library" and kinds[id(owner)] == "custom":
            picked.append((event, kind, owner))
    inside: dict[int, float] = defaultdict(float)
    for event, _, owner in picked:
        if owner is not None:
            inside[id(owner)] += event.time_range.elapsed_us()
    return [(kind, _display(event.name, attribution), max(0.0, event.time_range.elapsed_us() - inside[id(event)]))
            for event, kind, _ in picked]


def _cuda_units(events: list[Any], attribution: Attribution) -> list[Unit]:
    """Every device kernel: custom when the nearest attributed event above its launch is a custom call (the
    profiler links each CPU event to the kernels it launched), library when it is a library op or anything runs
    under torch.compile's range, by name when unlinked."""
    from torch.autograd import DeviceType

    kinds = {id(e): attribution.kind(e) for e in events}
    launched_by: dict[str, bool] = {}  # kernel name -> launched from a custom call's own code (any launch of it)
    for event in events:
        if event.device_type != DeviceType.CPU or not getattr(event, "kernels", None):
            continue
        chain = [event, *_ancestors(event)]
        nearest = next((kinds[id(a)] for a in chain if kinds.get(id(a))), None)
        custom = nearest == "custom" and not any(a.name == INDUCTOR_MARK for a in chain)
        for kernel in event.kernels:
            launched_by[kernel.name] = launched_by.get(kernel.name, False) or custom
    units: list[Unit] = []
    for event in events:
        if event.device_type != DeviceType.CUDA or event.name.startswith(MARKS) \
                or getattr(event, "is_user_annotation", False):  # ranges' GPU annotations are no kernels
            continue
        custom = launched_by.get(event.name)
        if custom is None:
            custom = not _LIBRARY_KERNEL.search(event.name)
        units.append(("custom" if custom else "library", event.name, event.time_range.elapsed_us()))
    return units


def _display(name: str, attribution: Attribution) -> str:
    if name == INDUCTOR_MARK:
        return "torch.compile (inductor)"
    match = _PYBIND_CALL.match(name)
    if match or name.startswith(attribution.mark):
        return f"{match.group(1) if match else name.removeprefix(attribution.mark)} (extension)"
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
