"""What a run is given and where it writes: its options, its result, its folder and manifest (new or resumed).

Apart from `pipeline` so that the command line and `plan`, which only read options and manifests, need not
import the machinery that runs the judging.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from kernelbench_eval.budgets import DEFAULT as DEFAULT_BUDGETS
from kernelbench_eval.budgets import Budgets
from kernelbench_eval.isolation import cores
from kernelbench_eval.judge.baselines import FILE_NAME as BASELINES_FILE
from kernelbench_eval.records import RunManifest, RunSettings, Verdict, now_utc
from kernelbench_eval.results.record import RunRecorder, check_manifest, seal_manifest

if TYPE_CHECKING:  # only `Backend`'s signatures name them
    from kernelbench_eval.building.compile import Compiled
    from kernelbench_eval.building.jitwarmup import WarmupSpec
    from kernelbench_eval.discover.corpus import Candidate
    from kernelbench_eval.run.lanes import LaneConfig, LaneHandle


@dataclass
class RunOptions:
    problems_dir: Path
    candidates_dir: Path
    results_dir: Path
    settings: RunSettings
    run_id: str | None = None
    resume: Path | None = None
    jobs: int = field(default_factory=cores.usable)
    budgets: Budgets = DEFAULT_BUDGETS  # every time limit (`--timeout`, `--compile-timeout`: `Budgets.of`)
    cache_dir: Path = field(default_factory=lambda: default_cache_dir())
    only: list[str] | None = None
    baselines: Path | None = None  # default: <results_dir>/baselines.json
    gpus: list[str] | None = None  # one evaluation lane each (CUDA_VISIBLE_DEVICES values); default: all visible
    lanes: int | None = None  # at most this many lanes (on the CPU: this many CPU lanes)
    backend: str = "local"  # or "ray"
    ray_address: str | None = None  # an existing cluster; default: a local Ray instance
    ray_build_resource: str | None = None  # Ray: compile only on nodes declaring this custom resource
    ray_judge_resource: str | None = None  # Ray: lanes only on nodes declaring this custom resource
    observe: Callable[[Backend], Backend] | None = None  # wraps the backend to watch compiles and lanes (progress)

    def baselines_path(self) -> Path:
        if self.baselines:
            return self.baselines
        return (self.resume.parent if self.resume else self.results_dir) / BASELINES_FILE


@dataclass
class RunResult:
    run_dir: Path
    verdicts: list[Verdict]
    warnings: list[str]
    reused: int
    phases: dict[str, object] | None = None  # where this session's wall time went (`account`)


Listener = Callable[[Verdict], None]  # called with each verdict the moment it is recorded


def default_cache_dir() -> Path:
    env = os.environ.get("KBEVAL_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "kernelbench-eval"


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def open_run(opts: RunOptions) -> tuple[RunRecorder, RunManifest]:
    """A new run directory with fresh secret seeds, or the manifest of the run being resumed."""
    if opts.resume:
        manifest = read_manifest(opts.resume)
        check_manifest(opts.cache_dir, opts.resume, manifest)
        return RunRecorder(opts.resume), manifest
    run_id = opts.run_id or f"{datetime.now():%Y%m%d-%H%M%S}-{opts.settings.device}"
    run_dir = opts.results_dir / run_id
    if (run_dir / "run.json").exists():
        raise FileExistsError(f"{run_dir}: run exists; use --resume {run_dir} to continue it")
    run_dir.mkdir(parents=True, exist_ok=True)
    manifest = RunManifest(
        run_id=run_id,
        settings=opts.settings,
        problems_dir=str(opts.problems_dir.resolve()),  # absolute: a resume may start from any folder
        candidates_dir=str(opts.candidates_dir.resolve()),
        only=opts.only,
        torch_version=torch.__version__,
        created_at=now_utc(),
    )
    recorder = RunRecorder(run_dir)
    recorder.write_manifest(manifest)
    seal_manifest(opts.cache_dir, run_dir)
    return recorder, manifest


def read_manifest(run_dir: Path) -> RunManifest:
    """The manifest of a run to resume; a missing or unreadable one is a one-line error (FileNotFoundError)."""
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: run folder not found")
    try:
        manifest = RunRecorder(run_dir).read_manifest()
    except (OSError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        raise FileNotFoundError(f"{run_dir / 'run.json'}: unreadable run manifest ({type(exc).__name__})") from exc
    if manifest is None:
        raise FileNotFoundError(f"{run_dir}: no run.json, so this is not a run directory to resume")
    return manifest


def manifest_dirs(manifest: RunManifest, run_dir: Path) -> tuple[Path, Path]:
    """The run's problems and candidates folders, whatever the current folder.

    New manifests hold absolute paths. Older ones hold the paths as typed: each is tried against the current
    folder (what those versions did), then against the folder holding the results folder (RUN_DIR/../..),
    where a run with the default `--out results` was started. Neither existing is one error line.
    """
    found = []
    for kind, text in (("problems", manifest.problems_dir), ("candidates", manifest.candidates_dir)):
        path = Path(text)
        tries = [path] if path.is_absolute() else [path.absolute(), (run_dir.absolute().parent.parent / path)]
        hit = next((p for p in tries if p.is_dir()), None)
        if hit is None:
            raise FileNotFoundError(f"{run_dir / 'run.json'}: {kind} folder {text!r} not found (looked in "
                                    f"{' and '.join(str(p) for p in tries)})")
        found.append(hit)
    return found[0], found[1]


class Backend(Protocol):
    """Where compiles and lanes run: here (`lanes.LocalBackend`) or on a Ray cluster (`cluster.RayBackend`)."""

    name: str

    def compile(self, cand: Candidate, device: str, cache_dir: Path, log: Path, timeout: float,
                warm: WarmupSpec | None = None) -> Compiled: ...

    def lanes(self, config: LaneConfig, gpus: list[str] | None, count: int | None) -> list[LaneHandle]: ...

    def close(self) -> None: ...
