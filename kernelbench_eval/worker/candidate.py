"""A candidate's side of the exchange: copy inputs out, run, put outputs in; nothing else crosses over.

Why copies in: the candidate never holds the checker's inputs (it could change them for the next candidate).
Outputs go into the exchange, never the candidate's own memory elsewhere: a trial's are copied in; a timed
call's are left where the call allocated them when that is the exchange's pool area (`carve`), else copied
in. The checker reads only the exchange, and only while this process is stopped. Everything this process says
about its outputs (`TensorMeta`, and where they lie) only explains a mismatch or moves where the checker reads
within the exchange; the comparison itself runs in the checker.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from kernelbench_eval.judge import cudart, timing
from kernelbench_eval.judge.carve import ExchangePool
from kernelbench_eval.judge.exchange import Exchange, slot_bytes
from kernelbench_eval.messages import Slot, TensorMeta, WorkerReply, WorkerRequest
from kernelbench_eval.worker.common import _meta, _nbytes, _sync, _torch, as_list, fill_free_memory, fits


class CandidateOps:
    """Mixed into `worker.Worker`; these ops are only ever sent to a candidate's worker."""

    device: str
    models: dict[str, Any]
    sets: dict[str, list[Any]]
    exchange: Exchange | None
    kept: list[list[Any]]
    pool: ExchangePool | None
    placements: int
    rotation: Any
    placed: list[list[Slot]]  # per call of the current block: where its outputs lie in the exchange
    held: list[list[Any]]  # per call of the current block: its outputs left in the pool area, kept alive until checked
    spans: list[tuple[int, int, int]]  # (call, begin, end): the exchange bytes those outputs occupy
    overwrote: list[int]  # calls of the current block whose outputs left in place a later call's outputs lie over

    def op_attach(self, req: WorkerRequest) -> WorkerReply:
        assert req.exchange is not None
        if req.placements:
            self.placements = req.placements  # as many live input buffers as the checker's (the memory plan)
        self.exchange = Exchange.attach(req.exchange, self.device)
        if req.exchange.kind == "cuda_ipc" and req.exchange.pool_offset and self.device == "cuda":
            try:
                self.pool = ExchangePool(self.exchange.buffer, req.exchange.pool_offset)
            except Exception:  # no pluggable allocator in this torch: outputs are copied, as before
                traceback.print_exc()
                self.pool = None
        return WorkerReply(ok=True)

    def op_take(self, req: WorkerRequest) -> WorkerReply:
        """Copy input set `name` out of the exchange into tensors of this process's own."""
        assert self.exchange is not None
        if req.drop:  # the sets it held are done with: their memory goes before this one comes (`memory`)
            self.leave_timing()  # type: ignore[attr-defined]
            self.sets, self.rotation = {}, None
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
        del inputs, out, outs, pairs
        if req.sentinel is not None and self.device == "cuda":  # the sentinel fill's blocks (4x the inputs) go
            torch.cuda.empty_cache()  # back to the device: cached here, they were memory the checker could not have
        return WorkerReply(ok=True, outputs=metas, mutated_inputs=mutated, launch_error=launch_error)

    def exchange_keeper(self, layout: list[list[Slot]], first: int) -> timing.Keeper:
        """While timed: each call's outputs left where the call put them when that is the exchange's pool area
        (`carve`), else copied into the call's slots, keeping only what they looked like and where they lie.
        `first`: the block's call index of this request's first call."""

        def keeper(call: int, out: Any) -> Callable[[], list[TensorMeta]]:
            outs = as_list(out)
            metas = [_meta(o) for o in outs]
            index = first + call
            del self.placed[index:], self.held[index:]
            in_place = self._in_place(outs, metas, layout[call], index)
            if in_place is not None:
                self.placed.append(in_place)
                self.held.append(outs)  # their memory must not serve a later call before the checker reads it
                return lambda: metas
            self.placed.append(list(layout[call]))
            self.held.append([])

            def copy() -> list[TensorMeta]:  # once the device is idle: work on any stream has finished
                self._copy_in(outs, metas, layout[call])
                return metas

            return copy

        return keeper

    def _in_place(self, outs: list[Any], metas: list[TensorMeta], slots: list[Slot], call: int
                  ) -> list[Slot] | None:
        """The slots where `outs` already lie in the pool area, or None when any one does not (then all are copied).

        Every output of this call is also looked for over the memory that earlier calls of the block left in
        place (`spans`): a model that hands out one buffer again (a `self.out` made during a timed call) has
        written over the earlier call's outputs before the checker read them. Those calls are reported
        (`overwrote`), and the harness measures again in blocks of one call (`timed`)."""
        if self.pool is None or not fits(metas, slots):
            return None
        for out in outs:
            begin, end = _extent(out)
            self.overwrote += [earlier for earlier, first, last in self.spans
                               if earlier not in self.overwrote and begin < self.pool.base + last
                               and self.pool.base + first < end]
        placed, spans = [], []
        for out, slot in zip(outs, slots, strict=True):
            nbytes = slot_bytes(slot)
            offset = self.pool.offset_of(out, nbytes) if out.is_contiguous() else None
            if offset is None or any(offset < end and begin < offset + nbytes for _, begin, end in self.spans + spans):
                return None
            spans.append((call, offset, offset + nbytes))
            placed.append(Slot.model_construct(offset=offset, dtype=slot.dtype, shape=slot.shape, value=None))
        self.spans += spans
        return placed  # no wait: the checker reads them only after the call's device-wide synchronise

    def op_export(self, req: WorkerRequest) -> WorkerReply:
        """What the outputs of calls `calls` of the last timed block looked like (they are in the exchange).

        Each timed call's reply already says so; the harness sends it with no calls, outside the wall clock,
        to wake a stopped candidate before its block (`timed.resume`).
        """
        metas = [[o if isinstance(o, TensorMeta) else _meta(o) for o in self.kept[call]] for call in req.calls]
        return WorkerReply(ok=True, metas=metas)

    def _copy_in(self, outs: list[Any], metas: list, slots: list[Slot]) -> None:
        assert self.exchange is not None
        if fits(metas, slots):
            for out, slot in zip(outs, slots, strict=True):
                self.exchange.view(slot).copy_(out)
        _sync(self.device)


def _extent(out: Any) -> tuple[int, int]:
    """The addresses a tensor's elements span, [begin, end): a view's too (none: an empty range)."""
    torch = _torch()
    if not isinstance(out, torch.Tensor) or out.numel() == 0:
        return 0, 0
    last = sum((size - 1) * stride for size, stride in zip(out.shape, out.stride(), strict=True))
    return out.data_ptr(), out.data_ptr() + (last + 1) * out.element_size()
