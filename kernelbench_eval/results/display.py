"""What a person sees in the terminal: one table of verdicts at the end of a run, one verdict in detail."""

from __future__ import annotations

import textwrap
from pathlib import Path

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from kernelbench_eval import statuses
from kernelbench_eval.records import Verdict
from kernelbench_eval.results.formatting import number, runtime, runtime_text, speedup_with_interval

NARROW = 120  # columns below which the table keeps to one line per verdict, its error on lines of its own
ERROR_LINES = 3  # of a narrow table's error, at most (the full text is in verdicts.jsonl and the logs)
GAP = "  "


def verdict_table(verdicts: list[Verdict], title: str = "Verdicts", width: int | None = None) -> RenderableType:
    """All columns, errors folded, when there is room; below `NARROW` columns, `narrow_table`."""
    if width is not None and width < NARROW:
        return narrow_table(verdicts, title, width)
    table = Table(title=title, show_lines=False)
    for col, justify in (("problem", "left"), ("candidate", "left"), ("status", "left"), ("runtime ms", "right"),
                         ("ref ms", "right"), ("speedup [95% CI]", "right"), ("max |diff|", "right"),
                         ("error", "left")):
        table.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for v in _ordered(verdicts):
        interval = v.speedup_vs_eager_ci
        speed = number(v.speedup, ".2f", "x") + (f" [{interval[0]:.2f}-{interval[1]:.2f}]" if interval else "")
        table.add_row(v.problem, v.candidate, f"[{statuses.style(v.status)}]{v.status}[/]",
                      runtime_text(v.runtime_ms), runtime_text(v.ref_runtime_ms), speed,
                      number(v.max_abs_diff, ".2g"), escape((v.error or "")[:160]))
    return table


def narrow_table(verdicts: list[Verdict], title: str, width: int) -> Group:
    """One line per verdict (problem, candidate, status, runtime, speedup) and its error below it, wrapped.

    Why not a table with an error column: at 80 columns the columns before it leave the error no room at all
    (it showed nothing). Here the error takes the whole width, up to `ERROR_LINES` lines; the names are cut
    with an ellipsis to what the other columns leave, and a status is never cut.
    """
    rows = _ordered(verdicts)
    heads = ("problem", "candidate", "status", "runtime ms", "speedup")
    cells = [(v.problem, v.candidate, v.status, runtime_text(v.runtime_ms), number(v.speedup, ".2f", "x"))
             for v in rows]
    widths = [max([len(head), *(len(c[i]) for c in cells)]) for i, head in enumerate(heads)]
    room = width - sum(widths[2:]) - len(GAP) * (len(heads) - 1)
    widths[0], widths[1] = _share(widths[0], widths[1], room)
    lines: list[RenderableType] = [Text(title, style="italic", justify="center"),
                                   _line(heads, widths, ("bold",) * len(heads)),
                                   Text("─" * (sum(widths) + len(GAP) * (len(heads) - 1)))]
    cut = False
    for v, row in zip(rows, cells, strict=True):
        lines.append(_line(row, widths, ("", "", statuses.style(v.status), "", "")))
        if v.error:
            wrapped = textwrap.wrap(" ".join(v.error.split()), max(width - 4, 20), break_on_hyphens=False)
            if len(wrapped) > ERROR_LINES:
                wrapped, cut = wrapped[:ERROR_LINES], True
                wrapped[-1] = wrapped[-1][:max(width - 5, 19)] + "…"
            lines.extend(Text("    " + part) for part in wrapped)
    if cut:
        lines.append(Text(f"errors cut to {ERROR_LINES} lines; full text in verdicts.jsonl and logs/", style="dim"))
    return Group(*lines)


def _share(problem: int, candidate: int, room: int) -> tuple[int, int]:
    """Widths of the two name columns in `room`: their own when both fit, else the room shared 2:3 (a column
    needing less than its share leaves the rest to the other)."""
    if problem + candidate <= room:
        return problem, candidate
    first = min(problem, max(room * 2 // 5, room - candidate))
    return max(first, 4), max(room - first, 4)


def _line(cells: tuple[str, ...], widths: list[int], styles: tuple[str, ...]) -> Text:
    """One row of the narrow table: each cell cut (with an ellipsis) or padded to its column; the last two
    (runtime, speedup) are numbers, right-aligned."""
    parts = []
    for i, (cell, width, style) in enumerate(zip(cells, widths, styles, strict=True)):
        text = Text(cell.rjust(width) if i >= 3 else cell, style=style)
        text.truncate(width, overflow="ellipsis", pad=True)
        parts.append(text)
    line = Text(GAP).join(parts)
    line.rstrip()  # empty numbers leave no trailing blanks
    return line


def _ordered(verdicts: list[Verdict]) -> list[Verdict]:
    return sorted(verdicts, key=lambda v: (v.problem, -(v.speedup or 0), v.candidate))


def status_counts(verdicts: list[Verdict]) -> str:
    counts = statuses.counts(v.status for v in verdicts)
    return ", ".join(f"[{statuses.style(s)}]{n} {s}[/]" for s, n in counts.items())


def print_verdict_detail(console: Console, verdict: Verdict) -> None:
    """The single-candidate view of `kbeval eval`: the seeds' two lines, then what a person needs next.

    The runtime is printed once, as `Runtime:` (the verdict's `runtime_ms`, the time per call the `.txt` file
    and the tables show); the timing line says what it is, its standard error and the single calls' spread,
    and the reference's time per call. The median of single calls (`runtime_stats.median_ms`), another figure
    for the same thing, is not printed: it once stood beside `Runtime:` with other digits.
    """
    console.print(f"Evaluation: {verdict.correct}")
    console.print(f"Runtime: {runtime(verdict.runtime_ms)}")
    style = statuses.style(verdict.status)
    console.print(f"status: [{style}]{verdict.status}[/]  device: {escape(verdict.device_name or verdict.device)}")
    if verdict.error:
        console.print(f"error: {verdict.error}", markup=False)
    if verdict.runtime_stats and verdict.ref_runtime_stats and verdict.runtime_ms > 0:
        rse = verdict.timing.rse if verdict.timing else None
        error = f" ±{rse:.1%} (std. error)" if rse is not None else ""
        stats = verdict.runtime_stats
        console.print(f"Runtime is ms per call{error}, over {stats.calls} calls (single calls' IQR "
                      f"{stats.iqr_ms:.2g} ms); reference {runtime_text(verdict.ref_runtime_ms) or '?'} ms per call, "
                      "timed interleaved", markup=False, highlight=False)
        eager = speedup_with_interval(verdict.speedup_vs_eager, verdict.speedup_vs_eager_ci)
        compiled = speedup_with_interval(verdict.speedup_vs_compile, verdict.speedup_vs_compile_ci)
        console.print(f"speedup vs eager {eager}, vs torch.compile {compiled}", markup=False, highlight=False)
        if verdict.timing and verdict.timing.basis not in ("device", "wall"):  # not the harness's own method
            console.print(f"these times and speedups: {verdict.timing.basis}", markup=False, highlight=False)
    if verdict.max_abs_diff is not None:
        console.print(f"max |diff| {verdict.max_abs_diff:.3g}, mean |diff| {verdict.mean_abs_diff:.3g}, "
                      f"trials passed {verdict.trials_passed}/{verdict.trials}")


def print_log_tail(console: Console, log: Path, lines: int = 20) -> None:
    """The end of a log about to be removed with its temporary folder (`kbeval eval` without --out); an empty
    log says so in one line instead of announcing lines that do not follow."""
    if not log.exists():
        return
    text = log.read_text(errors="replace").rstrip()
    if not text.strip():
        console.print("log: empty", markup=False, highlight=False)
        return
    tail = text.splitlines()[-lines:]
    console.print(f"log (last {len(tail)} lines; --out DIR keeps the whole log):", markup=False, highlight=False)
    for line in tail:
        console.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
