"""`kbeval problems`, `profile` and `selftest`: look at the problems, at one candidate's kernels, and at the
harness itself on this machine (the reference judged against an identical copy of itself)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from kernelbench_eval.budgets import DEFAULT as BUDGETS
from kernelbench_eval.budgets import Budgets
from kernelbench_eval.cli import options as opt
from kernelbench_eval.cli.options import JudgeOptions, judging_options
from kernelbench_eval.cli.output import console, usage_error, warn
from kernelbench_eval.discover.corpus import Problem, check_dims, find_problems, sha256_file, smoke_dims
from kernelbench_eval.judge.judging import describe_problem
from kernelbench_eval.run.plan import parse_dims


def problems_cmd(
    problems: Annotated[Path, typer.Option("--problems", help="folder of problem files")] = Path("problems"),
    dim: opt.DimOpt = None,
    smoke: Annotated[bool, typer.Option("--smoke", help="each problem at its KBEVAL_SMOKE_DIMS sizes")] = False,
    timeout: opt.DescribeTimeoutOpt = BUDGETS.describe,
) -> None:
    """List the problems with their input shapes (each problem is imported in its own process)."""
    opt.check_values({"timeout": timeout})
    warnings: list[str] = []
    try:
        found = find_problems(problems, warnings)
        dims = parse_dims(dim or [])
        check_dims(dims, list(found.values()))
        sizes = {pid: (smoke_dims(prob.path) if smoke else {}) | dims for pid, prob in found.items()}
    except (FileNotFoundError, ValueError) as exc:
        raise usage_error(exc) from exc
    table = Table(title=f"problems in {problems}")
    for col in ("problem", "file", "inputs"):
        table.add_column(col, overflow="fold")
    for pid, prob in found.items():
        shapes, error = describe_problem(prob, sizes[pid], timeout)
        table.add_row(pid, str(prob.path), ", ".join(shapes) if not error else f"[red]{escape(error)}[/]")
    for warning in warnings:
        warn(warning)
    console.print(table)


@judging_options(only=("device", "precision", "dim", "smoke", "threads", "timeout", "cache_dir"),
                 replace={"smoke": (Annotated[bool, typer.Option(
                     "--smoke", help="profile at the problem's KBEVAL_SMOKE_DIMS sizes (--dim wins)")], False),
                          "timeout": (opt.ProfileTimeoutOpt, BUDGETS.candidate)})
def profile_cmd(
    problem_file: Annotated[Path, typer.Argument(help="the problem's .py file (class Model)", exists=True,
                                                 dir_okay=False)],
    candidate_file: Annotated[Path, typer.Argument(help="the candidate's .py file (class ModelNew)", exists=True,
                                                   dir_okay=False)],
    json_out: Annotated[bool, typer.Option("--json", help="print the profile as JSON")] = False,
    *,
    judging: JudgeOptions,
    warmup: Annotated[int, typer.Option("--warmup", help="untimed calls before the profiled one")] = 3,
) -> None:
    """Per-kernel table (name, calls, total and mean time, share) of one forward of CANDIDATE and of the reference.

    Exit codes: 0 both profiled; 1 the candidate (or the reference) could not be loaded or run; 2 usage error.
    """
    from kernelbench_eval.run.profile import profile_pair, profile_tables

    prob = Problem(problem_id=problem_file.stem, path=problem_file, source_sha256=sha256_file(problem_file))
    try:
        settings = judging.settings([prob], [])
    except ValueError as exc:
        raise usage_error(exc) from exc
    report = profile_pair(problem_file, candidate_file, settings.device, judging.cache(), dims=settings.dims,
                          precision=settings.precision, threads=settings.threads, warmup=warmup,
                          budgets=Budgets.of(judging.timeout, compile_timeout=judging.timeout))  # its one limit
    if json_out:
        print(report.model_dump_json(indent=2))
    else:
        for item in profile_tables(report):
            console.print(item, markup=False, highlight=False) if isinstance(item, str) else console.print(item)
    if report.reference.error or report.candidate_profile.error:
        raise typer.Exit(1)


@judging_options(
    only=("device", "timeout", "trials", "atol", "rtol", "reps", "warmup", "warmup_seconds", "max_reps", "target_rse",
          "timing_budget", "cuda_graph", "compile_baseline", "max_speedup", "dim", "smoke", "threads", "cache_dir"),
    replace={"compile_baseline": (Annotated[bool, typer.Option("--compile-baseline/--no-compile-baseline",
                                                               help="also time torch.compile baselines")], False)})
def selftest_cmd(
    problems: Annotated[Path, typer.Option("--problems", help="folder of problem files")] = Path("problems"),
    problem: Annotated[list[str] | None, typer.Option("--problem", help="only these problem ids")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="results folder (default: a temporary one)")] = None,
    *,
    judging: JudgeOptions,
) -> None:
    """Judge each problem's reference against an identical copy of itself: every copy must be ok, at 1x.

    Exit codes: 0 every copy is ok and no more intervals exclude 1 than chance allows; 1 otherwise;
    2 usage error.
    """
    from kernelbench_eval.run.selftest import lines, selftest

    try:
        found = find_problems(problems, [])
        judged = [p for pid, p in found.items() if not problem or pid in problem]
        summary = selftest(problems, found, judging.settings(judged, []), problem, out, **judging.run_fields())
    except (FileNotFoundError, ValueError) as exc:
        raise usage_error(exc) from exc
    if json_out:
        print(json.dumps(summary.to_json(), indent=2))
    else:
        for line in lines(summary):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    if not summary.passed:
        raise typer.Exit(1)
