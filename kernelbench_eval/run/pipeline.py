"""The run, top to bottom: discover -> compile (parallel, cached) -> check -> time -> record.

Compiles run `jobs` wide (each one a separate process); each evaluation lane (one per GPU) judges one
candidate at a time, taking the next one the moment its compile is done (`schedule`). On the CPU,
evaluation waits for all compiles, since compilers and a CPU timer would fight for the same cores. The
backend decides where compiles and lanes run: here (`lanes.LocalBackend`) or on a Ray cluster
(`cluster.RayBackend`); verdicts are recorded here, as they arrive, either way.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from kernelbench_eval import interrupts
from kernelbench_eval.building import pch
from kernelbench_eval.building.compile import BuildTampered, Compiled
from kernelbench_eval.building.warmup import WarmupSpec
from kernelbench_eval.discover.corpus import Candidate, Discovery, ProblemChanged, discover
from kernelbench_eval.discover.guard import References
from kernelbench_eval.isolation import cores, private, sandbox
from kernelbench_eval.isolation.linux import keep_memory_private
from kernelbench_eval.isolation.workerenv import prestart
from kernelbench_eval.judge import baselines
from kernelbench_eval.judge.baselines import BaselineStore
from kernelbench_eval.records import Findings, RunManifest, Verdict, now_utc
from kernelbench_eval.results import phases as account
from kernelbench_eval.results.aggregates import verdict_context
from kernelbench_eval.results.record import RunRecorder
from kernelbench_eval.run import schedule
from kernelbench_eval.run.lanes import LaneConfig, LaneHandle, LaneResult, LocalBackend
from kernelbench_eval.run.setup import Backend, Listener, RunOptions, RunResult, manifest_dirs, open_run


def run(opts: RunOptions, listen: Listener = lambda verdict: None, found: Discovery | None = None) -> RunResult:
    """Judge every candidate not yet judged under these settings; `found` overrides discovery (`eval`)."""
    keep_memory_private()
    baselines.use_key_dir(opts.cache_dir)
    backend = _backend(opts)  # first: a backend that cannot start leaves no run folder behind
    if opts.backend == "local":
        prestart()  # the fork server imports torch while this run discovers and looks up its caches
    backend = opts.observe(backend) if opts.observe else backend
    private.enter()  # then this process's temp files (references, workers' folders) go in a private folder
    sandbox.warn(sandbox.probe())  # what this machine lets candidates be confined with, said once up front
    stopped: interrupts.Interrupted | None = None
    try:
        recorder, manifest = open_run(opts)
        found = found or discover(*manifest_dirs(manifest, recorder.run_dir), opts.only or manifest.only)
        previous = recorder.load()
        done = {(v.problem, v.candidate, v.source_sha256, v.settings_key) for v in previous}
        key = manifest.settings.key()
        todo = [c for c in found.candidates if (c.problem_id, c.candidate_id, c.source_sha256, key) not in done]
        session = _Session(opts, recorder, manifest, found, listen, backend)
        try:
            with interrupts.deferred():  # a signal stops the work; nothing unfinished is recorded
                session.judge_all(todo)
        except interrupts.Interrupted as exc:
            stopped = exc
    finally:
        backend.close()
    phases = session.account.summary()
    account.record(recorder.run_dir, phases)
    if recorder.finalize(manifest):
        session.warnings.append(f"{recorder.run_dir} was altered after the last verdict; restored")
    if session.store.repair():
        session.warnings.append(f"{session.store.path} was altered during the run; this run's entries restored")
    if stopped is not None:
        raise interrupts.Interrupted(stopped.signum, _unfinished(len(session.judged), len(todo)), recorder.run_dir)
    return RunResult(recorder.run_dir, recorder.load(), found.warnings + session.warnings,
                     reused=len(found.candidates) - len(todo), phases=phases)


def _unfinished(recorded: int, todo: int) -> str:
    """What an interrupted run says it recorded, and what it did not."""
    return f"{recorded} of {todo} candidates judged and recorded, {todo - recorded} not judged (nothing recorded)"


def _backend(opts: RunOptions) -> Backend:
    if opts.backend == "local":
        return LocalBackend()
    if opts.backend == "ray":
        from kernelbench_eval.run.cluster import RayBackend  # optional: `pip install kernelbench-eval[ray]`

        return RayBackend(opts.ray_address, opts.cache_dir, opts.ray_build_resource, opts.ray_judge_resource)
    raise ValueError(f"unknown backend {opts.backend!r} (local or ray)")


@dataclass
class _Built:
    compiled: Compiled
    seconds: float  # this run's compile wall time


class _Session:
    """One pass over the candidates still to judge; every verdict is recorded the moment it exists."""

    def __init__(self, opts: RunOptions, recorder: RunRecorder, manifest: RunManifest,
                 found: Discovery, listen: Listener, backend: Backend) -> None:
        self.opts, self.recorder, self.manifest, self.found, self.listen = opts, recorder, manifest, found, listen
        self.device = manifest.settings.device
        self.store = BaselineStore(opts.baselines_path())
        self.warnings: list[str] = []
        self.activity = _Activity()
        self.account = account.Account()  # where the wall time goes (`account`)
        self.backend = backend
        self._record_lock = threading.Lock()
        self.judged: dict[tuple[str, str], Verdict] = {}
        self.references = References(found.problems)  # the problems' private, verified copies

    def judge_all(self, todo: list[Candidate]) -> None:
        """Every candidate is judged in its own right: identical bytes share a build, never a verdict.

        (A copy that inherited its twin's verdict could behave differently under its own file name.)
        """
        self._judge_runnable([c for c in todo if not self._judged_statically(c)])

    def _judge_runnable(self, runnable: list[Candidate]) -> None:
        """Compile `jobs` wide and evaluate on every lane as soon as a compile is done (see `schedule`)."""
        jobs = max(1, self.opts.jobs)
        config = LaneConfig(self.manifest.settings, self.opts.baselines_path(), self.opts.timeout,
                            self.opts.compile_timeout)
        lanes = self.backend.lanes(config, self.opts.gpus, self.opts.lanes)  # may keep cores from the builds
        os.environ.setdefault("MAX_JOBS", str(build_parallelism(jobs, len(runnable))))  # ninja inside each build
        if self.opts.backend == "local":  # found (or made, in the background) before the first build asks
            pch.plan(self.opts.cache_dir, self.device, len(runnable), jobs)
        work = [schedule.LaneJobs(partial(self._evaluate, lane), lane.holds, partial(self._prepare, lane),
                                  partial(_near, lane)) for lane in lanes]
        try:
            schedule.drive(runnable, self._compile, jobs, work, key=lambda cand: cand.problem_id,
                           hold=self.device == "cpu", stopped=interrupts.requested)
        finally:
            for lane in lanes:
                lane.close()

    def _judged_statically(self, cand: Candidate) -> bool:
        if cand.invalid:
            self._record(cand, 0.0, Findings(status="load_error", error=cand.invalid))
        elif cand.devices is not None and self.device not in cand.devices:
            why = f"needs {'/'.join(cand.devices)}, this run is on {self.device}"
            self._record(cand, 0.0, Findings(status="skipped", error=why))
        else:
            return False
        return True

    def _compile(self, cand: Candidate) -> _Built | None:
        """Build one candidate; a failed build is recorded here and goes to no lane (None)."""
        log = self.recorder.log_path(cand.problem_id, cand.candidate_id, "compile")
        started = time.perf_counter()
        with self.activity, self.account.phase("build"):
            try:
                compiled = self.backend.compile(cand, self.device, self.opts.cache_dir, log, self.opts.compile_timeout,
                                                self._warmup(cand))
            except OSError as exc:  # something planted in the cache: this candidate's verdict, not a dead run
                findings = Findings(status="compile_error", error=f"build folder unusable: {exc}")
                self._record(cand, time.perf_counter() - started, findings, log=log)
                return None
        seconds = time.perf_counter() - started
        if compiled.record.ok:
            return _Built(compiled, seconds)
        findings = Findings(status=compiled.record.status or "compile_error", error=compiled.record.error)
        self._record(cand, seconds, _with_build(findings, compiled, seconds), log=log)
        return None

    def _warmup(self, cand: Candidate) -> WarmupSpec:
        """The inputs a Triton candidate's build-stage warm-up uses (`warmup.py`), on the first lane's GPU, and the
        problem whose names every build's import sees: the verified private copy, never the user's file (which a
        candidate's build could have edited under the next one)."""
        gpu = self.opts.gpus[0] if self.opts.gpus else None
        try:
            problem = self.references.problem(cand.problem_id)
        except (OSError, ProblemChanged):
            problem = self.found.problems[cand.problem_id]  # its reference says why, and its candidates are skipped
        return WarmupSpec.of(problem, self.manifest.settings, gpu)

    def _evaluate(self, lane: LaneHandle, cand: Candidate, built: _Built) -> None:
        log = self.recorder.log_path(cand.problem_id, cand.candidate_id, "eval")
        ref_log = self.recorder.log_path(cand.problem_id, "_reference", "eval")
        started = time.perf_counter()
        with self.activity, self.account.phase("judge"):
            self._check_tampering(None)  # what happened before this candidate ran is not its doing
            alone = self.activity.snapshot()
            result = self._evaluate_safely(lane, cand, built, ref_log, log)
            findings = result.findings
            if self._check_tampering(cand if self.activity.snapshot() == alone and alone[1] == 1 else None):
                findings.disqualify("incorrect", "cheating detected: it altered the run's verdicts.jsonl while it "
                                    "ran (restored; no verdict changed)")
        self._note_reference(cand.problem_id, result.warning, result.baseline_key)
        self._record(cand, built.seconds + time.perf_counter() - started,
                     _with_build(findings, built.compiled, built.seconds), log=log)

    def _prepare(self, lane: LaneHandle, problem_id: str) -> None:
        """Open a problem's reference on an idle lane while its candidates still build (`schedule`): its reference
        run and baselines take GPU time nobody else wants then. No candidate code runs in it."""
        try:
            problem = self.references.problem(problem_id)
        except (OSError, ProblemChanged):
            return  # each of its candidates is skipped with the reason when it comes
        with self.account.phase("reference"):
            prepared = lane.prepare(problem, self.recorder.log_path(problem_id, "_reference", "eval"))
        if prepared:
            self._note_reference(problem_id, prepared.warning, prepared.baseline_key)

    def _note_reference(self, problem_id: str, warning: str | None, baseline_key: str | None) -> None:
        """What opening a problem's reference told the run: a warning about the problem (once), its baseline."""
        line = f"{self.found.problems[problem_id].path}: {warning}" if warning else None
        if line and line not in self.warnings:
            self.warnings.append(line)
        if baseline_key:
            self.store.adopt(baseline_key)

    def _evaluate_safely(self, lane: LaneHandle, cand: Candidate, built: _Built, ref_log: Path, log: Path
                         ) -> LaneResult:
        """`lane.evaluate`, where a tampered build is rebuilt once and any other file error is a verdict."""
        try:
            problem = self.references.problem(cand.problem_id)
        except (OSError, ProblemChanged) as exc:
            return LaneResult(Findings(status="skipped", error=str(exc)))
        for attempt in range(2):
            try:
                return lane.evaluate(problem, cand.path, built.compiled, ref_log, log)
            except BuildTampered as exc:
                self.warnings.append(f"{cand.path}: {exc}")
                if attempt == 0:
                    built.compiled = self.backend.compile(cand, self.device, self.opts.cache_dir, log,
                                                          self.opts.compile_timeout, self._warmup(cand))
                    if not built.compiled.record.ok:
                        return LaneResult(Findings(status=built.compiled.record.status or "compile_error",
                                                   error=f"rebuild: {built.compiled.record.error}"))
            except OSError as exc:  # a lock or file another candidate broke: this verdict, not the run
                return LaneResult(Findings(status="runtime_error", error=f"harness file error while judging: {exc}"))
        return LaneResult(Findings(status="runtime_error", error="its build was altered again after a rebuild"))

    def _check_tampering(self, culprit: Candidate | None) -> bool:
        """Restore the verdict log if something altered it; True when `culprit` (the only code running) did."""
        if not self.recorder.tampered():
            return False
        if culprit is None:
            self.warnings.append(f"{self.recorder.verdicts_path} was altered by candidate code (a compile or an "
                                 "evaluation) that cannot be singled out; restored, no verdict changed")
            return False
        return True

    def _record(self, cand: Candidate, seconds: float, findings: Findings, log: Path | None = None) -> None:
        """Record a verdict, unless a stop was asked for: its workers may have been killed under it (the flag is
        set before any kill, so findings a kill shaped are always made after it)."""
        with self._record_lock:  # lanes and compile threads record concurrently
            if not interrupts.requested():
                self._record_locked(cand, seconds, findings, log)

    def _record_locked(self, cand: Candidate, seconds: float, findings: Findings, log: Path | None) -> None:
        rel_log = str(log.relative_to(self.recorder.run_dir)) if log else None
        findings = findings.model_copy(update=verdict_context(self.found.problems, cand.problem_id, self.manifest))
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
            finished_at=now_utc(),
            **findings.model_dump(),
        )
        self.recorder.append(verdict)
        self.judged[(verdict.problem, verdict.candidate)] = verdict
        self.listen(verdict)


def build_parallelism(jobs: int, builds: int) -> int:
    """ninja's jobs inside one build: the cores not taken by other builds, at least 2 (a CUDA build has two
    translation units, main.cpp and cuda.cu, that should compile side by side, not one after the other)."""
    at_once = max(1, min(jobs, builds))
    return max(2, cores.build_cores() // at_once)


def _near(lane: LaneHandle, cand: Candidate, built: _Built) -> bool:
    return lane.has_build(built.compiled)


def _with_build(findings: Findings, compiled: Compiled, seconds: float) -> Findings:
    """What the build settles, added to the findings: this run's compile cost (near zero when cached), with
    a warm-up a Ray lane ran (`ray_backend`)."""
    findings.compiled, findings.compile_cached = compiled.record.ok, compiled.cached
    findings.compile_seconds = round(seconds + getattr(compiled, "warmed_in_lane", 0.0), 3)
    findings.built_on = getattr(compiled, "built_on", None)  # the Ray node that built it
    if not compiled.cached and compiled.record.sandbox is not None:  # its build ran its code too, this run
        findings.sandbox = compiled.record.sandbox.weakest(findings.sandbox)
    return findings


class _Activity:
    """Counts compiles and evaluations (both run candidate code): tampering is blamed only on one that ran alone."""

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
