"""The compile stage as a run drives it: each candidate built through the backend (cached by content), a failed
build recorded at once and sent to no lane, and what the build settles added to the candidate's verdict.

Apart from `pipeline` because a build is asked for from two places (the compile threads, and a lane that found
its build altered and rebuilds it once), with the same inputs for its warm-up each time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from kernelbench_eval.building.compile import Compiled
from kernelbench_eval.building.jitwarmup import WarmupSpec
from kernelbench_eval.discover.corpus import Candidate, Discovery, ProblemChanged
from kernelbench_eval.discover.guard import References
from kernelbench_eval.isolation import cores
from kernelbench_eval.records import Findings, RunManifest
from kernelbench_eval.results import phases as account
from kernelbench_eval.run.recording import Recording
from kernelbench_eval.run.setup import Backend, RunOptions


@dataclass
class Built:
    compiled: Compiled
    seconds: float  # this run's compile wall time


class Builds:
    """Builds candidates for one run: `compile` for the compile threads, `rebuild` for a lane."""

    def __init__(self, opts: RunOptions, manifest: RunManifest, found: Discovery, references: References,
                 backend: Backend, recording: Recording, spent: account.Account) -> None:
        self.opts, self.manifest, self.found, self.references = opts, manifest, found, references
        self.backend, self.recording, self.spent = backend, recording, spent
        self.device = manifest.settings.device

    def compile(self, cand: Candidate) -> Built | None:
        """Build one candidate; a failed build is recorded here and goes to no lane (None)."""
        log = self.recording.recorder.log_path(cand.problem_id, cand.candidate_id, "compile")
        started = time.perf_counter()
        with self.recording.activity, self.spent.phase("build"):
            try:
                compiled = self.rebuild(cand, log)
            except OSError as exc:  # something planted in the cache: this candidate's verdict, not a dead run
                findings = Findings(status="compile_error", error=f"build folder unusable: {exc}")
                self.recording.record(cand, time.perf_counter() - started, findings, log=log)
                return None
        seconds = time.perf_counter() - started
        if compiled.record.ok:
            return Built(compiled, seconds)
        findings = Findings(status=compiled.record.status or "compile_error", error=compiled.record.error)
        self.recording.record(cand, seconds, with_build(findings, compiled, seconds), log=log)
        return None

    def rebuild(self, cand: Candidate, log: Path) -> Compiled:
        """The backend's build of `cand` (found in the cache when it is there and verifies)."""
        return self.backend.compile(cand, self.device, self.opts.cache_dir, log, self.opts.budgets.build,
                                    self._warmup(cand))

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


def build_parallelism(jobs: int, builds: int) -> int:
    """ninja's jobs inside one build: the cores not taken by other builds, at least 2 (a CUDA build has two
    translation units, main.cpp and cuda.cu, that should compile side by side, not one after the other)."""
    at_once = max(1, min(jobs, builds))
    return max(2, cores.build_cores() // at_once)


def with_build(findings: Findings, compiled: Compiled, seconds: float) -> Findings:
    """The findings with what the build settles: this run's compile cost (near zero when cached), with a warm-up a
    Ray lane ran (`ray_backend`)."""
    sandbox = findings.sandbox
    if not compiled.cached and compiled.record.sandbox is not None:  # its build ran its code too, this run
        sandbox = compiled.record.sandbox.weakest(sandbox)
    return findings.model_copy(update=dict(
        compiled=compiled.record.ok, compile_cached=compiled.cached, sandbox=sandbox,
        compile_seconds=round(seconds + getattr(compiled, "warmed_in_lane", 0.0), 3),
        built_on=getattr(compiled, "built_on", None)))  # the Ray node that built it
