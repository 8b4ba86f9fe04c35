"""The checker's input sets: the problem's own `get_inputs` draw, reshaped into one of several distributions.

Why several: a candidate judged only on what `get_inputs` draws (usually standard normal) can take shortcuts that
hold for that distribution alone: assume zero mean and unit variance ("analytical" answers), compute a loss or a
norm on a subsample of rows (every row looks alike), return a constant. KernelBench's later guidance and
robust-kbench test several distributions; so do we. Trial k uses `DISTRIBUTIONS[k % 4]`:

- `normal`: the problem's draw as it is (trial 0 always: its own distribution, the one the float64 truth uses);
- `shifted`: every floating tensor scaled by 2^U(-2, 2) and shifted by 1 to 3 of its standard deviations (a
  tensor with no negative values is only shifted up, so it stays in its domain: probabilities, variances);
- `heavy_tailed`: every element times a Pareto factor (tail index 3: a few elements 10x to 100x the rest);
- `row_scaled`: each row (slice of the first dimension) times 10^U(-2, 2), so rows of very different magnitudes.

Each is derived from the problem's own draw, so shapes, dtypes and integer tensors (indices, labels, masks) stay
what the problem makes, and signs only change where the draw already had both. The factors come from generators
seeded by the set's secret seed (on the tensor's device), so one (seed, trial) always gives one set: a set the
memory plan does not keep is drawn again, bit for bit. A problem whose reference cannot take a distribution (it
raises, or returns NaN/Inf where the normal draw gave none: a domain limit) keeps the ones it accepts
(`worker.reference`); the verdict names those used.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

DISTRIBUTIONS = ("normal", "shifted", "heavy_tailed", "row_scaled")
SCALE_OCTAVES = 2.0  # shifted: scale by 2^U(-2, 2)
SHIFT_SDS = (1.0, 3.0)  # shifted: by U(1, 3) standard deviations, either sign where the draw has both
TAIL_INDEX = 3.0  # heavy_tailed: factor U^(-1/3), P(factor > t) = t^-3; finite variance, infinite fourth moment
TAIL_CAP = 1e3  # the largest factor (fp16 overflows near 6.5e4)
ROW_DECADES = 2.0  # row_scaled: each row times 10^U(-2, 2)
_SALT = 0x5EED_D157  # the distribution's own stream, apart from the one `get_inputs` drew with


def distribution_of(trial: int) -> str:
    """The distribution trial `trial` asks for (the reference may refuse it: then `normal`)."""
    return DISTRIBUTIONS[trial % len(DISTRIBUTIONS)]


def draw_inputs(get_inputs: Callable[[], Any], seed: int, device: str) -> list[Any]:
    """The problem's input set for `seed`, made on `device` directly where its `get_inputs` allows, else on the CPU.

    Why: drawn on the CPU and copied over, a GPU run's sets cost seconds of one CPU thread's random numbers
    (problem 45: eight sets of 128 MB) before the first candidate; drawn on the GPU, milliseconds. A
    `get_inputs` that fails there (numpy, `.tolist()`) or makes any tensor elsewhere on purpose is drawn again
    on the CPU from the same seed, as before (moved to the device with the expected outputs). Either way one
    seed gives one set: each generator is deterministic for its seed.
    """
    import torch

    if device != "cpu":
        torch.manual_seed(seed)  # every device's generator
        try:
            with torch.device(device):
                drawn = list(get_inputs())
        except Exception:
            drawn = None
        if drawn is not None and all(x.device.type == torch.device(device).type
                                     for x in drawn if isinstance(x, torch.Tensor)):
            return drawn
    torch.manual_seed(seed)
    return list(get_inputs())


def reshape(inputs: list[Any], distribution: str, seed: int) -> list[Any]:
    """`inputs` (a problem's draw) in `distribution`: each floating tensor transformed, everything else as it is."""
    import torch

    if distribution == "normal":
        return inputs
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown input distribution {distribution!r}")
    params = torch.Generator().manual_seed((seed ^ _SALT) & (2**63 - 1))  # scalars, on the CPU
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel():
            elements = torch.Generator(device=x.device).manual_seed(int(_uniform(params, 0, 2**62)))
            x = _TRANSFORMS[distribution](x, params, elements)
        out.append(x)
    return out


def _uniform(gen: Any, low: float, high: float) -> float:
    import torch

    return low + (high - low) * float(torch.rand((), generator=gen, dtype=torch.float64))


def _shifted(x: Any, params: Any, _elements: Any) -> Any:
    scale = 2.0 ** _uniform(params, -SCALE_OCTAVES, SCALE_OCTAVES)
    spread = float(x.float().std()) if x.numel() > 1 else 0.0  # statistics in x's own precision: no float64 copy
    spread = spread if math.isfinite(spread) and spread > 0 else max(abs(float(x.float().mean())), 1.0)
    shift = _uniform(params, *SHIFT_SDS) * spread
    if bool((x < 0).any()) and _uniform(params, 0, 1) < 0.5:
        shift = -shift
    return (x * scale).add_(shift).to(x.dtype)


def _heavy_tailed(x: Any, _params: Any, elements: Any) -> Any:
    import torch

    factor = torch.rand(x.shape, generator=elements, device=x.device, dtype=torch.float32).clamp_(min=1e-9)
    factor.pow_(-1.0 / TAIL_INDEX).clamp_(max=TAIL_CAP)
    return factor.mul_(x).to(x.dtype)  # the factor's memory becomes the result's: one set's size beside the draw


def _row_scaled(x: Any, _params: Any, elements: Any) -> Any:
    import torch

    def factors(count: int) -> Any:
        exponent = torch.rand(count, generator=elements, device=x.device, dtype=torch.float32)
        return torch.pow(10.0, exponent * (2 * ROW_DECADES) - ROW_DECADES)

    if x.dim() == 0:
        return (x * factors(1).reshape(())).to(x.dtype)
    if x.dim() == 1:  # one row: blocks of about sqrt(n) elements instead
        block = max(1, math.isqrt(x.numel()))
        return (x * factors(-(-x.numel() // block)).repeat_interleave(block)[: x.numel()]).to(x.dtype)
    return (x * factors(x.shape[0]).reshape(-1, *([1] * (x.dim() - 1)))).to(x.dtype)


_TRANSFORMS: dict[str, Callable[[Any, Any, Any], Any]] = {
    "shifted": _shifted, "heavy_tailed": _heavy_tailed, "row_scaled": _row_scaled}
