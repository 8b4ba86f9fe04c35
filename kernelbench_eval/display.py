"""What a person sees in the terminal: a progress bar while running, one table at the end."""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.table import Table

from kernelbench_eval.models import Verdict
from kernelbench_eval.record import format_runtime

STATUS_STYLE = {
    "ok": "green",
    "suspicious": "bold yellow",
    "incorrect": "red",
    "compile_error": "magenta",
    "load_error": "magenta",
    "runtime_error": "red",
    "timeout": "yellow",
    "crashed": "bold red",
    "skipped": "dim",
}


def verdict_table(verdicts: list[Verdict], title: str = "Verdicts") -> Table:
    table = Table(title=title, show_lines=False)
    for col, justify in (("problem", "left"), ("candidate", "left"), ("status", "left"), ("runtime ms", "right"),
                         ("ref ms", "right"), ("speedup", "right"), ("max |diff|", "right"), ("error", "left")):
        table.add_column(col, justify=justify, overflow="fold")
    for v in sorted(verdicts, key=lambda v: (v.problem, -(v.speedup or 0), v.candidate)):
        style = STATUS_STYLE.get(v.status, "")
        table.add_row(
            v.problem,
            v.candidate,
            f"[{style}]{v.status}[/]",
            format_runtime(v.runtime_ms),
            format_runtime(v.ref_runtime_ms) if v.ref_runtime_ms is not None else "",
            f"{v.speedup:.2f}x" if v.speedup is not None else "",
            f"{v.max_abs_diff:.2g}" if v.max_abs_diff is not None else "",
            (v.error or "")[:160],
        )
    return table


def status_counts(verdicts: list[Verdict]) -> str:
    counts = Counter(v.status for v in verdicts)
    return ", ".join(f"[{STATUS_STYLE.get(s, '')}]{n} {s}[/]" for s, n in sorted(counts.items()))


def print_verdict_detail(console: Console, verdict: Verdict) -> None:
    """The single-candidate view of `kbeval eval`: the seeds' two lines, then what a person needs next."""
    console.print(f"Evaluation: {verdict.correct}")
    console.print(f"Runtime: {format_runtime(verdict.runtime_ms)}")
    style = STATUS_STYLE.get(verdict.status, "")
    console.print(f"status: [{style}]{verdict.status}[/]  device: {verdict.device_name or verdict.device}")
    if verdict.error:
        console.print(f"error: {verdict.error}", markup=False)
    if verdict.runtime_stats and verdict.ref_runtime_stats:
        s, r = verdict.runtime_stats, verdict.ref_runtime_stats
        console.print(f"candidate {s.median_ms:.4g} ms (IQR {s.iqr_ms:.2g}, {s.calls} calls), "
                      f"reference {r.median_ms:.4g} ms, interleaved")
        console.print(f"speedup vs eager {_speedup(verdict.speedup_vs_eager, verdict.speedup_vs_eager_ci)}, "
                      f"vs torch.compile {_speedup(verdict.speedup_vs_compile, verdict.speedup_vs_compile_ci)}")
    if verdict.max_abs_diff is not None:
        console.print(f"max |diff| {verdict.max_abs_diff:.3g}, mean |diff| {verdict.mean_abs_diff:.3g}, "
                      f"trials passed {verdict.trials_passed}/{verdict.trials}")


def _speedup(value: float | None, interval: tuple[float, float] | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3g}x" + (f" (95% CI {interval[0]:.3g}-{interval[1]:.3g})" if interval else "")
