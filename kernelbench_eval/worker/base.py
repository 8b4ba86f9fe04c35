"""What every worker is, whichever its role: the modules it imported, the models it built from them, the device they
run on and the input sets it holds; and the ops both roles answer that build and profile a model.

A role's worker (`reference.CheckerWorker`, `candidate.CandidateWorker`) adds its own ops and names every op it
answers in its table (`OPS`, op -> handler); `main.serve` refuses any other.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from typing import Any, ClassVar

from kernelbench_eval.common import cudart
from kernelbench_eval.common.precision import cast_model
from kernelbench_eval.messages import LoadReply, ProfileReply, Reply
from kernelbench_eval.requests import ImportRequest, LoadRequest, ProfileRequest
from kernelbench_eval.worker import namespace
from kernelbench_eval.worker.tensors import _device_name, _memory_bytes, _one_line, _torch

Handler = Callable[[Any, Any], Reply]  # (the worker, its request) -> its reply
Ops = dict[str, Handler]


class WorkerBase:
    """One model's process: its modules, models and input sets, and the ops that load and profile a model."""

    OPS: ClassVar[Ops] = {}  # a role's table: every op it answers

    def __init__(self) -> None:
        self.modules: dict[str, Any] = {}  # by path (a candidate's: and its problem's)
        self.models: dict[str, Any] = {}  # by name: "main", or "compiled" for the torch.compile baseline
        self.builders: dict[str, Callable[[], Any]] = {}  # how `op_load` built each model, to build it again
        self.device = "cpu"  # the models' device, once one is loaded
        self.sets: dict[str, list[Any]] = {}  # input sets by name ("trial0", "timing1"), on the model's device

    def op_load(self, req: LoadRequest) -> LoadReply:
        torch = _torch()
        if req.threads:
            torch.set_num_threads(req.threads)
        self.device = req.device or "cpu"
        module = self._module(req.path, req.problem, req.dims)
        cls = getattr(module, req.class_name or "", None)
        if not isinstance(cls, type):
            return LoadReply(ok=False, error_kind="load_error", error=missing_class(module, req))
        init = torch.load(req.init_file, weights_only=True)
        torch.manual_seed(req.init_seed or 0)
        try:
            model = cls(*init)
        except Exception as exc:  # a wrong __init__ signature is the candidate's fault, not a crash
            return LoadReply(ok=False, error_kind="load_error", error=f"{req.class_name}(*init): {_one_line(exc)}")
        model = cast_model(model.to(self.device) if hasattr(model, "to") else model, req.precision)
        self.models[req.model] = torch.compile(model, mode=req.compile_mode) if req.compile_mode else model
        self.builders[req.model] = lambda: self._build(cls, init, req)  # the same model, from a fresh start
        reply = LoadReply(ok=True, device_name=_device_name(self.device), torch_version=torch.__version__,
                          memory_bytes=_memory_bytes(self.device))
        if self.device == "cuda":
            reply.memory_bandwidth_gbs = cudart.memory_bandwidth_gbs()
            reply.event_overhead_ms = cudart.event_overhead_ms()
        return reply

    def _build(self, cls: type, init: list[Any], req: LoadRequest) -> Any:
        """`cls(*init)` as `op_load` built it (same seed, device, precision): a stateful reference starts again."""
        torch = _torch()
        torch.manual_seed(req.init_seed or 0)
        model = cls(*init)
        return cast_model(model.to(self.device) if hasattr(model, "to") else model, req.precision)

    def op_profile(self, req: ProfileRequest) -> ProfileReply:
        """Launch accounting (`launches.py`) of one forward on set `name` or `inputs_file`, after `req.warmup` calls."""
        from kernelbench_eval.common.launches import profile_model

        torch = _torch()
        if req.name:  # an input set this worker holds (a judged candidate's), on fresh copies
            inputs = [x.clone() if isinstance(x, torch.Tensor) else x for x in self.sets[req.name]]
        else:
            inputs = [x.to(self.device) if isinstance(x, torch.Tensor) else x
                      for x in torch.load(req.inputs_file, weights_only=True)]
        counted = profile_model(self.models[req.model], inputs, self.device, req.warmup)
        return ProfileReply(ok=True, kernels=counted.count, kernel_rows=counted.rows)

    def _module(self, path: str, problem: str | None = None, dims: dict[str, int | float] | None = None) -> Any:
        """The module in `path`, imported once. With `problem` (a model's load, a candidate's import) the problem is
        sized by `dims`, and a candidate's module starts with the problem's top-level names, as KernelBench's
        evaluation gives them (`namespace`)."""
        shared = problem is not None and problem != path
        names = self._problem_names(problem, dims or {}) if shared else {}
        key = f"{path}\0{problem}" if shared else path
        if key not in self.modules:
            name = f"kbeval_module_{len(self.modules)}"
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            module.__dict__.update(names)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            self.modules[key] = module
        if problem is not None and not shared:  # the problem's own Model, built with the run's sizes
            namespace.set_dims(self.modules[key], dims or {})
        return self.modules[key]

    def _problem_names(self, problem: str, dims: dict[str, int | float]) -> dict[str, Any]:
        """The problem's names with `dims` set; none when it does not import (the reference's own load says why,
        and its candidates are not judged)."""
        try:
            module = self._module(problem)
        except Exception as exc:
            print(f"kbeval: the problem's names are not given to the candidate: it does not import: {_one_line(exc)}",
                  file=sys.stderr, flush=True)
            return {}
        namespace.set_dims(module, dims)
        return namespace.problem_names(module)


def missing_class(module: Any, req: ImportRequest | LoadRequest) -> str:
    torch = _torch()
    others = sorted(
        n for n, v in vars(module).items()
        if isinstance(v, type) and issubclass(v, torch.nn.Module) and v.__module__ == module.__name__
    )
    found = f" (it defines {', '.join(others)})" if others else ""
    return f"no class {req.class_name} in {req.path}{found}"
