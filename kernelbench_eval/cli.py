"""`kbeval`: a thin command line over the pipeline.

Exit codes: 0 when the command completed (whatever the verdicts), 2 for usage errors (bad options,
missing folders or files).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kernelbench_eval import options as opt
from kernelbench_eval.compare import changes_table, compare_runs
from kernelbench_eval.discover import (
    Discovery,
    Problem,
    check_dims,
    find_problems,
    make_candidate,
    sha256_file,
    smoke_dims,
)
from kernelbench_eval.display import print_log_tail, print_verdict_detail, status_counts, verdict_table
from kernelbench_eval.gate import BASELINES, GateUsageError, check_gate
from kernelbench_eval.judge import describe_problem
from kernelbench_eval.models import RunSettings, Verdict
from kernelbench_eval.pipeline import (
    RunOptions,
    RunResult,
    default_cache_dir,
    run,
)
from kernelbench_eval.plan import build_settings, parse_dims, plan_run, precision_settings
from kernelbench_eval.progress import RunProgress
from kernelbench_eval.report import FORMATS, fast_p_text, load_run, render, write_default_reports

app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  rich_markup_mode=None)
console = Console()
DEFAULT_JOBS = os.cpu_count() or 1
err = Console(stderr=True)

def _warn(message: str) -> None:
    err.print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True)


def _usage_error(message: object) -> typer.Exit:
    """One line on stderr, exit 2; pydantic's multi-line errors are cut to their first field's."""
    if isinstance(message, ValidationError):
        first = message.errors()[0]
        message = f"--{'-'.join(str(p) for p in first['loc']).replace('_', '-')}: {first['msg']}"
    err.print(f"[red]error:[/] {escape(str(message))}", soft_wrap=True)
    return typer.Exit(2)


@app.command("run")
def run_cmd(
    problems: Annotated[Path, typer.Option("--problems", help="folder of problem files")] = Path("problems"),
    candidates: Annotated[Path, typer.Option("--candidates", help="folder of candidates/<problem_id>/*.py")] = Path(
        "candidates"),
    out: Annotated[Path, typer.Option("--out", help="results folder; the run goes in OUT/<run-id>/")] = Path(
        "results"),
    run_id: Annotated[str | None, typer.Option("--run-id", help="name of the run folder")] = None,
    resume: Annotated[Path | None, typer.Option(
        "--resume", help="continue this run folder, from any folder, with its recorded folders and settings")] = None,
    problem: Annotated[list[str] | None, typer.Option("--problem", metavar="ID", help="only these problem ids")] = None,
    smoke: opt.SmokeOpt = False,
    device: opt.DeviceOpt = "auto",
    jobs: opt.JobsOpt = DEFAULT_JOBS,
    timeout: opt.TimeoutOpt = 300.0,
    compile_timeout: opt.CompileTimeoutOpt = 600.0,
    trials: opt.TrialsOpt = None,
    atol: opt.AtolOpt = None,
    rtol: opt.RtolOpt = None,
    precision: opt.PrecisionOpt = "fp32",
    tolerance: opt.ToleranceOpt = "default",
    account_launches: opt.LaunchesOpt = False,
    reps: opt.RepsOpt = None,
    warmup: opt.WarmupOpt = None,
    warmup_seconds: opt.WarmupSecondsOpt = None,
    max_reps: opt.MaxRepsOpt = None,
    target_rse: opt.RseOpt = 0.01,
    timing_budget: opt.BudgetOpt = None,
    cuda_graph: opt.GraphOpt = False,
    compile_baseline: opt.CompileBaselineOpt = None,
    max_speedup: opt.MaxSpeedupOpt = 10.0,
    dim: opt.DimOpt = None,
    threads: opt.ThreadsOpt = None,
    cache_dir: opt.CacheOpt = None,
    baselines: opt.BaselinesOpt = None,
    gpus: opt.GpusOpt = None,
    lanes: opt.LanesOpt = None,
    backend: opt.BackendOpt = "local",
    address: opt.RayAddressOpt = None,
    ray_build_resource: opt.RayBuildOpt = None,
    ray_judge_resource: opt.RayJudgeOpt = None,
) -> None:
    """Judge every candidate under CANDIDATES against its problem; verdicts go to OUT/<run-id>/."""
    timing = {"trials": trials, "reps": reps, "warmup": warmup, "warmup_seconds": warmup_seconds,
              "max_reps": max_reps, "timing_budget": timing_budget, "compile_baseline": compile_baseline}

    def make_settings(judged: list[Problem], warnings: list[str]) -> RunSettings:
        return build_settings(device, dim, threads, smoke, judged, warnings,
                              **precision_settings(precision, tolerance, atol, rtol), target_rse=target_rse,
                              cuda_graph=cuda_graph, max_speedup=max_speedup, account_launches=account_launches,
                              **timing)

    try:
        found, settings, plan = plan_run(resume, problems, candidates, problem, make_settings, _warn)
    except (FileNotFoundError, ValueError) as exc:
        raise _usage_error(exc) from exc
    ignored = [name for name, value in timing.items() if value is not None] + ["dim"] * bool(dim) + ["smoke"] * smoke
    if resume and ignored:
        err.print(f"[yellow]warning:[/] --resume keeps the run's recorded settings; ignored: "
                  f"{', '.join('--' + n.replace('_', '-') for n in dict.fromkeys(ignored))}", soft_wrap=True)
    opts = RunOptions(problems_dir=problems, candidates_dir=candidates, results_dir=out, settings=settings,
                      run_id=run_id, resume=resume, jobs=jobs, timeout=timeout, compile_timeout=compile_timeout,
                      cache_dir=cache_dir or default_cache_dir(), only=problem, baselines=baselines,
                      gpus=[g.strip() for g in gpus.split(",") if g.strip()] if gpus else None, lanes=lanes,
                      backend=backend, ray_address=address, ray_build_resource=ray_build_resource,
                      ray_judge_resource=ray_judge_resource)
    try:
        with RunProgress(err, plan) as progress:
            opts.observe = progress.observe
            result = run(opts, progress.verdict, found)
    except ImportError as exc:
        err.print(f"[red]error:[/] --backend {backend} needs its extra: pip install 'kernelbench-eval[{backend}]' "
                  f"({exc})", markup=True, highlight=False)
        raise typer.Exit(2) from exc
    except (FileNotFoundError, FileExistsError, ValueError) as exc:
        raise _usage_error(exc) from exc
    _print_result(result)


def _print_result(result: RunResult) -> None:
    for warning in result.warnings:
        _warn(warning)
    if not result.verdicts:
        err.print(f"[red]error:[/] {result.run_dir}: no verdicts were recorded", soft_wrap=True)
        raise typer.Exit(1)
    console.print(verdict_table(result.verdicts, title=f"run {result.run_dir.name}", width=console.width))
    console.print(f"{len(result.verdicts)} verdicts ({status_counts(result.verdicts)})"
                  + (f", {result.reused} reused from before" if result.reused else ""))
    console.print(fast_p_text(result.verdicts), markup=False, highlight=False)
    console.print(f"verdicts: {result.run_dir / 'verdicts.jsonl'}", soft_wrap=True)
    for path in write_default_reports(result.run_dir):
        console.print(f"report: {path}", soft_wrap=True)


@app.command("eval")
def eval_cmd(
    problem_file: Annotated[Path, typer.Argument(
        help="the problem's .py file (class Model)", exists=True, dir_okay=False, metavar="PROBLEM_FILE")],
    candidate_file: Annotated[Path, typer.Argument(
        help="the candidate's .py file (class ModelNew)", exists=True, dir_okay=False, metavar="CANDIDATE_FILE")],
    out: Annotated[Path | None, typer.Option(
        "--out", help="results folder, kept (default: a temporary one, removed at the end)")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the verdict as JSON")] = False,
    smoke: opt.SmokeOpt = False,
    device: opt.DeviceOpt = "auto",
    timeout: opt.TimeoutOpt = 300.0,
    compile_timeout: opt.CompileTimeoutOpt = 600.0,
    trials: opt.TrialsOpt = None,
    atol: opt.AtolOpt = None,
    rtol: opt.RtolOpt = None,
    precision: opt.PrecisionOpt = "fp32",
    tolerance: opt.ToleranceOpt = "default",
    account_launches: opt.LaunchesOpt = False,
    reps: opt.RepsOpt = None,
    warmup: opt.WarmupOpt = None,
    warmup_seconds: opt.WarmupSecondsOpt = None,
    max_reps: opt.MaxRepsOpt = None,
    target_rse: opt.RseOpt = 0.01,
    timing_budget: opt.BudgetOpt = None,
    cuda_graph: opt.GraphOpt = False,
    compile_baseline: opt.CompileBaselineOpt = None,
    max_speedup: opt.MaxSpeedupOpt = 10.0,
    dim: opt.DimOpt = None,
    threads: opt.ThreadsOpt = None,
    cache_dir: opt.CacheOpt = None,
    baselines: opt.BaselinesOpt = None,
) -> None:
    """Judge one candidate file against one problem file and print its verdict."""
    if problem_file.suffix != ".py":
        raise _usage_error(f"{problem_file}: not a Python source; a problem is a .py file defining Model")
    prob = Problem(problem_id=problem_file.stem, path=problem_file, source_sha256=sha256_file(problem_file))
    warnings: list[str] = []
    try:
        settings = build_settings(device, dim, threads, smoke, [prob], warnings, trials=trials,
                                  **precision_settings(precision, tolerance, atol, rtol), reps=reps, warmup=warmup,
                                  warmup_seconds=warmup_seconds,
                                  max_reps=max_reps, target_rse=target_rse, timing_budget=timing_budget,
                                  cuda_graph=cuda_graph, compile_baseline=compile_baseline, max_speedup=max_speedup,
                                  account_launches=account_launches)
    except ValueError as exc:
        raise _usage_error(exc) from exc
    for warning in warnings:
        _warn(warning)
    cache = cache_dir or default_cache_dir()
    found = Discovery(problems={prob.problem_id: prob}, candidates=[make_candidate(prob, candidate_file)], warnings=[])
    results_dir = out or Path(tempfile.mkdtemp(prefix="kbeval-eval-"))
    opts = RunOptions(problems_dir=problem_file.parent, candidates_dir=candidate_file.parent,
                      results_dir=results_dir, settings=settings, jobs=1, timeout=timeout,
                      compile_timeout=compile_timeout, cache_dir=cache, lanes=1,
                      baselines=baselines or (None if out else cache / "baselines.json"),
                      run_id=f"eval-{datetime.now():%Y%m%d-%H%M%S}-{candidate_file.stem}")
    try:
        result = run(opts, found=found)
        verdict = result.verdicts[-1]
        if json_out:
            print(verdict.model_dump_json(indent=2))
            return
        print_verdict_detail(console, verdict)
        if verdict.log and out:
            console.print(f"log: {result.run_dir / verdict.log}", soft_wrap=True)
        elif verdict.log and verdict.status != "ok":  # the folder goes: show the end of the log instead
            print_log_tail(console, result.run_dir / verdict.log)
    finally:
        if out is None:
            shutil.rmtree(results_dir, ignore_errors=True)


@app.command("problems")
def problems_cmd(
    problems: Annotated[Path, typer.Option("--problems", help="folder of problem files")] = Path("problems"),
    dim: opt.DimOpt = None,
    smoke: Annotated[bool, typer.Option("--smoke", help="each problem at its KBEVAL_SMOKE_DIMS sizes")] = False,
    timeout: opt.TimeoutOpt = 120.0,
) -> None:
    """List the problems with their input shapes (each problem is imported in its own process)."""
    warnings: list[str] = []
    try:
        found = find_problems(problems, warnings)
        dims = parse_dims(dim or [])
        check_dims(dims, list(found.values()))
        sizes = {pid: (smoke_dims(prob.path) if smoke else {}) | dims for pid, prob in found.items()}
    except (FileNotFoundError, ValueError) as exc:
        raise _usage_error(exc) from exc
    table = Table(title=f"problems in {problems}")
    for col in ("problem", "file", "inputs"):
        table.add_column(col, overflow="fold")
    for pid, prob in found.items():
        shapes, error = describe_problem(prob, sizes[pid], timeout)
        table.add_row(pid, str(prob.path), ", ".join(shapes) if not error else f"[red]{escape(error)}[/]")
    for warning in warnings:
        _warn(warning)
    console.print(table)


def _load_run_or_exit(run_dir: Path) -> list[Verdict]:
    try:
        return load_run(run_dir)
    except (FileNotFoundError, ValueError) as exc:
        err.print(f"[red]error:[/] {exc}", markup=True)
        raise typer.Exit(2) from exc


@app.command("report")
def report_cmd(
    run_dir: Annotated[Path, typer.Argument(help="a run folder (results/<run-id>)", metavar="RUN_DIR")],
    fmt: Annotated[str, typer.Option("--format", "-f", help=f"one of: {', '.join(FORMATS)}")] = "table",
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", help="write here instead of stdout (html defaults to RUN_DIR/report.html)")] = None,
) -> None:
    """Render a run's verdicts as a table, CSV, JSON, Markdown, JUnit XML or a self-contained HTML page."""
    if fmt not in FORMATS:
        err.print(f"[red]error:[/] unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
        raise typer.Exit(2)
    verdicts = _load_run_or_exit(run_dir)
    text = render(verdicts, fmt, title=f"kbeval report: {run_dir.name}")
    if fmt == "html" and output is None:
        output = run_dir / "report.html"
    if output is None:
        sys.stdout.write(text)
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    console.print(f"wrote {output}", markup=False, highlight=False, soft_wrap=True)


@app.command("compare")
def compare_cmd(
    run_a: Annotated[Path, typer.Argument(help="the earlier run folder (the baseline)", metavar="RUN_A")],
    run_b: Annotated[Path, typer.Argument(help="the later run folder", metavar="RUN_B")],
    threshold: Annotated[float, typer.Option(
        "--threshold", help="relative runtime change that counts as faster/slower (0.05 = 5%)", min=0.0)] = 0.05,
) -> None:
    """Compare two runs candidate by candidate.

    Exit codes: 0 no regression; 1 a candidate broke (correct in RUN_A, not in RUN_B) or got slower by more
    than the threshold; 2 usage error (missing run folder).
    """
    a, b = _load_run_or_exit(run_a), _load_run_or_exit(run_b)
    changes = compare_runs(a, b, threshold)
    regressions = [c for c in changes if c.regression]
    if changes:
        console.print(changes_table(changes, title=f"{run_a.name} -> {run_b.name}"))
    else:
        console.print(f"no changes between {run_a.name} and {run_b.name}")
    console.print(f"{len(changes)} changes, {len(regressions)} regressions")
    if regressions:
        raise typer.Exit(1)


@app.command("gate")
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
        err.print(f"[red]error:[/] unknown baseline {baseline!r}; use one of {', '.join(BASELINES)}")
        raise typer.Exit(2)
    verdicts = _load_run_or_exit(run_dir)
    if not verdicts:
        err.print(f"[red]error:[/] {run_dir} has no verdicts")
        raise typer.Exit(2)
    try:
        failures = check_gate(verdicts, require_correct=require_correct, min_speedup=min_speedup,
                              baseline=baseline, allow_skipped=allow_skipped, allow_suspicious=allow_suspicious,
                              require_custom=require_custom)
    except GateUsageError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    for f in failures:
        console.print(f"FAIL {f.problem}/{f.candidate}: {f.reason}", markup=False, highlight=False, soft_wrap=True)
    if failures:
        console.print(f"gate failed: {len(failures)} of {len(verdicts)} candidates miss the bar", markup=False)
        raise typer.Exit(1)
    console.print(f"gate passed: all {len(verdicts)} candidates meet the bar", markup=False)


@app.command("profile")
def profile_cmd(
    problem_file: Annotated[Path, typer.Argument(help="the problem's .py file (class Model)", exists=True,
                                                 dir_okay=False)],
    candidate_file: Annotated[Path, typer.Argument(help="the candidate's .py file (class ModelNew)", exists=True,
                                                   dir_okay=False)],
    json_out: Annotated[bool, typer.Option("--json", help="print the profile as JSON")] = False,
    device: opt.DeviceOpt = "auto",
    precision: opt.PrecisionOpt = "fp32",
    dim: opt.DimOpt = None,
    threads: opt.ThreadsOpt = None,
    timeout: opt.TimeoutOpt = 300.0,
    warmup: Annotated[int, typer.Option("--warmup", help="untimed calls before the profiled one")] = 3,
    cache_dir: opt.CacheOpt = None,
) -> None:
    """Per-kernel table (name, calls, total and mean time, share) of one forward of CANDIDATE and of the reference.

    Exit codes: 0 both profiled; 1 the candidate (or the reference) could not be loaded or run; 2 usage error.
    """
    from kernelbench_eval.profile_cmd import profile_pair, profile_tables

    prob = Problem(problem_id=problem_file.stem, path=problem_file, source_sha256=sha256_file(problem_file))
    try:
        settings = build_settings(device, dim, threads, False, [prob], [],
                                  **precision_settings(precision, "default", None, None))
    except ValueError as exc:
        raise _usage_error(exc) from exc
    report = profile_pair(problem_file, candidate_file, settings.device, cache_dir or default_cache_dir(),
                          dims=settings.dims, precision=settings.precision, threads=settings.threads,
                          timeout=timeout, warmup=warmup)
    if json_out:
        print(report.model_dump_json(indent=2))
    else:
        for item in profile_tables(report):
            console.print(item, markup=False, highlight=False) if isinstance(item, str) else console.print(item)
    if report.reference.error or report.candidate_profile.error:
        raise typer.Exit(1)


@app.command("selftest")
def selftest_cmd(
    problems: Annotated[Path, typer.Option("--problems", help="folder of problem files")] = Path("problems"),
    problem: Annotated[list[str] | None, typer.Option("--problem", help="only these problem ids")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="results folder (default: a temporary one)")] = None,
    device: opt.DeviceOpt = "auto",
    timeout: opt.TimeoutOpt = 300.0,
    trials: opt.TrialsOpt = None,
    atol: opt.AtolOpt = None,
    rtol: opt.RtolOpt = None,
    reps: opt.RepsOpt = None,
    warmup: opt.WarmupOpt = None,
    warmup_seconds: opt.WarmupSecondsOpt = None,
    max_reps: opt.MaxRepsOpt = None,
    target_rse: opt.RseOpt = 0.01,
    timing_budget: opt.BudgetOpt = None,
    cuda_graph: opt.GraphOpt = False,
    compile_baseline: Annotated[bool, typer.Option("--compile-baseline/--no-compile-baseline",
                                                   help="also time torch.compile baselines")] = False,
    max_speedup: opt.MaxSpeedupOpt = 10.0,
    dim: opt.DimOpt = None,
    smoke: opt.SmokeOpt = False,
    threads: opt.ThreadsOpt = None,
    cache_dir: opt.CacheOpt = None,
) -> None:
    """Judge each problem's reference against an identical copy of itself: every copy must be ok, at 1x.

    Exit codes: 0 every copy is ok and no more intervals exclude 1 than chance allows; 1 otherwise;
    2 usage error.
    """
    import json

    from kernelbench_eval.selftest import lines, selftest

    try:
        found = find_problems(problems, [])
        judged = [p for pid, p in found.items() if not problem or pid in problem]
        settings = build_settings(device, dim, threads, smoke, judged, [], trials=trials,
                                  **precision_settings("fp32", "default", atol, rtol), reps=reps, warmup=warmup,
                                  warmup_seconds=warmup_seconds, max_reps=max_reps, target_rse=target_rse,
                                  timing_budget=timing_budget, cuda_graph=cuda_graph,
                                  compile_baseline=compile_baseline, max_speedup=max_speedup)
        summary = selftest(problems, settings, problem, out, timeout=timeout,
                           cache_dir=cache_dir or default_cache_dir())
    except (FileNotFoundError, ValueError) as exc:
        raise _usage_error(exc) from exc
    if json_out:
        print(json.dumps(summary.to_json(), indent=2))
    else:
        for line in lines(summary):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    if not summary.passed:
        raise typer.Exit(1)
