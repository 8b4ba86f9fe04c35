"""The run, top to bottom: discover -> compile (parallel, cached) -> check -> time -> record.

Compiles run `jobs` wide in background threads (each one a separate process); evaluations run one at a
time, problem by problem, as soon as a candidate's compile is done. On the CPU, evaluation waits for all
compiles, since compilers and a CPU timer would fight for the same cores.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from kernelbench_eval.compile import Compiled, compile_candidate
from kernelbench_eval.discover import Candidate, Discovery, discover
from kernelbench_eval.evaluate import Outcome, Reference, evaluate_candidate, prepare_reference
from kernelbench_eval.models import RunManifest, RunSettings, Verdict
from kernelbench_eval.record import RunRecorder


@dataclass
class RunOptions:
    problems_dir: Path
    candidates_dir: Path
    results_dir: Path
    settings: RunSettings
    run_id: str | None = None
    resume: Path | None = None
    jobs: int = field(default_factory=lambda: os.cpu_count() or 1)
    timeout: float = 300.0
    compile_timeout: float = 600.0
    cache_dir: Path = field(default_factory=lambda: default_cache_dir())
    only: list[str] | None = None


@dataclass
class RunResult:
    run_dir: Path
    verdicts: list[Verdict]
    warnings: list[str]
    reused: int


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
        recorder = RunRecorder(opts.resume)
        manifest = recorder.read_manifest()
        if manifest is None:
            raise FileNotFoundError(f"{opts.resume}: no run.json, so this is not a run directory to resume")
        return recorder, manifest
    run_id = opts.run_id or f"{datetime.now():%Y%m%d-%H%M%S}-{opts.settings.device}"
    run_dir = opts.results_dir / run_id
    if (run_dir / "run.json").exists():
        raise FileExistsError(f"{run_dir}: run exists; use --resume {run_dir} to continue it")
    run_dir.mkdir(parents=True, exist_ok=True)
    manifest = RunManifest(
        run_id=run_id,
        settings=opts.settings,
        problems_dir=str(opts.problems_dir),
        candidates_dir=str(opts.candidates_dir),
        init_seed=secrets.randbits(31),
        trial_seeds=[secrets.randbits(31) for _ in range(opts.settings.trials)],
        torch_version=torch.__version__,
        created_at=_now(),
    )
    recorder = RunRecorder(run_dir)
    recorder.write_manifest(manifest)
    return recorder, manifest


def run(opts: RunOptions, listen: Listener = lambda verdict: None, found: Discovery | None = None) -> RunResult:
    """Judge every candidate not yet judged under these settings; `found` overrides discovery (`eval`)."""
    recorder, manifest = open_run(opts)
    found = found or discover(Path(manifest.problems_dir), Path(manifest.candidates_dir), opts.only)
    previous = recorder.load()
    done = {(v.problem, v.candidate, v.source_sha256, v.settings_key) for v in previous}
    key = manifest.settings.key()
    todo = [c for c in found.candidates if (c.problem_id, c.candidate_id, c.source_sha256, key) not in done]
    session = _Session(opts, recorder, manifest, found, listen)
    session.judge(todo)
    return RunResult(recorder.run_dir, recorder.load(), found.warnings, reused=len(found.candidates) - len(todo))


class _Session:
    """One pass over the candidates still to judge; every verdict is recorded the moment it exists."""

    def __init__(self, opts: RunOptions, recorder: RunRecorder, manifest: RunManifest,
                 found: Discovery, listen: Listener) -> None:
        self.opts, self.recorder, self.manifest, self.found, self.listen = opts, recorder, manifest, found, listen
        self.device = manifest.settings.device

    def judge(self, todo: list[Candidate]) -> None:
        runnable = [c for c in todo if not self._judged_statically(c)]
        jobs = max(1, self.opts.jobs)
        os.environ.setdefault("MAX_JOBS", str(max(1, (os.cpu_count() or 1) // jobs)))  # ninja inside each build
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {c: pool.submit(self._compile, c) for c in runnable}
            if self.device == "cpu":
                for future in futures.values():
                    future.exception()
            for problem_id in dict.fromkeys(c.problem_id for c in runnable):
                mine = {futures[c]: c for c in runnable if c.problem_id == problem_id}
                self._judge_problem(problem_id, mine)

    def _judged_statically(self, cand: Candidate) -> bool:
        if cand.invalid:
            self._record(cand, 0.0, status="load_error", error=cand.invalid)
        elif cand.devices is not None and self.device not in cand.devices:
            why = f"needs {'/'.join(cand.devices)}, this run is on {self.device}"
            self._record(cand, 0.0, status="skipped", error=why)
        else:
            return False
        return True

    def _compile(self, cand: Candidate) -> tuple[Compiled, float]:
        log = self.recorder.log_path(cand.problem_id, cand.candidate_id, "compile")
        started = time.perf_counter()
        compiled = compile_candidate(cand, self.device, self.opts.cache_dir, log, self.opts.compile_timeout)
        return compiled, time.perf_counter() - started

    def _judge_problem(self, problem_id: str, futures: dict[Future, Candidate]) -> None:
        ref: Reference | None = None
        try:
            for future in as_completed(futures):
                cand = futures[future]
                compiled, seconds = future.result()
                base = {"compiled": compiled.record.ok, "compile_cached": compiled.cached,
                        "compile_seconds": round(seconds, 3)}  # this run's cost: near zero when cached
                if not compiled.record.ok:
                    log = self.recorder.log_path(cand.problem_id, cand.candidate_id, "compile")
                    self._record(cand, seconds, status=compiled.record.status or "compile_error",
                                 error=compiled.record.error, log=log, **base)
                    continue
                ref = ref or self._reference(problem_id)
                if ref.error:
                    self._record(cand, seconds, status="skipped", error=ref.error, **base)
                    continue
                self._evaluate(cand, compiled, ref, seconds, base)
        finally:
            if ref:
                ref.discard()

    def _reference(self, problem_id: str) -> Reference:
        problem = self.found.problems[problem_id]
        log = self.recorder.log_path(problem_id, "_reference", "eval")
        return prepare_reference(problem, self.manifest, log, self.opts.timeout)

    def _evaluate(self, cand: Candidate, compiled: Compiled, ref: Reference, seconds: float, base: dict) -> None:
        log = self.recorder.log_path(cand.problem_id, cand.candidate_id, "eval")
        started = time.perf_counter()
        outcome = evaluate_candidate(compiled, cand.path, ref, self.manifest, log, self.opts.timeout)
        self._record(cand, seconds + time.perf_counter() - started, log=log, **base, **_outcome_fields(outcome, ref))

    def _record(self, cand: Candidate, seconds: float, log: Path | None = None, **fields) -> None:
        rel_log = str(log.relative_to(self.recorder.run_dir)) if log else None
        verdict = Verdict(
            run_id=self.manifest.run_id,
            problem=cand.problem_id,
            candidate=cand.candidate_id,
            source_sha256=cand.source_sha256,
            settings_key=self.manifest.settings.key(),
            device=self.device,
            torch_version=torch.__version__,
            trials=self.manifest.settings.trials,
            log=rel_log,
            wall_seconds=round(seconds, 3),
            finished_at=_now(),
            **fields,
        )
        self.recorder.append(verdict)
        self.listen(verdict)


def _outcome_fields(outcome: Outcome, ref: Reference) -> dict:
    fields = {
        "status": outcome.status,
        "error": outcome.error,
        "trials_passed": outcome.trials_passed,
        "mutates_inputs": outcome.mutates_inputs,
        "max_abs_diff": outcome.max_abs_diff,
        "mean_abs_diff": outcome.mean_abs_diff,
        "device_name": outcome.device_name or ref.device_name,
        "ref_runtime_ms": ref.stats.median_ms if ref.stats else None,
        "ref_runtime_stats": ref.stats,
    }
    if outcome.status == "ok" and outcome.stats:
        fields.update(
            correct=True,
            runtime_ms=outcome.stats.median_ms,
            runtime_stats=outcome.stats,
            speedup=(ref.stats.median_ms / outcome.stats.median_ms) if ref.stats else None,
        )
    return fields


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
