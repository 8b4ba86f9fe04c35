"""What a person sees in the terminal: a progress bar while running, one table at the end."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kernelbench_eval import statuses
from kernelbench_eval.records import Verdict
from kernelbench_eval.results.formatting import number, runtime, speedup_with_interval


def verdict_table(verdicts: list[Verdict], title: str = "Verdicts", width: int | None = None) -> Table:
    """All columns, errors folded, when there is room; below 120 columns one line per verdict instead.

    Narrow, problem and candidate names are cut with an ellipsis, the reference time and max |diff| go, and
    each error is cut to what fits (its full text is in verdicts.jsonl and the candidate's log).
    """
    narrow = width is not None and width < NARROW
    cut = narrow and any(v.error for v in verdicts)
    caption = "errors cut to fit; full text in verdicts.jsonl and logs/" if cut else None
    table = Table(title=title, show_lines=False, caption=caption, expand=narrow)
    for col, justify, limit in _columns(narrow):
        table.add_column(col, justify=justify, overflow="ellipsis" if narrow else "fold", no_wrap=narrow,
                         max_width=limit, ratio=1 if col == "error" and narrow else None)
    for v in sorted(verdicts, key=lambda v: (v.problem, -(v.speedup or 0), v.candidate)):
        style = statuses.style(v.status)
        cells = {
            "problem": v.problem,
            "candidate": v.candidate,
            "status": f"[{style}]{v.status}[/]",
            "runtime ms": runtime(v.runtime_ms),
            "ref ms": runtime(v.ref_runtime_ms) if v.ref_runtime_ms is not None else "",
            "speedup": number(v.speedup, ".2f", "x"),
            "max |diff|": number(v.max_abs_diff, ".2g"),
            "error": escape(" ".join((v.error or "").split()) if narrow else (v.error or "")[:160]),
        }
        table.add_row(*(cells[col] for col, _, _ in _columns(narrow)))
    return table


NARROW = 120  # columns below which the table keeps to one line per verdict


def _columns(narrow: bool) -> list[tuple[str, str, int | None]]:
    """(name, justify, max width) of each column."""
    if narrow:
        return [("problem", "left", 14), ("candidate", "left", 22), ("status", "left", None),
                ("runtime ms", "right", None), ("speedup", "right", None), ("error", "left", None)]
    return [(col, justify, None) for col, justify in (
        ("problem", "left"), ("candidate", "left"), ("status", "left"), ("runtime ms", "right"), ("ref ms", "right"),
        ("speedup", "right"), ("max |diff|", "right"), ("error", "left"))]


def status_counts(verdicts: list[Verdict]) -> str:
    counts = statuses.counts(v.status for v in verdicts)
    return ", ".join(f"[{statuses.style(s)}]{n} {s}[/]" for s, n in counts.items())


def print_verdict_detail(console: Console, verdict: Verdict) -> None:
    """The single-candidate view of `kbeval eval`: the seeds' two lines, then what a person needs next."""
    console.print(f"Evaluation: {verdict.correct}")
    console.print(f"Runtime: {runtime(verdict.runtime_ms)}")
    style = statuses.style(verdict.status)
    console.print(f"status: [{style}]{verdict.status}[/]  device: {verdict.device_name or verdict.device}")
    if verdict.error:
        console.print(f"error: {verdict.error}", markup=False)
    if verdict.runtime_stats and verdict.ref_runtime_stats:
        s, r = verdict.runtime_stats, verdict.ref_runtime_stats
        console.print(f"candidate {s.median_ms:.4g} ms (IQR {s.iqr_ms:.2g}, {s.calls} calls), "
                      f"reference {r.median_ms:.4g} ms, interleaved")
        eager = speedup_with_interval(verdict.speedup_vs_eager, verdict.speedup_vs_eager_ci)
        compiled = speedup_with_interval(verdict.speedup_vs_compile, verdict.speedup_vs_compile_ci)
        console.print(f"speedup vs eager {eager}, vs torch.compile {compiled}")
    if verdict.max_abs_diff is not None:
        console.print(f"max |diff| {verdict.max_abs_diff:.3g}, mean |diff| {verdict.mean_abs_diff:.3g}, "
                      f"trials passed {verdict.trials_passed}/{verdict.trials}")


def print_log_tail(console: Console, log: Path, lines: int = 20) -> None:
    """The end of a log about to be removed with its temporary folder (`kbeval eval` without --out)."""
    if not log.exists():
        return
    tail = log.read_text(errors="replace").splitlines()[-lines:]
    console.print(f"log (last {len(tail)} lines; --out DIR keeps the whole log):", markup=False, highlight=False)
    for line in tail:
        console.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)

