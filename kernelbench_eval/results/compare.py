"""Compare two runs candidate by candidate: what broke, what was fixed, what got faster or slower."""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table

from kernelbench_eval.records import Verdict

KIND_STYLE = {"broken": "bold red", "slower": "red", "fixed": "green", "faster": "green", "added": "cyan",
              "removed": "yellow", "source_changed": "dim"}


@dataclass(frozen=True)
class Change:
    problem: str
    candidate: str
    kind: str  # broken, fixed, faster, slower, added, removed, source_changed
    detail: str
    regression: bool = False


def _key(v: Verdict) -> tuple[str, str]:
    return (v.problem, v.candidate)


def _timed(v: Verdict) -> bool:
    return v.correct and v.runtime_ms > 0


def compare_runs(a: list[Verdict], b: list[Verdict], threshold: float = 0.05) -> list[Change]:
    """Pair A's and B's verdicts by (problem, candidate). A runtime change counts when |B/A - 1| > threshold.

    Regressions: correct in A but not in B (`broken`), or more than `threshold` slower (`slower`).
    When a run holds one candidate twice (a resumed run), its last verdict counts.
    """
    old = {_key(v): v for v in a}
    new = {_key(v): v for v in b}
    changes: list[Change] = []
    for key in sorted(old.keys() | new.keys()):
        problem, candidate = key
        va, vb = old.get(key), new.get(key)
        if va is None and vb is not None:
            changes.append(Change(problem, candidate, "added", f"new candidate: {vb.status}"))
            continue
        if vb is None and va is not None:
            changes.append(Change(problem, candidate, "removed", f"was {va.status}"))
            continue
        assert va is not None and vb is not None
        if va.source_sha256 != vb.source_sha256:
            changes.append(Change(problem, candidate, "source_changed",
                                  f"source {va.source_sha256[:10]} -> {vb.source_sha256[:10]}"))
        if va.correct and not vb.correct:
            first = (vb.error or "").strip().splitlines()[0][:120] if (vb.error or "").strip() else ""
            changes.append(Change(problem, candidate, "broken", f"ok -> {vb.status}" + (f": {first}" if first else ""),
                                  regression=True))
        elif vb.correct and not va.correct:
            changes.append(Change(problem, candidate, "fixed", f"{va.status} -> ok"))
        elif _timed(va) and _timed(vb):
            ratio = vb.runtime_ms / va.runtime_ms - 1.0
            detail = f"{va.runtime_ms:.4g} ms -> {vb.runtime_ms:.4g} ms ({ratio:+.1%})"
            if ratio > threshold:
                changes.append(Change(problem, candidate, "slower", detail, regression=True))
            elif ratio < -threshold:
                changes.append(Change(problem, candidate, "faster", detail))
    return changes


def changes_table(changes: list[Change], title: str) -> Table:
    table = Table(title=title)
    for col in ("problem", "candidate", "change", "detail"):
        table.add_column(col, overflow="fold")
    for c in changes:
        style = KIND_STYLE.get(c.kind, "")
        table.add_row(c.problem, c.candidate, f"[{style}]{c.kind}[/]", c.detail)
    return table
