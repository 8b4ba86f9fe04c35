"""`--precision fp32|fp16|bf16`: which dtype the models and their inputs run in, and the tolerance that goes with it.

KernelBench (`eval.py`: `_process_input_tensor`, `get_tolerance_for_precision`) casts the inputs, the init
inputs and both models to the precision's dtype before building and calling them, and compares with
atol = rtol = 1e-4 in fp32 and 1e-2 in fp16/bf16. We do the same, with one deliberate difference: only
floating-point tensors are cast (KernelBench casts every tensor, which turns integer indices or labels into
floats and breaks problems that take them). Our fp32 default stays 1e-2 (what the seed corpus was judged
with); `--tolerance kernelbench` picks KernelBench's current values for every precision.
"""

from __future__ import annotations

from typing import Any, Literal

Precision = Literal["fp32", "fp16", "bf16"]
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16")
TOLERANCE_PRESETS: tuple[str, ...] = ("default", "kernelbench")

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
