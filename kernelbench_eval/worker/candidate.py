"""A candidate's worker: copy inputs out of the exchange, run, put outputs in; nothing else crosses over.

Why copies in: the candidate never holds the checker's inputs (it could change them for the next candidate).
Outputs go into the exchange, never the candidate's own memory elsewhere: a trial's are copied in; a timed
call's are left where the call allocated them when that is the exchange's pool area (`carve`), else copied
in (`placing`). The checker reads only the exchange, and only while this process is stopped. Everything this
process says about its outputs (`TensorMeta`, and where they lie) only explains a mismatch or moves where the
checker reads within the exchange; the comparison itself runs in the checker.

The same role builds a candidate (`import`, then a Triton candidate's `warmup` call) and times the torch.compile
baseline (a model of the harness's, fed and timed as a candidate is, its outputs kept in storage of its own).
"""

from __future__ import annotations

import traceback
from typing import ClassVar

from kernelbench_eval.common import cudart
from kernelbench_eval.common.carve import ExchangePool
from kernelbench_eval.common.exchange import Exchange
from kernelbench_eval.messages import ExportReply, ImportReply, Reply, RunReply, Slot, TensorMeta
from kernelbench_eval.requests import (
    AttachRequest,
    ExportRequest,
    ImportRequest,
    RunRequest,
    TakeRequest,
    TimeRequest,
    WarmupRequest,
)
from kernelbench_eval.worker import percall
from kernelbench_eval.worker.base import Ops, missing_class
from kernelbench_eval.worker.failures import classify
from kernelbench_eval.worker.placing import ExchangeOutputs
from kernelbench_eval.worker.tensors import _meta, _nbytes, _sync, _torch, as_list, fill_free_memory
from kernelbench_eval.worker.timed import SHARED_OPS, TimingWorker


class CandidateWorker(TimingWorker):
    """The worker of a model judged against the checker: it only ever sees inputs and its own outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.exchange: Exchange | None = None  # the buffer the checker lent it, once attached
        self.outputs: ExchangeOutputs | None = None  # its outputs in that buffer

    def op_import(self, req: ImportRequest) -> ImportReply:
        module = self._module(req.path, req.problem, req.dims)
        if req.class_name and not isinstance(getattr(module, req.class_name, None), type):
            return ImportReply(ok=False, error_kind="load_error", error=missing_class(module, req))
        return ImportReply(ok=True, torch_version=_torch().__version__)

    def op_warmup(self, req: WarmupRequest) -> ImportReply:
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
            reply = ImportReply(ok=False, error_kind=status, error=message)
        if not reply.ok:
            reply.error = f"warm-up call on problem-shaped inputs: {reply.error}"
        return reply

    def op_attach(self, req: AttachRequest) -> Reply:
        if req.placements:
            self.placements = req.placements  # as many live input buffers as the checker's (the memory plan)
        self.exchange = Exchange.attach(req.exchange, self.device)
        pool = None
        if req.exchange.kind == "cuda_ipc" and req.exchange.pool_offset and self.device == "cuda":
            try:
                pool = ExchangePool(self.exchange.buffer, req.exchange.pool_offset)
            except Exception:  # no pluggable allocator in this torch: outputs are copied, as before
                traceback.print_exc()
        self.outputs = ExchangeOutputs(self.exchange, pool, self.device)
        return Reply(ok=True)

    def op_take(self, req: TakeRequest) -> Reply:
        """Copy input set `name` out of the exchange into tensors of this process's own; under a lean memory plan,
        take it where it lies (its trials and its timed calls still run on copies of it: `op_run`, `refill`)."""
        assert self.exchange is not None
        if req.drop:  # the sets it held are done with: their memory goes before this one comes (`memory`)
            self.leave_timing()
            self.sets, self.rotation = {}, None
        in_place = req.in_place and self.exchange.aliases(self.device)
        self.sets[req.name] = self.exchange.views(req.slots) if in_place else self.exchange.read(req.slots, self.device)
        _sync(self.device)
        return Reply(ok=True)

    def op_run(self, req: RunRequest) -> RunReply:
        """One trial run on fresh copies of set `name`; outputs that fit their slots are copied in."""
        assert self.outputs is not None
        torch = _torch()
        pristine = self.sets[req.name]
        inputs = [x.clone() if isinstance(x, torch.Tensor) else x for x in pristine]
        if req.sentinel is not None:
            fill_free_memory(self.device, req.sentinel, sum(_nbytes(x) for x in inputs))
        with torch.no_grad():
            out = self.models["main"](*inputs)
            _sync(self.device)
        launch_error = cudart.last_launch_error() if self.device == "cuda" else None
        outs = as_list(out)
        metas = [_meta(o) for o in outs]
        self.outputs.copy_in(outs, metas, req.slots)
        pairs = zip(inputs, pristine, strict=True)
        mutated = any(isinstance(x, torch.Tensor) and not torch.equal(x, p) for x, p in pairs)
        del inputs, out, outs, pairs
        if req.sentinel is not None and self.device == "cuda":  # the sentinel fill's blocks (4x the inputs) go
            torch.cuda.empty_cache()  # back to the device: cached here, they were memory the checker could not have
        return RunReply(ok=True, outputs=metas, mutated_inputs=mutated, launch_error=launch_error)

    def op_export(self, req: ExportRequest) -> ExportReply:
        """What the outputs of calls `calls` of the last timed block looked like (they are in the exchange).

        Each timed call's reply already says so; the harness sends it with no calls, outside the wall clock,
        to wake a stopped candidate before its block (`timing_stage.resume`).
        """
        metas = [[o if isinstance(o, TensorMeta) else _meta(o) for o in self.kept[call]] for call in req.calls]
        return ExportReply(ok=True, metas=metas)

    # -- a timed block's outputs, with a layout: in the exchange (`placing`) -----------------------------------------

    def _new_block(self) -> None:
        super()._new_block()
        if self.outputs is not None:
            self.outputs.new_block()

    def _pool(self, req: TimeRequest) -> ExchangePool | None:
        return self.outputs.pool if req.layout and self.outputs is not None else None

    def _keeper(self, req: TimeRequest) -> percall.Keeper:
        if req.layout and self.outputs is not None:
            return self.outputs.keeper(req.layout, req.first)
        return super()._keeper(req)

    def _placed(self, req: TimeRequest, metas: list[list[TensorMeta]]) -> list[list[Slot]]:
        if req.layout and self.outputs is not None:
            return self.outputs.placed[req.first:req.first + len(req.schedule)]
        return super()._placed(req, metas)

    def _overwrote(self) -> list[int]:
        return self.outputs.overwrote if self.outputs is not None else []

    OPS: ClassVar[Ops] = {**SHARED_OPS, "import": op_import, "warmup": op_warmup, "attach": op_attach,
                          "take": op_take, "run": op_run, "export": op_export}
