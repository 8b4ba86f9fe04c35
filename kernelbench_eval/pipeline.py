"""The run, top to bottom: discover -> compile (parallel, cached) -> check -> time -> record.

Compiles run `jobs` wide in background threads (each one a separate process); evaluations run one at a
time, problem by problem, as soon as a candidate's compile is done. On the CPU, evaluation waits for all
compiles, since compilers and a CPU timer would fight for the same cores.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from kernelbench_eval.baselines import FILE_NAME as BASELINES_FILE
from kernelbench_eval.baselines import BaselineStore
from kernelbench_eval.compile import Compiled, compile_candidate
from kernelbench_eval.discover import Candidate, Discovery, discover
from kernelbench_eval.evaluate import Outcome, ProblemSession, Secrets
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
    baselines: Path | None = None  # default: <results_dir>/baselines.json

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
        torch_version=torch.__version__,
        created_at=_now(),
    )
    recorder = RunRecorder(run_dir)
    recorder.write_manifest(manifest)
    return recorder, manifest


def run(opts: RunOptions, listen: Listener = lambda verdict: None, found: Discovery | None = None) -> RunResult:
    """Judge every candidate not yet judged under these settings; `found` overrides discovery (`eval`)."""
    _keep_memory_private()
    recorder, manifest = open_run(opts)
    found = found or discover(Path(manifest.problems_dir), Path(manifest.candidates_dir), opts.only)
    previous = recorder.load()
    done = {(v.problem, v.candidate, v.source_sha256, v.settings_key) for v in previous}
    key = manifest.settings.key()
    todo = [c for c in found.candidates if (c.problem_id, c.candidate_id, c.source_sha256, key) not in done]
    session = _Session(opts, recorder, manifest, found, listen)
    session.judge(todo)
    if recorder.finalize(manifest):
        session.warnings.append(f"{recorder.run_dir} was altered after the last verdict; restored")
    if session.store.repair():
        session.warnings.append(f"{session.store.path} was altered during the run; this run's entries restored")
    return RunResult(recorder.run_dir, recorder.load(), found.warnings + session.warnings,
                     reused=len(found.candidates) - len(todo))


class _Session:
    """One pass over the candidates still to judge; every verdict is recorded the moment it exists."""

    def __init__(self, opts: RunOptions, recorder: RunRecorder, manifest: RunManifest,
                 found: Discovery, listen: Listener) -> None:
        self.opts, self.recorder, self.manifest, self.found, self.listen = opts, recorder, manifest, found, listen
        self.device = manifest.settings.device
        self.seeds = Secrets.draw(manifest.settings.trials)  # this process's own: a resumed run draws anew
        self.store = BaselineStore(opts.baselines_path())
        self.warnings: list[str] = []
        self.compiles = _CompileActivity()
        self.judged: dict[tuple[str, str], Verdict] = {}

    def judge(self, todo: list[Candidate]) -> None:
        runnable, copies = _first_of_each_source([c for c in todo if not self._judged_statically(c)])
        self._judge_runnable(runnable)
        for copy, original in copies:  # identical bytes for the same problem: judged once, verdict reused
            self._record_copy(copy, original)

    def _record_copy(self, copy: Candidate, original: Candidate) -> None:
        verdict = self.judged.get((original.problem_id, original.candidate_id))
        if verdict is None:
            return  # the original was not judged (the run stopped): the copy is judged on resume
        fields = verdict.model_dump(exclude={"run_id", "problem", "candidate", "source_sha256", "settings_key",
                                             "device", "torch_version", "trials", "log", "wall_seconds",
                                             "finished_at", "duplicate_of"})
        self._record(copy, 0.0, duplicate_of=original.candidate_id, **fields)

    def _judge_runnable(self, runnable: list[Candidate]) -> None:
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
        with self.compiles:
            compiled = compile_candidate(cand, self.device, self.opts.cache_dir, log, self.opts.compile_timeout)
        return compiled, time.perf_counter() - started

    def _judge_problem(self, problem_id: str, futures: dict[Future, Candidate]) -> None:
        ref: ProblemSession | None = None
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
                ref.close()

    def _reference(self, problem_id: str) -> ProblemSession:
        problem = self.found.problems[problem_id]
        log = self.recorder.log_path(problem_id, "_reference", "eval")
        session = ProblemSession(problem, self.manifest.settings, self.seeds, log, self.opts.timeout,
                                 self.opts.compile_timeout, self.store).open()
        if session.warning:
            self.warnings.append(f"{problem.path}: {session.warning}")
        return session

    def _evaluate(self, cand: Candidate, compiled: Compiled, ref: ProblemSession, seconds: float, base: dict) -> None:
        log = self.recorder.log_path(cand.problem_id, cand.candidate_id, "eval")
        started = time.perf_counter()
        self._check_tampering(None)  # what happened before this candidate ran is not its doing
        alone = self.compiles.snapshot()
        outcome = ref.judge(compiled, cand.path, log, self.opts.timeout)
        fields = _outcome_fields(outcome, ref)
        if self._check_tampering(cand if self.compiles.snapshot() == alone and alone[1] == 0 else None):
            fields.update(status="incorrect", correct=False, runtime_ms=-1.0, speedup=None, speedup_vs_eager=None,
                          speedup_vs_compile=None, error="cheating detected: it altered the run's verdicts.jsonl "
                          "while it ran (restored; no verdict changed)")
        self._record(cand, seconds + time.perf_counter() - started, log=log, **base, **fields)

    def _check_tampering(self, culprit: Candidate | None) -> bool:
        """Restore the verdict log if something altered it; True when `culprit` (the only code running) did."""
        if not self.recorder.tampered():
            return False
        if culprit is None:
            self.warnings.append(f"{self.recorder.verdicts_path} was altered by candidate code (a compile or an "
                                 "evaluation) that cannot be singled out; restored, no verdict changed")
            return False
        return True

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
        self.judged[(verdict.problem, verdict.candidate)] = verdict
        self.listen(verdict)


def _first_of_each_source(candidates: list[Candidate]) -> tuple[list[Candidate], list[tuple[Candidate, Candidate]]]:
    """The candidates to judge, and (copy, original) for each later one with the same bytes and problem."""
    first: dict[tuple[str, str], Candidate] = {}
    copies = []
    for cand in candidates:
        key = (cand.problem_id, cand.source_sha256)
        if key in first:
            copies.append((cand, first[key]))
        else:
            first[key] = cand
    return list(first.values()), copies


class _CompileActivity:
    """Counts compiles (which run candidate code) so tampering is blamed only on a candidate that ran alone."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = 0
        self.running = 0

    def __enter__(self) -> None:
        with self._lock:
            self.started += 1
            self.running += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.running -= 1

    def snapshot(self) -> tuple[int, int]:
        with self._lock:
            return self.started, self.running


def _outcome_fields(outcome: Outcome, ref: ProblemSession) -> dict:
    timing = outcome.timing
    fields = {
        "status": outcome.status,
        "error": outcome.error,
        "trials_passed": outcome.trials_passed,
        "mutates_inputs": outcome.mutates_inputs,
        "max_abs_diff": outcome.max_abs_diff,
        "mean_abs_diff": outcome.mean_abs_diff,
        "device_name": outcome.device_name or ref.device_name,
        "problem_warning": ref.warning,
        "timing": timing,
        "ref_runtime_ms": timing.reference.median_ms if timing else None,
        "ref_runtime_stats": timing.reference if timing else None,
        "compile_runtime_ms": ref.baseline.compiled.median_ms if ref.baseline and ref.baseline.compiled else None,
    }
    if outcome.status in ("ok", "suspicious") and timing and outcome.runtime_ms is not None:
        fields.update(
            correct=True,
            runtime_ms=outcome.runtime_ms,
            runtime_stats=outcome.stats,
            speedup=timing.speedup,
            speedup_vs_eager=timing.speedup,
            speedup_vs_eager_ci=timing.speedup_ci,
            speedup_vs_compile=outcome.speedup_vs_compile,
            speedup_vs_compile_ci=outcome.speedup_vs_compile_ci,
        )
    return fields


def _keep_memory_private() -> None:
    """Make this process non-dumpable: other processes of the same (non-root) user, candidates included,
    can then no longer read its memory through /proc/<pid>/mem or map_files, where expected outputs live."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0)  # PR_SET_DUMPABLE
    except (OSError, AttributeError):
        pass


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
