"""What a run settles before anything runs: its settings, its folders (a resume's from its manifest) and
how much work it holds, all from the command line and a static read of the sources.

Bad input must cost one line and exit 2, not minutes of compiling: an unknown `--problem` id or `--dim` name,
an empty candidates folder, a run folder without a manifest are all found here. Each raises ValueError or
FileNotFoundError with the option or file named; the command line prints it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kernelbench_eval.common import kbmethod
from kernelbench_eval.common.precision import PRECISIONS, TOLERANCE_PRESETS
from kernelbench_eval.common.precision import tolerance as preset_tolerance
from kernelbench_eval.discover.corpus import (
    Discovery,
    Problem,
    check_dims,
    check_problem_ids,
    discover,
    merged_smoke_dims,
)
from kernelbench_eval.records import RunSettings, Verdict
from kernelbench_eval.results.record import RunRecorder
from kernelbench_eval.run.setup import manifest_dirs, read_manifest, resolve_device

# What --smoke lowers, and the values otherwise (RunSettings' own defaults); an option typed explicitly wins
# over both.
SMOKE = {"trials": 2, "reps": 10, "max_reps": 100, "warmup": 2, "warmup_seconds": 0.2, "timing_budget": 2.0,
         "compile_baseline": False}
DEFAULTS = {name: RunSettings.model_fields[name].default for name in SMOKE}


@dataclass(frozen=True)
class Plan:
    """How many verdicts, builds and problem references a run expects (the pipeline decides the same way)."""

    judge: int
    build: int
    problems: int

    @classmethod
    def of(cls, found: Discovery, settings: RunSettings, previous: list[Verdict]) -> Plan:
        key = settings.key()
        done = {(v.problem, v.candidate, v.source_sha256, v.settings_key) for v in previous}
        todo = [c for c in found.candidates if (c.problem_id, c.candidate_id, c.source_sha256, key) not in done]
        runnable = {(c.problem_id, c.source_sha256) for c in todo
                    if not c.invalid and (c.devices is None or settings.device in c.devices)}
        return cls(len(todo), len(runnable), len({pid for pid, _ in runnable}))


def build_settings(device: str, dims: list[str] | None, threads: int | None, smoke: bool, problems: list[Problem],
                   warnings: list[str], method: str = "kbeval", **timing: float | int | bool | None) -> RunSettings:
    """The run's settings; on the CPU the thread count is always fixed (and so reported).

    Sizes are checked against the problems' sources first: a `--dim` name no problem has would change nothing.
    Timing options left unset (None) take `SMOKE` or `DEFAULTS`. `method`: how calls are timed (`--timing`).
    """
    kbmethod.check(method, bool(timing.get("cuda_graph")))
    resolved = resolve_device(device)
    if resolved not in ("cpu", "cuda"):
        raise ValueError(f"--device: unknown device {device!r}; use auto, cuda or cpu")
    if resolved == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device: CUDA requested but torch sees no GPU")
    if resolved == "cpu" and threads is None:
        import torch

        threads = torch.get_num_threads()
    explicit = parse_dims(dims or [])
    check_dims(explicit, problems)
    sizes = merged_smoke_dims(problems, explicit, warnings) if smoke else explicit
    chosen = {k: (SMOKE if smoke else DEFAULTS).get(k) if v is None else v for k, v in timing.items()}
    return RunSettings(device=resolved, dims=sizes, threads=threads, smoke=smoke, timing=method, **chosen)


def precision_settings(precision: str, preset: str, atol: float | None, rtol: float | None) -> dict[str, object]:
    """precision, atol and rtol for RunSettings: the preset's values for the precision unless given."""
    if precision not in PRECISIONS:
        raise ValueError(f"--precision: {precision!r}: use one of {', '.join(PRECISIONS)}")
    if preset not in TOLERANCE_PRESETS:
        raise ValueError(f"--tolerance: {preset!r}: use one of {', '.join(TOLERANCE_PRESETS)}")
    default_atol, default_rtol = preset_tolerance(precision, preset)
    return {"precision": precision, "atol": default_atol if atol is None else atol,
            "rtol": default_rtol if rtol is None else rtol}


def parse_dims(items: list[str]) -> dict[str, int | float]:
    dims: dict[str, int | float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise ValueError(f"--dim: {item!r}: expected NAME=NUMBER")
        try:
            dims[name] = int(value)
        except ValueError:
            try:
                dims[name] = float(value)
            except ValueError as exc:
                raise ValueError(f"--dim: {item!r}: {value!r} is not a number") from exc
    return dims


def plan_run(resume: Path | None, problems: Path, candidates: Path, only: list[str] | None,
             make_settings: Callable[[list[Problem], list[str]], RunSettings],
             warn: Callable[[str], None]) -> tuple[Discovery, RunSettings, Plan]:
    """Discovery, settings and counts of a new run, or of the run in `resume` (its manifest's folders and
    settings: the default folders are never looked at then)."""
    previous: list[Verdict] = []
    settings = None
    if resume:
        manifest = read_manifest(resume)
        problems, candidates = manifest_dirs(manifest, resume)
        settings, only = manifest.settings, only or manifest.only
        previous = RunRecorder(resume).load()
    found = discover(problems, candidates, only)
    check_problem_ids(only, found.problems)
    judged = [found.problems[pid] for pid in dict.fromkeys(c.problem_id for c in found.candidates)]
    if not found.candidates:  # before the settings: a --dim checked against no problem would mislead
        for warning in found.warnings:
            warn(warning)
        what = f"for --problem {', '.join(only)} " if only else ""
        raise ValueError(f"{candidates}: no candidates to judge {what}(expected {candidates}/<problem_id>/*.py, "
                         f"with <problem_id>.py under {problems})")
    settings = settings or make_settings(judged, found.warnings)
    return found, settings, Plan.of(found, settings, previous)
