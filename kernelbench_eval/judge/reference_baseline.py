"""The reference's baselines: its eager time and its time under torch.compile, reused from `baselines.json` when this
machine measured them before in good conditions (`conditions`), else measured now and stored.

Apart from `reference` because a baseline is a decision (reuse, measure again, keep the better) across runs and
lanes sharing one store, and torch.compile runs in a worker of its own, which only this module starts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from kernelbench_eval.common.stats import finite, rse_per_call
from kernelbench_eval.discover.corpus import Problem
from kernelbench_eval.discover.guard import user_paths
from kernelbench_eval.isolation import cores
from kernelbench_eval.isolation.process import WorkerFailure, WorkerProcess
from kernelbench_eval.judge import conditions
from kernelbench_eval.judge.baselines import BaselineStore
from kernelbench_eval.judge.checker import Checker
from kernelbench_eval.judge.lending import Lender
from kernelbench_eval.judge.measure import Deadline
from kernelbench_eval.judge.reference_timing import ReferenceTiming
from kernelbench_eval.records import Baseline, Conditions, RunSettings, TimingStats, baseline_key, now_utc
from kernelbench_eval.requests import AttachRequest, LoadRequest

COMPILE_MODE = "default"

MakeLoad = Callable[..., LoadRequest]  # `ReferenceSide.load_request`


class ReferenceBaselines:
    """One problem's baselines on one lane: `settle` once its reference is open, then read `baseline`."""

    def __init__(self, problem: Problem, settings: RunSettings, store: BaselineStore, checker: Checker,
                 lender: Lender, timing: ReferenceTiming, compile_limit: float, load_request: MakeLoad) -> None:
        self.problem, self.settings, self.store = problem, settings, store
        self.checker, self.lender, self.timing = checker, lender, timing
        self.compile_limit, self.load_request = compile_limit, load_request  # torch.compile's worker: its seconds
        self.baseline: Baseline | None = None
        self.key: str | None = None  # its `baselines.json` entry
        self.remeasured: str | None = None  # why the stored baseline was not reused, when it was not

    def settle(self, device_name: str) -> Baseline | None:
        """From `baselines.json` when this machine measured it before in good conditions, else measured now
        (and stored, unless the stored one was measured in better conditions still: that one is used)."""
        self.baseline = self._settle(device_name)
        return self.baseline

    def _settle(self, device_name: str) -> Baseline | None:
        if not self.settings.compile_baseline:
            return None
        key = self.key = baseline_key(self.problem.source_sha256, device_name, torch.__version__,
                                      self.settings.timing_key())
        with self.store.claim(key):  # another lane (or run) measuring it now: wait, then reuse its numbers
            stored = self.store.get(key)
            doubts = conditions.doubts(stored.conditions, self.settings) if stored else []
            if stored and not doubts:
                return stored
            fresh = self._measure(device_name)
            if stored is None:
                self.store.put(fresh)
                return fresh
            self.remeasured = "the stored baseline was measured again: " + "; ".join(doubts)
            kept = conditions.better(stored, fresh, self.settings)
            if kept is fresh:
                self.store.put(fresh)
            else:
                self.remeasured += " (and kept: this run's measurement was no better)"
            return kept

    def _measure(self, device_name: str) -> Baseline:
        assert self.checker.worker is not None
        load = conditions.HostLoad(self.checker.pid)
        eager = self.timing.measure_alone(self.checker.worker, Deadline(self.timing.time_limit))
        found = Conditions(eager_rse=finite(rse_per_call(eager)), others_cores=load.others_cores(),
                           cores=cores.usable(), threads=self.settings.threads or 1, seconds=load.seconds())
        baseline = Baseline(problem=self.problem.problem_id, source_sha256=self.problem.source_sha256,
                            device_name=device_name, torch_version=torch.__version__,
                            timing_key=self.settings.timing_key(), eager=TimingStats.from_samples(eager),
                            eager_samples=eager, compile_mode=COMPILE_MODE, measured_at=now_utc(), conditions=found)
        self._measure_compiled(baseline)
        if baseline.compiled_samples:
            found.compiled_rse = finite(rse_per_call(baseline.compiled_samples))
        return baseline

    def _measure_compiled(self, baseline: Baseline) -> None:
        """torch.compile in a worker of its own: a compiler crash or hang must not take the checker with it."""
        deadline = Deadline(self.compile_limit)
        workdir: Path = self.checker.workdir
        try:
            env = self.checker.env | {"TORCHINDUCTOR_COMPILE_THREADS": "1"}  # leave the cores to the builds
            # fed and timed as a candidate is (a candidate's role), though the harness's own model: unconfined
            with WorkerProcess(workdir, self.checker.log, env, time_limit=self.compile_limit,
                               role="candidate") as worker:
                worker.call(self.load_request("Model", self.problem.path, COMPILE_MODE), deadline.left())
                worker.call(AttachRequest(exchange=self.lender.lend(workdir, pool=False),
                                          placements=self.lender.placements), deadline.left())
                self.lender.feed(worker, self.lender.timing_sets(), deadline)
                samples = self.timing.measure_alone(worker, deadline)
            baseline.compiled, baseline.compiled_samples = TimingStats.from_samples(samples), samples
        except WorkerFailure as exc:
            baseline.compile_error = user_paths(self.problem, f"torch.compile baseline: {exc.message}")
        finally:
            self.lender.reclaim()
