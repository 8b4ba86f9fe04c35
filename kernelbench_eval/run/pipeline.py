"""The run, top to bottom: discover -> compile (parallel, cached) -> check -> time -> record.

Compiles run `jobs` wide (each one a separate process); each evaluation lane (one per GPU) judges one
candidate at a time, taking the next one the moment its compile is done (`schedule`). On the CPU,
evaluation waits for all compiles, since compilers and a CPU timer would fight for the same cores. The
backend decides where compiles and lanes run: here (`lanes.LocalBackend`) or on a Ray cluster
(`cluster.RayBackend`); verdicts are recorded here, as they arrive, either way (`recording`), and builds are
asked for through `builds`.
"""

from __future__ import annotations

import os
import time
from functools import partial
from pathlib import Path

from kernelbench_eval import interrupts
from kernelbench_eval.building import pch
from kernelbench_eval.building.compile import BuildTampered
from kernelbench_eval.discover.corpus import Candidate, Discovery, ProblemChanged, discover
from kernelbench_eval.discover.guard import References
from kernelbench_eval.isolation import private, sandbox
from kernelbench_eval.isolation.linux import keep_memory_private
from kernelbench_eval.isolation.workerenv import prestart
from kernelbench_eval.judge import baselines
from kernelbench_eval.judge.baselines import BaselineStore
from kernelbench_eval.records import Findings, RunManifest
from kernelbench_eval.results import phases as account
from kernelbench_eval.results.record import RunRecorder
from kernelbench_eval.run import schedule
from kernelbench_eval.run.builds import Builds, Built, build_parallelism, with_build
from kernelbench_eval.run.lanes import LaneConfig, LaneHandle, LaneResult, LocalBackend
from kernelbench_eval.run.recording import Recording
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
        raise interrupts.Interrupted(stopped.signum, _unfinished(len(session.recording.judged), len(todo)),
                                     recorder.run_dir)
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


class _Session:
    """One pass over the candidates still to judge; every verdict is recorded the moment it exists."""

    def __init__(self, opts: RunOptions, recorder: RunRecorder, manifest: RunManifest,
                 found: Discovery, listen: Listener, backend: Backend) -> None:
        self.opts, self.recorder, self.manifest, self.found = opts, recorder, manifest, found
        self.device = manifest.settings.device
        self.store = BaselineStore(opts.baselines_path())
        self.warnings: list[str] = []
        self.account = account.Account()  # where the wall time goes (`account`)
        self.backend = backend
        self.references = References(found.problems)  # the problems' private, verified copies
        self.recording = Recording(recorder, manifest, found.problems, listen, self.warnings)
        self.activity = self.recording.activity
        self.builds = Builds(opts, manifest, found, self.references, backend, self.recording, self.account)

    def judge_all(self, todo: list[Candidate]) -> None:
        """Every candidate is judged in its own right: identical bytes share a build, never a verdict.

        (A copy that inherited its twin's verdict could behave differently under its own file name.)
        """
        self._judge_runnable([c for c in todo if not self._judged_statically(c)])

    def _judge_runnable(self, runnable: list[Candidate]) -> None:
        """Compile `jobs` wide and evaluate on every lane as soon as a compile is done (see `schedule`)."""
        jobs = max(1, self.opts.jobs)
        config = LaneConfig(self.manifest.settings, self.opts.baselines_path(), self.opts.budgets)
        lanes = self.backend.lanes(config, self.opts.gpus, self.opts.lanes)  # may keep cores from the builds
        os.environ.setdefault("MAX_JOBS", str(build_parallelism(jobs, len(runnable))))  # ninja inside each build
        if self.opts.backend == "local":  # found (or made, in the background) before the first build asks
            pch.plan(self.opts.cache_dir, self.device, len(runnable), jobs)
        work = [schedule.LaneJobs(partial(self._evaluate, lane), lane.holds, partial(self._prepare, lane),
                                  partial(_near, lane)) for lane in lanes]
        try:
            schedule.drive(runnable, self.builds.compile, jobs, work, key=lambda cand: cand.problem_id,
                           hold=self.device == "cpu", stopped=interrupts.requested)
        finally:
            for lane in lanes:
                lane.close()

    def _judged_statically(self, cand: Candidate) -> bool:
        if cand.invalid:
            self.recording.record(cand, 0.0, Findings(status="load_error", error=cand.invalid))
        elif cand.devices is not None and self.device not in cand.devices:
            why = f"needs {'/'.join(cand.devices)}, this run is on {self.device}"
            self.recording.record(cand, 0.0, Findings(status="skipped", error=why))
        else:
            return False
        return True

    def _evaluate(self, lane: LaneHandle, cand: Candidate, built: Built) -> None:
        log = self.recorder.log_path(cand.problem_id, cand.candidate_id, "eval")
        ref_log = self.recorder.log_path(cand.problem_id, "_reference", "eval")
        started = time.perf_counter()
        with self.activity, self.account.phase("judge"):
            self.recording.check_tampering(None)  # what happened before this candidate ran is not its doing
            alone = self.activity.snapshot()
            result = self._evaluate_safely(lane, cand, built, ref_log, log)
            findings = result.findings
            if self.recording.check_tampering(cand if self.activity.snapshot() == alone and alone[1] == 1 else None):
                findings = findings.disqualified("incorrect", "cheating detected: it altered the run's verdicts.jsonl "
                                                 "while it ran (restored; no verdict changed)")
        self._note_reference(cand.problem_id, result.warning, result.baseline_key)
        self.recording.record(cand, built.seconds + time.perf_counter() - started,
                              with_build(findings, built.compiled, built.seconds), log=log)

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

    def _evaluate_safely(self, lane: LaneHandle, cand: Candidate, built: Built, ref_log: Path, log: Path
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
                    built.compiled = self.builds.rebuild(cand, log)
                    if not built.compiled.record.ok:
                        return LaneResult(Findings(status=built.compiled.record.status or "compile_error",
                                                   error=f"rebuild: {built.compiled.record.error}"))
            except OSError as exc:  # a lock or file another candidate broke: this verdict, not the run
                return LaneResult(Findings(status="runtime_error", error=f"harness file error while judging: {exc}"))
        return LaneResult(Findings(status="runtime_error", error="its build was altered again after a rebuild"))


def _near(lane: LaneHandle, cand: Candidate, built: Built) -> bool:
    return lane.has_build(built.compiled)
