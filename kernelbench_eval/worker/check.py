"""Stage 3 (the judging half): compare a candidate's outputs with the reference's, in the harness.

This runs in the checker (the reference's worker), on the device the outputs were computed on, reading the
candidate's outputs from the exchange buffer: nothing the candidate does in its own process can touch the
expected values or the comparison itself.

What each kind of output is held to:
- integer and bool outputs (counts, indices, masks): equal, element for element. A float tolerance let a count
  computed on 1/6 of the input and multiplied by 6 pass (its error is well under 1 % of a large count);
- floating outputs: `|out - expected| <= atol + rtol |expected|` (KernelBench's rule), NaN/Inf at the same places;
- reduction outputs (a loss, a norm), where the checker has the float64 truth: also within `truth.reduction_bound`
  of it, which a subsample of the inputs does not meet (`truthcheck`);
- trial 0: each floating output's error against the float64 truth is measured beside the reference's, for the
  precision rule (`precision.reduced_precision`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernelbench_eval.messages import TensorMeta
from kernelbench_eval.worker import truthcheck as against_truth
from kernelbench_eval.worker.truthcheck import Truth


@dataclass
class TrialCheck:
    passed: bool
    max_abs_diff: float | None = None
    mean_abs_diff: float | None = None
    error: str | None = None
    # against the float64 truth (trial 0): (output, the candidate's relative error, the reference's), for the
    # output whose error is largest beside the reference's
    precision: tuple[int, float, float] | None = None


def compare_outputs(
    expected: list[torch.Tensor],
    expected_meta: list[TensorMeta],
    got: list[torch.Tensor | None],
    got_meta: list[TensorMeta],
    atol: float,
    rtol: float,
    truths: list[Truth | None] | None = None,
) -> TrialCheck:
    """Exact structure first (count, type, device, shape, dtype), then NaN/Inf parity, then tolerance (exact for
    integer and bool outputs), then, where `truths` holds one, the float64 truth (reductions, precision)."""
    if len(got_meta) != len(expected_meta) or len(got) != len(expected):
        return TrialCheck(False, error=f"returned {len(got_meta)} outputs, expected {len(expected_meta)}")
    worst, most = TrialCheck(True, 0.0, 0.0), -1.0
    for i, (exp, exp_meta, out, meta) in enumerate(zip(expected, expected_meta, got, got_meta, strict=True)):
        label = f"output {i}: " if len(expected) > 1 else ""
        problem = _structure_problem(exp_meta, meta, out)
        if problem:
            return TrialCheck(False, error=label + problem)
        exact = not exp.is_floating_point() and not exp.is_complex()
        result = _compare_exact(exp, out) if exact else _compare_values(exp, out, atol, rtol)
        known = truths[i] if truths and i < len(truths) else None
        if result.passed and known is not None:
            error, why = against_truth.against(out, known)
            if why:
                result = TrialCheck(False, result.max_abs_diff, result.mean_abs_diff, why)
            elif error / max(known.ref_error, known.unit) > most:
                most, worst.precision = error / max(known.ref_error, known.unit), (i, error, known.ref_error)
        if not result.passed:
            result.error = label + (result.error or "")
            return result
        worst.max_abs_diff = max(worst.max_abs_diff or 0.0, result.max_abs_diff or 0.0)
        worst.mean_abs_diff = max(worst.mean_abs_diff or 0.0, result.mean_abs_diff or 0.0)
    return worst


def _compare_exact(exp: torch.Tensor, out: torch.Tensor) -> TrialCheck:
    """Integer and bool outputs: every element equal (a count or an index is right or wrong)."""
    differ = (out != exp).reshape(-1)
    bad = int(differ.sum())
    if not bad:
        return TrialCheck(True, 0.0, 0.0)
    gap = (out.long() - exp.long()).abs().reshape(-1)  # only once something differs: 8 bytes an element
    at = int(differ.nonzero()[0, 0])
    return TrialCheck(False, float(gap.max()), float(gap.double().mean()), error=(
        f"{bad}/{exp.numel()} values differ ({exp.dtype} output: compared exactly), first at {_index(at, exp.shape)} "
        f"(got {out.reshape(-1)[at].item()}, expected {exp.reshape(-1)[at].item()})"))


def _structure_problem(exp: TensorMeta, got: TensorMeta, out: torch.Tensor | None) -> str | None:
    if not got.exact_tensor or type(out) is not torch.Tensor:
        return f"returned {got.type_name}, expected a plain torch.Tensor"
    for field in ("device", "shape", "dtype"):
        if getattr(got, field) != getattr(exp, field):
            return f"{field} {_fmt(getattr(got, field))}, expected {_fmt(getattr(exp, field))}"
    return None


def _fmt(value: object) -> str:
    return str(tuple(value)) if isinstance(value, list) else str(value)


_CHUNK = 1 << 24  # elements compared at a time on the CPU: bounded memory for outputs of a gigabyte or more
_GPU_CHUNK = 1 << 26  # on a GPU, fewer and larger chunks: each costs one host synchronisation


def _compare_values(exp: torch.Tensor, out: torch.Tensor, atol: float, rtol: float) -> TrialCheck:
    """NaN/Inf parity before tolerance, in float64 chunks; the worst element is located for the message."""
    flat_exp, flat_out = exp.reshape(-1), out.reshape(-1)
    tally = _Tally()
    chunk = _GPU_CHUNK if exp.is_cuda else _CHUNK
    for start in range(0, flat_exp.numel(), chunk):
        tally.add(start, _wide(flat_exp[start:start + chunk]), _wide(flat_out[start:start + chunk]), atol, rtol)
    for count, first, what in ((tally.nan, tally.first_nan, "NaN"), (tally.inf, tally.first_inf, "Inf")):
        if count:
            where = _index(first, exp.shape)
            return TrialCheck(False, error=f"{count} {what} values where the reference has none, first at {where}")
    numel = max(flat_exp.numel(), 1)
    if tally.special:  # the finite worst element would name a matching value: name a wrong non-finite one
        at = tally.first_special
        return TrialCheck(False, tally.max_diff, tally.sum_diff / numel, error=(
            f"{tally.special} values differ where the reference has Inf or NaN, first at {_index(at, exp.shape)} "
            f"(got {float(flat_out[at]):.6g}, expected {float(flat_exp[at]):.6g})"))
    result = TrialCheck(True, tally.max_diff, tally.sum_diff / numel)
    if tally.bad:
        worst = tally.worst
        result.passed = False
        result.error = (
            f"{tally.bad}/{flat_exp.numel()} values outside atol={atol:g} rtol={rtol:g}; "
            f"max |diff| {tally.max_diff:.4g} at {_index(worst, exp.shape)} (got {float(flat_out[worst]):.6g}, "
            f"expected {float(flat_exp[worst]):.6g})"
        )
    return result


def _wide(x: torch.Tensor) -> torch.Tensor:
    """float32 or wider for arithmetic (half and bfloat16 would round the differences themselves)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.to(torch.float32)


@dataclass
class _Tally:
    nan: int = 0
    inf: int = 0
    first_nan: int = 0
    first_inf: int = 0
    special: int = 0  # where the reference is Inf or NaN and the output is not the same
    first_special: int = 0
    bad: int = 0
    max_diff: float = 0.0
    sum_diff: float = 0.0
    worst: int = 0

    def add(self, start: int, exp: torch.Tensor, out: torch.Tensor, atol: float, rtol: float) -> None:
        diff = (out - exp).abs_()
        chunk_max, where = diff.max(dim=0)  # NaN propagates, so a finite max means an all-finite chunk
        total = diff.sum(dtype=torch.float64)
        # one transfer (one synchronisation) for the chunk's three numbers
        chunk_max_f, where_i, total_f = torch.stack([chunk_max.double(), where.double(), total]).tolist()
        if not math.isfinite(chunk_max_f):
            self._add_special(start, exp.double(), out.double(), atol, rtol)
            return
        # The bound atol + rtol*|expected| is never below atol as the kernel rounds it (the diff's dtype), so a
        # chunk whose largest difference is within that has no element outside the tolerance: the bound's three
        # passes over a (large) output are only made when some difference exceeds atol. Every timed call is
        # compared in full, and an honest candidate's differences sit far below atol.
        if chunk_max_f > torch.tensor(atol, dtype=diff.dtype).item():
            self.bad += int((diff > exp.abs().mul_(rtol).add_(atol)).sum())
        self.sum_diff += total_f
        if start == 0 or chunk_max_f > self.max_diff:
            self.max_diff, self.worst = chunk_max_f, start + int(where_i)

    def _add_special(self, start: int, exp: torch.Tensor, out: torch.Tensor, atol: float, rtol: float) -> None:
        """The slow, exact path for chunks holding NaN or Inf on either side."""
        nan_mask, inf_mask = torch.isnan(out) & ~torch.isnan(exp), torch.isinf(out) & ~torch.isinf(exp)
        for mask, kind in ((nan_mask, "nan"), (inf_mask, "inf")):
            count = int(mask.sum())
            if count and not getattr(self, kind):
                setattr(self, f"first_{kind}", start + int(mask.nonzero()[0, 0]))
            setattr(self, kind, getattr(self, kind) + count)
        finite = torch.isfinite(exp)
        diff = torch.where(finite, (out - exp).abs(), torch.zeros((), dtype=exp.dtype)).nan_to_num(nan=float("inf"))
        special_mismatch = ~finite & ~((out == exp) | (torch.isnan(out) & torch.isnan(exp)))
        special = int(special_mismatch.sum())
        if special and not self.special:
            self.first_special = start + int(special_mismatch.nonzero()[0, 0])
        self.special += special
        self.bad += int(((diff > atol + rtol * exp.abs()) | special_mismatch).sum())
        chunk_max, where = diff.max(dim=0)
        if start == 0 or float(chunk_max) > self.max_diff:
            self.max_diff, self.worst = float(chunk_max), start + int(where)
        self.sum_diff += float(diff[torch.isfinite(diff)].sum())


def _index(flat: int, shape: torch.Size) -> str:
    coords = []
    for size in reversed(shape):
        coords.append(flat % size)
        flat //= size
    return str(tuple(reversed(coords)))


def degenerate_outputs(expected: list[torch.Tensor], atol: float, rtol: float) -> str | None:
    """Why a problem's reference output cannot tell a kernel from a constant, or None when it can.

    If a tensor of zeros, or of the output's median, passes the tolerance against the reference, a
    kernel that computes nothing would be judged correct; the problem needs other sizes or tolerances.
    A scalar or one-element output (a loss) is always "constant" at its own median, so it is not judged
    here: a single number cannot be told from a constant by any statistic of itself.
    """
    for i, exp in enumerate(expected):
        if not isinstance(exp, torch.Tensor) or not exp.is_floating_point() or exp.numel() <= 1:
            continue
        values = _wide(exp.reshape(-1)[: _CHUNK]).double()
        finite = values[torch.isfinite(values)]
        if finite.numel() == 0:
            continue
        allowed = atol + rtol * finite.abs()
        for name, constant in (("zeros", 0.0), ("a constant", float(finite.median()))):
            if bool(((finite - constant).abs() <= allowed).all()):
                label = f"output {i}" if len(expected) > 1 else "the reference output"
                return (f"{label} is nearly constant at the tolerance's scale ({name} would pass): mean "
                        f"{float(finite.mean()):.3g}, std {float(finite.std()) if finite.numel() > 1 else 0.0:.3g}, "
                        f"min {float(finite.min()):.3g}, max {float(finite.max()):.3g}")
    return None
