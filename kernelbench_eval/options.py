"""The options `kbeval run` and `kbeval eval` share, declared once.

Help texts stay plain (the app renders help without rich markup, so `[ray]` survives and nothing is cut at
80 columns). Timing options default to None: `plan.build_settings` fills them from `plan.DEFAULTS`, or from
`plan.SMOKE` under `--smoke`, so an option typed explicitly always wins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

DeviceOpt = Annotated[str, typer.Option("--device", help="auto (CUDA when available), cuda or cpu")]
JobsOpt = Annotated[int, typer.Option("--jobs", "-j", help="parallel compiles (default: CPU count)")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="seconds for one candidate's check and timing")]
CompileTimeoutOpt = Annotated[float, typer.Option("--compile-timeout", help="seconds for one compile")]
TrialsOpt = Annotated[int | None, typer.Option("--trials", help="correctness trials, each on fresh random inputs "
                                                                "[default: 5; --smoke: 2]")]
AtolOpt = Annotated[float | None, typer.Option("--atol", help="absolute tolerance (default: by --tolerance)")]
RtolOpt = Annotated[float | None, typer.Option("--rtol", help="relative tolerance (default: by --tolerance)")]
PrecisionOpt = Annotated[str, typer.Option("--precision", help="dtype of inputs and models: fp32, fp16 or bf16")]
ToleranceOpt = Annotated[str, typer.Option(
    "--tolerance", help="tolerance preset: default (1e-2) or kernelbench (fp32 1e-4, fp16/bf16 1e-2)")]
RepsOpt = Annotated[int | None, typer.Option("--reps", help="timed calls per model, at least (budget allowing) "
                                                            "[default: 100; --smoke: 10]")]
WarmupOpt = Annotated[int | None, typer.Option("--warmup", help="untimed calls before timing, at most "
                                                                "[default: 10; --smoke: 2]")]
WarmupSecondsOpt = Annotated[float | None, typer.Option("--warmup-seconds", help="warm-up stops after this long "
                                                                                 "[default: 1.0; --smoke: 0.2]")]
MaxRepsOpt = Annotated[int | None, typer.Option("--max-reps", help="timed calls per model, at most "
                                                                   "[default: 2000; --smoke: 100]")]
RseOpt = Annotated[float, typer.Option("--target-rse", help="stop timing once the median's relative std. error "
                                                            "is below this")]
BudgetOpt = Annotated[float | None, typer.Option("--timing-budget", help="seconds of timing per candidate, at most "
                                                                         "[default: 10; --smoke: 2]")]
GraphOpt = Annotated[bool, typer.Option("--cuda-graph", help="time CUDA-graph replays (falls back to plain calls)")]
CompileBaselineOpt = Annotated[bool | None, typer.Option(
    "--compile-baseline/--no-compile-baseline", help="time the reference under torch.compile too "
                                                     "[default: on; --smoke: off]")]
MaxSpeedupOpt = Annotated[float, typer.Option("--max-speedup", help="a larger speedup is `suspicious` (0: no limit)")]
BaselinesOpt = Annotated[Path | None, typer.Option(
    "--baselines", help="baseline cache file (default OUT/baselines.json)")]
DimOpt = Annotated[list[str] | None, typer.Option(
    "--dim", metavar="NAME=N", help="override a problem's module-level size, e.g. --dim batch_size=2 (repeatable; "
                                    "wins over --smoke)")]
SmokeOpt = Annotated[bool, typer.Option(
    "--smoke", help="a quick CPU-sized run: each problem's KBEVAL_SMOKE_DIMS sizes, fewer trials and timed calls, "
                    "no torch.compile baseline (explicit options win)")]
ThreadsOpt = Annotated[int | None, typer.Option("--threads", help="CPU threads for models (CPU timing)")]
GpusOpt = Annotated[str | None, typer.Option(
    "--gpus", help="GPUs to evaluate on, one lane each, e.g. 0,1 (default: all visible)")]
LanesOpt = Annotated[int | None, typer.Option(
    "--lanes", help="evaluation lanes, at most (CPU: this many; Ray: default one per GPU of the cluster)")]
BackendOpt = Annotated[str, typer.Option("--backend", help="local, or ray (pip install 'kernelbench-eval[ray]')")]
RayAddressOpt = Annotated[str | None, typer.Option(
    "--address", help="Ray cluster to join (auto, ray://host:10001); default: start a local Ray instance")]
RayBuildOpt = Annotated[str | None, typer.Option(
    "--ray-build-resource", help="Ray: compile only on nodes declaring this custom resource (ray start --resources)")]
RayJudgeOpt = Annotated[str | None, typer.Option(
    "--ray-judge-resource", help="Ray: evaluation lanes only on nodes declaring this custom resource")]
CacheOpt = Annotated[Path | None, typer.Option(
    "--cache-dir", help="build cache (default $KBEVAL_CACHE_DIR or ~/.cache/kernelbench-eval)")]
LaunchesOpt = Annotated[bool, typer.Option(
    "--account-launches", help="profile one more forward of each correct candidate: its own kernels against "
                               "library ones (verdict field `kernels`; a few seconds each on a GPU)")]
