"""`kbeval`: a thin command line over the pipeline.

Exit codes: 0 when the command completed (whatever the verdicts), 2 for usage errors (bad options,
missing folders or files).
"""

from __future__ import annotations

import os
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kernelbench_eval.compare import changes_table, compare_runs
from kernelbench_eval.discover import Discovery, Problem, discover, find_problems, make_candidate, sha256_file
from kernelbench_eval.display import print_verdict_detail, status_counts, verdict_table
from kernelbench_eval.evaluate import describe_problem
from kernelbench_eval.gate import BASELINES, GateUsageError, check_gate
from kernelbench_eval.models import RunSettings, Verdict
from kernelbench_eval.pipeline import RunOptions, RunResult, default_cache_dir, resolve_device, run
from kernelbench_eval.report import FORMATS, fast_p_text, load_run, render, write_default_reports

app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
console = Console()
DEFAULT_JOBS = os.cpu_count() or 1
err = Console(stderr=True)

DeviceOpt = Annotated[str, typer.Option("--device", help="auto (CUDA when available), cuda or cpu")]
JobsOpt = Annotated[int, typer.Option("--jobs", "-j", help="parallel compiles (default: CPU count)")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="seconds for one candidate's check and timing")]
CompileTimeoutOpt = Annotated[float, typer.Option("--compile-timeout", help="seconds for one compile")]
TrialsOpt = Annotated[int, typer.Option("--trials", help="correctness trials, each on fresh random inputs")]
AtolOpt = Annotated[float, typer.Option("--atol", help="absolute tolerance")]
RtolOpt = Annotated[float, typer.Option("--rtol", help="relative tolerance")]
RepsOpt = Annotated[int, typer.Option("--reps", help="timed calls per model, at least (budget allowing)")]
WarmupOpt = Annotated[int, typer.Option("--warmup", help="untimed calls before timing, at most")]
WarmupSecondsOpt = Annotated[float, typer.Option("--warmup-seconds", help="warm-up stops after this long")]
MaxRepsOpt = Annotated[int, typer.Option("--max-reps", help="timed calls per model, at most")]
RseOpt = Annotated[float, typer.Option("--target-rse", help="stop timing once the median's relative std. error "
                                                            "is below this")]
BudgetOpt = Annotated[float, typer.Option("--timing-budget", help="seconds of timing per candidate, at most")]
GraphOpt = Annotated[bool, typer.Option("--cuda-graph", help="time CUDA-graph replays (falls back to plain calls)")]
CompileBaselineOpt = Annotated[bool, typer.Option("--compile-baseline/--no-compile-baseline",
                                                  help="time the reference under torch.compile too")]
MaxSpeedupOpt = Annotated[float, typer.Option("--max-speedup", help="a larger speedup is `suspicious` (0: no limit)")]
BaselinesOpt = Annotated[Path | None, typer.Option(
    "--baselines", help="baseline cache file (default OUT/baselines.json)")]
DimOpt = Annotated[list[str] | None, typer.Option(
    "--dim", help="override a problem's module-level size, e.g. --dim batch_size=2 (repeatable)")]
ThreadsOpt = Annotated[int | None, typer.Option("--threads", help="CPU threads for models (CPU timing)")]
GpusOpt = Annotated[str | None, typer.Option(
    "--gpus", help="GPUs to evaluate on, one lane each, e.g. 0,1 (default: all visible)")]
LanesOpt = Annotated[int | None, typer.Option(
    "--lanes", help="evaluation lanes, at most (CPU: this many; Ray: default one per GPU of the cluster)")]
BackendOpt = Annotated[str, typer.Option("--backend", help="local, or ray (pip install kernelbench-eval[ray])")]
RayAddressOpt = Annotated[str | None, typer.Option(
    "--address", help="Ray cluster to join (auto, ray://host:10001); default: start a local Ray instance")]
CacheOpt = Annotated[Path | None, typer.Option(
    "--cache-dir", help="build cache (default $KBEVAL_CACHE_DIR or ~/.cache/kernelbench-eval)")]


def _settings(device: str, dims: list[str] | None, threads: int | None, **timing: float | int | bool) -> RunSettings:
    """The run's settings; on the CPU the thread count is always fixed (and so reported)."""
    resolved = resolve_device(device)
    if resolved not in ("cpu", "cuda"):
        raise typer.BadParameter(f"unknown device {device!r}; use auto, cuda or cpu", param_hint="--device")
    if resolved == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise typer.BadParameter("CUDA requested but torch sees no GPU", param_hint="--device")
    if resolved == "cpu" and threads is None:
        import torch

        threads = torch.get_num_threads()
    return RunSettings(device=resolved, dims=_parse_dims(dims or []), threads=threads, **timing)


def _parse_dims(items: list[str]) -> dict[str, int | float]:
    dims: dict[str, int | float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise typer.BadParameter(f"{item!r}: expected NAME=NUMBER", param_hint="--dim")
        try:
            dims[name] = int(value)
        except ValueError:
            try:
                dims[name] = float(value)
            except ValueError as exc:
                raise typer.BadParameter(f"{item!r}: {value!r} is not a number", param_hint="--dim") from exc
    return dims


def _run_with_progress(opts: RunOptions, total: int, found: Discovery | None = None) -> RunResult:
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("{task.fields[last]}"), console=err, transient=False) as bar:
        task = bar.add_task("judging", total=total, last="")

        def listen(verdict: Verdict) -> None:
            bar.update(task, advance=1, last=f"{verdict.problem}/{verdict.candidate}: {verdict.status}")

        return run(opts, listen, found)


@app.command("run")
def run_cmd(
    problems: Annotated[Path, typer.Option("--problems", help="folder of problem files")] = Path("problems"),
    candidates: Annotated[Path, typer.Option("--candidates", help="folder of candidates/<problem_id>/*.py")] = Path(
        "candidates"),
    out: Annotated[Path, typer.Option("--out", help="results folder; the run goes in OUT/<run-id>/")] = Path(
        "results"),
    run_id: Annotated[str | None, typer.Option("--run-id", help="name of the run folder")] = None,
    resume: Annotated[Path | None, typer.Option("--resume", help="continue this run folder")] = None,
    problem: Annotated[list[str] | None, typer.Option("--problem", help="only these problem ids")] = None,
    device: DeviceOpt = "auto",
    jobs: JobsOpt = DEFAULT_JOBS,
    timeout: TimeoutOpt = 300.0,
    compile_timeout: CompileTimeoutOpt = 600.0,
    trials: TrialsOpt = 5,
    atol: AtolOpt = 1e-2,
    rtol: RtolOpt = 1e-2,
    reps: RepsOpt = 100,
    warmup: WarmupOpt = 10,
    warmup_seconds: WarmupSecondsOpt = 1.0,
    max_reps: MaxRepsOpt = 2000,
    target_rse: RseOpt = 0.01,
    timing_budget: BudgetOpt = 10.0,
    cuda_graph: GraphOpt = False,
    compile_baseline: CompileBaselineOpt = True,
    max_speedup: MaxSpeedupOpt = 10.0,
    dim: DimOpt = None,
    threads: ThreadsOpt = None,
    cache_dir: CacheOpt = None,
    baselines: BaselinesOpt = None,
    gpus: GpusOpt = None,
    lanes: LanesOpt = None,
    backend: BackendOpt = "local",
    address: RayAddressOpt = None,
) -> None:
    """Judge every candidate under CANDIDATES against its problem; verdicts go to OUT/<run-id>/."""
    settings = _settings(device, dim, threads, trials=trials, atol=atol, rtol=rtol, reps=reps, warmup=warmup,
                         warmup_seconds=warmup_seconds, max_reps=max_reps, target_rse=target_rse,
                         timing_budget=timing_budget, cuda_graph=cuda_graph, compile_baseline=compile_baseline,
                         max_speedup=max_speedup)
    opts = RunOptions(problems_dir=problems, candidates_dir=candidates, results_dir=out, settings=settings,
                      run_id=run_id, resume=resume, jobs=jobs, timeout=timeout, compile_timeout=compile_timeout,
                      cache_dir=cache_dir or default_cache_dir(), only=problem, baselines=baselines,
                      gpus=[g.strip() for g in gpus.split(",") if g.strip()] if gpus else None, lanes=lanes,
                      backend=backend, ray_address=address)
    try:
        total = len(discover(problems, candidates, problem).candidates)
        result = _run_with_progress(opts, total)
    except ImportError as exc:
        err.print(f"[red]error:[/] --backend {backend} needs its extra: pip install 'kernelbench-eval[{backend}]' "
                  f"({exc})")
        raise typer.Exit(2) from exc
    except (FileNotFoundError, FileExistsError, ValueError) as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    for warning in result.warnings:
        err.print(f"[yellow]warning:[/] {warning}", markup=True)
    console.print(verdict_table(result.verdicts, title=f"run {result.run_dir.name}"))
    console.print(f"{len(result.verdicts)} verdicts ({status_counts(result.verdicts)})"
                  + (f", {result.reused} reused from before" if result.reused else ""))
    console.print(fast_p_text(result.verdicts), markup=False, highlight=False)
    console.print(f"verdicts: {result.run_dir / 'verdicts.jsonl'}")
    for path in write_default_reports(result.run_dir):
        console.print(f"report: {path}")


@app.command("eval")
def eval_cmd(
    problem_file: Annotated[Path, typer.Argument(help="the problem's .py file (class Model)", exists=True,
                                                 dir_okay=False)],
    candidate_file: Annotated[Path, typer.Argument(help="the candidate's .py file (class ModelNew)", exists=True,
                                                   dir_okay=False)],
    out: Annotated[Path | None, typer.Option("--out", help="results folder (default: a temporary one)")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the verdict as JSON")] = False,
    device: DeviceOpt = "auto",
    timeout: TimeoutOpt = 300.0,
    compile_timeout: CompileTimeoutOpt = 600.0,
    trials: TrialsOpt = 5,
    atol: AtolOpt = 1e-2,
    rtol: RtolOpt = 1e-2,
    reps: RepsOpt = 100,
    warmup: WarmupOpt = 10,
    warmup_seconds: WarmupSecondsOpt = 1.0,
    max_reps: MaxRepsOpt = 2000,
    target_rse: RseOpt = 0.01,
    timing_budget: BudgetOpt = 10.0,
    cuda_graph: GraphOpt = False,
    compile_baseline: CompileBaselineOpt = True,
    max_speedup: MaxSpeedupOpt = 10.0,
    dim: DimOpt = None,
    threads: ThreadsOpt = None,
    cache_dir: CacheOpt = None,
    baselines: BaselinesOpt = None,
) -> None:
    """Judge one candidate file against one problem file and print its verdict."""
    settings = _settings(device, dim, threads, trials=trials, atol=atol, rtol=rtol, reps=reps, warmup=warmup,
                         warmup_seconds=warmup_seconds, max_reps=max_reps, target_rse=target_rse,
                         timing_budget=timing_budget, cuda_graph=cuda_graph, compile_baseline=compile_baseline,
                         max_speedup=max_speedup)
    cache = cache_dir or default_cache_dir()
    prob = Problem(problem_id=problem_file.stem, path=problem_file, source_sha256=sha256_file(problem_file))
    found = Discovery(problems={prob.problem_id: prob}, candidates=[make_candidate(prob, candidate_file)], warnings=[])
    results_dir = out or Path(tempfile.mkdtemp(prefix="kbeval-eval-"))
    opts = RunOptions(problems_dir=problem_file.parent, candidates_dir=candidate_file.parent,
                      results_dir=results_dir, settings=settings, jobs=1, timeout=timeout,
                      compile_timeout=compile_timeout, cache_dir=cache, lanes=1,
                      baselines=baselines or (None if out else cache / "baselines.json"),
                      run_id=f"eval-{datetime.now():%Y%m%d-%H%M%S}-{candidate_file.stem}")
    result = run(opts, found=found)
    verdict = result.verdicts[-1]
    if json_out:
        print(verdict.model_dump_json(indent=2))
        return
    print_verdict_detail(console, verdict)
    if verdict.log:
        console.print(f"log: {result.run_dir / verdict.log}")


@app.command("problems")
def problems_cmd(
    problems: Annotated[Path, typer.Option("--problems", help="folder of problem files")] = Path("problems"),
    dim: DimOpt = None,
    timeout: TimeoutOpt = 120.0,
) -> None:
    """List the problems with their input shapes (each problem is imported in its own process)."""
    warnings: list[str] = []
    try:
        found = find_problems(problems, warnings)
    except FileNotFoundError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    dims = _parse_dims(dim or [])
    table = Table(title=f"problems in {problems}")
    for col in ("problem", "file", "inputs"):
        table.add_column(col, overflow="fold")
    for pid, prob in found.items():
        shapes, error = describe_problem(prob, dims, timeout)
        table.add_row(pid, str(prob.path), ", ".join(shapes) if not error else f"[red]{error}[/]")
    for warning in warnings:
        err.print(f"[yellow]warning:[/] {warning}")
    console.print(table)


def _load_run_or_exit(run_dir: Path) -> list[Verdict]:
    try:
        return load_run(run_dir)
    except (FileNotFoundError, ValueError) as exc:
        err.print(f"[red]error:[/] {exc}", markup=True)
        raise typer.Exit(2) from exc


@app.command("report")
def report_cmd(
    run_dir: Annotated[Path, typer.Argument(help="a run folder (results/<run-id>)")],
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
    run_a: Annotated[Path, typer.Argument(help="the earlier run folder (the baseline)")],
    run_b: Annotated[Path, typer.Argument(help="the later run folder")],
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
    run_dir: Annotated[Path, typer.Argument(help="a run folder (results/<run-id>)")],
    require_correct: Annotated[bool, typer.Option(
        "--require-correct/--no-require-correct", help="every candidate must be correct")] = True,
    min_speedup: Annotated[float | None, typer.Option(
        "--min-speedup", help="every correct candidate must be at least this much faster than the baseline")] = None,
    baseline: Annotated[str, typer.Option("--baseline", help=f"speedup baseline: {' or '.join(BASELINES)}")] = "eager",
    allow_skipped: Annotated[bool, typer.Option("--allow-skipped", help="skipped candidates do not fail")] = False,
    allow_suspicious: Annotated[bool, typer.Option(
        "--allow-suspicious", help="suspicious timings do not fail (they still must meet the other bars)")] = False,
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
                              baseline=baseline, allow_skipped=allow_skipped, allow_suspicious=allow_suspicious)
    except GateUsageError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    for f in failures:
        console.print(f"FAIL {f.problem}/{f.candidate}: {f.reason}", markup=False, highlight=False, soft_wrap=True)
    if failures:
        console.print(f"gate failed: {len(failures)} of {len(verdicts)} candidates miss the bar", markup=False)
        raise typer.Exit(1)
    console.print(f"gate passed: all {len(verdicts)} candidates meet the bar", markup=False)


@app.command("selftest")
def selftest_cmd(
    problems: Annotated[Path, typer.Option("--problems", help="folder of problem files")] = Path("problems"),
    problem: Annotated[list[str] | None, typer.Option("--problem", help="only these problem ids")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="results folder (default: a temporary one)")] = None,
    device: DeviceOpt = "auto",
    timeout: TimeoutOpt = 300.0,
    trials: TrialsOpt = 5,
    atol: AtolOpt = 1e-2,
    rtol: RtolOpt = 1e-2,
    reps: RepsOpt = 100,
    warmup: WarmupOpt = 10,
    warmup_seconds: WarmupSecondsOpt = 1.0,
    max_reps: MaxRepsOpt = 2000,
    target_rse: RseOpt = 0.01,
    timing_budget: BudgetOpt = 10.0,
    cuda_graph: GraphOpt = False,
    compile_baseline: Annotated[bool, typer.Option("--compile-baseline/--no-compile-baseline",
                                                   help="also time torch.compile baselines")] = False,
    max_speedup: MaxSpeedupOpt = 10.0,
    dim: DimOpt = None,
    threads: ThreadsOpt = None,
    cache_dir: CacheOpt = None,
) -> None:
    """Judge each problem's reference against an identical copy of itself: every copy must be ok, at 1x.

    Exit codes: 0 every copy is ok and no more intervals exclude 1 than chance allows; 1 otherwise;
    2 usage error.
    """
    import json

    from kernelbench_eval.selftest import lines, selftest

    settings = _settings(device, dim, threads, trials=trials, atol=atol, rtol=rtol, reps=reps, warmup=warmup,
                         warmup_seconds=warmup_seconds, max_reps=max_reps, target_rse=target_rse,
                         timing_budget=timing_budget, cuda_graph=cuda_graph, compile_baseline=compile_baseline,
                         max_speedup=max_speedup)
    try:
        summary = selftest(problems, settings, problem, out, timeout=timeout,
                           cache_dir=cache_dir or default_cache_dir())
    except (FileNotFoundError, ValueError) as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    if json_out:
        print(json.dumps(summary.to_json(), indent=2))
    else:
        for line in lines(summary):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    if not summary.passed:
        raise typer.Exit(1)
