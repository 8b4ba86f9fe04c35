"""Where a candidate's outputs go: into the exchange the checker lent it, copied into their slots, or (a timed call's,
where the exchange has a pool area: `carve`) left where the call allocated them.

Apart from the candidate's ops (`candidate.py`) because it is one job with state of its own: which timed calls of
the block left their outputs in place, where, and whether a later call's outputs lie over an earlier one's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kernelbench_eval.common.carve import ExchangePool
from kernelbench_eval.common.exchange import Exchange, slot_bytes
from kernelbench_eval.messages import Slot, TensorMeta
from kernelbench_eval.worker import percall
from kernelbench_eval.worker.tensors import _meta, _sync, _torch, as_list, fits


class ExchangeOutputs:
    """A candidate's outputs in the exchange it is attached to; per timed block, where each call's lie."""

    def __init__(self, exchange: Exchange, pool: ExchangePool | None, device: str) -> None:
        self.exchange = exchange
        self.pool = pool  # CUDA: the exchange's pool area, where timed calls may allocate (`carve`)
        self.device = device
        self.placed: list[list[Slot]] = []  # per call of the current block: where its outputs lie in the exchange
        self.held: list[list[Any]] = []  # per call: its outputs left in the pool area, kept alive until checked
        self.spans: list[tuple[int, int, int]] = []  # (call, begin, end): the exchange bytes those outputs occupy
        self.overwrote: list[int] = []  # calls whose outputs, left in place, a later call's outputs lie over

    def new_block(self) -> None:
        self.placed, self.held, self.spans, self.overwrote = [], [], [], []

    def keeper(self, layout: list[list[Slot]], first: int) -> percall.Keeper:
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
                self.copy_in(outs, metas, layout[call])
                return metas

            return copy

        return keeper

    def _in_place(self, outs: list[Any], metas: list[TensorMeta], slots: list[Slot], call: int
                  ) -> list[Slot] | None:
        """The slots where `outs` already lie in the pool area, or None when any one does not (then all are copied).

        Every output of this call is also looked for over the memory that earlier calls of the block left in
        place (`spans`): a model that hands out one buffer again (a `self.out` made during a timed call) has
        written over the earlier call's outputs before the checker read them. Those calls are reported
        (`overwrote`), and the harness measures again in blocks of one call (`timing_stage`)."""
        if self.pool is None or not fits(metas, slots):
            return None
        for out in outs:
            begin, end = _extent(out)
            self.overwrote += [earlier for earlier, first, last in self.spans
                               if earlier not in self.overwrote and begin < self.pool.base + last
                               and self.pool.base + first < end]
        placed: list[Slot] = []
        spans: list[tuple[int, int, int]] = []
        for out, slot in zip(outs, slots, strict=True):
            nbytes = slot_bytes(slot)
            offset = self.pool.offset_of(out, nbytes) if out.is_contiguous() else None
            if offset is None or any(offset < end and begin < offset + nbytes for _, begin, end in self.spans + spans):
                return None
            spans.append((call, offset, offset + nbytes))
            placed.append(Slot.model_construct(offset=offset, dtype=slot.dtype, shape=slot.shape, value=None))
        self.spans += spans
        return placed  # no wait: the checker reads them only after the call's device-wide synchronise

    def copy_in(self, outs: list[Any], metas: list[TensorMeta], slots: list[Slot]) -> None:
        """`outs` into their slots, where they fit them as they are (else the checker finds them missing)."""
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
