"""`--precision fp32|fp16|bf16`: which dtype the models and their inputs run in, and the tolerance that goes with it.

KernelBench (`eval.py`: `_process_input_tensor`, `get_tolerance_for_precision`) casts the inputs, the init
inputs and both models to the precision's dtype before building and calling them, and compares with
atol = rtol = 1e-4 in fp32 and 1e-2 in fp16/bf16. We do the same, with one deliberate difference: only
floating-point tensors are cast (KernelBench casts every tensor, which turns integer indices or labels into
floats and breaks problems that take them). Our fp32 default stays 1e-2 (what the seed corpus was judged
with); `--tolerance kernelbench` picks KernelBench's current values for every precision.

**Precision against the truth** (`reduced_precision`): on trial 0 the checker computes the reference in float64
(`worker.truth`) and measures both the reference's and the candidate's norm-wise relative error against it
(`check.compare_outputs`). A candidate far less precise than the reference, an fp32 run computed in bf16, fp16
or TF32 where the reference was not, is `suspicious` with both figures unless `--allow-reduced-precision`. It
fires only when the candidate's error is both `PRECISION_RATIO` times the reference's and above
`PRECISION_FLOOR_UNITS` roundoffs of the run's dtype (6.1e-5 in fp32). Measured on this CPU
(tests/test_attacks_36.py, errors against float64): honest fp32 reorderings (sequential or reversed
accumulation, blocked, im2col, einsum, a hand-written softmax, layer norm or erf GELU) came within 3.4x of torch's
own error, and at most 1.2e-6 (a sequential matmul over K = 4096; sqrt-growth puts K = 131072 near 7e-6);
TF32/fp16 inputs reached 1.8e-4 to 4.9e-4 and 490x to 8300x the reference's error, bf16 2.3e-3 to 4e-3 and
6700x or more. So the floor sits 50x above the largest honest error and 3-8x below TF32's smallest, and the
ratio 6x above sequential accumulation's extrapolated worst (about 20x) and 4x below TF32's. Where the
reference itself ran in TF32 (cuDNN convolutions by default), a TF32 candidate is as precise as it and passes.
In fp16/bf16 runs the floor (0.5, 4 relative) never fires: precision below those is left to the tolerance.
"""

from __future__ import annotations

from typing import Any, Literal

Precision = Literal["fp32", "fp16", "bf16"]
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16")
TOLERANCE_PRESETS: tuple[str, ...] = ("default", "kernelbench")

PRECISION_RATIO = 128.0  # the candidate's error against the truth, over the reference's...
PRECISION_FLOOR_UNITS = 1024.0  # ...and over this many roundoffs of the run's dtype (2^-14 in fp32)

# (atol, rtol) per precision and preset; `--atol/--rtol` given explicitly override either.
_TOLERANCES: dict[str, dict[str, tuple[float, float]]] = {
    "default": {"fp32": (1e-2, 1e-2), "fp16": (1e-2, 1e-2), "bf16": (1e-2, 1e-2)},
    "kernelbench": {"fp32": (1e-4, 1e-4), "fp16": (1e-2, 1e-2), "bf16": (1e-2, 1e-2)},
}


def dtype_of(precision: str | None) -> Any:
    """The torch dtype of a precision name; None (not given) means fp32, the problems' own dtype."""
    import torch

    table = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    if precision is None:
        return torch.float32
    if precision not in table:
        raise ValueError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    return table[precision]


def tolerance(precision: str, preset: str = "default") -> tuple[float, float]:
    """(atol, rtol) for a precision under a preset ("default" or "kernelbench")."""
    if preset not in _TOLERANCES:
        raise ValueError(f"unknown tolerance preset {preset!r}; use one of {', '.join(TOLERANCE_PRESETS)}")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    return _TOLERANCES[preset][precision]


def cast_inputs(inputs: Any, precision: str | None) -> list[Any]:
    """The inputs as a list, floating-point tensors cast to the precision; everything else untouched.

    fp32 (or None) returns the tensors as they are, so a default run's inputs are bit-for-bit what the
    problem made.
    """
    import torch

    items = list(inputs)
    if precision in (None, "fp32"):
        return items
    dtype = dtype_of(precision)
    return [x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in items]


def cast_model(model: Any, precision: str | None) -> Any:
    """The model with its floating-point parameters and buffers in the precision's dtype (`Module.to(dtype)`).

    Anything without `.to` (a candidate whose ModelNew is not an nn.Module) is returned as it is; its
    outputs' dtype is then checked like any other output.
    """
    if precision in (None, "fp32") or not hasattr(model, "to"):
        return model
    return model.to(dtype_of(precision))


def reduced_precision(candidate_error: float, reference_error: float, unit: float) -> bool:
    """Whether a candidate's error against the float64 truth is far beyond the reference's (`PRECISION_RATIO`
    times it) and beyond what fp32 arithmetic explains (`PRECISION_FLOOR_UNITS` roundoffs `unit` of the dtype)."""
    return candidate_error > max(PRECISION_RATIO * reference_error, PRECISION_FLOOR_UNITS * unit)


def unit_roundoff(precision: str | None) -> float:
    """Half the machine epsilon of the precision's dtype: 2^-24 for fp32, 2^-11 fp16, 2^-8 bf16."""
    return {"fp16": 2.0**-11, "bf16": 2.0**-8}.get(precision or "fp32", 2.0**-24)


def precision_reason(candidate_error: float | None, reference_error: float | None, precision: str | None,
                     output: int = 0, timed_error: float | None = None) -> str | None:
    """The `suspicious` reason for a candidate far less precise than the reference on trial 0 (against the float64
    truth) or on a timed call (`timed_error`: against the reference's output, standing in for it), or None."""
    if reference_error is None:
        return None
    unit = unit_roundoff(precision)
    worst = max((e for e in (candidate_error, timed_error) if e is not None), default=None)
    if worst is None or not reduced_precision(worst, reference_error, unit):
        return None
    where = f" (output {output})" if output else ""
    timed = f", {timed_error:.3g} on a timed call" if timed_error is not None and timed_error == worst else ""
    return (f"reduced precision: its error against the float64 truth{where} is {candidate_error or 0:.3g}{timed}, "
            f"the reference's {reference_error:.3g} (more than {PRECISION_RATIO:g}x it and {PRECISION_FLOOR_UNITS:g} "
            f"{precision or 'fp32'} roundoffs): computed in a narrower type (bf16, fp16, TF32?); "
            "--allow-reduced-precision accepts it")
