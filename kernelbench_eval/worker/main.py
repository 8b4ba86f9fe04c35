"""The child side of every isolated process: imports, builds, runs and times one model.

Started by `process.WorkerProcess` as `python -m kernelbench_eval.worker.main --reply-fd N`. Requests arrive
as JSON lines on stdin; replies go to the private pipe N, never to stdout, which (with stderr) is the
candidate's log. A reference's worker (the checker, `worker_reference`) holds the inputs and expected outputs
and compares; a candidate's (`worker_candidate`) only ever sees inputs and its own outputs.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import os
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from kernelbench_eval.building import pch
from kernelbench_eval.isolation import cores, sandbox  # timing binds the clocks before candidate code is imported
from kernelbench_eval.isolation.linux import die_with_parent, poll_readable
from kernelbench_eval.judge import cudart, refill, timing
from kernelbench_eval.judge.carve import ExchangePool
from kernelbench_eval.judge.exchange import Exchange
from kernelbench_eval.judge.precision import cast_model
from kernelbench_eval.messages import WorkerReply, WorkerRequest
from kernelbench_eval.worker import namespace, workermemory
from kernelbench_eval.worker.candidate import CandidateOps
from kernelbench_eval.worker.common import _device_name, _memory_bytes, _one_line, _torch
from kernelbench_eval.worker.reference import ReferenceOps
from kernelbench_eval.worker.timed import TimingOps

_BUILD_FAILURE = "Error building extension"
# After these replies stdin is polled this long for the next timed call before sleeping on it: waking from a
# pipe costs tens of microseconds with the device idle. `export` woke a stopped candidate for its block; a timed
# call is followed by the block's next one within microseconds (`WorkerProcess.call_each`), or by nothing for
# a while (the block ended: a candidate is stopped then, a reference checks it).
NEXT_CALL_S = {"export": 0.002, "time": 0.0005}
KEEP_TIMING = frozenset({"export"})  # requests that allocate nothing on the device: the timing scope stays
_BUILD_PATH = re.compile(r"^/\S*/")  # the private build directory in front of `main.cpp:6:25: error: ...`


class Worker(ReferenceOps, CandidateOps, TimingOps):
    """One model's process: the reference's (the checker) or a candidate's; the ops say which role it plays."""

    def __init__(self) -> None:
        self.modules: dict[str, Any] = {}
        self.models: dict[str, Any] = {}
        self.builders: dict[str, Any] = {}  # how `op_load` built each model, to build it again (`trials`)
        self.device = "cpu"
        self.sets: dict[str, list[Any]] = {}  # input sets by name ("trial0", "timing1"), on the model's device
        self.exchange: Exchange | None = None
        self.pool: ExchangePool | None = None  # a candidate's, on a GPU: its timed calls allocate in the exchange
        self.placed: list[list[Any]] = []
        self.held: list[list[Any]] = []
        self.spans: list[tuple[int, int]] = []
        self.overwrote: list[int] = []
        self.rotation: refill.Rotation | None = None
        self.rotation_sets: tuple[str, ...] = ()
        self.placements = refill.PLACEMENTS  # CUDA: live input buffers of the timed calls (the memory plan's)
        self.kept: list[list[Any]] = []
        self.store: list[list[Any]] = []  # the checker's per-call output storage while timed (see store_keeper)
        self.replay: Any = None
        self.graph_error: str | None = None
        self.timing_scope: contextlib.ExitStack | None = None  # held from one timed request to the next
        self.timing_pool: ExchangePool | None = None
        self.pending: timing.Launched | None = None
        self.settled = timing.Block()
        self.deferred: BaseException | None = None  # what failed after a reply was written: the next one says it

    # -- ops both roles use --------------------------------------------------------------------------

    def op_import(self, req: WorkerRequest) -> WorkerReply:
        module = self._module(req.path, req.problem, req.dims)
        if req.class_name and not isinstance(getattr(module, req.class_name, None), type):
            return WorkerReply(ok=False, error_kind="load_error", error=_missing_class(module, req))
        return WorkerReply(ok=True, torch_version=_torch().__version__)

    def op_load(self, req: WorkerRequest) -> WorkerReply:
        torch = _torch()
        if req.threads:
            torch.set_num_threads(req.threads)
        self.device = req.device or "cpu"
        module = self._module(req.path, req.problem, req.dims)
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
        self.models[req.model] = torch.compile(model, mode=req.compile_mode) if req.compile_mode else model
        self.builders[req.model] = lambda: self._build(cls, init, req)  # the same model, from a fresh start
        reply = WorkerReply(ok=True, device_name=_device_name(self.device), torch_version=torch.__version__,
                            memory_bytes=_memory_bytes(self.device))
        if self.device == "cuda":
            reply.memory_bandwidth_gbs = cudart.memory_bandwidth_gbs()
            reply.event_overhead_ms = cudart.event_overhead_ms()
        return reply

    def _build(self, cls: type, init: list[Any], req: WorkerRequest) -> Any:
        """`cls(*init)` as `op_load` built it (same seed, device, precision): a stateful reference starts again."""
        torch = _torch()
        torch.manual_seed(req.init_seed or 0)
        model = cls(*init)
        return cast_model(model.to(self.device) if hasattr(model, "to") else model, req.precision)

    def op_profile(self, req: WorkerRequest) -> WorkerReply:
        """Launch accounting (`launches.py`) of one forward on set `name` or `inputs_file`, after `req.warmup` calls."""
        from kernelbench_eval.judge.launches import profile_model

        torch = _torch()
        if req.name:  # an input set this worker holds (a judged candidate's), on fresh copies
            inputs = [x.clone() if isinstance(x, torch.Tensor) else x for x in self.sets[req.name]]
        else:
            inputs = [x.to(self.device) if isinstance(x, torch.Tensor) else x
                      for x in torch.load(req.inputs_file, weights_only=True)]
        counted = profile_model(self.models[req.model], inputs, self.device, req.warmup)
        return WorkerReply(ok=True, kernels=counted.count, kernel_rows=counted.rows)

    def op_warmup(self, req: WorkerRequest) -> WorkerReply:
        """Build stage: one call of ModelNew on problem-shaped inputs, so Triton (JIT at first call) compiles.

        Its failure is the build's: one line saying it was the warm-up, never a traceback in the verdict.
        """
        from kernelbench_eval.worker.warmup import warm_up

        problem = self._module(req.problem)  # the harness's file: its failure is no candidate's
        try:
            reply = warm_up(self._module(req.path, req.problem, req.dims), problem, req)
        except Exception as exc:
            traceback.print_exc()
            status, message = classify(exc)
            reply = WorkerReply(ok=False, error_kind=status, error=message)
        if not reply.ok:
            reply.error = f"warm-up call on problem-shaped inputs: {reply.error}"
        return reply

    # -- helpers -------------------------------------------------------------------------------------

    def _module(self, path: str | None, problem: str | None = None, dims: dict[str, int | float] | None = None) -> Any:
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


def _missing_class(module: Any, req: WorkerRequest) -> str:
    torch = _torch()
    others = sorted(
        n for n, v in vars(module).items()
        if isinstance(v, type) and issubclass(v, torch.nn.Module) and v.__module__ == module.__name__
    )
    found = f" (it defines {', '.join(others)})" if others else ""
    return f"no class {req.class_name} in {req.path}{found}"


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
    if type(exc).__module__.startswith("triton.compiler"):  # a @triton.jit kernel that does not compile
        return "compile_error", _one_line(exc) + _candidate_frame(exc)
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
        try:  # an answered (overlapped) call's device work, waited for now: the next request, read and parsed
            worker.settle_answered()  # while the device still computed, costs it no idle time
        except Exception as exc:
            worker.deferred = exc
        if req.op == "exit":
            break
        # no collection (0.1 s once torch is loaded) inside a timed call: it waits for a request of another kind
        if req.op == "time":
            gc.disable()
        else:
            gc.enable()
            if req.op not in KEEP_TIMING:
                worker.leave_timing()
        started = time.perf_counter()
        try:
            if worker.deferred is not None:
                failed, worker.deferred = worker.deferred, None
                raise failed
            reply = getattr(worker, f"op_{req.op}")(req)
        except Exception as exc:
            traceback.print_exc()
            status, message = classify(exc)
            if req.op in ("import", "load", "prepare") and status == "runtime_error":
                status = "load_error"
            reply = WorkerReply(ok=False, error_kind=status, error=message)
        reply.seconds = time.perf_counter() - started
        if req.op != "time":  # (a timed call's reply carries nothing it does not need)
            reply.peak_bytes = workermemory.peak(worker.device)
            workermemory.give_back(req.op, worker.device)
            workermemory.trace(req.op, worker.device)
        sys.stdout.flush()
        _write_all(reply_fd, (reply.model_dump_json(exclude_defaults=True) + "\n").encode())
        if worker.device == "cuda" and req.op in NEXT_CALL_S:  # the next timed call is on its way
            poll_readable(sys.stdin.fileno(), NEXT_CALL_S[req.op])


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def main() -> None:
    die_with_parent()  # no candidate outlives the harness, even one SIGKILLed
    cores.pin_self()  # a lane's cores or the builds', before any thread of torch's or the candidate's starts
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reply-fd", type=int, required=True)
    reply_fd = parser.parse_args().reply_fd
    confined = sandbox.enter_and_report(reply_fd)  # a candidate's worker: confined before its first request
    pch.enter(confined)  # a build's precompiled header, used only where this worker cannot rewrite it
    workermemory.allocator_settings()
    serve(reply_fd)


if __name__ == "__main__":
    main()
