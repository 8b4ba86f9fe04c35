"""Timed outputs compared where the candidate's call put them (`common/carve.py`): the pool area's bookkeeping, what
the harness accepts of where the candidate says they lie, and the candidate's keeper choosing between leaving and
copying. All without a GPU: the device path runs in
`tests/test_judge_units.py::test_timed_outputs_are_compared_where_the_call_put_them`."""

from __future__ import annotations

import torch

from kernelbench_eval.budgets import Budgets
from kernelbench_eval.common.carve import IN_PLACE_VAR, POOL_MIN_BYTES, SEGMENT_ALIGN, Carver, pool_bytes
from kernelbench_eval.common.exchange import Exchange, output_layout
from kernelbench_eval.discover.corpus import Problem
from kernelbench_eval.judge.baselines import BaselineStore
from kernelbench_eval.judge.judging import ReferenceSide, Secrets
from kernelbench_eval.judge.measure import block_calls
from kernelbench_eval.judge.timing_stage import placed_slots
from kernelbench_eval.messages import MemoryPlan, Slot, TensorMeta
from kernelbench_eval.records import RunSettings
from kernelbench_eval.worker.placing import ExchangeOutputs


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
    assert pool_bytes(5 * (520 << 20), 520 << 20, 80 << 30, calls=5) == 7 * (520 << 20)  # a block's, two spare
    assert pool_bytes(5 * (520 << 20), 520 << 20, 16 << 30, calls=5) == 0  # 6 GB of 16: a block of one, then
    assert pool_bytes(520 << 20, 520 << 20, 4 << 30) == 0  # 2 GB of 4: too much of a small device
    assert pool_bytes(1 << 20, 1 << 20, None) == 0  # memory unknown: no pool


class _Pool:
    """The worker's view of an ExchangePool over a CPU exchange: where a tensor lies."""

    def __init__(self, exchange: Exchange, offset: int) -> None:
        self.base, self.offset, self.size = exchange.buffer.data_ptr(), offset, exchange.info.size

    def offset_of(self, tensor: torch.Tensor, nbytes: int) -> int | None:
        at = tensor.data_ptr() - self.base
        return at if self.offset <= at and at + nbytes <= self.size else None


def _outputs(tmp_path) -> tuple[ExchangeOutputs, Exchange, list[list[Slot]]]:  # noqa: ANN001
    """A candidate's outputs in a CPU exchange whose upper half is its pool area."""
    exchange = Exchange.create("cpu", 1 << 16, str(tmp_path))
    outputs = ExchangeOutputs(exchange, _Pool(exchange, 1 << 15), "cpu")  # type: ignore[arg-type]
    metas = [TensorMeta(type_name="Tensor", exact_tensor=True, dtype="torch.float32", shape=[16])]
    return outputs, exchange, output_layout(metas, calls=2)


def test_the_keeper_leaves_outputs_in_the_pool_area_and_copies_the_rest(tmp_path):
    outputs, exchange, layout = _outputs(tmp_path)
    pooled = exchange.buffer[1 << 15:(1 << 15) + 64].view(torch.float32)
    pooled.copy_(torch.arange(16.0))
    metas = outputs.keeper(layout[:1], first=0)(0, pooled)()
    assert outputs.placed[0][0].offset == 1 << 15 and outputs.held[0][0] is pooled  # no copy, kept alive
    assert metas[0].shape == [16]
    elsewhere = torch.arange(16.0) + 1
    finish = outputs.keeper(layout[1:], first=1)(0, elsewhere)
    assert outputs.placed[1] == layout[1] and not torch.equal(exchange.view(layout[1][0]), elsewhere)
    finish()  # the copy waits until the device is idle (the keeper's first half may run while it computes)
    assert torch.equal(exchange.view(layout[1][0]), elsewhere)  # copied
    exchange.close()


def test_the_keeper_copies_views(tmp_path):
    outputs, exchange, layout = _outputs(tmp_path)
    region = exchange.buffer[1 << 15:(1 << 15) + 128].view(torch.float32)
    outputs.keeper(layout[:1], first=0)(0, region[::2])()  # not contiguous
    assert outputs.placed[0] == layout[0] and outputs.held[0] == []
    assert torch.equal(exchange.view(layout[0][0]), region[::2])
    exchange.close()


def test_a_block_of_several_calls_leaves_each_in_place_and_says_when_one_lies_over_an_earlier_one(tmp_path):
    """Outputs stay in place across a block (each held until the check), but a model that hands out one buffer
    again has written over the earlier call's outputs: the worker reports that call (`overwrote`), whose
    outputs it can no longer vouch for, and copies the later one; the next block starts afresh."""
    outputs, exchange, layout = _outputs(tmp_path)
    layout = output_layout([TensorMeta(type_name="Tensor", exact_tensor=True, dtype="torch.float32", shape=[16])],
                           calls=3)
    pool = exchange.buffer[1 << 15:].view(torch.float32)
    first, second = pool[:16], pool[64:80]
    outputs.keeper(layout[0:1], first=0)(0, first)()
    outputs.keeper(layout[1:2], first=1)(0, second)()
    assert [p[0].offset for p in outputs.placed] == [1 << 15, (1 << 15) + 256] and outputs.overwrote == []
    again = pool[8:24]  # over half of the first call's outputs: a buffer handed out again, shifted
    outputs.keeper(layout[2:3], first=2)(0, again)()
    assert outputs.overwrote == [0] and outputs.placed[2] == layout[2]  # reported, and this one copied
    assert torch.equal(exchange.view(layout[2][0]), again)
    outputs.new_block()  # what `op_time` has done at a block's first call
    outputs.keeper(layout[0:1], first=0)(0, again)()
    assert outputs.overwrote == [] and outputs.placed[0][0].offset == (1 << 15) + 32  # in place again
    exchange.close()


def test_large_outputs_on_a_gpu_share_a_block_that_divides_the_window():
    """On the CPU, outputs over half the kept budget are a block each; on a GPU (copied into the exchange or left
    in place), as many as DEVICE_BLOCK_BYTES holds, rounded down to a divisor of the 10-call window (71_Conv2d's
    520 MB: five). Small outputs go in blocks of ten on either."""
    assert block_calls(520 << 20) == 1 and block_calls(520 << 20, "cuda") == 5
    assert block_calls(1 << 30, "cuda") == 2  # three would fit: not a divisor of 10
    assert block_calls(4 << 30, "cuda") == 1
    assert block_calls(1 << 20, "cuda") == block_calls(1 << 20) == 10
    assert block_calls(200 << 20, "cuda") == block_calls(200 << 20) == 2  # within the kept budget: the same


def test_a_lane_takes_the_largest_in_place_block_its_device_has_room_for(tmp_path, monkeypatch):
    """71_Conv2d's outputs on a GPU, outputs in place asked for (KBEVAL_IN_PLACE=1): five calls to a block with
    their pool area where a quarter of the device holds it (an H100), one where only a block of one fits (a 16 GB
    card), none where CUDA IPC was refused; copied blocks hold five calls too (the memory plan counts them), one
    on the CPU and where the plan does not fit. The reference's own blocks follow the same rule, so alone it keeps
    its candidates' cadence. Not asked for (the default), blocks are copied."""
    problem = Problem("71", tmp_path / "p.py", "0" * 64)
    monkeypatch.setenv(IN_PLACE_VAR, "1")
    settings = RunSettings(device="cuda")
    ref = ReferenceSide(problem, settings, Secrets.draw(1), tmp_path / "log", Budgets.of(60, 60),
                        BaselineStore(tmp_path / "b"))
    lender = ref.lender
    try:
        lender.learn_inputs(128 * 8 * 128 * 128 * 4)
        lender.learn_outputs([[TensorMeta(type_name="Tensor", exact_tensor=True, dtype="torch.float32",
                                          shape=[128, 64, 126, 126])]], None)
        lender.learn_device(80 << 30)
        assert lender.calls_per_block() == 5 and lender.calls_per_block(in_place=False) == 5
        assert lender._in_place_block()[0] == 5
        lender.learn_device(16 << 30)
        assert lender._in_place_block()[0] == 1 and lender.calls_per_block() == 1
        lender.learn_device(80 << 30)
        lender.refuse_ipc("refused here")
        assert lender._in_place_block() == (0, 0) and lender.calls_per_block() == 5
        lender.residency = MemoryPlan(trial_inputs=False, expected=False, timing_sets=1, placements=1,
                                      need_bytes=100 << 30, budget_bytes=80 << 30, fits=False, resident_bytes=0,
                                      input_bytes=0, output_bytes=0, transient_bytes=0)
        assert lender.calls_per_block() == 1  # the plan is over the budget already: no block beyond one call
        lender.residency = None
        lender.settings = RunSettings(device="cpu")
        assert lender.calls_per_block() == 1
        lender.settings, lender.ipc = settings, True
        monkeypatch.delenv(IN_PLACE_VAR)
        assert lender._in_place_block() == (0, 0) and lender.calls_per_block() == 5  # the default: copied
    finally:
        ref.close()
