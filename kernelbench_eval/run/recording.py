"""A run's verdicts as they are made: each recorded the moment it exists (unless a stop was asked for), and a
candidate that alters the verdict log while it runs caught and disqualified.

Apart from `pipeline` because recording is shared by the compile threads and every lane, under one lock, and
because deciding whom to blame for an altered log needs to know what candidate code was running at the time
(`Activity`), which both stages report here.
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from kernelbench_eval import interrupts
from kernelbench_eval.discover.corpus import Candidate, Problem
from kernelbench_eval.records import Findings, RunManifest, Verdict, now_utc
from kernelbench_eval.results.aggregates import verdict_context
from kernelbench_eval.results.record import RunRecorder
from kernelbench_eval.run.setup import Listener


class Activity:
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


class Recording:
    """Where a run's verdicts go: `record` them, `check_tampering` around the candidate code that could alter them."""

    def __init__(self, recorder: RunRecorder, manifest: RunManifest, problems: dict[str, Problem],
                 listen: Listener, warnings: list[str]) -> None:
        self.recorder, self.manifest, self.problems, self.listen = recorder, manifest, problems, listen
        self.warnings = warnings  # the run's: an alteration no candidate can be blamed for is said there
        self.activity = Activity()
        self.judged: dict[tuple[str, str], Verdict] = {}
        self._lock = threading.Lock()

    def record(self, cand: Candidate, seconds: float, findings: Findings, log: Path | None = None) -> None:
        """Record a verdict, unless a stop was asked for: its workers may have been killed under it (the flag is
        set before any kill, so findings a kill shaped are always made after it)."""
        with self._lock:  # lanes and compile threads record concurrently
            if not interrupts.requested():
                self._record_locked(cand, seconds, findings, log)

    def _record_locked(self, cand: Candidate, seconds: float, findings: Findings, log: Path | None) -> None:
        rel_log = str(log.relative_to(self.recorder.run_dir)) if log else None
        findings = findings.model_copy(update=verdict_context(self.problems, cand.problem_id, self.manifest))
        verdict = Verdict(
            run_id=self.manifest.run_id,
            problem=cand.problem_id,
            candidate=cand.candidate_id,
            source_sha256=cand.source_sha256,
            settings_key=self.manifest.settings.key(),
            device=self.manifest.settings.device,
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

    def check_tampering(self, culprit: Candidate | None) -> bool:
        """Restore the verdict log if something altered it; True when `culprit` (the only code running) did."""
        if not self.recorder.tampered():
            return False
        if culprit is None:
            self.warnings.append(f"{self.recorder.verdicts_path} was altered by candidate code (a compile or an "
                                 "evaluation) that cannot be singled out; restored, no verdict changed")
            return False
        return True
