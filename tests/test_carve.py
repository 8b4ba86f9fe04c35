"""Timed outputs compared where the candidate's call put them (`judge/carve.py`): the pool area's bookkeeping, what
the harness accepts of where the candidate says they lie, and the candidate's keeper choosing between leaving and
copying. All without a GPU: the device path runs in
`tests/test_judge_units.py::test_timed_outputs_are_compared_where_the_call_put_them`."""

from __future__ import annotations

import pytest
import torch

from kernelbench_eval.judge import measure
from kernelbench_eval.judge.carve import POOL_MIN_BYTES, SEGMENT_ALIGN, Carver, pool_bytes
from kernelbench_eval.judge.exchange import Exchange, output_layout
from kernelbench_eval.judge.timed import placed_slots
from kernelbench_eval.messages import Slot, TensorMeta
from kernelbench_eval.worker.main import Worker


def test_segments_are_carved_in_order_aligned_and_what_does_not_fit_falls_back():
    fallbacks, released = [], []
    carver = Carver(1000, 1000 + 3 * SEGMENT_ALIGN, lambda n: fallbacks.append(n) or 7, released.append)
    first, second = carver.alloc(SEGMENT_ALIGN), carver.alloc(10)
    assert first == SEGMENT_ALIGN and second == 2 * SEGMENT_ALIGN  # aligned, one after the other
    assert carver.alloc(2 * SEGMENT_ALIGN) == 7 and fallbacks == [2 * SEGMENT_ALIGN]  # past the end: cudaMalloc
    carver.free(first)
    carver.free(7)
    assert released == [7]  # only memory the fallback gave is given back
    assert carver.within(first, SEGMENT_ALIGN) and not carver.within(first, 3 * SEGMENT_ALIGN)


def test_the_harness_takes_only_an_offset_inside_the_exchange_on_an_element_boundary():
    metas = [TensorMeta(type_name="Tensor", exact_tensor=True, dtype="torch.float32", shape=[4, 4])]
    slots = output_layout(metas)[0]
    assert placed_slots(slots, None, 4096) == slots  # nothing reported: the layout's own slots
    moved = placed_slots(slots, [Slot(offset=1024, dtype="torch.int8", shape=[1])], 4096)
    assert moved == [Slot(offset=1024, dtype="torch.float32", shape=[4, 4])]  # dtype and shape stay the reference's
    assert placed_slots(slots, [Slot(offset=4096 - 32)], 4096) is None  # its 64 bytes would run past the end
    assert placed_slots(slots, [Slot(offset=-4)], 4096) is None
    assert placed_slots(slots, [Slot(offset=1026)], 4096) is None  # off a float32 boundary
    assert placed_slots(slots, [Slot(offset=0), Slot(offset=64)], 4096) is None  # not the layout's outputs
    plain = [Slot(value=3)]
    assert placed_slots(plain, [Slot(offset=10 ** 12)], 4096) == plain  # a plain value is not read from memory


def test_the_pool_area_fits_a_quarter_of_the_device_or_is_left_out():
    assert pool_bytes(1 << 20, 1 << 20, 80 << 30) == POOL_MIN_BYTES
    assert pool_bytes(520 << 20, 520 << 20, 80 << 30) == 3 * (520 << 20)
    assert pool_bytes(520 << 20, 520 << 20, 4 << 30) == 0  # 2 GB of 4: too much of a small device
    assert pool_bytes(1 << 20, 1 << 20, None) == 0  # memory unknown: no pool


class _Pool:
    """The worker's view of an ExchangePool over a CPU exchange: where a tensor lies."""

    def __init__(self, exchange: Exchange, offset: int) -> None:
        self.base, self.offset, self.size = exchange.buffer.data_ptr(), offset, exchange.info.size

    def offset_of(self, tensor: torch.Tensor, nbytes: int) -> int | None:
        at = tensor.data_ptr() - self.base
        return at if self.offset <= at and at + nbytes <= self.size else None


def _worker(tmp_path) -> tuple[Worker, Exchange, list[list[Slot]]]:  # noqa: ANN001
    exchange = Exchange.create("cpu", 1 << 16, str(tmp_path))
    worker = Worker()
    worker.exchange, worker.pool = exchange, _Pool(exchange, 1 << 15)
    metas = [TensorMeta(type_name="Tensor", exact_tensor=True, dtype="torch.float32", shape=[16])]
    return worker, exchange, output_layout(metas, calls=2)


@pytest.fixture
def one_call_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outputs of 64 bytes fill the kept-output budget: a block is one call, as for 71_Conv2d's 520 MB."""
    monkeypatch.setattr(measure, "KEPT_BYTES", 64)


def test_the_keeper_leaves_outputs_in_the_pool_area_and_copies_the_rest(tmp_path, one_call_blocks):
    worker, exchange, layout = _worker(tmp_path)
    pooled = exchange.buffer[1 << 15:(1 << 15) + 64].view(torch.float32)
    pooled.copy_(torch.arange(16.0))
    metas = worker.exchange_keeper(layout[:1], first=0)(0, pooled)()
    assert worker.placed[0][0].offset == 1 << 15 and worker.held[0][0] is pooled  # no copy, kept alive
    assert metas[0].shape == [16]
    elsewhere = torch.arange(16.0) + 1
    finish = worker.exchange_keeper(layout[1:], first=1)(0, elsewhere)
    assert worker.placed[1] == layout[1] and not torch.equal(exchange.view(layout[1][0]), elsewhere)
    finish()  # the copy waits until the device is idle (the keeper's first half may run while it computes)
    assert torch.equal(exchange.view(layout[1][0]), elsewhere)  # copied
    exchange.close()


def test_the_keeper_copies_views_and_outputs_of_blocks_of_several_calls(tmp_path, one_call_blocks):
    worker, exchange, layout = _worker(tmp_path)
    region = exchange.buffer[1 << 15:(1 << 15) + 128].view(torch.float32)
    worker.exchange_keeper(layout[:1], first=0)(0, region[::2])()  # not contiguous
    assert worker.placed[0] == layout[0]
    measure.KEPT_BYTES = 1 << 20  # (undone by the fixture) 64-byte outputs: ten calls to a block
    worker.exchange_keeper(layout[:1], first=0)(0, region[:16])()
    assert worker.placed[0] == layout[0] and worker.held[0] == []  # a later call could write over it: copied
    assert torch.equal(exchange.view(layout[0][0]), region[:16])
    exchange.close()
