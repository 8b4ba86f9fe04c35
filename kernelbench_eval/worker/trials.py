"""The checker's trials: the reference's expected outputs on each trial's input set under the memory budget, and
the float64 truths they are also judged against.

Why in one place: which distribution a trial uses is settled while its expected outputs are computed (the
reference may refuse one: `worker.draws`), and a set that the memory plan does not keep is drawn again later
from the same seed in the same distribution (`inputs`), so the draw, the plan and the refusals must agree.
"""

from __future__ import annotations

from typing import Any

from kernelbench_eval.common import memory
from kernelbench_eval.messages import ExpectReply, MemoryPlan, TensorMeta
from kernelbench_eval.requests import ExpectRequest
from kernelbench_eval.worker import refill
from kernelbench_eval.worker.check import degenerate_outputs
from kernelbench_eval.worker.draws import distribution_of
from kernelbench_eval.worker.inputs import CheckerInputs
from kernelbench_eval.worker.tensors import (
    _meta,
    _nbytes,
    _one_line,
    _sync,
    _torch,
    as_list,
    out_of_memory,
    peak_memory,
)
from kernelbench_eval.worker.truth import TruthMaker
from kernelbench_eval.worker.truthcheck import Truth


class CheckerTrials(CheckerInputs):
    """Every trial's expected outputs (kept, or computed again), and how they are compared (tolerances, truths)."""

    def __init__(self) -> None:
        super().__init__()
        self.atol = self.rtol = 0.0  # the tolerances every comparison uses
        self.expected: list[list[Any] | None] = []  # per trial: the reference's outputs, None where not kept
        self.expected_metas: list[list[TensorMeta]] = []  # per trial: what they looked like
        self.recent: tuple[int, list[Any]] | None = None  # the last trial's outputs computed again, cached
        self.truths: list[list[Truth | None] | None] = []  # per trial: its float64 truth per output, where made
        self.truth_note: str | None = None  # why no float64 truth judges the trials, when none does
        self.stateful = False  # the reference's outputs change from call to call on the same inputs
        self.refused: dict[str, str] = {}  # distribution -> why the reference refused it
        self.finite_at_first = True  # trial 0's outputs held no NaN/Inf

    def op_expect(self, req: ExpectRequest) -> ExpectReply:
        """Compute every trial's expected outputs, measure the problem's footprint and plan what stays on the
        device under the budget (`memory.plan`); the timing's base sets are drawn here, to stay. Running out of
        memory here is the problem's verdict (its candidates are skipped), said with the sizes."""
        try:
            return self._expect(req)
        except Exception as exc:
            if not out_of_memory(exc):
                raise
            self.sets, self.expected, self.recent = {}, [], None
            return ExpectReply(ok=False, error_kind="runtime_error", error=self._too_big(exc))

    def _expect(self, req: ExpectRequest) -> ExpectReply:
        torch = _torch()
        self.atol, self.rtol = req.atol, req.rtol
        self.sets = {name: [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in inputs]
                     for name, inputs in self.sets.items()}
        self.expected, self.expected_metas, self.recent, self.truths = [], [], None, []
        self.trial_distributions, self.refused = {}, {}
        maker: TruthMaker | None = None  # made after trial 0's reference call: its float64 copy is not measured
        trials = len(req.trial_seeds)
        self.stateful = self._keeps_state(self.inputs("trial0"))
        plan: memory.Residency | None = None
        footprint: memory.Footprint | None = None
        warning, reductions = None, False
        for trial in range(trials):
            name = f"trial{trial}"
            inputs, outs, transient = self._trial(trial, measure=trial == 0)
            if isinstance(outs, ExpectReply):
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
        self.lean = plan.lean
        for k in range(plan.timing_sets * (not plan.lean)):  # lean: drawn for each timing, not kept in between
            self.sets[f"timing{k}"] = self.inputs(f"timing{k}")
        self.placements = plan.placements
        release(self.device)  # what the plan let go goes back to the device, for the candidate's process
        return ExpectReply(ok=True, expected=self.expected_metas, warning=warning, residency=residency(plan, footprint),
                           distributions=[self.distribution(f"trial{k}") for k in range(trials)],
                           distributions_note=_refusals(self.refused), truth_note=note, stateful=self.stateful)

    def _keeps_state(self, inputs: list[Any]) -> bool:
        """Whether the reference's outputs change from one call to the next on the same inputs (KernelBench's
        level 3 RNNs keep their hidden state in the module); if so it starts again from a fresh build, so that
        its calls and a candidate's (one per trial, in order, from a fresh start: KernelBench's own sequence)
        see the same states."""
        first, _ = reference_call(self.models["main"], inputs, self.device)
        if isinstance(first, ExpectReply):
            return False
        first = [_sample(o) for o in first]  # a state changes every element: a sample shows it, at no memory cost
        second, _ = reference_call(self.models["main"], inputs, self.device)
        if isinstance(second, ExpectReply):
            return False
        same = len(first) == len(second) and all(
            a.dtype == b.dtype and _close(a, _sample(b), self.atol, self.rtol)
            for a, b in zip(first, second, strict=True))
        del first, second
        if not same and "main" in self.builders:
            self.models["main"] = self.builders["main"]()
        return not same

    def _trial(self, trial: int, measure: bool) -> tuple[list[Any], list[Any] | ExpectReply, int]:
        """Trial `trial`'s inputs and the reference's outputs on them, in the trial's distribution, or in `normal`
        where the reference refuses it (raises, or gives NaN/Inf where the normal trial 0 gave none)."""
        name = f"trial{trial}"
        wanted = distribution_of(trial)
        if wanted in self.refused:
            wanted = "normal"
        self.trial_distributions[name] = wanted
        inputs = self.inputs(name)
        try:
            outs, transient = reference_call(self.models["main"], inputs, self.device, measure=measure)
            why = None if wanted == "normal" or isinstance(outs, ExpectReply) else _nonfinite_news(
                outs, self.finite_at_first)
        except Exception as exc:
            if wanted == "normal" or out_of_memory(exc):
                raise
            why = f"the reference raised {_one_line(exc)}"[:200]
        if why is None:
            if trial == 0 and not isinstance(outs, ExpectReply):
                self.finite_at_first = all(bool(_torch().isfinite(o).all()) for o in outs if o.is_floating_point())
            return inputs, outs, transient
        self.refused[wanted] = why
        self.sets.pop(name, None)
        return self._trial(trial, measure)

    def expected_outputs(self, trial: int) -> list[Any]:
        """Trial `trial`'s expected outputs: kept, or computed again from its input set (the last one is cached:
        each trial is compared twice, over two memory fills)."""
        kept = self.expected[trial]
        if kept is not None:
            return kept
        if self.recent is None or self.recent[0] != trial:
            self.recent = None  # its memory goes before the next one is made
            name = f"trial{trial}"
            drawn = name not in self.sets  # drawn for this call alone: the reference may have it, no copy made
            outs, _ = reference_call(self.models["main"], self.inputs(name), self.device, fresh=drawn)
            assert not isinstance(outs, ExpectReply)
            self.recent = (trial, outs)
        return self.recent[1]


def reference_call(model: Any, inputs: list[Any], device: str, measure: bool = False, fresh: bool = False
                   ) -> tuple[list[Any] | ExpectReply, int]:
    """The reference on fresh copies of `inputs` (`fresh`: they are already, drawn for this call alone): (its
    outputs, bytes it allocated beyond inputs and outputs at its peak, when `measure`); an error reply when it
    returns anything but tensors."""
    torch = _torch()
    before = peak_memory(device, reset=measure) if measure else 0
    with torch.no_grad():
        copies = list(inputs) if fresh else [_clone(x) for x in inputs]
        outs = as_list(model(*copies))
        _sync(device)
    if not all(type(o) is torch.Tensor for o in outs):
        return ExpectReply(ok=False, error_kind="load_error",
                           error="the reference returned something other than tensors"), 0
    outs = [o.detach() for o in outs]
    transient = 0
    if measure:
        used = sum(_nbytes(x) for x in copies) + sum(_nbytes(o) for o in outs)
        transient = max(0, peak_memory(device) - before - used)
    return outs, transient


def residency(plan: memory.Residency, footprint: memory.Footprint) -> MemoryPlan:
    """The plan as the expect reply tells it, with the sizes it was made from."""
    return MemoryPlan(trial_inputs=plan.trial_inputs, expected=plan.expected, timing_sets=plan.timing_sets,
                      placements=plan.placements, need_bytes=plan.need_bytes, budget_bytes=plan.budget_bytes,
                      fits=plan.fits, lean=plan.lean, resident_bytes=plan.resident_bytes(footprint),
                      input_bytes=footprint.input_bytes, output_bytes=footprint.output_bytes,
                      transient_bytes=footprint.transient_bytes)


STATEFUL_NOTE = "the reference keeps state between calls: no float64 truth (a copy would start in another state)"


def _nonfinite_news(outs: list[Any], finite_at_first: bool) -> str | None:
    """Why outputs refuse a distribution: NaN or Inf where the normal trial's outputs had none (a domain limit)."""
    torch = _torch()
    if not finite_at_first:
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


def release(device: str) -> None:
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
