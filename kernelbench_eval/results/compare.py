"""Compare two runs candidate by candidate: what broke, what was fixed, what got faster or slower.

A change in speed is judged by the runs' intervals, not their point estimates: two runs of the same sources
on a loaded machine differ by tens of per cent (a cold run against a warm one, 2x on a busy host), and a CI
check that fails on that fails on noise. Which interval, of the verdict's fields:

- `speedup_vs_eager_ci` (the same as `timing.speedup_ci`): the 95 % interval of the candidate's speedup over
  the reference, timed interleaved in the same session and widened by the problem's between-session spread.
  A ratio to a reference timed beside it, so load that slows both cancels; this is what is compared.
- not `timing.speedup_rerun_interval`: that already predicts where *another* session lands (it holds the
  second session's error), so setting it against the other run's interval would count that error twice.
- not `runtime_stats` (median, IQR): the spread of single calls, not the uncertainty of the time per call,
  and a runtime alone moves with the machine's load, which the reference beside it shows and cancels.

A candidate got slower when run B's whole interval lies below run A's (and faster when above) and the
speedup moved by more than the threshold besides; overlapping intervals are noise, counted but not a change.
Two 95 % intervals that do not overlap are a stricter test than 95 % (about 99.5 % for equal widths): a
check that fails a build must not fail on chance. A verdict without an interval (older runs), or with one of
zero width (under 20 timed calls the bootstrap has one window to resample), is compared by its runtime's
point estimate against the threshold, as before, and its detail says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.table import Table

from kernelbench_eval.records import Verdict
from kernelbench_eval.results.formatting import runtime

KIND_STYLE = {"broken": "bold red", "slower": "red", "fixed": "green", "faster": "green", "added": "cyan",
              "removed": "yellow", "source_changed": "dim", "timing_changed": "dim"}


@dataclass(frozen=True)
class Change:
    problem: str
    candidate: str
    kind: str  # broken, fixed, faster, slower, added, removed, source_changed
    detail: str
    regression: bool = False


@dataclass
class Comparison:
    changes: list[Change] = field(default_factory=list)
    within_noise: list[Change] = field(default_factory=list)  # points moved past the threshold, intervals overlap


def _key(v: Verdict) -> tuple[str, str]:
    return (v.problem, v.candidate)


def _timed(v: Verdict) -> bool:
    return v.correct and v.runtime_ms > 0


def _method(v: Verdict) -> str:
    """What its runtime measures (`Timing.basis`, without the counts): the harness's device or wall time, or
    KernelBench's method (`--timing`)."""
    return v.timing.basis.split(" (")[0] if v.timing else "device" if v.device == "cuda" else "wall"


def rule(threshold: float) -> str:
    """The bar a speed change must clear, as the command states it."""
    return (f"a speed change counts when the runs' 95% speedup intervals (vs eager) do not overlap and the "
            f"speedup moved by more than {threshold:.0%}; without intervals, when the runtime moved by more than "
            f"{threshold:.0%}")


def compare_runs(a: list[Verdict], b: list[Verdict], threshold: float = 0.05) -> list[Change]:
    """The changes from A to B (`compare`'s, without the differences judged noise)."""
    return compare(a, b, threshold).changes


def compare(a: list[Verdict], b: list[Verdict], threshold: float = 0.05) -> Comparison:
    """Pair A's and B's verdicts by (problem, candidate) and sort what differs into changes and noise.

    Regressions: correct in A but not in B (`broken`), or slower as the module's docstring says (`slower`).
    When a run holds one candidate twice (a resumed run), its last verdict counts.
    """
    old = {_key(v): v for v in a}
    new = {_key(v): v for v in b}
    result = Comparison()
    for key in sorted(old.keys() | new.keys()):
        problem, candidate = key
        va, vb = old.get(key), new.get(key)
        if va is None and vb is not None:
            result.changes.append(Change(problem, candidate, "added", f"new candidate: {vb.status}"))
            continue
        if vb is None and va is not None:
            result.changes.append(Change(problem, candidate, "removed", f"was {va.status}"))
            continue
        assert va is not None and vb is not None
        if va.source_sha256 != vb.source_sha256:
            result.changes.append(Change(problem, candidate, "source_changed",
                                         f"source {va.source_sha256[:10]} -> {vb.source_sha256[:10]}"))
        if va.correct and not vb.correct:
            first = (vb.error or "").strip().splitlines()[0][:120] if (vb.error or "").strip() else ""
            result.changes.append(Change(problem, candidate, "broken",
                                         f"ok -> {vb.status}" + (f": {first}" if first else ""), regression=True))
        elif vb.correct and not va.correct:
            result.changes.append(Change(problem, candidate, "fixed", f"{va.status} -> ok"))
        elif _timed(va) and _timed(vb) and _method(va) != _method(vb):  # two bases: no speed to compare
            result.changes.append(Change(problem, candidate, "timing_changed",
                                         f"timed two ways, not compared: {runtime(va.runtime_ms)} ms "
                                         f"({_method(va)}) -> {runtime(vb.runtime_ms)} ms ({_method(vb)})"))
        elif _timed(va) and _timed(vb):
            kind, detail = speed_change(va, vb, threshold)
            if kind in ("slower", "faster"):
                result.changes.append(Change(problem, candidate, kind, detail, regression=kind == "slower"))
            elif kind == "noise":
                result.within_noise.append(Change(problem, candidate, kind, detail))
    return result


def speed_change(va: Verdict, vb: Verdict, threshold: float) -> tuple[str | None, str]:
    """(kind, detail) for one candidate timed in both runs: "slower", "faster", "noise" (its points moved by
    more than the threshold, its intervals say it need not have), or None (nothing to show)."""
    moved = vb.runtime_ms / va.runtime_ms - 1.0
    detail = f"{runtime(va.runtime_ms)} ms -> {runtime(vb.runtime_ms)} ms ({moved:+.1%})"
    ia, ib, sa, sb = va.speedup_vs_eager_ci, vb.speedup_vs_eager_ci, va.speedup_vs_eager, vb.speedup_vs_eager
    if not (ia and ib and sa and sb and ia[1] > ia[0] and ib[1] > ib[0]):  # none, or one of zero width
        detail += "; no interval: point estimates"
        return ("slower" if moved > threshold else "faster" if moved < -threshold else None), detail
    detail += f"; speedup {_interval(sa, ia)} -> {_interval(sb, ib)}"
    if ib[1] < ia[0] and sa / sb - 1.0 > threshold:
        return "slower", detail
    if ib[0] > ia[1] and sb / sa - 1.0 > threshold:
        return "faster", detail
    points_moved = max(abs(moved), sa / sb - 1.0, sb / sa - 1.0) > threshold
    overlap = ib[1] >= ia[0] and ib[0] <= ia[1]
    return ("noise" if points_moved else None), detail + ("; intervals overlap" if overlap else
                                                           f"; speedup moved {threshold:.0%} or less")


def _interval(point: float, interval: tuple[float, float]) -> str:
    return f"{point:.3g}x [{interval[0]:.3g}-{interval[1]:.3g}]"


def changes_table(changes: list[Change], title: str) -> Table:
    table = Table(title=title)
    for col in ("problem", "candidate", "change", "detail"):
        table.add_column(col, overflow="fold")
    for c in changes:
        style = KIND_STYLE.get(c.kind, "")
        table.add_row(c.problem, c.candidate, f"[{style}]{c.kind}[/]", c.detail)
    return table
