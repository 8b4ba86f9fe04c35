"""`kbeval report`, `compare` and `gate`: read finished run folders; nothing here judges anything.

Exit codes: 2 for a usage error (no such run folder, an unknown format or baseline); `compare` and `gate`
exit 1 when the runs miss their bar, so CI can use them as checks.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from kernelbench_eval.cli.options import check_file, check_values
from kernelbench_eval.cli.output import console, load_run_or_exit, usage_error
from kernelbench_eval.results.compare import changes_table, compare, rule
from kernelbench_eval.results.gate import BASELINES, GateUsageError, bar, check_gate
from kernelbench_eval.results.report import FORMATS, render


def report_cmd(
    run_dir: Annotated[Path, typer.Argument(help="a run folder (results/<run-id>)", metavar="RUN_DIR")],
    fmt: Annotated[str, typer.Option("--format", "-f", help=f"one of: {', '.join(FORMATS)}")] = "table",
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", help="write here instead of stdout (html defaults to RUN_DIR/report.html)")] = None,
) -> None:
    """Render a run's verdicts as a table, CSV, JSON, Markdown, JUnit XML or a self-contained HTML page."""
    if fmt not in FORMATS:
        raise usage_error(f"--format: unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    verdicts = load_run_or_exit(run_dir)
    if fmt == "html" and output is None:
        output = run_dir / "report.html"
    if output is not None:
        check_file("--output", output)
    text = render(verdicts, fmt, title=f"kbeval report: {run_dir.name}")
    if output is None:
        sys.stdout.write(text)
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    console.print(f"wrote {output}", markup=False, highlight=False, soft_wrap=True)


def compare_cmd(
    run_a: Annotated[Path, typer.Argument(help="the earlier run folder (the baseline)", metavar="RUN_A")],
    run_b: Annotated[Path, typer.Argument(help="the later run folder", metavar="RUN_B")],
    threshold: Annotated[float, typer.Option(
        "--threshold", help="relative speed change that counts as faster/slower (0.05 = 5%), once the runs' "
                            "intervals separate")] = 0.05,
) -> None:
    """Compare two runs candidate by candidate.

    A speed change counts only when the two runs' 95% speedup intervals do not overlap and it exceeds the
    threshold (verdicts without intervals: their runtimes, by the threshold alone).

    Exit codes: 0 no regression; 1 a candidate broke (correct in RUN_A, not in RUN_B) or got slower; 2 usage
    error (missing run folder, negative threshold).
    """
    check_values({"threshold": threshold})
    a, b = load_run_or_exit(run_a), load_run_or_exit(run_b)
    result = compare(a, b, threshold)
    changes, regressions = result.changes, [c for c in result.changes if c.regression]
    if changes:
        console.print(changes_table(changes, title=f"{run_a.name} -> {run_b.name}"))
    else:
        console.print(f"no changes between {run_a.name} and {run_b.name}", markup=False, highlight=False)
    noise = f"; {len(result.within_noise)} speed differences within the runs' intervals, not counted" if (
        result.within_noise) else ""
    console.print(f"{len(changes)} changes, {len(regressions)} regressions{noise}", markup=False, highlight=False)
    console.print(f"({rule(threshold)})", markup=False, highlight=False)
    if regressions:
        raise typer.Exit(1)


def gate_cmd(
    run_dir: Annotated[Path, typer.Argument(help="a run folder (results/<run-id>)", metavar="RUN_DIR")],
    require_correct: Annotated[bool, typer.Option(
        "--require-correct/--no-require-correct", help="every candidate must be correct")] = True,
    min_speedup: Annotated[float | None, typer.Option(
        "--min-speedup", help="every correct candidate must be at least this much faster than the baseline")] = None,
    baseline: Annotated[str, typer.Option("--baseline", help=f"speedup baseline: {' or '.join(BASELINES)}")] = "eager",
    allow_skipped: Annotated[bool, typer.Option("--allow-skipped", help="skipped candidates do not fail")] = False,
    allow_suspicious: Annotated[bool, typer.Option(
        "--allow-suspicious", help="suspicious timings do not fail (they still must meet the other bars)")] = False,
    require_custom: Annotated[bool, typer.Option(
        "--require-custom", help="every correct candidate must have run at least one kernel of its own")] = False,
) -> None:
    """Pass or fail a run for CI; prints one line per candidate that misses the bar.

    Exit codes: 0 every candidate meets the bar; 1 at least one does not; 2 usage error (no such run folder,
    a run with no verdicts, an unknown baseline, or --baseline compile on a run without a torch.compile
    baseline).
    """
    if baseline not in BASELINES:
        raise usage_error(f"--baseline: unknown baseline {baseline!r}; use one of {', '.join(BASELINES)}")
    check_values({"min_speedup": min_speedup})
    verdicts = load_run_or_exit(run_dir)
    if not verdicts:
        raise usage_error(f"{run_dir} has no verdicts")
    settings = dict(require_correct=require_correct, min_speedup=min_speedup, baseline=baseline,
                    allow_skipped=allow_skipped, allow_suspicious=allow_suspicious, require_custom=require_custom)
    try:
        failures = check_gate(verdicts, **settings)  # type: ignore[arg-type]
    except GateUsageError as exc:
        raise usage_error(exc) from exc
    for f in failures:
        console.print(f"FAIL {f.problem}/{f.candidate}: {f.reason}", markup=False, highlight=False, soft_wrap=True)
    stated = f" (bar: {bar(**settings)})"  # type: ignore[arg-type]
    if failures:
        console.print(f"gate failed: {len(failures)} of {len(verdicts)} candidates miss the bar{stated}",
                      markup=False, highlight=False)
        raise typer.Exit(1)
    console.print(f"gate passed: all {len(verdicts)} candidates meet the bar{stated}", markup=False,
                  highlight=False)
