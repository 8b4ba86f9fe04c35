"""`kbeval run` and `kbeval eval`: judge a folder of candidates, or one candidate file, and show the verdicts.

Both take the shared judging options (`options.JudgeOptions`); what they add is where the candidates come
from and where the verdicts go.
"""

from __future__ import annotations

import shutil
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from kernelbench_eval.cli import options as opt
from kernelbench_eval.cli.options import JudgeOptions, judging_options
from kernelbench_eval.cli.output import console, err, usage_error, warn
from kernelbench_eval.cli.progress import RunProgress
from kernelbench_eval.discover.corpus import Discovery, Problem, make_candidate, sha256_file
from kernelbench_eval.interrupts import Interrupted
from kernelbench_eval.isolation import gpus as gpu_list
from kernelbench_eval.results import phases
from kernelbench_eval.results.display import print_log_tail, print_verdict_detail, status_counts, verdict_table
from kernelbench_eval.results.record import check_manifest
from kernelbench_eval.results.report import fast_p_text, write_default_reports
from kernelbench_eval.run.pipeline import run
from kernelbench_eval.run.plan import plan_run
from kernelbench_eval.run.setup import RunOptions, RunResult, read_manifest


@judging_options()
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
    *,
    judging: JudgeOptions,
    jobs: opt.JobsOpt = opt.DEFAULT_JOBS,
    gpus: opt.GpusOpt = None,
    lanes: opt.LanesOpt = None,
    backend: opt.BackendOpt = "local",
    address: opt.RayAddressOpt = None,
    ray_build_resource: opt.RayBuildOpt = None,
    ray_judge_resource: opt.RayJudgeOpt = None,
) -> None:
    """Judge every candidate under CANDIDATES against its problem; verdicts go to OUT/<run-id>/."""
    try:
        found, settings, plan = plan_run(resume, problems, candidates, problem, judging.settings, warn)
        if resume:  # before any progress is drawn: a run this cache did not seal is one line, nothing else
            check_manifest(judging.cache(), resume, read_manifest(resume))
    except (FileNotFoundError, ValueError) as exc:
        raise usage_error(exc) from exc
    if resume and (ignored := judging.typed_settings()):
        err.print(f"[yellow]warning:[/] --resume keeps the run's recorded settings; ignored: {', '.join(ignored)}",
                  soft_wrap=True)
    opts = RunOptions(problems_dir=problems, candidates_dir=candidates, results_dir=out, settings=settings,
                      run_id=run_id, resume=resume, jobs=jobs, only=problem, **judging.run_fields(),
                      gpus=gpu_list.parse(gpus) or None, lanes=lanes,
                      backend=backend, ray_address=address, ray_build_resource=ray_build_resource,
                      ray_judge_resource=ray_judge_resource)
    try:
        with RunProgress(err, plan) as progress:
            opts.observe = progress.observe
            result = run(opts, progress.verdict, found)
    except Interrupted as exc:
        if exc.run_dir is not None:
            exc.hint = f"finish with: kbeval run --resume {exc.run_dir}"
        raise
    except ImportError as exc:
        err.print(f"[red]error:[/] --backend {backend} needs its extra: pip install 'kernelbench-eval[{backend}]' "
                  f"({escape(str(exc))})", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from exc
    except (FileNotFoundError, FileExistsError, ValueError) as exc:
        raise usage_error(exc) from exc
    _print_result(result)


def _print_result(result: RunResult) -> None:
    for warning in result.warnings:
        warn(warning)
    if not result.verdicts:
        err.print(f"[red]error:[/] {escape(str(result.run_dir))}: no verdicts were recorded", soft_wrap=True)
        raise typer.Exit(1)
    console.print(verdict_table(result.verdicts, title=f"run {result.run_dir.name}", width=console.width))
    console.print(f"{len(result.verdicts)} verdicts ({status_counts(result.verdicts)})"
                  + (f", {result.reused} reused from before" if result.reused else ""))
    console.print(fast_p_text(result.verdicts, width=console.width), markup=False, highlight=False)
    if result.phases:  # where this session's wall time went: the floor that binds a large run
        console.print(phases.line(result.phases), markup=False, highlight=False)
    console.print(f"verdicts: {result.run_dir / 'verdicts.jsonl'}", soft_wrap=True)
    for path in write_default_reports(result.run_dir):
        console.print(f"report: {path}", soft_wrap=True)


@judging_options()
def eval_cmd(
    problem_file: Annotated[Path, typer.Argument(
        help="the problem's .py file (class Model)", exists=True, dir_okay=False, metavar="PROBLEM_FILE")],
    candidate_file: Annotated[Path, typer.Argument(
        help="the candidate's .py file (class ModelNew)", exists=True, dir_okay=False, metavar="CANDIDATE_FILE")],
    out: Annotated[Path | None, typer.Option(
        "--out", help="results folder, kept (default: a temporary one, removed at the end)")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the verdict as JSON")] = False,
    *,
    judging: JudgeOptions,
) -> None:
    """Judge one candidate file against one problem file and print its verdict."""
    if problem_file.suffix != ".py":
        raise usage_error(f"{problem_file}: not a Python source; a problem is a .py file defining Model")
    prob = Problem(problem_id=problem_file.stem, path=problem_file, source_sha256=sha256_file(problem_file))
    warnings: list[str] = []
    try:
        settings = judging.settings([prob], warnings)
    except ValueError as exc:
        raise usage_error(exc) from exc
    for warning in warnings:
        warn(warning)
    cache = judging.cache()
    found = Discovery(problems={prob.problem_id: prob}, candidates=[make_candidate(prob, candidate_file)], warnings=[])
    results_dir = out or Path(tempfile.mkdtemp(prefix="kbeval-eval-"))
    opts = RunOptions(problems_dir=problem_file.parent, candidates_dir=candidate_file.parent,
                      results_dir=results_dir, settings=settings, jobs=1, lanes=1,
                      **(judging.run_fields() | {"baselines": judging.baselines or (
                          None if out else cache / "baselines.json")}),
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
