"""The reference side of judging: one problem on one lane, its checker worker, its secrets and baselines.

The checker (the reference's worker) makes every input set from secret seeds, computes the expected
outputs once, keeps both in its own memory (on the GPU for a CUDA run) and does every comparison. The
harness holds only seeds, metadata and verdicts, and lends each candidate the checker's exchange buffer.

`ReferenceSide` opens the problem and holds what that taught (the problem's warning, whether it keeps state, its
input distributions); the rest is done by the collaborators it makes, one job each: `checker` (the worker's life),
`lender` (the exchange's sizes, lending it and feeding input sets through it), `timing` (the reference's own
times) and `baselines` (eager and torch.compile, reused or measured).
"""

from __future__ import annotations

import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kernelbench_eval.budgets import Budgets
from kernelbench_eval.common import memory
from kernelbench_eval.discover.corpus import Problem
from kernelbench_eval.discover.guard import user_paths
from kernelbench_eval.isolation.process import WorkerFailure, WorkerProcess
from kernelbench_eval.judge.baselines import BaselineStore
from kernelbench_eval.judge.checker import Checker, ReferenceFailure
from kernelbench_eval.judge.lending import Lender
from kernelbench_eval.judge.measure import Deadline
from kernelbench_eval.judge.reference_baseline import ReferenceBaselines
from kernelbench_eval.judge.reference_timing import ReferenceTiming
from kernelbench_eval.messages import CheckResult, Slot, TensorMeta
from kernelbench_eval.records import RunSettings
from kernelbench_eval.requests import CompareRequest, CompareTimedRequest, ExpectRequest, LoadRequest, PrepareRequest

__all__ = ["ReferenceFailure", "ReferenceSide", "Secrets", "describe_problem"]

STATEFUL_WARNING = ("the reference keeps state between calls (its outputs change on the same inputs): each model is "
                    "called once per trial from a fresh start, as KernelBench does, and timed calls are not compared")
TIMING_SETS = 3  # base input sets the timing loop rotates through (each call also gets a fresh scale)


@dataclass
class Secrets:
    """Seeds drawn by this harness process and never written to disk, argv or a candidate's environment."""

    init_seed: int
    trial_seeds: list[int]
    timing_seeds: list[int]

    @classmethod
    def draw(cls, trials: int) -> Secrets:
        return cls(secrets.randbits(31), [secrets.randbits(31) for _ in range(trials)],
                   [secrets.randbits(31) for _ in range(TIMING_SETS)])


class ReferenceSide:
    """The reference of one problem, kept alive (in its checker worker) while the problem's candidates are judged."""

    def __init__(self, problem: Problem, settings: RunSettings, seeds: Secrets, log: Path, budgets: Budgets,
                 store: BaselineStore, env: dict[str, str] | None = None, memory_share: float = 1.0) -> None:
        self.problem, self.settings, self.seeds, self.budgets = problem, settings, seeds, budgets
        self.env = env or {}  # the lane's: CUDA_VISIBLE_DEVICES names its GPU
        self.memory_share = memory_share  # of the device's budget: lanes sharing one device split it
        self.checker = Checker(log, self.env, budgets.reference)
        self.lender = Lender(self.checker, settings, len(seeds.trial_seeds) + len(seeds.timing_seeds),
                             len(seeds.timing_seeds))
        self.timing = ReferenceTiming(self.checker, self.lender, settings, budgets.reference)
        self.baselines = ReferenceBaselines(problem, settings, store, self.checker, self.lender, self.timing,
                                            budgets.compiled_baseline, self.load_request)
        # what opening it taught
        self.error: str | None = None  # why it could not be opened: its candidates are skipped with this
        self.device_name: str | None = None
        self.warning: str | None = None
        self.stateful = False  # its outputs change from call to call on the same inputs (`worker.trials`)
        self.distributions: list[str] = []  # each trial's input distribution, as the checker settled them (`draws`)
        self.distributions_note: str | None = None  # those the reference refused, and why
        self.init_bytes = b""  # the init arguments, as the reference wrote them (each candidate gets a copy)

    def open(self) -> ReferenceSide:
        """Inputs, expected outputs and baselines; on failure `error` says why and candidates are skipped."""
        deadline, checker = Deadline(self.budgets.reference), self.checker
        try:
            checker.start()
            prepared = checker.ask(PrepareRequest(
                path=str(self.problem.path.resolve()), dims=self.settings.dims,
                trial_seeds=self.seeds.trial_seeds, timing_seeds=self.seeds.timing_seeds, device=self.settings.device,
                inputs_dir=str(checker.workdir), precision=self.settings.precision), deadline)
            self.lender.learn_inputs(prepared.input_bytes)
            loaded = checker.ask(self.load_request("Model", self.problem.path), deadline)
            self.device_name = loaded.device_name
            self.lender.learn_device(loaded.memory_bytes)
            self.timing.learn_device(loaded.memory_bandwidth_gbs, loaded.event_overhead_ms)
            expected = checker.ask(ExpectRequest(trial_seeds=self.seeds.trial_seeds,
                                                 timing_seeds=self.seeds.timing_seeds, atol=self.settings.atol,
                                                 rtol=self.settings.rtol, memory_budget=memory.forced_budget(),
                                                 memory_share=self.memory_share), deadline)
            self.lender.learn_outputs(expected.expected, expected.residency)
            self.warning, self.stateful = expected.warning, expected.stateful
            if self.stateful:  # said once per problem, with the verdicts it shapes
                self.warning = "; ".join(filter(None, [self.warning, STATEFUL_WARNING]))
            self.distributions, self.distributions_note = expected.distributions, expected.distributions_note
            checker.note_peak(expected.peak_bytes)
            baseline = self.baselines.settle(self.device_name or "")
            self.timing.start(baseline.eager_samples if baseline else self.timing.time_alone())
            checker.remember_sched()
            init = checker.workdir / "init.pt"  # read once, then gone: nothing in this folder for a candidate to alter
            self.init_bytes = init.read_bytes()
            init.unlink()
        except (WorkerFailure, OSError) as exc:
            self.error = user_paths(self.problem, f"{self.problem.shown}: reference: {getattr(exc, 'message', exc)}")
        return self

    def close(self) -> None:
        self.checker.close()

    # -- what its lane asks of it -------------------------------------------------------------------------------

    @property
    def broken(self) -> bool:
        """Its checker died mid-candidate: open the problem again for the next one."""
        return self.checker.broken

    def park(self) -> None:
        """Free the checker's timing leftovers while other problems are judged (`Checker.park`)."""
        if not self.error:
            self.checker.park()

    def unpark(self) -> None:
        self.checker.unpark()

    # -- what candidates are loaded with and checked against ----------------------------------------------------

    def load_request(self, class_name: str, path: Path, compile_mode: str | None = None,
                     model: str = "main", init_dir: Path | None = None) -> LoadRequest:
        return LoadRequest(path=str(path.resolve()), class_name=class_name, model=model,
                           init_file=str((init_dir or self.checker.workdir) / "init.pt"),
                           init_seed=self.seeds.init_seed, device=self.settings.device,
                           threads=self.settings.threads, compile_mode=compile_mode,
                           precision=self.settings.precision, problem=str(self.problem.path.resolve()),
                           dims=self.settings.dims)  # the names a candidate sees (`worker.namespace`)

    def compare(self, trial: int, slots: list[Slot], outputs: list[TensorMeta]) -> CheckResult:
        check = self.checker.call(CompareRequest(trial=trial, slots=slots, outputs=outputs)).check
        assert check is not None
        return check

    def compare_timed(self, calls: list[int], layout: list[list[Slot]], metas: list[list[TensorMeta]]
                      ) -> CheckResult:
        req = CompareTimedRequest(calls=calls, layout=layout, metas=metas)
        check = self.checker.call(req).check
        assert check is not None
        return check


def describe_problem(problem: Problem, dims: dict[str, int | float], timeout: float) -> tuple[list[str], str | None]:
    """Input shapes of one problem (for `kbeval problems`), from its own worker; (shapes, error)."""
    with tempfile.TemporaryDirectory(prefix="kbeval-describe-") as tmp:
        req = PrepareRequest(path=str(problem.path.resolve()), dims=dims, trial_seeds=[0], inputs_dir=tmp)
        try:
            with WorkerProcess(Path(tmp), Path(tmp) / "log", role="checker") as worker:
                reply = worker.call(req, timeout)
        except WorkerFailure as failure:
            return [], failure.message
        return reply.input_shapes, None
