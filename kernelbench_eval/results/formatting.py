"""How numbers look to people, in every report, table and line the harness prints.

Two rules, here once: a missing number (None, NaN, or the -1.0 that means 'no valid time') prints as
nothing (or a placeholder), never as `nan` or `-1`; and a runtime in the seeds' two-line files keeps their
style (`Runtime: 13.6`, `-1.0` when there is no time), which other tools parse.
"""

from __future__ import annotations

import math


def number(value: float | None, spec: str, suffix: str = "", missing: str = "") -> str:
    """`value` formatted with `spec` (and `suffix`), or `missing` when there is no number."""
    if value is None or math.isnan(value) or value < 0:
        return missing
    return f"{value:{spec}}{suffix}"


def runtime(ms: float) -> str:
    """The seeds' `Runtime:` style: 3 significant digits, `-1.0` when there is no valid time."""
    if ms < 0:
        return "-1.0"
    return f"{float(f'{ms:.3g}'):g}"


def speedup_with_interval(value: float | None, interval: tuple[float, float] | None) -> str:
    """`1.23x (95% CI 1.1-1.4)`, or `n/a` without a speedup."""
    if value is None:
        return "n/a"
    return f"{value:.3g}x" + (f" (95% CI {interval[0]:.3g}-{interval[1]:.3g})" if interval else "")
