"""The child side of every isolated process: imports, builds, runs and times one model.

Started by `process.WorkerProcess` as `python -m kernelbench_eval.worker --reply-fd N`. Requests arrive
as JSON lines on stdin; replies go to the private pipe N, never to stdout, which (with stderr) is the
candidate's log. Expected outputs never enter this process: it only writes what the model returned.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from kernelbench_eval import timing  # noqa: F401  (binds the clocks before candidate code is imported)
from kernelbench_eval.linux import die_with_parent
from kernelbench_eval.models import TensorMeta, WorkerReply, WorkerRequest
from kernelbench_eval.precision import cast_inputs, cast_model

_BUILD_FAILURE = "Error building extension"
_BUILD_PATH = re.compile(r"^/\S*/")  # the private build directory in front of `main.cpp:6:25: error: ...`


class Worker:
    def __init__(self) -> None:
        self.modules: dict[str, Any] = {}
        self.model: Any = None
        self.device = "cpu"
        self.rotation: timing.Rotation | None = None
        self.rotation_files: tuple[str, ...] = ()
        self.kept: list[list[Any]] = []
        self.replay: Any = None
        self.graph_error: str | None = None

    # -- ops -----------------------------------------------------------------------------------------

    def op_import(self, req: WorkerRequest) -> WorkerReply:
        module = self._module(req.path)
        if req.class_name and not isinstance(getattr(module, req.class_name, None), type):
            return WorkerReply(ok=False, error_kind="load_error", error=_missing_class(module, req))
        return WorkerReply(ok=True, torch_version=_torch().__version__)

    def op_prepare(self, req: WorkerRequest) -> WorkerReply:
        """Reference side: apply size overrides, then write init arguments and one input set per seed."""
        torch = _torch()
        module = self._module(req.path)
        missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if not hasattr(module, n)]
        if missing:
            return WorkerReply(ok=False, error_kind="load_error", error=f"problem lacks {', '.join(missing)}")
        for name, value in req.dims.items():
            if hasattr(module, name):
                setattr(module, name, value)
        out_dir = Path(req.inputs_dir)
        torch.save(cast_inputs(module.get_init_inputs(), req.precision), out_dir / "init.pt")
        named = [(f"inputs_{k}.pt", s) for k, s in enumerate(req.trial_seeds)]
        named += [(f"timing_{k}.pt", s) for k, s in enumerate(req.timing_seeds)]
        inputs: list[Any] = []
        for name, seed in named:
            torch.manual_seed(seed)
            inputs = cast_inputs(module.get_inputs(), req.precision)
            torch.save(inputs, out_dir / name)
        return WorkerReply(ok=True, input_shapes=[_describe(x) for x in inputs], torch_version=torch.__version__,
                           input_bytes=sum(_nbytes(x) for x in inputs))

    def op_load(self, req: WorkerRequest) -> WorkerReply:
        torch = _torch()
        if req.threads:
            torch.set_num_threads(req.threads)
        self.device = req.device or "cpu"
        module = self._module(req.path)
        cls = getattr(module, req.class_name or "", None)
        if not isinstance(cls, type):
            return WorkerReply(ok=False, error_kind="load_error", error=_missing_class(module, req))
        init = torch.load(req.init_file, weights_only=True)
        torch.manual_seed(req.init_seed or 0)
        try:
            model = cls(*init)
        except Exception as exc:  # a wrong __init__ signature is the candidate's fault, not a crash
            return WorkerReply(ok=False, error_kind="load_error", error=f"{req.class_name}(*init): {_one_line(exc)}")
        model = cast_model(model.to(self.device) if hasattr(model, "to") else model, req.precision)
        self.model = torch.compile(model, mode=req.compile_mode) if req.compile_mode else model
        reply = WorkerReply(ok=True, device_name=_device_name(self.device), torch_version=torch.__version__)
        if self.device == "cuda":
            reply.memory_bandwidth_gbs = timing.memory_bandwidth_gbs()
            reply.event_overhead_ms = timing.event_overhead_ms()
        return reply

    def op_run(self, req: WorkerRequest) -> WorkerReply:
        torch = _torch()
        inputs = self._inputs(req.inputs_file)
        pristine = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        if req.sentinel is not None:
            fill_free_memory(self.device, req.sentinel, sum(_nbytes(x) for x in inputs))
        with torch.no_grad():
            out = self.model(*inputs)
            _sync(self.device)
        launch_error = timing.last_launch_error() if self.device == "cuda" else None
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        metas = [_meta(o) for o in outs]
        torch.save([o.detach().to("cpu") if isinstance(o, torch.Tensor) else None for o in outs], req.output_file)
        pairs = zip(inputs, pristine, strict=True)
        mutated = any(isinstance(x, torch.Tensor) and not torch.equal(x, p) for x, p in pairs)
        return WorkerReply(ok=True, outputs=metas, mutated_inputs=mutated, launch_error=launch_error)

    def op_time(self, req: WorkerRequest) -> WorkerReply:
        """One block of timed calls on rotating inputs; every call's outputs are kept for `dump`."""
        torch = _torch()
        files = tuple(req.inputs_files)
        if self.rotation is None or self.rotation_files != files:
            self.rotation = timing.Rotation([self._inputs(f) for f in files])
            self.rotation_files = files
        self.kept = []  # free the last block's copies before this block allocates
        with torch.no_grad():
            if req.warmup:
                timing.warm_up(self.model, self.rotation, req.warmup, req.warmup_seconds, self.device)
            if req.graph and self.device == "cuda" and self.replay is None and self.graph_error is None:
                self.replay, self.graph_error = timing.capture_graph(self.model, self.rotation)
            block = timing.time_block(self.model, self.rotation, req.schedule, self.device, self.replay)
        self.kept = block.kept
        return WorkerReply(ok=True, samples_ms=block.event_ms, device_ms=block.device_ms,
                           fingerprints=block.fingerprints(), graph_error=self.graph_error)

    def op_dump(self, req: WorkerRequest) -> WorkerReply:
        torch = _torch()
        outs = self.kept[req.index]
        torch.save([o.to("cpu") if isinstance(o, torch.Tensor) else None for o in outs], req.output_file)
        return WorkerReply(ok=True, outputs=[_meta(o) for o in outs])

    def op_profile(self, req: WorkerRequest) -> WorkerReply:
        """Launch accounting of one forward on `inputs_file` (after `req.warmup` untimed calls): `launches.py`."""
        from kernelbench_eval.launches import profile_model

        counted = profile_model(self.model, self._inputs(req.inputs_file), self.device, req.warmup)
        return WorkerReply(ok=True, kernels=counted.count, kernel_rows=counted.rows)

    def op_warmup(self, req: WorkerRequest) -> WorkerReply:
        """Build stage: one call of ModelNew on problem-shaped inputs, so Triton (JIT at first call) compiles."""
        from kernelbench_eval.warmup import warm_up

        return warm_up(self._module(req.path), self._module(req.problem), req)

    # -- helpers -------------------------------------------------------------------------------------

    def _module(self, path: str | None) -> Any:
        if path not in self.modules:
            name = f"kbeval_module_{len(self.modules)}"
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            self.modules[path] = module
        return self.modules[path]

    def _inputs(self, path: str | None) -> list[Any]:
        torch = _torch()
        inputs = torch.load(path, weights_only=True)
        return [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in inputs]


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
        size = min(size, torch.cuda.mem_get_info()[0] // 2)
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


def _missing_class(module: Any, req: WorkerRequest) -> str:
    torch = _torch()
    others = sorted(
        n for n, v in vars(module).items()
        if isinstance(v, type) and issubclass(v, torch.nn.Module) and v.__module__ == module.__name__
    )
    found = f" (it defines {', '.join(others)})" if others else ""
    return f"no class {req.class_name} in {req.path}{found}"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:400]}"


def first_compiler_error(text: str) -> str | None:
    """The compiler's first `error` line, the one a person fixes first."""
    for line in text.splitlines():
        if "error:" in line:  # gcc `file:3:5: error: ...`, nvcc `file(3): error: ...`, `fatal error:`
            return _BUILD_PATH.sub("", line.strip())[:400]
    return None


def classify(exc: BaseException) -> tuple[str, str]:
    """(status, one-line message) for an exception raised while importing or running a model."""
    if isinstance(exc, SyntaxError):
        return "load_error", f"SyntaxError: {exc.msg} ({Path(exc.filename or '?').name}, line {exc.lineno})"
    text = str(exc)
    if _BUILD_FAILURE in text:
        return "compile_error", first_compiler_error(text) or _one_line(exc)
    where = _candidate_frame(exc)
    return "runtime_error", f"{_one_line(exc)}{where}"


def _candidate_frame(exc: BaseException) -> str:
    """` (file:line)` of the innermost frame outside torch and this package, to point at the culprit."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "site-packages" not in f.filename]
    frames = [f for f in frames if "kernelbench_eval" not in f.filename]
    return f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""


def serve(reply_fd: int) -> None:
    worker = Worker()
    for line in sys.stdin:
        req = WorkerRequest.model_validate_json(line)
        if req.op == "exit":
            break
        started = time.perf_counter()
        try:
            reply = getattr(worker, f"op_{req.op}")(req)
        except Exception as exc:
            traceback.print_exc()
            status, message = classify(exc)
            if req.op in ("import", "load", "prepare") and status == "runtime_error":
                status = "load_error"
            reply = WorkerReply(ok=False, error_kind=status, error=message)
        reply.seconds = time.perf_counter() - started
        sys.stdout.flush()
        _write_all(reply_fd, (reply.model_dump_json() + "\n").encode())


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def main() -> None:
    die_with_parent()  # no candidate outlives the harness, even one SIGKILLed
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reply-fd", type=int, required=True)
    serve(parser.parse_args().reply_fd)


if __name__ == "__main__":
    main()
