"""Outputs against the float64 truth: how far a reduction may stray, and how precise an output is.

The checker runs a float64 copy of the reference on the trial's inputs (`worker.truth`) and keeps, per floating
output, its values at up to `SAMPLE` positions. Two things are judged from it (`check.compare_outputs`):

- **Reductions** (a loss, a norm: an output with at most 1/`REDUCTION_FACTOR` as many elements as the largest
  input, or 0-d). The elementwise tolerance (1e-2) is far wider than an fp32 sum of n terms strays: a loss
  computed on a quarter of the rows passes it (its error is ~sqrt(6/n) of the value, 3.4e-3 at n = 2^19), so the
  output must also stay within `reduction_bound` of the truth: what an honest fp32 computation of it strays,
  even a naive sequential loop. Measured (sums of n fp32 terms, worst of 10-20 draws; `tests/test_attacks_36.py`):
  a sequential loop over positive terms (d^2 of normal d) strayed 1.2e-5 at n = 2^16, 2.3e-5 at 2^17, 1.7e-4
  at 2^19, 1.3e-3 at 2^21, where the bound is 1.5e-4, 2.4e-4, 9.0e-4, 5.1e-3 (relative); random-sign sums 8e-5
  of |sum| at 2^16; torch's own (pairwise) 5e-8. The mean of a quarter of the rows strays sqrt(24/n)/2 (6.8e-3
  at n = 2^17): it passed the old tolerance in 40 of 40 draws, the bound in 2. Beyond n = 2^20 the bound is
  as wide as such an error, and the `row_scaled` and `heavy_tailed` inputs (`worker.draws`) catch a subsample.
- **Precision** (trial 0): the candidate's and the reference's norm-wise relative errors against the truth,
  for `precision.reduced_precision`.

Timed calls have no float64 run of their own (one per call would cost more than the call): there the reference's
output of the same call stands in for the truth (`stand_in`), scaled as trial 0's truth measured, so a candidate
that is exact on the trials and cuts corners only when timed meets the same bound and the same precision rule.

Pure functions of tensors and named thresholds; tested on known numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

SAMPLE = 1 << 18  # positions of an output kept in float64 (all of a smaller one): 2 MB, and a 0.3 % estimate
REDUCTION_FACTOR = 16  # an output with at most 1/16 as many elements as the largest input is a reduction
REDUCTION_UNITS = 8.0  # sqrt(n) roundoffs of the output's norm, and sqrt(n) times its sensitivity, 8 times over
STAGNATION = 0.1  # + this * (n u)^1.5 of the norm: a naive fp32 loop loses small terms (measured: 0.03-0.036)
REF_SLACK = 4.0  # + this many times the fp32 reference's own distance from the truth (a model that is not
# exactly float64 inside, or not deterministic, widens the bound by as much as it is off)


@dataclass
class Truth:
    """The float64 truth of one output of one trial, at the positions `index` (None: every position)."""

    values: Any  # float64, flat
    index: Any | None
    unit: float  # unit roundoff of the output's dtype (2^-24 for fp32)
    truth_norm: float
    ref_distance: float  # ||reference - truth|| at those positions
    reduction: int | None = None  # n: inputs summed per output element, for a reduction output
    sensitivity: float = 0.0  # ||f(x (1 + u r)) - f(x)||: the output moved by rounding its inputs once
    source: str = "the float64 truth"  # what `values` are (a timed call's: the reference's output, `stand_in`)

    @property
    def ref_error(self) -> float:
        return relative_error(self.ref_distance, self.truth_norm)


def reduction_size(output_numel: int, output_dim: int, input_numels: list[int]) -> int | None:
    """n, the inputs per output element, when the output is a reduction (0-d, or 1/16 the largest input or less);
    None otherwise."""
    largest = max(input_numels, default=0)
    out = max(output_numel, 1)
    if largest and (output_dim == 0 or out * REDUCTION_FACTOR <= largest):
        return max(1, largest // out)
    return None


def reduction_bound(n: int, unit: float, truth_norm: float, sensitivity: float, ref_distance: float) -> float:
    """How far (norm over the kept positions) an honest computation of a reduction of `n` terms may stray from the
    truth: sqrt(n) growth of the output's roundoff and of its inputs' rounding, a naive loop's stagnation, and
    the reference's own distance."""
    growth = REDUCTION_UNITS * math.sqrt(n) * (unit * truth_norm + sensitivity)
    return growth + STAGNATION * (n * unit) ** 1.5 * truth_norm + REF_SLACK * ref_distance


def relative_error(distance: float, norm: float) -> float:
    """distance / norm; 0 for an all-zero truth (no relative precision to judge there: the reduction bound and the
    tolerance still apply, in absolute terms)."""
    return distance / norm if norm > 0 else 0.0


def distance(values: Any, truth: Truth) -> float:
    """||values - truth|| at the truth's positions, in float64, where both are finite (NaN/Inf parity is judged
    before this, against the reference)."""
    import torch

    flat = values.reshape(-1)
    picked = flat if truth.index is None else flat[truth.index.to(flat.device)]
    picked = picked.to(torch.float64)
    expected = truth.values.to(picked.device)
    finite = torch.isfinite(picked) & torch.isfinite(expected)
    return float(torch.linalg.vector_norm(torch.where(finite, picked - expected, torch.zeros((), dtype=picked.dtype,
                                                                                            device=picked.device))))


def stand_in(reference: Any, model: Truth) -> Truth | None:
    """A timed call's reference output in place of its truth, at trial 0's positions, with trial 0's reduction size
    and, relative to its norm, trial 0's sensitivity and reference error (None where the shapes differ)."""
    import torch

    if model.index is None and reference.numel() != model.values.numel():
        return None
    flat = reference.reshape(-1)
    values = (flat if model.index is None else flat[model.index.to(flat.device)]).to(torch.float64)
    norm = float(torch.linalg.vector_norm(torch.where(torch.isfinite(values), values, torch.zeros_like(values))))
    scale = norm / model.truth_norm if model.truth_norm > 0 else 0.0
    return Truth(values=values, index=model.index, unit=model.unit, truth_norm=norm,
                 ref_distance=model.ref_distance * scale, reduction=model.reduction,
                 sensitivity=model.sensitivity * scale,
                 source="the reference's output of this call (standing in for the float64 truth, as trial 0 scaled it)")


def against(out: Any, truth: Truth) -> tuple[float, str | None]:
    """(the output's relative error against the truth, why a reduction output strays too far or None)."""
    gap = distance(out, truth)
    error = relative_error(gap, truth.truth_norm)
    if truth.reduction is None:
        return error, None
    bound = reduction_bound(truth.reduction, truth.unit, truth.truth_norm, truth.sensitivity, truth.ref_distance)
    if gap <= bound:
        return error, None
    return error, (f"a reduction output (about {truth.reduction} inputs per value) strays {gap:.3g} from "
                   f"{truth.source} (norm {truth.truth_norm:.6g}, relative {error:.3g}), more than the {bound:.3g} an "
                   f"fp32 computation of it does (the reference strays {truth.ref_distance:.3g}): computed on part of "
                   "its inputs, or less precisely")
