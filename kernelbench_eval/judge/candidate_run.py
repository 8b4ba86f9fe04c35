"""The candidate side of judging: one worker process for the whole evaluation, its workdir, deadline and outcome.

One process (one CUDA context, one extension load) runs the trials and then the timing: the checks that
needed a second, fresh process before (launch errors, uninitialised memory) are made after every trial run
instead. Everything the candidate sends back is compared by the checker (`reference.ReferenceSide`).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from kernelbench_eval.building.compile import Compiled, build_lock, extension_env, private_triton
from kernelbench_eval.containment import SandboxRecord
from kernelbench_eval.isolation import sandbox
from kernelbench_eval.isolation.process import WorkerFailure, WorkerProcess
from kernelbench_eval.judge.checker import ReferenceFailure
from kernelbench_eval.judge.measure import Deadline
from kernelbench_eval.judge.reference_side import ReferenceSide
from kernelbench_eval.measured import PrecisionCheck
from kernelbench_eval.messages import CheckResult
from kernelbench_eval.records import KernelCount
from kernelbench_eval.requests import ExportRequest, ProfileRequest, RunRequest
from kernelbench_eval.statuses import Status

SENTINELS = (0xFF, 0x00)  # NaN-filled, then zero-filled free memory: uninitialised reads cannot pass both


@dataclass(frozen=True)
class Checked:
    """What a candidate's own run settled (its outcome, its trials, what every check saw), frozen when judging is
    done (`CandidateRun.checked`); `judging.verdict` assembles the verdict from it and the timing's result."""

    status: Status
    error: str | None
    device_name: str | None
    sandbox: SandboxRecord | None
    trials_passed: int
    mutates_inputs: bool
    max_abs_diff: float | None  # the largest over its trials and its timed calls
    mean_abs_diff: float | None
    precision_check: PrecisionCheck | None  # trial 0 against the float64 truth
    timed_error: float | None  # its largest error over its timed calls (`note_precision`)
    phases: tuple[tuple[str, float], ...] = ()  # seconds by phase: spawn, load, trials, checks, timing, ...


@dataclass
class _Tally:
    """What a run has found so far, written through its methods (by `CandidateRun` and the timing stage's checks)."""

    status: Status = "ok"
    error: str | None = None
    device_name: str | None = None
    sandbox: SandboxRecord | None = None
    trials_passed: int = 0
    mutates_inputs: bool = False
    max_abs_diff: float | None = None
    mean_abs_diff: float | None = None
    precision_check: PrecisionCheck | None = None
    timed_error: float | None = None
    phases: dict[str, float] = field(default_factory=dict)

    def end(self, status: Status, error: str) -> None:
        self.status, self.error = status, error

    def add_time(self, phase: str, seconds: float) -> None:
        self.phases[phase] = self.phases.get(phase, 0.0) + seconds

    def note_precision(self, check: CheckResult) -> None:
        """Its precision over its timed calls so far, from a timed block's check (`timing_stage`)."""
        error = check.precision.candidate_error if check.precision else None
        if error is not None and (self.timed_error is None or error > self.timed_error):
            self.timed_error = error

    def note_diffs(self, max_diff: float | None, mean_diff: float | None) -> None:
        if max_diff is not None:
            self.max_abs_diff = max(self.max_abs_diff or 0.0, max_diff)
            self.mean_abs_diff = max(self.mean_abs_diff or 0.0, mean_diff or 0.0)

    def freeze(self) -> Checked:
        return Checked(self.status, self.error, self.device_name, self.sandbox, self.trials_passed,
                       self.mutates_inputs, self.max_abs_diff, self.mean_abs_diff, self.precision_check,
                       self.timed_error, tuple(self.phases.items()))


class CandidateRun:
    """One candidate being judged against `ref`: its worker, its workdir, and what it has found so far."""

    def __init__(self, ref: ReferenceSide, build: Compiled, path: Path, log: Path, timeout: float) -> None:
        self.ref, self.build, self.path, self.log = ref, build, path, log
        self.deadline = Deadline(timeout)
        self.timeout = timeout
        self.tally = _Tally(device_name=ref.device_name)
        self.workdir = Path(tempfile.mkdtemp(prefix="kbeval-cand-"))
        self.worker: WorkerProcess | None = None
        self.exchange_kind: str | None = None
        self.exchange_bytes = 0  # the lent exchange's size: a reported output must lie inside it
        self.block_calls = 1  # timed calls a block holds, as the lent exchange allows (`Lender.lend`)
        self._lent = False

    def __enter__(self) -> CandidateRun:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.worker is not None:
            self.worker.close()  # first: the exchange is freed only once nothing can write into it
        if self._lent:
            with contextlib.suppress(WorkerFailure):  # a failed checker is marked broken and opened again
                self.ref.lender.reclaim()
        shutil.rmtree(self.workdir, ignore_errors=True)

    @contextmanager
    def stage(self, name: str, phase: str | None = None) -> Iterator[None]:
        """Time a phase; a worker failure inside it becomes the outcome, named after the stage."""
        started = time.perf_counter()
        try:
            yield
        except ReferenceFailure as exc:
            self.tally.end("crashed", f"{name}: {exc.message}")
        except WorkerFailure as exc:  # a load error speaks for itself; anything later says when it happened
            where = "" if exc.status == "load_error" and name == "loading" else f"{name}: "
            self.tally.end(exc.status, where + exc.message)  # type: ignore[arg-type]
        finally:
            self.tally.add_time(phase or name, time.perf_counter() - started)

    @property
    def ok(self) -> bool:
        return self.tally.status == "ok"

    def fail(self, error: str) -> bool:
        self.tally.end("incorrect", error)
        return False

    def checked(self) -> Checked:
        """What this run settled, frozen (`judging.verdict` makes the verdict of it)."""
        return self.tally.freeze()

    # -- start ---------------------------------------------------------------------------------------

    def start(self) -> bool:
        """Its worker, its model (under the build's lock) and the checker's exchange buffer, attached."""
        self.ref.checker.settle()  # the reference as opened (what cannot be put back: opened afresh next time)
        with self.stage("loading", "spawn"):
            (self.workdir / "init.pt").write_bytes(self.ref.init_bytes)
            env = extension_env(self.build.build_dir, triton=self.workdir / "triton")  # a copy: private_triton
            # it writes its own folder (its Triton copy included) and the build's extension folder, where
            # load_inline takes its lock and ninja its logs (the build is verified at every load)
            confined = sandbox.spec([self.workdir, self.build.build_dir / "ext"], self.ref.settings.device,
                                    "evaluate")
            self.worker = WorkerProcess(self.workdir, self.log, self.ref.env | env, time_limit=self.timeout,
                                        sandbox=confined, role="candidate")
            self.worker.start()
        if not self.ok:
            return False
        with self.stage("loading", "load"):
            with build_lock(self.build.build_dir):  # load_inline's own lock file may be stale (see build_lock)
                private_triton(self.build.build_dir, self.workdir / "triton")
                self.deadline = Deadline(self.timeout)  # a wait for the lock is not the candidate's time
                try:
                    reply = self.worker.call(self.ref.load_request("ModelNew", self.path, init_dir=self.workdir),
                                             self.deadline.left())
                finally:
                    self.tally.sandbox = self.worker.sandbox_record
            self.tally.device_name = reply.device_name or self.tally.device_name
            self._attach()
        return self.ok

    def _attach(self) -> None:
        assert self.worker is not None
        info = self.ref.lender.lend(self.workdir)
        self._lent = True
        info = self.ref.lender.attach(self.worker, info, self.workdir, self.deadline)
        self.exchange_bytes, self.block_calls = info.size, info.calls
        self.exchange_kind = self.ref.lender.kind_of(info)

    # -- correctness ---------------------------------------------------------------------------------

    def check_trials(self) -> bool:
        """Every trial, run twice over differently filled free memory; both runs must match the reference."""
        for trial in range(len(self.ref.lender.metas)):
            with self.stage(f"trial {trial}", "trials"):
                self._check_trial(trial)
            if not self.ok:
                return False
            self.tally.trials_passed += 1
        return True

    def _check_trial(self, trial: int) -> None:
        assert self.worker is not None
        name = f"trial{trial}"
        self.ref.lender.feed(self.worker, [name], self.deadline, drop=True)  # one trial's set at a time (`memory`)
        slots = self.ref.lender.timed_layout(1)[0]
        # a stateful reference was called once per trial: so is the candidate, or their states part
        for run, sentinel in enumerate(SENTINELS[:1] if self.ref.stateful else SENTINELS):
            reply = self.worker.call(RunRequest(name=name, sentinel=sentinel, slots=slots),
                                     self.deadline.left())
            self.tally.mutates_inputs = self.tally.mutates_inputs or reply.mutated_inputs
            if reply.launch_error:
                self.fail(f"trial {trial}: a kernel launch failed without raising: {reply.launch_error}")
                return
            started = time.perf_counter()
            check = self.ref.compare(trial, slots, reply.outputs)
            self.tally.add_time("checks", time.perf_counter() - started)
            self.tally.note_diffs(check.max_abs_diff, check.mean_abs_diff)
            if check.precision is not None:  # trial 0, against the float64 truth (`precision.precision_reason`)
                self.tally.precision_check = check.precision
            if not check.passed:
                why = check.error
                if run == 1:
                    why = (f"it passed once and failed over memory filled with 0x{sentinel:02X}: reads uninitialised "
                           f"memory ({why})")
                self.fail(f"trial {trial}: {why}")
                return

    def peak_bytes(self) -> int | None:
        """The candidate's worker's peak memory, asked once its judging is done (None if it cannot answer)."""
        if self.worker is None or self.worker.proc is None or self.worker.proc.poll() is not None:
            return None
        try:
            return self.worker.call(ExportRequest(), min(10.0, self.deadline.left())).peak_bytes
        except WorkerFailure:
            return None


@dataclass(frozen=True)
class Launches:
    """What ran in one forward of a correct candidate (`launches`), or why that is not known."""

    kernels: KernelCount | None
    warning: str | None


def count_launches(run: CandidateRun) -> Launches:
    """What ran in one forward of a correct candidate: its own kernels or library ones (`launches`)."""
    from kernelbench_eval.common.launches import warning_for

    assert run.worker is not None
    started = time.perf_counter()
    try:  # accounting, not judging: a profiler that fails leaves the verdict as it was, with a note
        name = run.ref.lender.timing_sets()[0]  # a set it holds after the timing (trial sets are dropped by then)
        reply = run.worker.call(ProfileRequest(name=name, warmup=1), run.deadline.left())
        return Launches(reply.kernels, warning_for(reply.kernels))
    except WorkerFailure as exc:
        return Launches(None, f"launch accounting failed: {exc.message}"[:300])
    finally:
        run.tally.add_time("profile", time.perf_counter() - started)
