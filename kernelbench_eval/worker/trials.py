"""The checker's trials: each trial's input set (drawn from its secret seed in the trial's distribution), the
reference's expected outputs under the memory budget, and the float64 truths they are also judged against.

Why in one place: which distribution a trial uses is settled while its expected outputs are computed (the
reference may refuse one: `worker.draws`), and a set that the memory plan does not keep is drawn again later
from the same seed in the same distribution, so the draw, the plan and the refusals must agree.
"""

from __future__ import annotations

from typing import Any

from kernelbench_eval.judge import memory, refill
from kernelbench_eval.judge.check import degenerate_outputs
from kernelbench_eval.judge.precision import cast_inputs
from kernelbench_eval.judge.truth import Truth
from kernelbench_eval.messages import MemoryPlan, TensorMeta, WorkerReply, WorkerRequest
from kernelbench_eval.worker.common import (
    _memory_bytes,
    _meta,
    _nbytes,
    _one_line,
    _sync,
    _torch,
    as_list,
    out_of_memory,
    peak_memory,
)
from kernelbench_eval.worker.draws import distribution_of, draw_inputs, reshape
from kernelbench_eval.worker.truth import TruthMaker


class TrialOps:
    """Mixed into `worker.Worker` through `ReferenceOps`: the checker's input sets and expected outputs."""

    device: str
    models: dict[str, Any]
    sets: dict[str, list[Any]]
    set_seeds: dict[str, int]
    draw_from: tuple[Any, str, str | None]
    free_at_start: int | None
    input_bytes: int

    def draw(self, name: str) -> list[Any]:
        """Input set `name`, made from its secret seed in its distribution (the same values every time)."""
        torch = _torch()
        get_inputs, device, precision = self.draw_from
        seed = self.set_seeds[name]
        drawn = reshape(draw_inputs(get_inputs, seed, device), self.distribution(name), seed)
        inputs = cast_inputs(drawn, precision)
        return [x.contiguous() if isinstance(x, torch.Tensor) else x for x in inputs]

    def distribution(self, name: str) -> str:
        """The distribution set `name` is drawn in: a trial's as settled (`normal` where the reference refused
        its own), the timing sets' the problem's."""
        settled = getattr(self, "trial_distributions", {})
        if name in settled:
            return settled[name]
        return distribution_of(int(name[5:])) if name.startswith("trial") else "normal"

    def inputs(self, name: str) -> list[Any]:
        """Input set `name` on the model's device: kept, or drawn again (not kept: the plan left it out)."""
        torch = _torch()
        if name in self.sets:
            return self.sets[name]
        return [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in self.draw(name)]

    def op_expect(self, req: WorkerRequest) -> WorkerReply:
        """Compute every trial's expected outputs, measure the problem's footprint and plan what stays on the
        device under the budget (`memory.plan`); the timing's base sets are drawn here, to stay. Running out of
        memory here is the problem's verdict (its candidates are skipped), said with the sizes."""
        try:
            return self._expect(req)
        except Exception as exc:
            if not out_of_memory(exc):
                raise
            self.sets, self.expected, self.recent = {}, [], None
            return WorkerReply(ok=False, error_kind="runtime_error", error=self._too_big(exc))

    def _too_big(self, exc: BaseException) -> str:
        """The out-of-memory message of a problem whose reference cannot be judged on this device."""
        total = _memory_bytes(self.draw_from[1] if hasattr(self, "draw_from") else self.device) or 0
        one_set = f"; one input set takes {memory.gb(self.input_bytes)}" if getattr(self, "input_bytes", 0) else ""
        return (f"out of memory: the reference needs more than this device has ({memory.gb(total)} in all, "
                f"{memory.gb(self.free_at_start or 0)} free when it started{one_set}): {type(exc).__name__}: "
                + " ".join(str(exc).split())[:200])

    def _expect(self, req: WorkerRequest) -> WorkerReply:
        torch = _torch()
        self.atol, self.rtol = req.atol, req.rtol
        self.sets = {name: [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in inputs]
                     for name, inputs in self.sets.items()}
        self.expected: list[list[Any] | None] = []
        self.expected_metas: list[list[TensorMeta]] = []
        self.recent: tuple[int, list[Any]] | None = None
        self.truths: list[list[Truth | None] | None] = []
        self.trial_distributions: dict[str, str] = {}
        self.refused: dict[str, str] = {}  # distribution -> why the reference refused it
        maker: TruthMaker | None = None  # made after trial 0's reference call: its float64 copy is not measured
        trials = len(req.trial_seeds)
        self.stateful = self._keeps_state(self.inputs("trial0"))
        plan: memory.Residency | None = None
        footprint: memory.Footprint | None = None
        warning, reductions = None, False
        for trial in range(trials):
            name = f"trial{trial}"
            inputs, outs, transient = self._trial(trial, measure=trial == 0)
            if isinstance(outs, WorkerReply):
                return outs
            self.expected_metas.append([_meta(o) for o in outs])
            made = None
            if (trial == 0 or reductions) and not self.stateful:  # (a float64 copy would start in another state)
                maker = maker or TruthMaker(self.models["main"], self.device)
                made = maker.truths(inputs, outs, self.set_seeds[name], reductions_only=trial > 0)
            reductions = reductions or any(t is not None and t.reduction for t in made or [])
            self.truths.append(made)
            if trial == 0:
                warning = degenerate_outputs(outs, self.atol, self.rtol)
                footprint = memory.Footprint(
                    input_bytes=sum(_nbytes(x) for x in inputs), output_bytes=sum(_nbytes(o) for o in outs),
                    transient_bytes=transient, trials=trials, timing_sets=len(req.timing_seeds),
                    block_bytes=memory.block_bytes(sum(_nbytes(o) for o in outs), self.device),
                    placements=refill.PLACEMENTS if self.device == "cuda" else 1)
                budget = req.memory_budget or int(memory.SHARE * (self.free_at_start or 0))
                plan = memory.plan(footprint, int(budget * req.memory_share) if budget else 1 << 62)
            assert plan is not None
            self.expected.append(outs if plan.expected or self.stateful else None)  # a state is not replayed
            if plan.trial_inputs:
                self.sets[name] = inputs
            else:
                self.sets.pop(name, None)
        note = self.truth_note = STATEFUL_NOTE if self.stateful else maker_note(self.truths, maker)
        del maker  # the float64 copy goes before the timing sets are drawn
        assert plan is not None and footprint is not None
        for k in range(plan.timing_sets):
            self.sets[f"timing{k}"] = self.inputs(f"timing{k}")
        self.placements = plan.placements
        _release(self.device)  # what the plan let go goes back to the device, for the candidate's process
        residency = MemoryPlan(trial_inputs=plan.trial_inputs, expected=plan.expected, timing_sets=plan.timing_sets,
                               placements=plan.placements, need_bytes=plan.need_bytes, budget_bytes=plan.budget_bytes,
                               fits=plan.fits, resident_bytes=plan.resident_bytes(footprint),
                               input_bytes=footprint.input_bytes, output_bytes=footprint.output_bytes,
                               transient_bytes=footprint.transient_bytes)
        return WorkerReply(ok=True, expected=self.expected_metas, warning=warning, residency=residency,
                           distributions=[self.distribution(f"trial{k}") for k in range(trials)],
                           distributions_note=_refusals(self.refused), truth_note=note, stateful=self.stateful)

    def _keeps_state(self, inputs: list[Any]) -> bool:
        """Whether the reference's outputs change from one call to the next on the same inputs (KernelBench's
        level 3 RNNs keep their hidden state in the module); if so it starts again from a fresh build, so that
        its calls and a candidate's (one per trial, in order, from a fresh start: KernelBench's own sequence)
        see the same states."""
        first, _ = self._reference_call(inputs)
        if isinstance(first, WorkerReply):
            return False
        first = [_sample(o) for o in first]  # a state changes every element: a sample shows it, at no memory cost
        second, _ = self._reference_call(inputs)
        if isinstance(second, WorkerReply):
            return False
        same = len(first) == len(second) and all(
            a.dtype == b.dtype and _close(a, _sample(b), self.atol, self.rtol)
            for a, b in zip(first, second, strict=True))
        del first, second
        if not same and "main" in getattr(self, "builders", {}):
            self.models["main"] = self.builders["main"]()
        return not same

    def _trial(self, trial: int, measure: bool) -> tuple[list[Any], list[Any] | WorkerReply, int]:
        """Trial `trial`'s inputs and the reference's outputs on them, in the trial's distribution, or in `normal`
        where the reference refuses it (raises, or gives NaN/Inf where the normal trial 0 gave none)."""
        name = f"trial{trial}"
        wanted = distribution_of(trial)
        if wanted in self.refused:
            wanted = "normal"
        self.trial_distributions[name] = wanted
        inputs = self.inputs(name)
        try:
            outs, transient = self._reference_call(inputs, measure=measure)
            why = None if wanted == "normal" or isinstance(outs, WorkerReply) else _nonfinite_news(outs, self)
        except Exception as exc:
            if wanted == "normal" or out_of_memory(exc):
                raise
            why = f"the reference raised {_one_line(exc)}"[:200]
        if why is None:
            if trial == 0 and not isinstance(outs, WorkerReply):
                self.finite_at_first = all(bool(_torch().isfinite(o).all()) for o in outs if o.is_floating_point())
            return inputs, outs, transient
        self.refused[wanted] = why
        self.sets.pop(name, None)
        return self._trial(trial, measure)

    def _reference_call(self, inputs: list[Any], measure: bool = False) -> tuple[list[Any] | WorkerReply, int]:
        """The reference on fresh copies of `inputs`: (its outputs, bytes it allocated beyond inputs and outputs
        at its peak, when `measure`); an error reply when it returns anything but tensors."""
        torch = _torch()
        before = peak_memory(self.device, reset=measure) if measure else 0
        with torch.no_grad():
            copies = [_clone(x) for x in inputs]
            outs = as_list(self.models["main"](*copies))
            _sync(self.device)
        if not all(type(o) is torch.Tensor for o in outs):
            return WorkerReply(ok=False, error_kind="load_error",
                               error="the reference returned something other than tensors"), 0
        outs = [o.detach() for o in outs]
        transient = 0
        if measure:
            used = sum(_nbytes(x) for x in copies) + sum(_nbytes(o) for o in outs)
            transient = max(0, peak_memory(self.device) - before - used)
        return outs, transient

    def expected_outputs(self, trial: int) -> list[Any]:
        """Trial `trial`'s expected outputs: kept, or computed again from its input set (the last one is cached:
        each trial is compared twice, over two memory fills)."""
        kept = self.expected[trial]
        if kept is not None:
            return kept
        if self.recent is None or self.recent[0] != trial:
            self.recent = None  # its memory goes before the next one is made
            outs, _ = self._reference_call(self.inputs(f"trial{trial}"))
            assert not isinstance(outs, WorkerReply)
            self.recent = (trial, outs)
        return self.recent[1]


STATEFUL_NOTE = "the reference keeps state between calls: no float64 truth (a copy would start in another state)"


def _nonfinite_news(outs: list[Any], ops: Any) -> str | None:
    """Why outputs refuse a distribution: NaN or Inf where the normal trial's outputs had none (a domain limit)."""
    torch = _torch()
    if not getattr(ops, "finite_at_first", True):
        return None  # the problem's own outputs hold NaN/Inf (masked scores): that is no refusal
    bad = sum(int((~torch.isfinite(o)).sum()) for o in outs if o.is_floating_point())
    return f"the reference gave {bad} NaN/Inf values" if bad else None


def _refusals(refused: dict[str, str]) -> str | None:
    if not refused:
        return None
    return "; ".join(f"{name} inputs left out: {why}" for name, why in refused.items())


def maker_note(truths: list[Any], maker: Any = None) -> str | None:
    """Why no float64 truth judged these trials, when none did."""
    return None if truths and truths[0] is not None else getattr(maker, "note", None) or "no float64 truth"


def _release(device: str) -> None:
    """Give the allocator's cached blocks back to the device: another process (the candidate's) needs them."""
    if device == "cuda":
        _torch().cuda.empty_cache()


SAMPLE = 1 << 20  # elements of each output the state check compares (evenly spaced, every one when fewer)


def _sample(out: Any) -> Any:
    """Evenly spaced elements of an output, a copy (an output can be a tenth of the device: 23_Softmax 6.4 GB)."""
    flat = out.reshape(-1)
    return flat[::max(1, flat.numel() // SAMPLE)].clone()


def _close(a: Any, b: Any, atol: float, rtol: float) -> bool:
    return a.shape == b.shape and bool(_torch().allclose(a.double(), b.double(), atol=atol, rtol=rtol, equal_nan=True))


def _clone(x: Any) -> Any:
    return x.clone() if hasattr(x, "clone") else x
