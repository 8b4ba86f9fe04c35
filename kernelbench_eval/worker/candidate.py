"""A candidate's side of the exchange: copy inputs out, run, copy outputs in; nothing else crosses over.

Why copies both ways: the candidate never holds the checker's inputs (it could change them for the next
candidate) and the checker never reads the candidate's own tensors (it could change them while they are
compared). Everything this process says about its outputs (`TensorMeta`) is only used to explain a
mismatch; the comparison itself reads the exchange, in the checker.
"""

from __future__ import annotations

from typing import Any

from kernelbench_eval.judge import cudart, timing
from kernelbench_eval.judge.exchange import Exchange
from kernelbench_eval.records import Slot, TensorMeta, WorkerReply, WorkerRequest
from kernelbench_eval.worker.common import _meta, _nbytes, _sync, _torch, as_list, fill_free_memory, fits


class CandidateOps:
    """Mixed into `worker.Worker`; these ops are only ever sent to a candidate's worker."""

    device: str
    models: dict[str, Any]
    sets: dict[str, list[Any]]
    exchange: Exchange | None
    kept: list[list[Any]]

    def op_attach(self, req: WorkerRequest) -> WorkerReply:
        assert req.exchange is not None
        self.exchange = Exchange.attach(req.exchange, self.device)
        return WorkerReply(ok=True)

    def op_take(self, req: WorkerRequest) -> WorkerReply:
        """Copy input set `name` out of the exchange into tensors of this process's own."""
        assert self.exchange is not None
        self.sets[req.name or ""] = self.exchange.read(req.slots, self.device)
        _sync(self.device)
        return WorkerReply(ok=True)

    def op_run(self, req: WorkerRequest) -> WorkerReply:
        """One trial run on fresh copies of set `name`; outputs that fit their slots are copied in."""
        torch = _torch()
        pristine = self.sets[req.name or ""]
        inputs = [x.clone() if isinstance(x, torch.Tensor) else x for x in pristine]
        if req.sentinel is not None:
            fill_free_memory(self.device, req.sentinel, sum(_nbytes(x) for x in inputs))
        with torch.no_grad():
            out = self.models["main"](*inputs)
            _sync(self.device)
        launch_error = cudart.last_launch_error() if self.device == "cuda" else None
        outs = as_list(out)
        metas = [_meta(o) for o in outs]
        self._copy_in(outs, metas, req.slots)
        pairs = zip(inputs, pristine, strict=True)
        mutated = any(isinstance(x, torch.Tensor) and not torch.equal(x, p) for x, p in pairs)
        return WorkerReply(ok=True, outputs=metas, mutated_inputs=mutated, launch_error=launch_error)

    def exchange_keeper(self, layout: list[list[Slot]]) -> timing.Keeper:
        """While timed: each call's outputs straight into its slots of the exchange (one copy, as a private
        copy would cost), keeping only what they looked like; `op_export` then reports that."""

        def keeper(call: int, out: Any) -> list[TensorMeta]:
            outs = as_list(out)
            metas = [_meta(o) for o in outs]
            self._copy_in(outs, metas, layout[call])
            return metas

        return keeper

    def op_export(self, req: WorkerRequest) -> WorkerReply:
        """What the outputs of calls `calls` of the last timed block looked like (they are in the exchange).

        The checker answers it too (its kept outputs are tensors): the reference makes the same round trip
        inside its wall clock, so the hand-over costs both timed models alike.
        """
        metas = [[o if isinstance(o, TensorMeta) else _meta(o) for o in self.kept[call]] for call in req.calls]
        return WorkerReply(ok=True, metas=metas)

    def _copy_in(self, outs: list[Any], metas: list, slots: list[Slot]) -> None:
        assert self.exchange is not None
        if fits(metas, slots):
            for out, slot in zip(outs, slots, strict=True):
                self.exchange.view(slot).copy_(out)
        _sync(self.device)
