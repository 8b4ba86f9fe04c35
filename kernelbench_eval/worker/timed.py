"""The worker's timing op (both roles): timed calls on rotating inputs, one request a call (`measure` sends them).

A call is answered either once its device work is done, or (`WorkerRequest.overlap`, CUDA) as soon as it is
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

from kernelbench_eval.judge import cudagraph, flush, kbmethod, refill, timing
from kernelbench_eval.judge.carve import ExchangePool
from kernelbench_eval.messages import Slot, TensorMeta, WorkerReply, WorkerRequest
from kernelbench_eval.worker.common import _meta, _torch, as_list


class TimingOps:
    """Mixed into `worker.Worker`: the `time` op, its scope (no-grad, the exchange's pool) and its pending call."""

    device: str
    models: dict[str, Any]
    sets: dict[str, list[Any]]
    pool: ExchangePool | None
    rotation: refill.Rotation | None
    rotation_sets: tuple[str, ...]
    placements: int
    kept: list[list[Any]]
    placed: list[list[Slot]]
    held: list[list[Any]]
    spans: list[tuple[int, int]]
    overwrote: list[int]
    replay: Any
    graph_error: str | None
    timing_scope: contextlib.ExitStack | None
    timing_pool: ExchangePool | None
    pending: timing.Launched | None  # an answered call whose device work may still run
    timing_method: str = kbmethod.OWN  # how the calls of the measurement under way are timed (its warm-up's)
    settled: timing.Block  # calls whose times no reply has carried yet
    exchange_keeper: Callable[[list[list[Slot]], int], timing.Keeper]  # a candidate's (`worker/candidate.py`)
    store_keeper: Callable[[int, int], timing.Keeper]  # the checker's (`worker/reference.py`)

    def op_time(self, req: WorkerRequest) -> WorkerReply:
        """Timed calls on rotating inputs (the harness sends one at a time, `req.first` its index in the block);
        every call's outputs are kept for the checks, the block's together. No calls and no warm-up: the end of
        an overlapped block, answered with its last call's times."""
        if not req.schedule and not req.warmup:
            return self._with_times(WorkerReply(ok=True, overwrote=self.overwrote))
        names = tuple(req.input_sets)
        if self.rotation is None or self.rotation_sets != names:
            self.leave_timing()  # the new buffers must not come from the exchange's pool
            self.rotation = refill.Rotation([self.sets[n] for n in names],
                                            self.placements if self.device == "cuda" else 1)
            self.rotation_sets = names
        model = self.models[req.model]
        # the candidate's outputs stay in the exchange's pool area or are copied into the exchange; the
        # checker's are copied into storage of its own, made once and reused, so neither side allocates per
        # call (fresh pages per call made the reference 1.5-1.9x slower)
        if req.warmup:  # a measurement begins: its method (`kbmethod`) holds for its calls, sent without it
            self.timing_method = req.method
        kernelbench = kbmethod.is_kernelbench(self.timing_method)  # KernelBench's: its allocations, its warm-up
        pooled = self.pool if req.layout and not req.graph and not kernelbench else None
        if pooled is not None:
            flush.l2_flush_buffer()  # made before the pool is in use: it must not take the pool's area
        if req.first == 0:
            self.kept, self.placed, self.held, self.spans, self.overwrote = [], [], [], [], []
        self._enter_timing(pooled)
        if req.warmup and kernelbench:
            self.settled.launch_ms += kbmethod.warm_up(model, self.rotation, req.warmup, self.timing_method,
                                                       self.device)
        elif req.warmup:  # outside the pool: see `timing.warm_up`
            self.settled.launch_ms += timing.warm_up(model, self.rotation, req.warmup, req.warmup_seconds,
                                                     self.device)
        if req.graph and self.device == "cuda" and self.replay is None and self.graph_error is None:
            self.replay, self.graph_error = cudagraph.capture_graph(model, self.rotation)
        keeper = (self.exchange_keeper(req.layout, req.first) if req.layout
                  else self.store_keeper(req.first, len(req.schedule)))
        replay = self.replay if req.model == "main" else None
        placement = 0 if replay else req.placement
        if req.overlap and self.device == "cuda" and len(req.schedule) == 1:
            self.pending = timing.launch(model, self.rotation, req.schedule[0], 0, keeper, replay, placement,
                                         early=True, cover_s=req.cover_s)
            metas = [[_meta(o) for o in as_list(self.pending.out)]]
        else:
            block = (kbmethod.time_block(model, self.rotation, req.schedule, self.device, keeper, self.timing_method)
                     if kernelbench else timing.time_block(model, self.rotation, req.schedule, self.device, replay,
                                                           keeper, placement, req.cover_s))
            self.kept += block.kept
            self.settled.extend(block)
            metas = [[o if isinstance(o, TensorMeta) else _meta(o) for o in kept] for kept in block.kept]
        # each call's outputs described (and, by a candidate, located) in its own reply: the hand-over is the
        # reply, inside the harness's wall clock on the block, with nothing left to do after the last call
        # (the checker's reply says where its own copies lie, which nobody reads: the same bytes to write and
        # parse on the harness's clock as the candidate's, so the clock check compares like with like)
        placed = self.placed[req.first:req.first + len(req.schedule)] if req.layout else [
            [Slot.model_construct(offset=0, dtype=m.dtype, shape=m.shape or [], value=None) for m in call]
            for call in metas]
        return self._with_times(WorkerReply(ok=True, graph_error=self.graph_error, replaced=timing.replaced(),
                                            metas=metas, placed=placed, overwrote=self.overwrote))

    def settle_answered(self) -> None:
        """Once an overlapped call's reply is written and the next request read: wait for the call's device work,
        time it and keep its outputs."""
        if self.pending is None:
            return
        launched, self.pending = self.pending, None
        block = timing.Block()
        block.late = timing.settle(launched, block)
        self.kept += block.kept
        self.settled.extend(block)

    def _with_times(self, reply: WorkerReply) -> WorkerReply:
        """`reply` with the times of every call settled since the last one."""
        done, self.settled = self.settled, timing.Block()
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

    def leave_timing(self) -> None:
        if self.timing_scope is not None:
            scope, self.timing_scope, self.timing_pool = self.timing_scope, None, None
            scope.close()
