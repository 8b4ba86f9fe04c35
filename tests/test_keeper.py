"""The checker keeps timed outputs the way the candidate does: copied into storage made once, never per call.

An A/A test (the reference against its own copy) found the reference 1.5-1.9x slower on a CPU when the checker
kept a fresh clone of every call's output: each call of a block then allocated new pages. These tests hold
the storage's identity across blocks, which is what makes the two lanes allocate alike.
"""

import torch

from kernelbench_eval.worker.percall import Keeper
from kernelbench_eval.worker.tensors import _meta
from kernelbench_eval.worker.timed import store_keeper


class _Worker:
    """The checker's side of `store_keeper`: one store for every block, made from trial 0's expected outputs."""

    def __init__(self, template: list[torch.Tensor]) -> None:
        self.store: list[list[torch.Tensor | None]] = []
        self.template = [_meta(t) for t in template]

    def store_keeper(self, first: int, calls: int) -> Keeper:
        return store_keeper(self.store, first, calls, self.template, "cpu")


def _worker(template: list[torch.Tensor]) -> _Worker:
    return _Worker(template)


def test_store_keeper_copies_into_the_same_storage_every_block():
    worker = _worker([torch.zeros(4, 8)])
    first = worker.store_keeper(0, 3)
    ptrs = [first(call, torch.full((4, 8), float(call)))()[0].data_ptr() for call in range(3)]
    second = worker.store_keeper(0, 3)
    kept = [second(call, torch.full((4, 8), 10.0 + call))() for call in range(3)]
    assert [k[0].data_ptr() for k in kept] == ptrs  # no allocation in a later block
    assert len(set(ptrs)) == 3  # one slot per call: every call of a block is still checked on its own
    assert [k[0][0, 0].item() for k in kept] == [10.0, 11.0, 12.0]


def test_one_call_per_request_still_gets_a_slot_per_call():
    """The harness sends one call per request (`first` = its index in the block): each keeps its own slot."""
    worker = _worker([torch.zeros(2)])
    kept = [worker.store_keeper(i, 1)(0, torch.full((2,), float(i)))() for i in range(3)]
    assert [k[0][0].item() for k in kept] == [0.0, 1.0, 2.0]
    assert len({k[0].data_ptr() for k in kept}) == 3


def test_store_keeper_copies_not_aliases_an_output_the_model_reuses():
    worker = _worker([torch.zeros(2)])
    keeper = worker.store_keeper(0, 2)
    reused = torch.tensor([1.0, 2.0])
    a = keeper(0, reused)()
    reused.fill_(7.0)  # a model writing into the same output buffer on the next call
    b = keeper(1, reused)()
    assert a[0].tolist() == [1.0, 2.0] and b[0].tolist() == [7.0, 7.0]


def test_store_keeper_copies_only_once_the_call_is_finished():
    """Its first half runs while a long call still computes on the device (`timing.EARLY_MS`): it must not copy."""
    worker = _worker([torch.zeros(2)])
    out = torch.tensor([1.0, 2.0])
    finish = worker.store_keeper(0, 1)(0, out)
    out.fill_(3.0)  # the device finishing the call after the keeper's first half
    assert finish()[0].tolist() == [3.0, 3.0]


def test_store_keeper_follows_outputs_unlike_the_template():
    worker = _worker([torch.zeros(3)])
    keeper = worker.store_keeper(0, 1)
    out = (torch.ones(2, 2, dtype=torch.float64), 5)
    kept = keeper(0, out)()
    assert kept[0].dtype == torch.float64 and kept[0].shape == (2, 2) and kept[1] is None
