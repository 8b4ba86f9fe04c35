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

from kernelbench_eval.build import pch
from kernelbench_eval.isolation import cores, sandbox  # timing binds the clocks before candidate code is imported
from kernelbench_eval.isolation.linux import die_with_parent, poll_readable
from kernelbench_eval.judge import cudagraph, cudart, timing
from kernelbench_eval.judge.carve import ExchangePool
from kernelbench_eval.judge.exchange import Exchange
from kernelbench_eval.judge.precision import cast_model
from kernelbench_eval.messages import Slot, TensorMeta, WorkerReply, WorkerRequest
from kernelbench_eval.worker.candidate import CandidateOps
from kernelbench_eval.worker.common import _device_name, _memory_bytes, _meta, _one_line, _torch
from kernelbench_eval.worker.reference import ReferenceOps

_BUILD_FAILURE = "Error building extension"
# After these replies stdin is polled this long for the next timed call before sleeping on it: waking from a
# pipe costs tens of microseconds with the device idle. `export` woke a stopped candidate for its block; a timed
# call is followed by the block's next one within microseconds (`WorkerProcess.call_each`), or by nothing for
# a while (the block ended: a candidate is stopped then, a reference checks it).
NEXT_CALL_S = {"export": 0.002, "time": 0.0005}
KEEP_TIMING = frozenset({"export"})  # requests that allocate nothing on the device: the timing scope stays
_BUILD_PATH = re.compile(r"^/\S*/")  # the private build directory in front of `main.cpp:6:25: error: ...`


class Worker(ReferenceOps, CandidateOps):
    """One model's process: the reference's (the checker) or a candidate's; the ops say which role it plays."""

    def __init__(self) -> None:
        self.modules: dict[str, Any] = {}
        self.models: dict[str, Any] = {}
        self.device = "cpu"
        self.sets: dict[str, list[Any]] = {}  # input sets by name ("trial0", "timing1"), on the model's device
        self.exchange: Exchange | None = None
        self.pool: ExchangePool | None = None  # a candidate's, on a GPU: its timed calls allocate in the exchange
        self.placed: list[list[Any]] = []
        self.held: list[list[Any]] = []
        self.spans: list[tuple[int, int]] = []
        self.rotation: timing.Rotation | None = None
        self.rotation_sets: tuple[str, ...] = ()
        self.kept: list[list[Any]] = []
        self.store: list[list[Any]] = []  # the checker's per-call output storage while timed (see store_keeper)
        self.replay: Any = None
        self.graph_error: str | None = None
        self.timing_scope: contextlib.ExitStack | None = None  # held from one timed request to the next
        self.timing_pool: ExchangePool | None = None

    # -- ops both roles use --------------------------------------------------------------------------

    def op_import(self, req: WorkerRequest) -> WorkerReply:
        module = self._module(req.path)
        if req.class_name and not isinstance(getattr(module, req.class_name, None), type):
            return WorkerReply(ok=False, error_kind="load_error", error=_missing_class(module, req))
        return WorkerReply(ok=True, torch_version=_torch().__version__)

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
        self.models[req.model] = torch.compile(model, mode=req.compile_mode) if req.compile_mode else model
        reply = WorkerReply(ok=True, device_name=_device_name(self.device), torch_version=torch.__version__,
                            memory_bytes=_memory_bytes(self.device))
        if self.device == "cuda":
            reply.memory_bandwidth_gbs = cudart.memory_bandwidth_gbs()
            reply.event_overhead_ms = cudart.event_overhead_ms()
        return reply

    def op_time(self, req: WorkerRequest) -> WorkerReply:
        """Timed calls on rotating inputs (the harness sends one at a time, `req.first` its index in the block);
        every call's outputs are kept for the checks, the block's together."""
        names = tuple(req.input_sets)
        if self.rotation is None or self.rotation_sets != names:
            self.leave_timing()  # the new buffers must not come from the exchange's pool
            self.rotation = timing.Rotation([self.sets[n] for n in names],
                                            timing.PLACEMENTS if self.device == "cuda" else 1)
            self.rotation_sets = names
        model = self.models[req.model]
        # the candidate's outputs stay in the exchange's pool area or are copied into the exchange; the
        # checker's are copied into storage of its own, made once and reused, so neither side allocates per
        # call (fresh pages per call made the reference 1.5-1.9x slower)
        pooled = self.pool if req.layout and not req.graph else None
        if pooled is not None:
            timing.l2_flush_buffer()  # made before the pool is in use: it must not take the pool's area
        if req.first == 0:
            self.kept, self.placed, self.held, self.spans = [], [], [], []
        self._enter_timing(pooled)
        if req.warmup:  # in the pool too: its segments are carved before timing
            timing.warm_up(model, self.rotation, req.warmup, req.warmup_seconds, self.device)
        if req.graph and self.device == "cuda" and self.replay is None and self.graph_error is None:
            self.replay, self.graph_error = cudagraph.capture_graph(model, self.rotation)
        keeper = (self.exchange_keeper(req.layout, req.first) if req.layout
                  else self.store_keeper(req.first, len(req.schedule)))
        block = timing.time_block(model, self.rotation, req.schedule, self.device,
                                  self.replay if req.model == "main" else None, keeper, req.placement)
        self.kept += block.kept
        # each call's outputs described (and, by a candidate, located) in its own reply: the hand-over is the
        # reply, inside the harness's wall clock on the block, with nothing left to do after the last call
        # (the checker's reply says where its own copies lie, which nobody reads: the same bytes to write and
        # parse on the harness's clock as the candidate's, so the clock check compares like with like)
        metas = [[o if isinstance(o, TensorMeta) else _meta(o) for o in kept] for kept in block.kept]
        placed = self.placed[req.first:req.first + len(req.schedule)] if req.layout else [
            [Slot.model_construct(offset=0, dtype=m.dtype, shape=m.shape or [], value=None) for m in call]
            for call in metas]
        return WorkerReply(ok=True, samples_ms=block.event_ms, device_ms=block.device_ms, gate_ms=block.gate_ms,
                           graph_error=self.graph_error, replaced=timing.replaced(), metas=metas, placed=placed)

    def _enter_timing(self, pooled: ExchangePool | None) -> None:
        """Grad mode off, and a candidate's allocations in the exchange's pool, from the first timed request
        until a request of another kind (`leave_timing`): entered and left per request, they cost every timed
        call host time with the device idle, between its predecessor's end and its own refill."""
        if self.timing_scope is not None and self.timing_pool is pooled:
            return
        self.leave_timing()
        scope = contextlib.ExitStack()
        scope.enter_context(_torch().no_grad())
        if pooled is not None:
            scope.enter_context(pooled.allocating())
        self.timing_scope, self.timing_pool = scope, pooled

    def leave_timing(self) -> None:
        if self.timing_scope is not None:
            scope, self.timing_scope, self.timing_pool = self.timing_scope, None, None
            scope.close()

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
        from kernelbench_eval.build.warmup import warm_up

        problem = self._module(req.problem)  # the harness's file: its failure is no candidate's
        try:
            reply = warm_up(self._module(req.path), problem, req)
        except Exception as exc:
            traceback.print_exc()
            status, message = classify(exc)
            reply = WorkerReply(ok=False, error_kind=status, error=message)
        if not reply.ok:
            reply.error = f"warm-up call on problem-shaped inputs: {reply.error}"
        return reply

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
            reply = getattr(worker, f"op_{req.op}")(req)
        except Exception as exc:
            traceback.print_exc()
            status, message = classify(exc)
            if req.op in ("import", "load", "prepare") and status == "runtime_error":
                status = "load_error"
            reply = WorkerReply(ok=False, error_kind=status, error=message)
        reply.seconds = time.perf_counter() - started
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
    serve(reply_fd)


if __name__ == "__main__":
    main()
