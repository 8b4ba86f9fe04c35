"""The checker: the reference's worker holds the inputs and expected outputs and compares what candidates send.

Why here and not in the harness: the expected outputs and every comparison stay next to the device they
were computed on (a GPU compares a 2 GB output in milliseconds), in a process no candidate code ever runs
in, which makes itself non-dumpable before it holds anything secret. A candidate only ever gets the
exchange buffer this process lends it (see `exchange`). Its input sets are `inputs.py`, its trials `trials.py`.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from kernelbench_eval.common.exchange import Exchange
from kernelbench_eval.measured import PrecisionCheck
from kernelbench_eval.messages import CheckReply, CheckResult, ExchangeReply, PutReply, Reply, Slot, TensorMeta
from kernelbench_eval.requests import (
    CloseExchangeRequest,
    CompareRequest,
    CompareTimedRequest,
    OpenExchangeRequest,
    ParkRequest,
    PutRequest,
    TimeRequest,
)
from kernelbench_eval.worker import flush, percall
from kernelbench_eval.worker.base import Ops
from kernelbench_eval.worker.check import compare_outputs
from kernelbench_eval.worker.tensors import _meta, _sync, _torch
from kernelbench_eval.worker.timed import SHARED_OPS, store_keeper
from kernelbench_eval.worker.trials import CheckerTrials, release
from kernelbench_eval.worker.truthcheck import Truth, stand_in

TRUTH_ODDS = 10  # blocks per timed call checked against the float64 stand-in, on average
_CHOICE = random.SystemRandom()


class CheckerWorker(CheckerTrials):
    """The reference's worker: it lends the exchange, writes inputs into it and compares what lies there."""

    def __init__(self) -> None:
        super().__init__()
        self.exchange: Exchange | None = None  # the buffer lent to the candidate being judged
        self.blocks_compared = 0  # timed blocks of this candidate compared (its first is held to the stand-in)

    def op_park(self, req: ParkRequest) -> Reply:
        """Another problem's candidates are judged on this lane meanwhile: free what only a timing needed (the
        last block's outputs and their storage, the allocator's cached blocks); the input sets and expected
        outputs stay."""
        self._drop_timed_outputs()
        if self.device == "cuda":
            flush.release_flush()
            if self.rotation is not None:
                self.rotation.flush = None  # a view: it would hold the buffer
            _torch().cuda.empty_cache()
        return Reply(ok=True)

    def _drop_timed_outputs(self) -> None:
        """The last block's outputs, their storage and the last recomputed expected outputs."""
        self.kept, self.store, self.recent = [], [], None

    def op_open_exchange(self, req: OpenExchangeRequest) -> ExchangeReply:
        self._close_exchange()
        if self.lean:  # a new candidate: the last one's timing buffers go first, as the plan counted (`memory`)
            self.drop_rotation()
            self._drop_timed_outputs()
            release(self.device)
        self.blocks_compared = 0  # a new candidate (or baseline): its first block is held to the stand-in
        self.exchange = Exchange.create(self.device, req.size, req.shm_dir, prefer_ipc=req.prefer_ipc)
        return ExchangeReply(ok=True, exchange=self.exchange.info)

    def op_close_exchange(self, req: CloseExchangeRequest) -> Reply:
        self._close_exchange()
        return Reply(ok=True)

    def _close_exchange(self) -> None:
        if self.exchange is not None:
            self.exchange.close()
            self.exchange = None

    def op_put(self, req: PutRequest) -> PutReply:
        """Write input set `name` into the exchange, for the candidate to copy out."""
        assert self.exchange is not None
        drawn = req.name not in self.sets  # not kept: drawn again for this, and let go after
        slots = self.exchange.write(self.inputs(req.name))
        _sync(self.device)
        if drawn:
            release(self.device)
        return PutReply(ok=True, slots=slots)

    def op_compare(self, req: CompareRequest) -> CheckReply:
        """Trial `trial`: the candidate's outputs, as it described them and as they lie in the exchange; where the
        trial has a float64 truth, against it too (reductions; trial 0's precision figures, or why there are none)."""
        truths = self.truths[req.trial] if req.trial < len(self.truths) else None
        check = self._compare(self.expected_outputs(req.trial), self.expected_metas[req.trial], req.slots,
                              req.outputs, truths)
        if req.trial == 0 and check.passed and check.precision is None:
            check.precision = PrecisionCheck(note=self.truth_note or "no floating output to measure")
        return CheckReply(ok=True, check=check)

    def op_compare_timed(self, req: CompareTimedRequest) -> CheckReply:
        """Every listed call of the last timed block, in full, against this worker's own outputs of that call; where
        trial 0 had a float64 truth, also against the reference's output standing in for it (`truth.stand_in`: the
        reduction bound, and the precision figure: the block's largest)."""
        worst = CheckResult(passed=True, max_abs_diff=0.0, mean_abs_diff=0.0)
        models = self.truths[0] if self.truths else None
        # the float64 stand-in costs more than the comparison itself (on a 2-core CPU, 20 ms a block against 4):
        # one call of a candidate's first block, then of a block in TRUTH_ODDS, chosen here after the block ran, so
        # no candidate knows which (one that cheats only after its first block is caught within a few tens)
        first = self.blocks_compared == 0
        self.blocks_compared += 1
        chosen = first or _CHOICE.random() < 1 / TRUTH_ODDS
        truth_call = _CHOICE.randrange(len(req.calls)) if models and req.calls and chosen else None
        for index, (call, slots, metas) in enumerate(zip(req.calls, req.layout, req.metas, strict=True)):
            expected = self.kept[call]
            truths = [stand_in(e, m) if m is not None and isinstance(e, _torch().Tensor) else None
                      for e, m in zip(expected, models, strict=False)] if index == truth_call else None
            result = self._compare(expected, [_meta(e) for e in expected], slots, metas, truths)
            if not result.passed:
                result.error = f"timed call {call}: {result.error}"
                return CheckReply(ok=True, check=result)
            worst.max_abs_diff = max(worst.max_abs_diff or 0.0, result.max_abs_diff or 0.0)
            worst.mean_abs_diff = max(worst.mean_abs_diff or 0.0, result.mean_abs_diff or 0.0)
            if result.precision is not None and (worst.precision is None or (result.precision.candidate_error or 0)
                                                 > (worst.precision.candidate_error or 0)):
                worst.precision = result.precision
        return CheckReply(ok=True, check=worst)

    def _compare(self, expected: list[Any], expected_metas: list[TensorMeta], slots: list[Slot],
                 metas: list[TensorMeta], truths: list[Truth | None] | None = None) -> CheckResult:
        assert self.exchange is not None
        # on a GPU run over a shared file (CUDA IPC refused), the outputs are brought to the expected ones' device
        got: list[Any] = []
        if len(slots) == len(metas) == len(expected):
            try:
                got = [self.exchange.view(s).to(e.device) for s, e in zip(slots, expected, strict=True)]
            except (ValueError, RuntimeError) as exc:  # a slot outside the exchange or misaligned (the harness
                # checks first; what a candidate reported is never trusted here either)
                return CheckResult(passed=False, error=str(exc))
        result = compare_outputs(expected, expected_metas, got, metas, self.atol, self.rtol, truths)
        figures = None
        if result.precision is not None:
            output, error, ref_error = result.precision
            figures = PrecisionCheck(candidate_error=error, reference_error=ref_error, output=output)
        return CheckResult(passed=result.passed, max_abs_diff=result.max_abs_diff,
                           mean_abs_diff=result.mean_abs_diff, error=result.error, precision=figures)

    def _keeper(self, req: TimeRequest) -> percall.Keeper:
        """Its timed outputs into storage shaped as trial 0's expected outputs, made before the first block."""
        template = self.expected_metas[0] if self.expected_metas else []
        return store_keeper(self.store, req.first, len(req.schedule), template, self.device)

    OPS: ClassVar[Ops] = {**SHARED_OPS, "prepare": CheckerTrials.op_prepare, "expect": CheckerTrials.op_expect,
                          "park": op_park, "open_exchange": op_open_exchange, "close_exchange": op_close_exchange,
                          "put": op_put, "compare": op_compare, "compare_timed": op_compare_timed}
