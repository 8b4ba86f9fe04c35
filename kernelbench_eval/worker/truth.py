"""The checker's float64 truth: a copy of the reference's model cast to float64, run on the trial's inputs.

Why a copy: the reference the candidates are compared with stays exactly what it was (its dtype, its state:
a BatchNorm's running statistics); the copy is made once when the problem is opened and dropped after the
expected outputs are computed. It runs on trial 0 for every problem (the precision figures) and on every trial
of a problem with a reduction output (the reduction bound, `truthcheck`), and, for a reduction, twice more on
inputs rounded once at the run's precision (`PERTURBATIONS`: how far rounding alone moves the output, which
scales the bound for sums that cancel). Where the model cannot run in float64 (an op without a float64 kernel, a
model that cannot be copied, no memory for it), the truth is skipped with a note and the elementwise tolerance
alone applies.
"""

from __future__ import annotations

import copy
from typing import Any

from kernelbench_eval.worker.tensors import _one_line, _sync, _torch, as_list
from kernelbench_eval.worker.truthcheck import SAMPLE, Truth, distance, reduction_size

HEADROOM = 0.8  # of the free memory the float64 run may count on (the model's own temporaries need the rest)
PERTURBATIONS = 2  # float64 runs on inputs each rounded once at random (relative u), for the sensitivity
_SALT = 0x7457_1234


class TruthMaker:
    """The float64 copy of one reference model, and the truths it gives (None after it failed: `note` says why)."""

    def __init__(self, model: Any, device: str) -> None:
        self.device, self.note, self.wide = device, None, None
        torch = _torch()
        try:
            self.wide = copy.deepcopy(model)
            if hasattr(self.wide, "to"):
                self.wide = self.wide.to(torch.float64)
        except Exception as exc:
            self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        self.wide, self.note = None, f"float64 truth skipped: the reference cannot run in float64 ({_one_line(exc)})"
        if self.device == "cuda":
            _torch().cuda.empty_cache()

    def truths(self, inputs: list[Any], outs: list[Any], seed: int, reductions_only: bool = False
               ) -> list[Truth | None] | None:
        """Per output of the reference (`outs`, on `inputs`): its truth, None for outputs it does not judge (integer
        outputs, and with `reductions_only` all but reductions); None altogether once the float64 model failed."""
        torch = _torch()
        if self.wide is None:
            return None
        sizes = [x.numel() for x in inputs if isinstance(x, torch.Tensor)]
        wanted = [isinstance(o, torch.Tensor) and o.is_floating_point() and (
            not reductions_only or reduction_size(o.numel(), o.dim(), sizes) is not None) for o in outs]
        if not any(wanted):
            return [None] * len(outs)
        short = self._short_of_memory(inputs, outs)
        if short:
            self.wide, self.note = None, short
            return None
        try:
            exact = self._run(inputs)
            if len(exact) != len(outs):
                raise ValueError(f"the float64 model returned {len(exact)} outputs, the reference {len(outs)}")
            gen = torch.Generator(device=self.device).manual_seed((seed ^ _SALT) & (2**63 - 1))
            made: list[Truth | None] = []
            for out, truth, want in zip(outs, exact, wanted, strict=True):
                made.append(self._one(out, truth, sizes, gen) if want else None)
            moved = [self._run(_rounded(inputs, gen, _unit(outs))) for _ in range(PERTURBATIONS)
                     if any(t is not None and t.reduction for t in made)]
            for k, t in enumerate(made):
                if t is not None and t.reduction and moved:
                    shifts = [_at(m[k], t.index).sub_(t.values).square_().sum() for m in moved]
                    t.sensitivity = float((sum(shifts) / len(shifts)).sqrt())
            return made
        except Exception as exc:
            self.fail(exc)
            return None

    def _short_of_memory(self, inputs: list[Any], outs: list[Any]) -> str | None:
        """Why the float64 run would not fit the device now, if it would not: its inputs and outputs at twice
        the width, and for a reduction one rounded input set more (`_rounded`), against the free memory and what
        this process's allocator holds unused. An out-of-memory error inside the run is caught too, but only after
        the allocator has grown: the candidate's process then finds less (23_Softmax, 19_ReLU at their current
        sizes on an 80 GB card)."""
        torch = _torch()
        if self.device != "cuda":
            return None
        sizes = [x.numel() for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point()]
        need = 8 * (2 * sum(sizes) + sum(o.numel() for o in outs if isinstance(o, torch.Tensor)))
        free = torch.cuda.mem_get_info()[0] + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
        if need <= HEADROOM * free:
            return None
        return (f"float64 truth skipped: it needs about {need / 1e9:.1f} GB of device memory, "
                f"{free / 1e9:.1f} GB are free")

    def _run(self, inputs: list[Any]) -> list[Any]:
        torch = _torch()
        wide = [x.to(torch.float64) if isinstance(x, torch.Tensor) and x.is_floating_point() else
                x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        with torch.no_grad():
            outs = as_list(self.wide(*wide))
        _sync(self.device)
        return [o.detach().to(torch.float64) if isinstance(o, torch.Tensor) and o.is_floating_point() else o
                for o in outs]

    def _one(self, out: Any, exact: Any, sizes: list[int], gen: Any) -> Truth:
        torch = _torch()
        if not isinstance(exact, torch.Tensor) or exact.shape != out.shape:
            raise ValueError("the float64 model's outputs are not shaped as the reference's")
        numel = out.numel()
        index = None if numel <= SAMPLE else torch.randint(0, numel, (SAMPLE,), generator=gen, device=out.device)
        values = _at(exact, index)
        finite = torch.isfinite(values)
        truth_norm = float(torch.linalg.vector_norm(torch.where(finite, values, torch.zeros_like(values))))
        made = Truth(values=values, index=index, unit=torch.finfo(out.dtype).eps / 2, truth_norm=truth_norm,
                     ref_distance=0.0, reduction=reduction_size(numel, out.dim(), sizes))
        made.ref_distance = distance(out, made)
        return made


def _at(values: Any, index: Any | None) -> Any:
    flat = values.reshape(-1).to(_torch().float64)
    return flat.clone() if index is None else flat[index]


def _unit(outs: list[Any]) -> float:
    torch = _torch()
    return max((torch.finfo(o.dtype).eps / 2 for o in outs if isinstance(o, torch.Tensor) and o.is_floating_point()),
               default=2.0**-24)


def _rounded(inputs: list[Any], gen: Any, unit: float) -> list[Any]:
    """Each floating input times (1 + u r), r uniform in [-1, 1]: one rounding at the run's precision."""
    torch = _torch()
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.is_floating_point():  # in place: one float64 copy of the input
            r = torch.rand(x.shape, generator=gen, device=x.device, dtype=torch.float64)
            x = r.mul_(2).sub_(1).mul_(unit).add_(1).mul_(x)
        out.append(x)
    return out
