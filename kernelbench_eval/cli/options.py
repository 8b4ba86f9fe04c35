"""The command line's options, each declared once, and `JudgeOptions`: those that decide how candidates are
judged, shared by `kbeval run`, `eval`, `selftest` and `profile`.

A command takes the shared options as one parameter, `judging: JudgeOptions`, and `@judging_options()`
declares that parameter to typer as one option per field (typer reads a command's signature), so the list
is written here once and a command asks `judging.settings(...)` instead of passing twenty arguments on.

Help texts stay plain (the app renders help without rich markup, so `[ray]` survives and nothing is cut at
80 columns). Timing options default to None: `plan.build_settings` fills them from `plan.DEFAULTS`, or from
`plan.SMOKE` under `--smoke`, so an option typed explicitly always wins. Every other default is read from
where it takes effect (`RunSettings`, `RunOptions`, `budgets.Budgets`), never written again here.

Every value is checked by `check_values` and `check_folders` before the command's body runs (the decorator
calls them), so a nonsense number or an unwritable folder costs one line and exit 2, not a crash minutes
later or a traceback.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import os
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar

import typer

from kernelbench_eval.budgets import DEFAULT as BUDGETS
from kernelbench_eval.budgets import Budgets
from kernelbench_eval.cli.output import usage_error
from kernelbench_eval.discover.corpus import Problem
from kernelbench_eval.records import RunSettings
from kernelbench_eval.run.plan import build_settings, precision_settings
from kernelbench_eval.run.setup import RunOptions, default_cache_dir

DeviceOpt = Annotated[str, typer.Option("--device", help="auto (CUDA when available), cuda or cpu")]
JobsOpt = Annotated[int, typer.Option("--jobs", "-j", help="parallel compiles (default: CPU count)")]
TimeoutOpt = Annotated[float, typer.Option(
    "--timeout", help="seconds for one candidate's check and timing; also for opening a problem's reference, each "
                      "request to it and each timing of it alone")]
CompileTimeoutOpt = Annotated[float, typer.Option(
    "--compile-timeout", help="seconds for one candidate's build (with its warm-up call); also for the torch.compile "
                              "baseline")]
DescribeTimeoutOpt = Annotated[float, typer.Option("--timeout", help="seconds for each problem's import and shapes")]
ProfileTimeoutOpt = Annotated[float, typer.Option(
    "--timeout", help="seconds for each model's profile; also for the candidate's build")]
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
MethodOpt = Annotated[str, typer.Option(
    "--timing", help="how calls are timed: kbeval (the harness's own), kernelbench (KernelBench's cuda_event: mean "
                     "of --reps calls, L2 thrash) or kernelbench-2025 (its January 2025 method: no flush)")]
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
ReducedOpt = Annotated[bool, typer.Option(
    "--allow-reduced-precision", help="accept a candidate far less precise than the reference against the float64 "
                                      "truth (bf16/fp16/TF32 in an fp32 run); else it is suspicious")]


def _setting(name: str) -> Any:
    """A default as `RunSettings` has it (the CLI shows it, the settings apply it: one number)."""
    return RunSettings.model_fields[name].default


def _run_option(name: str) -> Any:
    """A default as `RunOptions` has it."""
    found = {f.name: f for f in dataclasses.fields(RunOptions)}[name]
    return found.default_factory() if found.default is dataclasses.MISSING else found.default  # type: ignore[misc]


DEFAULT_JOBS: int = _run_option("jobs")


@dataclass
class JudgeOptions:
    """How candidates are judged and timed, as typed on the command line (see the module's docstring)."""

    smoke: SmokeOpt = False
    device: DeviceOpt = "auto"
    timeout: TimeoutOpt = BUDGETS.candidate  # with the reference's (`Budgets.of`)
    compile_timeout: CompileTimeoutOpt = BUDGETS.build  # with torch.compile's
    trials: TrialsOpt = None
    atol: AtolOpt = None
    rtol: RtolOpt = None
    precision: PrecisionOpt = _setting("precision")
    tolerance: ToleranceOpt = "default"
    account_launches: LaunchesOpt = _setting("account_launches")
    allow_reduced_precision: ReducedOpt = _setting("allow_reduced_precision")
    reps: RepsOpt = None
    warmup: WarmupOpt = None
    warmup_seconds: WarmupSecondsOpt = None
    max_reps: MaxRepsOpt = None
    target_rse: RseOpt = _setting("target_rse")
    timing_budget: BudgetOpt = None
    cuda_graph: GraphOpt = _setting("cuda_graph")
    timing: MethodOpt = _setting("timing")
    compile_baseline: CompileBaselineOpt = None
    max_speedup: MaxSpeedupOpt = _setting("max_speedup")
    dim: DimOpt = None
    threads: ThreadsOpt = None
    cache_dir: CacheOpt = None
    baselines: BaselinesOpt = None

    # None unless typed: `--smoke` or the defaults fill them (`plan.build_settings`)
    TIMING: ClassVar[tuple[str, ...]] = ("trials", "reps", "warmup", "warmup_seconds", "max_reps", "timing_budget",
                                         "compile_baseline")

    def settings(self, problems: list[Problem], warnings: list[str]) -> RunSettings:
        """The run's settings for these problems; ValueError naming the option when one is wrong."""
        return build_settings(self.device, self.dim, self.threads, self.smoke, problems, warnings, self.timing,
                              **precision_settings(self.precision, self.tolerance, self.atol, self.rtol),
                              target_rse=self.target_rse, cuda_graph=self.cuda_graph, max_speedup=self.max_speedup,
                              account_launches=self.account_launches,
                              allow_reduced_precision=self.allow_reduced_precision,
                              **{name: getattr(self, name) for name in self.TIMING})

    def typed_settings(self) -> list[str]:
        """The options typed that only choose settings a resumed run has recorded (so they are ignored)."""
        typed = [name for name in self.TIMING if getattr(self, name) is not None]
        return [f"--{name.replace('_', '-')}" for name in [*typed, *["dim"] * bool(self.dim),
                                                          *["smoke"] * self.smoke]]

    def cache(self) -> Path:
        """Absolute: build workers and the compilers they start do not run in this process's folder."""
        return (self.cache_dir or default_cache_dir()).expanduser().resolve()

    def run_fields(self) -> dict[str, Any]:
        """The `RunOptions` fields these options set besides the settings."""
        return {"budgets": Budgets.of(self.timeout, self.compile_timeout), "cache_dir": self.cache(),
                "baselines": self.baselines}


# The lowest value each numeric option takes, and whether that value itself is allowed: `--timeout 0` would
# kill every candidate at once, `--jobs 0` would compile nothing. Keyed by parameter name, so one table serves
# every command (`run`'s --jobs and --lanes, `profile`'s own --warmup, `problems`' --timeout).
LOWEST: dict[str, tuple[float, bool]] = {
    "timeout": (0, False), "compile_timeout": (0, False), "timing_budget": (0, False), "target_rse": (0, False),
    "jobs": (1, True), "trials": (1, True), "reps": (1, True), "max_reps": (1, True), "lanes": (1, True),
    "threads": (1, True), "warmup": (0, True), "warmup_seconds": (0, True), "max_speedup": (0, True),
    "atol": (0, True), "rtol": (0, True), "threshold": (0, True), "min_speedup": (0, True)}


def flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def check_values(values: dict[str, Any]) -> None:
    """Refuse (one line, exit 2) a number out of its range; None means not typed. NaN is refused too."""
    for name, (lowest, inclusive) in LOWEST.items():
        value = values.get(name)
        if value is None or isinstance(value, bool):
            continue
        if math.isnan(value) or value < lowest or (value == lowest and not inclusive):
            raise usage_error(f"{flag(name)}: must be {'at least' if inclusive else 'more than'} {lowest:g} "
                              f"(got {value:g})")
    reps, max_reps = values.get("reps"), values.get("max_reps")
    if reps is not None and max_reps is not None and max_reps < reps:
        raise usage_error(f"--max-reps: must be at least --reps ({max_reps} < {reps})")


def folder_problem(path: Path) -> str | None:
    """Why files cannot be written in folder `path` (made when missing), or None when they can.

    Walks up to the first part that exists: a file there means the folder can never be made; a folder the
    user cannot write (or a read-only filesystem: `os.access` says so for root too) means nothing goes in.
    """
    probe = path.absolute()
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        return "is a file, not a folder" if probe == path.absolute() else f"cannot be made: {probe} is a file"
    if not os.access(probe, os.W_OK | os.X_OK):
        return "is not writable" if probe == path.absolute() else f"cannot be made: {probe} is not writable"
    return None


def check_folder(option: str, path: Path) -> None:
    if why := folder_problem(path):
        raise usage_error(f"{option}: {path} {why}")


def check_file(option: str, path: Path) -> None:
    """A file the command writes: not a folder, and its folder writable."""
    if path.is_dir():
        raise usage_error(f"{option}: {path} is a folder, not a file")
    if why := folder_problem(path.parent):
        raise usage_error(f"{option}: {path}: its folder {path.parent} {why}")


def check_folders(values: dict[str, Any], judging: JudgeOptions) -> None:
    """The folders and files a judging command writes, checked before anything is made or started."""
    if values.get("resume") is not None:
        if values["resume"].is_dir():  # a missing one is `plan_run`'s error; `--out` is not used then
            check_folder("--resume", values["resume"])
    elif values.get("out") is not None:
        check_folder("--out", values["out"])
    check_folder("--cache-dir" if judging.cache_dir else "--cache-dir (default; $KBEVAL_CACHE_DIR sets it)",
                 judging.cache())
    if judging.baselines is not None:
        check_file("--baselines", judging.baselines)


Command = Callable[..., None]


def judging_options(only: tuple[str, ...] | None = None,
                    replace: dict[str, tuple[object, object]] | None = None) -> Callable[[Command], Command]:
    """Declare the command's `JudgeOptions` parameter to typer as one option per field, in its place.

    `only` keeps some fields, in its order (the rest take their defaults); `replace` gives a field another
    declaration and default, as (annotation, default), where one command means something else by it.
    """

    def declare(command: Command) -> Command:
        hints = typing.get_type_hints(command, include_extras=True)
        signature = inspect.signature(command)
        [slot] = [name for name in signature.parameters if hints.get(name) is JudgeOptions]
        field_hints = typing.get_type_hints(JudgeOptions, include_extras=True)
        every = {f.name: f for f in dataclasses.fields(JudgeOptions)}
        fields = [every[name] for name in only] if only else list(every.values())
        names = [f.name for f in fields]
        if clash := set(names) & (set(signature.parameters) - {slot}):
            raise TypeError(f"{command.__name__}: parameters {sorted(clash)} shadow shared options")
        declared: list[inspect.Parameter] = []
        for param in signature.parameters.values():
            if param.name != slot:
                declared.append(param.replace(annotation=hints[param.name], kind=inspect.Parameter.KEYWORD_ONLY))
                continue
            for f in fields:
                hint, default = (replace or {}).get(f.name, (field_hints[f.name], f.default))
                declared.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=hint,
                                                  default=default))

        @functools.wraps(command)
        def with_options(**kwargs: Any) -> None:
            check_values(kwargs)
            shared = JudgeOptions(**{name: kwargs.pop(name) for name in names})
            check_folders(kwargs, shared)
            return command(**kwargs, **{slot: shared})

        with_options.__signature__ = signature.replace(parameters=declared)  # type: ignore[attr-defined]
        with_options.__annotations__ = {p.name: p.annotation for p in declared}
        return with_options

    return declare
