"""What a candidate sees of its problem: the problem module's own top-level names, as KernelBench shows them.

Why: KernelBench's evaluation `exec`s the problem's source and then the candidate's into one dict
(kernelbench/eval.py, `load_original_model_and_inputs` and `load_custom_model`), so candidates written for it
read the problem's sizes (`batch_size`) and imports without defining them. Here the candidate's module starts
with a copy of those names, taken after the run's `--dim` overrides were set on the problem as the reference
sets them; the candidate's own definitions then take their place, as they do there. Only names the
problem's code bound at its top level are copied: nothing of the harness (no seed, no input set) is in that
module, and the module's own machinery (`__name__`, `__file__`, `__builtins__`, ...) is left out.
"""

from __future__ import annotations

from typing import Any


def set_dims(problem: Any, dims: dict[str, int | float]) -> None:
    """`--dim` overrides, set only where the problem defines the name (as the checker does in `op_prepare`)."""
    for name, value in dims.items():
        if hasattr(problem, name):
            setattr(problem, name, value)


def problem_names(problem: Any) -> dict[str, Any]:
    """The problem module's top-level names, without the dunder names every module has."""
    return {name: value for name, value in vars(problem).items()
            if not (name.startswith("__") and name.endswith("__"))}
