"""The checker: the reference's worker holds the inputs and expected outputs and compares what candidates send.

Why here and not in the harness: the expected outputs and every comparison stay next to the device they
were computed on (a GPU compares a 2 GB output in milliseconds), in a process no candidate code ever runs
in, which makes itself non-dumpable before it holds anything secret. A candidate only ever gets the
exchange buffer this process lends it (see `exchange`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelbench_eval.isolation.linux import keep_memory_private
from kernelbench_eval.judge import flush, refill, timing
from kernelbench_eval.judge.check import compare_outputs
from kernelbench_eval.judge.exchange import Exchange
from kernelbench_eval.judge.precision import cast_inputs
from kernelbench_eval.judge.truth import Truth, stand_in
from kernelbench_eval.measured import PrecisionCheck
from kernelbench_eval.messages import CheckResult, Slot, TensorMeta, WorkerReply, WorkerRequest
from kernelbench_eval.worker.common import _describe, _meta, _nbytes, _sync, _torch, as_list, free_memory, out_of_memory
from kernelbench_eval.worker.draws import draw_inputs  # noqa: F401 (where tests and older callers import it)
from kernelbench_eval.worker.trials import TrialOps, _release

TRUTH_ODDS = 10  # blocks per timed call checked against the float64 stand-in, on average
_CHOICE = random.SystemRandom()


class ReferenceOps(TrialOps):
    """Mixed into `worker.Worker`; these ops are only ever sent to a reference's worker."""

    device: str
    models: dict[str, Any]
    sets: dict[str, list[Any]]
    exchange: Exchange | None
    kept: list[list[Any]]
    store: list[list[Any]]
    rotation: refill.Rotation | None

    def op_prepare(self, req: WorkerRequest) -> WorkerReply:
        """Apply size overrides, write the init arguments, and learn how to make one input set per secret seed.

        Only the first trial's set is drawn now (its sizes are the problem's footprint); the others are drawn
        when `op_expect` has planned what stays resident (`memory`), and again whenever one not kept is needed:
        one seed always gives one set."""
        keep_memory_private()  # secrets from here on: no same-user process may read this one's memory
        torch = _torch()
        module = self._module(req.path)  # type: ignore[attr-defined]
        missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if not hasattr(module, n)]
        if missing:
            return WorkerReply(ok=False, error_kind="load_error", error=f"problem lacks {', '.join(missing)}")
        for name, value in req.dims.items():
            if hasattr(module, name):
                setattr(module, name, value)
        self.free_at_start = free_memory(req.device or "cpu")
        out_dir = Path(req.inputs_dir or ".")
        torch.save(cast_inputs(module.get_init_inputs(), req.precision), out_dir / "init.pt")
        self.set_seeds = {f"trial{k}": s for k, s in enumerate(req.trial_seeds)}
        self.set_seeds |= {f"timing{k}": s for k, s in enumerate(req.timing_seeds)}
        self.draw_from = (module.get_inputs, req.device or "cpu", req.precision)
        names = list(self.set_seeds) if req.save_inputs else list(self.set_seeds)[:1]
        inputs: list[Any] = []
        self.input_bytes = 0
        try:
            for name in names:
                inputs = self.sets[name] = self.draw(name)
                self.input_bytes = sum(_nbytes(x) for x in inputs)
                if req.save_inputs:
                    torch.save(inputs, out_dir / f"{name}.pt")
        except Exception as exc:
            if not out_of_memory(exc):
                raise
            self.sets = {}
            return WorkerReply(ok=False, error_kind="runtime_error", error=self._too_big(exc))
        return WorkerReply(ok=True, input_shapes=[_describe(x) for x in inputs], torch_version=torch.__version__,
                           input_bytes=self.input_bytes)

    def op_park(self, req: WorkerRequest) -> WorkerReply:
        """Another problem's candidates are judged on this lane meanwhile: free what only a timing needed (the
        last block's outputs and their storage, the allocator's cached blocks); the input sets and expected
        outputs stay."""
        self.kept, self.store, self.recent = [], [], None
        if self.device == "cuda":
            flush.release_flush()
            if self.rotation is not None:
                self.rotation.flush = None  # a view: it would hold the buffer
            _torch().cuda.empty_cache()
        return WorkerReply(ok=True)

    def op_open_exchange(self, req: WorkerRequest) -> WorkerReply:
        self.op_close_exchange(req)
        self.blocks_compared = 0  # a new candidate (or baseline): its first block is held to the stand-in
        self.exchange = Exchange.create(self.device, req.size, req.shm_dir, prefer_ipc=req.name != "shm")
        return WorkerReply(ok=True, exchange=self.exchange.info)

    def op_close_exchange(self, req: WorkerRequest) -> WorkerReply:
        if self.exchange is not None:
            self.exchange.close()
            self.exchange = None
        return WorkerReply(ok=True)

    def op_put(self, req: WorkerRequest) -> WorkerReply:
        """Write input set `name` into the exchange, for the candidate to copy out."""
        assert self.exchange is not None
        drawn = req.name not in self.sets  # not kept: drawn again for this, and let go after
        slots = self.exchange.write(self.inputs(req.name or ""))
        _sync(self.device)
        if drawn:
            _release(self.device)
        return WorkerReply(ok=True, slots=slots)

    def store_keeper(self, first: int, calls: int) -> timing.Keeper:
        """While timed: each call's outputs copied into storage made before the block, as the candidate copies
        into the exchange, with the same host work after the call (describe, copy, wait): both keepers run
        inside the wall clock the clock check compares, so work one side did alone would count against it.
        Keeping fresh outputs (or fresh clones) instead makes every call of a block allocate new memory, which
        on a CPU means new pages: an A/A test then found the reference 1.5-1.9x slower than its own copy.
        `first`: the block's call index of this request's first call."""
        torch = _torch()
        template = getattr(self, "expected_metas", None) or [[]]
        while len(self.store) < first + calls:
            self.store.append([_empty(m, self.device) for m in template[0]])

        def keeper(call: int, out: Any) -> Callable[[], list[Any]]:
            outs, slots = as_list(out), self.store[first + call]
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
                _sync(self.device)  # as the candidate's keeper waits for its copies into the exchange
                return list(slots)

            return copy

        return keeper

    def op_compare(self, req: WorkerRequest) -> WorkerReply:
        """Trial `trial`: the candidate's outputs, as it described them and as they lie in the exchange; where the
        trial has a float64 truth, against it too (reductions; trial 0's precision figures, or why there are none)."""
        truths = self.truths[req.trial] if req.trial < len(getattr(self, "truths", [])) else None
        check = self._compare(self.expected_outputs(req.trial), self.expected_metas[req.trial], req.slots,
                              req.outputs, truths)
        if req.trial == 0 and check.passed and check.precision is None:
            check.precision = PrecisionCheck(note=self.truth_note or "no floating output to measure")
        return WorkerReply(ok=True, check=check)

    def op_compare_timed(self, req: WorkerRequest) -> WorkerReply:
        """Every listed call of the last timed block, in full, against this worker's own outputs of that call; where
        trial 0 had a float64 truth, also against the reference's output standing in for it (`truth.stand_in`: the
        reduction bound, and the precision figure: the block's largest)."""
        worst = CheckResult(passed=True, max_abs_diff=0.0, mean_abs_diff=0.0)
        models = self.truths[0] if getattr(self, "truths", None) else None
        # the float64 stand-in costs more than the comparison itself (on a 2-core CPU, 20 ms a block against 4):
        # one call of a candidate's first block, then of a block in TRUTH_ODDS, chosen here after the block ran, so
        # no candidate knows which (one that cheats only after its first block is caught within a few tens)
        first = getattr(self, "blocks_compared", 0) == 0
        self.blocks_compared = getattr(self, "blocks_compared", 0) + 1
        chosen = first or _CHOICE.random() < 1 / TRUTH_ODDS
        truth_call = _CHOICE.randrange(len(req.calls)) if models and req.calls and chosen else None
        for index, (call, slots, metas) in enumerate(zip(req.calls, req.layout, req.metas, strict=True)):
            expected = self.kept[call]
            truths = [stand_in(e, m) if m is not None and isinstance(e, _torch().Tensor) else None
                      for e, m in zip(expected, models, strict=False)] if index == truth_call else None
            result = self._compare(expected, [_meta(e) for e in expected], slots, metas, truths)
            if not result.passed:
                result.error = f"timed call {call}: {result.error}"
                return WorkerReply(ok=True, check=result)
            worst.max_abs_diff = max(worst.max_abs_diff or 0.0, result.max_abs_diff or 0.0)
            worst.mean_abs_diff = max(worst.mean_abs_diff or 0.0, result.mean_abs_diff or 0.0)
            if result.precision is not None and (worst.precision is None or (result.precision.candidate_error or 0)
                                                 > (worst.precision.candidate_error or 0)):
                worst.precision = result.precision
        return WorkerReply(ok=True, check=worst)

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


def _empty(meta: TensorMeta, device: str) -> Any:
    """Storage shaped as an output `meta` describes (None where it was no tensor)."""
    torch = _torch()
    if not meta.exact_tensor or meta.dtype is None:
        return None
    return torch.empty(meta.shape or [], dtype=getattr(torch, meta.dtype.removeprefix("torch.")), device=device)
