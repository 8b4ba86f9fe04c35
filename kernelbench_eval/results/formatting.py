"""How numbers look to people, in every report, table and line the harness prints.

Three rules, here once: a missing number (None, NaN, or the -1.0 that means 'no valid time') prints as
nothing (or a placeholder), never as `nan` or `-1`; a runtime in the seeds' two-line files keeps their
style (`Runtime: 13.6`, `-1.0` when there is no time), which other tools parse; and a candidate has one
runtime figure everywhere (`kbeval eval`, tables, reports, `.txt`): its verdict's `runtime_ms` (time per
call) to those same 3 significant digits, so no two places show two numbers for one thing.
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


def runtime_text(ms: float | None) -> str:
    """A runtime in tables and reports: `runtime`'s digits, nothing when there is no time."""
    return "" if ms is None or math.isnan(ms) or ms < 0 else runtime(ms)


def fit_items(head: str, items: list[str], width: int | None, indent: int = 4) -> list[str]:
    """`head` and then `items` (two spaces apart) as lines of at most `width`, broken between items, never
    inside one; continuation lines are indented. One line when `width` is None."""
    lines = [head]
    for i, item in enumerate(items):
        sep = " " if i == 0 else "  "
        if width is None or len(lines[-1]) + len(sep) + len(item) <= width:
            lines[-1] += sep + item
        else:
            lines.append(" " * indent + item)
    return lines


def speedup_with_interval(value: float | None, interval: tuple[float, float] | None) -> str:
    """`1.23x (95% CI 1.1-1.4)`, or `n/a` without a speedup."""
    if value is None:
        return "n/a"
    return f"{value:.3g}x" + (f" (95% CI {interval[0]:.3g}-{interval[1]:.3g})" if interval else "")
