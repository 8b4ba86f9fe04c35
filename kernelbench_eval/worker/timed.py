"""The worker's timing op (both roles): timed calls on rotating inputs, one request a call (`measure` sends them).

A call is answered either once its device work is done, or (`TimeRequest.overlap`, CUDA) as soon as it is
launched and its outputs described: the reply, the harness's reading of it and the next request then pass
while the device still computes, and the worker waits for the device after it has answered (`settle_answered`).
That call's times go out with the next reply; a request of no calls ends the block, answered once the last
call's device work is done, so the harness never checks outputs that are still being written. `serve` reads
and parses the next request before it waits (the harness sends it as soon as it has read the reply), so that
when the device is done only the call's bookkeeping and the next refill's launch stand between two calls.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from kernelbench_eval.common import kbmethod
from kernelbench_eval.common.carve import ExchangePool
from kernelbench_eval.messages import Slot, TensorMeta, TimeReply
from kernelbench_eval.requests import TimeRequest
from kernelbench_eval.worker import cudagraph, flush, flushkernel, kbtiming, percall, refill
from kernelbench_eval.worker.base import Ops, WorkerBase
from kernelbench_eval.worker.tensors import _meta, _sync, _torch, as_list


class TimingWorker(WorkerBase):
    """Both roles' `time` op: timed calls, their scope (no-grad, a candidate's exchange pool) and a pending call.

    Where a block's outputs go is the role's: copied into this worker's own storage (the checker's, and any worker
    timed without a layout: the torch.compile baseline's), or (a candidate's) into the exchange (`CandidateWorker`
    overrides the hooks at the end)."""

    def __init__(self) -> None:
        super().__init__()
        self.rotation: refill.Rotation | None = None  # the timed calls' inputs, refilled before each call
        self.rotation_sets: tuple[str, ...] = ()  # the input sets it was made from
        self.placements = refill.PLACEMENTS  # CUDA: live input buffers of the timed calls (the memory plan's)
        self.kept: list[list[Any]] = []  # per call of the block: its outputs (or their descriptions), for the checks
        self.store: list[list[Any]] = []  # per call of a block: storage its outputs are copied into (`store_keeper`)
        self.replay: Any = None  # CUDA: the captured graph (`cudagraph`)
        self.graph_error: str | None = None
        self.timing_method = kbmethod.OWN  # how the calls of the measurement under way are timed (its warm-up's)
        self.timing_scope: contextlib.ExitStack | None = None  # held from one timed request to the next
        self.timing_pool: ExchangePool | None = None  # the pool the scope allocates from
        self.pending: percall.Launched | None = None  # an answered call whose device work may still run
        self.settled = percall.Block()  # calls whose times no reply has carried yet

    def op_time(self, req: TimeRequest) -> TimeReply:
        """Timed calls on rotating inputs (the harness sends one at a time, `req.first` its index in the block);
        every call's outputs are kept for the checks, the block's together. No calls and no warm-up: the end of
        an overlapped block, answered with its last call's times."""
        if not req.schedule and not req.warmup:
            return self._with_times(TimeReply(ok=True, overwrote=self._overwrote()))
        names = tuple(req.input_sets)
        if self.rotation is None or self.rotation_sets != names:
            self.leave_timing()  # the new buffers must not come from the exchange's pool
            self.rotation = refill.Rotation([self.timing_inputs(n) for n in names],
                                            self.placements if self.device == "cuda" else 1)
            self.rotation_sets = names
        model = self.models[req.model]
        # the candidate's outputs stay in the exchange's pool area or are copied into the exchange; the
        # checker's are copied into storage of its own, made once and reused, so neither side allocates per
        # call (fresh pages per call made the reference 1.5-1.9x slower)
        if req.warmup:  # a measurement begins: its method (`kbmethod`) holds for its calls, sent without it
            self.timing_method = req.method
        kernelbench = kbmethod.is_kernelbench(self.timing_method)  # KernelBench's: its allocations, its warm-up
        cuda_flush = self.device == "cuda" and not kernelbench  # the harness's flush (KernelBench's is its own)
        pooled = self._pool(req) if not req.graph and not kernelbench else None
        if pooled is not None:
            flush.l2_flush_buffer()  # made before the pool is in use: it must not take the pool's area
        if cuda_flush and req.warmup:
            flushkernel.kernel()  # compiled by the driver (milliseconds) before the warm-up, not in a timed call
        if req.first == 0:
            self._new_block()
        self._enter_timing(pooled)
        if req.warmup and kernelbench:
            self.settled.launch_ms += kbtiming.warm_up(model, self.rotation, req.warmup, self.timing_method,
                                                       self.device)
        elif req.warmup:  # outside the pool: see `percall.warm_up`
            self.settled.launch_ms += percall.warm_up(model, self.rotation, req.warmup, req.warmup_seconds,
                                                     self.device)
        if req.graph and self.device == "cuda" and self.replay is None and self.graph_error is None:
            self.replay, self.graph_error = cudagraph.capture_graph(model, self.rotation)
        keeper = self._keeper(req)
        replay = self.replay if req.model == "main" else None
        placement = 0 if replay else req.placement
        if req.overlap and self.device == "cuda" and len(req.schedule) == 1:
            self.pending = percall.launch(model, self.rotation, req.schedule[0], 0, keeper, replay, placement,
                                         early=True, cover_s=req.cover_s)
            metas = [[_meta(o) for o in as_list(self.pending.out)]]
        else:
            block = (kbtiming.time_block(model, self.rotation, req.schedule, self.device, keeper, self.timing_method)
                     if kernelbench else percall.time_block(model, self.rotation, req.schedule, self.device, replay,
                                                           keeper, placement, req.cover_s))
            self.kept += block.kept
            self.settled.extend(block)
            metas = [[o if isinstance(o, TensorMeta) else _meta(o) for o in kept] for kept in block.kept]
        # each call's outputs described (and, by a candidate, located) in its own reply: the hand-over is the
        # reply, inside the harness's wall clock on the block, with nothing left to do after the last call
        # (the checker's reply says where its own copies lie, which nobody reads: the same bytes to write and
        # parse on the harness's clock as the candidate's, so the clock check compares like with like)
        return self._with_times(TimeReply(ok=True, graph_error=self.graph_error, replaced=percall.replaced(),
                                          metas=metas, placed=self._placed(req, metas), overwrote=self._overwrote(),
                                          flush=flushkernel.describe() if cuda_flush else None))

    def settle_answered(self) -> None:
        """Once an overlapped call's reply is written and the next request read: wait for the call's device work,
        time it and keep its outputs."""
        if self.pending is None:
            return
        launched, self.pending = self.pending, None
        block = percall.Block()
        block.late = percall.settle(launched, block)
        self.kept += block.kept
        self.settled.extend(block)

    def _with_times(self, reply: TimeReply) -> TimeReply:
        """`reply` with the times of every call settled since the last one."""
        done, self.settled = self.settled, percall.Block()
        reply.samples_ms, reply.device_ms, reply.gate_ms, reply.late = (done.event_ms, done.device_ms, done.gate_ms,
                                                                        done.late)
        reply.launch_ms = done.launch_ms
        return reply

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

    def timing_inputs(self, name: str) -> list[Any]:
        """The base set `name` of the timed calls: the one this worker holds (the checker's may be drawn again)."""
        return self.sets[name]

    def drop_rotation(self) -> None:
        """Let go of the timed calls' inputs, live buffers and graph: the next timing makes them again."""
        self.rotation, self.rotation_sets, self.replay, self.graph_error = None, (), None, None

    def leave_timing(self) -> None:
        if self.timing_scope is not None:
            scope, self.timing_scope, self.timing_pool = self.timing_scope, None, None
            scope.close()

    # -- where a block's outputs go: this worker's storage (a candidate's, with a layout: the exchange) -------------

    def _new_block(self) -> None:
        self.kept = []

    def _pool(self, req: TimeRequest) -> ExchangePool | None:
        """The pool the block's calls allocate from: none of this worker's own."""
        return None

    def _keeper(self, req: TimeRequest) -> percall.Keeper:
        return store_keeper(self.store, req.first, len(req.schedule), [], self.device)

    def _placed(self, req: TimeRequest, metas: list[list[TensorMeta]]) -> list[list[Slot]]:
        """Where each call's outputs lie, as its reply says: here in storage of its own (nobody reads it)."""
        return [[Slot.model_construct(offset=0, dtype=m.dtype, shape=m.shape or [], value=None) for m in call]
                for call in metas]

    def _overwrote(self) -> list[int]:
        """Calls of the block whose outputs a later call's lie over: none in storage of its own."""
        return []


SHARED_OPS: Ops = {"load": WorkerBase.op_load, "profile": WorkerBase.op_profile, "time": TimingWorker.op_time}


def store_keeper(store: list[list[Any]], first: int, calls: int, template: list[TensorMeta], device: str
                 ) -> percall.Keeper:
    """While timed: each call's outputs copied into `store`, storage made before the block (from `template`, the
    outputs' description where one is known), as the candidate copies into the exchange, with the same host work
    after the call (describe, copy, wait): both keepers run inside the wall clock the clock check compares, so work
    one side did alone would count against it. Keeping fresh outputs (or fresh clones) instead makes every call of
    a block allocate new memory, which on a CPU means new pages: an A/A test then found the reference 1.5-1.9x
    slower than its own copy. `first`: the block's call index of this request's first call."""
    torch = _torch()
    while len(store) < first + calls:
        store.append([_empty(m, device) for m in template])

    def keeper(call: int, out: Any) -> Callable[[], list[Any]]:
        outs, slots = as_list(out), store[first + call]
        [_meta(o) for o in outs]  # the candidate's keeper describes its outputs too: the same host work

        def copy() -> list[Any]:
            if len(slots) != len(outs):
                slots[:] = [None] * len(outs)
            for k, o in enumerate(outs):
                if not isinstance(o, torch.Tensor):
                    slots[k] = None
                    continue
                if slots[k] is None or slots[k].shape != o.shape or slots[k].dtype != o.dtype \
                        or slots[k].device != o.device:
                    slots[k] = torch.empty_like(o)
                slots[k].copy_(o.detach())
            _sync(device)  # as the candidate's keeper waits for its copies into the exchange
            return list(slots)

        return copy

    return keeper


def _empty(meta: TensorMeta, device: str) -> Any:
    """Storage shaped as an output `meta` describes (None where it was no tensor)."""
    torch = _torch()
    if not meta.exact_tensor or meta.dtype is None:
        return None
    return torch.empty(meta.shape or [], dtype=getattr(torch, meta.dtype.removeprefix("torch.")), device=device)
