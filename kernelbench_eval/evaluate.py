"""Stages 3 and 4: check a compiled candidate against its problem's reference, then time both side by side.

One `ProblemSession` per problem keeps the reference's worker alive: it writes the init arguments, one
input set per trial seed and a few timing input sets, and its outputs are loaded into the harness (then
deleted from disk) before any candidate starts. Each candidate then gets two fresh workers in a private
directory holding copies of the inputs only: one for correctness (synchronous CUDA launches, each trial
run twice over memory filled with different sentinels) and one for timing, interleaved with the
reference's own worker. The harness compares everything the candidate sends back, timed calls included.
"""

from __future__ import annotations

import secrets
import shutil
import statistics
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from kernelbench_eval.baselines import BaselineStore
from kernelbench_eval.check import (
    TrialCheck,
    compare_fingerprints,
    compare_outputs,
    degenerate_outputs,
    same_fingerprint,
)
from kernelbench_eval.compile import Compiled, build_lock, extension_env
from kernelbench_eval.discover import Problem
from kernelbench_eval.measure import Deadline, Lane, LaneError, block_calls, measure, sm_clock_mhz
from kernelbench_eval.models import (
    Baseline,
    RunSettings,
    TensorMeta,
    Timing,
    TimingStats,
    WorkerReply,
    WorkerRequest,
    baseline_key,
)
from kernelbench_eval.plausibility import Judgement, judge, speedup_reason
from kernelbench_eval.process import WorkerFailure, WorkerProcess
from kernelbench_eval.stats import chained_speedup_ci, rse_of_median, speedup_ci
from kernelbench_eval.timing import fingerprint

TIMING_SETS = 3  # base input sets the timing loop rotates through (each call also gets a fresh scale)
SENTINELS = (0xFF, 0x00)  # NaN-filled, then zero-filled free memory: uninitialised reads cannot pass both
MAX_TIMED_CHECKS = 4
LARGE_OUTPUT = 64 << 20  # above this, only the first and last blocks are read back in full (fingerprints check all)
COMPILE_MODE = "default"


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


@dataclass
class Outcome:
    """What evaluating one candidate found; the pipeline turns it into a Verdict."""

    status: str
    error: str | None = None
    trials_passed: int = 0
    max_abs_diff: float | None = None
    mean_abs_diff: float | None = None
    runtime_ms: float | None = None
    stats: TimingStats | None = None
    timing: Timing | None = None
    speedup_vs_compile: float | None = None
    speedup_vs_compile_ci: tuple[float, float] | None = None
    device_name: str | None = None
    mutates_inputs: bool = False


class _ReplyError(Exception):
    def __init__(self, reply: WorkerReply) -> None:
        super().__init__(reply.error or "failed")
        self.kind = reply.error_kind or "runtime_error"


def _ok(reply: WorkerReply) -> WorkerReply:
    if not reply.ok:
        raise _ReplyError(reply)
    return reply


@dataclass
class _Timed:
    """One interleaved measurement of the candidate against the reference."""

    ref: Lane
    cand: Lane
    blocks: int
    checks: int
    clocks: list[int | None]
    seconds: float


@dataclass
class ProblemSession:
    """The reference of one problem, kept alive (in its own worker) while its candidates are judged."""

    problem: Problem
    settings: RunSettings
    seeds: Secrets
    log: Path
    timeout: float
    compile_timeout: float
    store: BaselineStore
    env: dict[str, str] = field(default_factory=dict)  # the lane's: CUDA_VISIBLE_DEVICES names its GPU
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="kbeval-ref-")))
    outputs: list[list[torch.Tensor]] = field(default_factory=list)
    metas: list[list[TensorMeta]] = field(default_factory=list)
    baseline: Baseline | None = None
    baseline_key: str | None = None
    device_name: str | None = None
    input_bytes: int = 0
    bandwidth_gbs: float | None = None
    event_overhead_ms: float | None = None
    warning: str | None = None
    error: str | None = None
    _stack: ExitStack = field(default_factory=ExitStack)
    worker: WorkerProcess | None = None

    # -- the reference -------------------------------------------------------------------------------

    def open(self) -> ProblemSession:
        """Inputs, expected outputs and baselines; on failure `error` says why and candidates are skipped."""
        deadline = Deadline(self.timeout)
        try:
            self.worker = self._stack.enter_context(WorkerProcess(self.workdir, self.log, self.env,
                                                                              time_limit=self.timeout))
            prepared = _ok(self.worker.request(self._prepare_request(), deadline.left()))
            self.input_bytes = prepared.input_bytes
            loaded = _ok(self.worker.request(self._load_request("Model", self.problem.path, self.workdir),
                                             deadline.left()))
            self.device_name, self.bandwidth_gbs = loaded.device_name, loaded.memory_bandwidth_gbs
            self.event_overhead_ms = loaded.event_overhead_ms
            for trial in range(len(self.seeds.trial_seeds)):
                out_file = self.workdir / f"expected_{trial}.pt"
                reply = _ok(self.worker.request(_run_request(self.input_file(trial), out_file), deadline.left()))
                self.metas.append(reply.outputs)
                self.outputs.append(_load_private(out_file))
                out_file.unlink()  # expected values live only in the harness's private memory from here on
            self.warning = degenerate_outputs(self.outputs[0], self.settings.atol, self.settings.rtol)
            self.baseline = self._baseline()
        except (WorkerFailure, _ReplyError, LaneError) as exc:
            self.error = f"{self.problem.path}: reference: {exc}"
        return self

    def close(self) -> None:
        self._stack.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def input_file(self, trial: int) -> Path:
        return self.workdir / f"inputs_{trial}.pt"

    def timing_files(self) -> list[str]:
        """Relative names: each worker reads its own copies, from its own working directory."""
        return [f"timing_{k}.pt" for k in range(len(self.seeds.timing_seeds))]

    def output_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.outputs[0] if isinstance(t, torch.Tensor))

    def output_numels(self) -> list[int]:
        return [t.numel() if isinstance(t, torch.Tensor) else 0 for t in self.outputs[0]]

    def _prepare_request(self) -> WorkerRequest:
        return WorkerRequest(op="prepare", path=str(self.problem.path.resolve()), dims=self.settings.dims,
                             trial_seeds=self.seeds.trial_seeds, timing_seeds=self.seeds.timing_seeds,
                             inputs_dir=str(self.workdir))

    def _load_request(self, class_name: str, path: Path, workdir: Path, compile_mode: str | None = None
                      ) -> WorkerRequest:
        return WorkerRequest(op="load", path=str(path.resolve()), class_name=class_name,
                             init_file=str(workdir / "init.pt"), init_seed=self.seeds.init_seed,
                             device=self.settings.device, threads=self.settings.threads, compile_mode=compile_mode)

    # -- baselines -----------------------------------------------------------------------------------

    def _baseline(self) -> Baseline | None:
        """From `baselines.json` when this machine measured it before, else measured (and stored) now."""
        if not self.settings.compile_baseline:
            return None
        key = self.baseline_key = baseline_key(self.problem.source_sha256, self.device_name or "",
                                               torch.__version__, self.settings.timing_key())
        with self.store.claim(key):  # another lane (or run) measuring it now: wait, then reuse its numbers
            return self.store.get(key) or self._measure_baseline()

    def _measure_baseline(self) -> Baseline:
        eager = self._measure_alone(self.worker, Deadline(self.timeout))
        baseline = Baseline(problem=self.problem.problem_id, source_sha256=self.problem.source_sha256,
                            device_name=self.device_name or "", torch_version=torch.__version__,
                            timing_key=self.settings.timing_key(), eager=TimingStats.from_samples(eager),
                            eager_samples=eager, compile_mode=COMPILE_MODE, measured_at=_now())
        self._measure_compiled(baseline)
        self.store.put(baseline)
        return baseline

    def _measure_alone(self, worker: WorkerProcess, deadline: Deadline) -> list[float]:
        lane = Lane(worker)
        measure([lane], self.timing_files(), self.settings, deadline, block_calls(self.output_bytes()))
        return lane.event_ms

    def _measure_compiled(self, baseline: Baseline) -> None:
        deadline = Deadline(self.compile_timeout)
        try:
            with WorkerProcess(self.workdir, self.log, self.env, time_limit=self.compile_timeout) as worker:
                _ok(worker.request(self._load_request("Model", self.problem.path, self.workdir, COMPILE_MODE),
                                   deadline.left()))
                samples = self._measure_alone(worker, deadline)
            baseline.compiled, baseline.compiled_samples = TimingStats.from_samples(samples), samples
        except (WorkerFailure, _ReplyError, LaneError) as exc:
            baseline.compile_error = f"torch.compile baseline: {exc}"

    # -- candidates ----------------------------------------------------------------------------------

    def judge(self, compiled: Compiled, path: Path, log: Path, timeout: float) -> Outcome:
        """Check over every trial, then (only when all pass) time one candidate against the reference."""
        deadline = Deadline(timeout)
        outcome = Outcome(status="ok")
        with tempfile.TemporaryDirectory(prefix="kbeval-cand-") as tmp:
            workdir = Path(tmp)
            names = ["init.pt"] + [f"inputs_{k}.pt" for k in range(len(self.outputs))]
            names += self.timing_files()
            for name in names:
                shutil.copyfile(self.workdir / name, workdir / name)
            stage = "loading"
            try:
                env = self.env | extension_env(compiled.build_dir)
                if self.settings.device == "cuda":
                    env["CUDA_LAUNCH_BLOCKING"] = "1"  # a faulting kernel is reported at its own launch
                with WorkerProcess(workdir, log, env, time_limit=timeout) as worker:
                    if not self._load_candidate(worker, path, workdir, compiled, outcome, deadline):
                        return outcome
                    for trial in range(len(self.outputs)):
                        stage = f"trial {trial}"
                        if not self._check_trial(worker, workdir, trial, outcome, deadline):
                            return outcome
                stage = "timing"
                env = self.env | extension_env(compiled.build_dir)
                with WorkerProcess(workdir, log, env, time_limit=timeout) as worker:
                    if not self._load_candidate(worker, path, workdir, compiled, outcome, deadline):
                        return outcome
                    self._time(worker, workdir, outcome, deadline)
            except WorkerFailure as failure:
                outcome.status, outcome.error = failure.status, f"{stage}: {failure.message}"
            except (_ReplyError, LaneError) as exc:
                outcome.status, outcome.error = exc.kind, f"{stage}: {exc}"
        return outcome

    def _load_candidate(self, worker: WorkerProcess, path: Path, workdir: Path, compiled: Compiled,
                        outcome: Outcome, deadline: Deadline) -> bool:
        with build_lock(compiled.build_dir):  # load_inline's own lock file may be stale (see build_lock)
            reply = worker.request(self._load_request("ModelNew", path, workdir), deadline.left())
        if not reply.ok:
            outcome.status, outcome.error = reply.error_kind or "load_error", reply.error
            return False
        outcome.device_name = reply.device_name
        return True

    def _check_trial(self, worker: WorkerProcess, workdir: Path, trial: int, outcome: Outcome,
                     deadline: Deadline) -> bool:
        """Two runs of the trial over differently filled free memory; both must match the reference."""
        results: list[TrialCheck] = []
        for sentinel in SENTINELS:
            out_file = workdir / f"out_{trial}.pt"
            req = _run_request(workdir / f"inputs_{trial}.pt", out_file, sentinel)
            reply = _ok(worker.request(req, deadline.left()))
            outcome.mutates_inputs = outcome.mutates_inputs or reply.mutated_inputs
            if reply.launch_error:
                return _fail(outcome, f"trial {trial}: a kernel launch failed without raising: {reply.launch_error}")
            result = self._compare(out_file, self.outputs[trial], self.metas[trial], reply.outputs, outcome)
            results.append(result)
            if not result.passed:
                why = result.error
                if len(results) == 2:
                    why = (f"it passed once and failed over memory filled with 0x{sentinel:02X}: reads uninitialised "
                           f"memory ({why})")
                return _fail(outcome, f"trial {trial}: {why}")
        outcome.trials_passed += 1
        return True

    def _compare(self, out_file: Path, expected: list[torch.Tensor], metas: list[TensorMeta],
                 got_metas: list[TensorMeta], outcome: Outcome) -> TrialCheck:
        try:
            got = _load_private(out_file)
        except Exception as exc:  # a forged or unpicklable output is the candidate's failure
            return TrialCheck(False, error=f"outputs could not be read back ({exc})")
        finally:
            out_file.unlink(missing_ok=True)
        return self._compare_loaded(got, expected, metas, got_metas, outcome)

    def _compare_loaded(self, got: list, expected: list[torch.Tensor], metas: list[TensorMeta],
                        got_metas: list[TensorMeta], outcome: Outcome) -> TrialCheck:
        result = compare_outputs(expected, metas, got, got_metas, self.settings.atol, self.settings.rtol)
        if result.max_abs_diff is not None:
            outcome.max_abs_diff = max(outcome.max_abs_diff or 0.0, result.max_abs_diff)
            outcome.mean_abs_diff = max(outcome.mean_abs_diff or 0.0, result.mean_abs_diff or 0.0)
        return result

    # -- timing --------------------------------------------------------------------------------------

    def _time(self, worker: WorkerProcess, workdir: Path, outcome: Outcome, deadline: Deadline) -> None:
        """Measure, and measure again once when the clocks disagree: a tampered timer disagrees every time,
        a burst of host load (a busy CPU box) rarely twice. Only the last measurement is reported."""
        for attempt in (1, 2):
            timed = self._measure_once(worker, workdir, outcome, deadline)
            if timed is None:
                return
            verdict = judge(timed.ref, timed.cand, self.settings.device, self._floor(), self.settings.threads)
            if verdict.speedup_trusted or attempt == 2:
                self._record_timing(timed, verdict, attempt, outcome)
                return

    def _measure_once(self, worker: WorkerProcess, workdir: Path, outcome: Outcome, deadline: Deadline
                      ) -> _Timed | None:
        """Interleave the candidate's lane with the reference's, checking a random timed call now and then."""
        assert self.worker is not None
        ref, cand = Lane(self.worker), Lane(worker)
        rng = secrets.SystemRandom()
        checked: list[int] = []

        def check(block: int, schedule: list[tuple[int, float, int]], always: bool = False) -> None:
            if outcome.status != "ok":
                return
            if not always:  # every call of every block, by fingerprint
                why = compare_fingerprints(ref.last.fingerprints, cand.last.fingerprints, self.output_numels(),
                                           self.settings.atol, self.settings.rtol)
                if why:
                    _fail(outcome, f"block {block}, {why} (every timed call is checked)")
                    return
            sampled = self.output_bytes() <= LARGE_OUTPUT and len(checked) < MAX_TIMED_CHECKS and rng.random() < 0.25
            if always or block == 0 or sampled:
                call = rng.randrange(len(schedule))
                self._check_timed_call(ref, cand, workdir, (block, call), outcome, deadline)
                checked.append(block)

        gpu = self.env.get("CUDA_VISIBLE_DEVICES")
        clocks = [sm_clock_mhz(gpu)] if self.settings.device == "cuda" else []
        started = time.monotonic()
        result = measure([ref, cand], self.timing_files(), self.settings, deadline, block_calls(self.output_bytes()),
                         check)
        check(result.blocks, result.last_schedule, always=True)
        if outcome.status != "ok":
            return None
        clocks += [sm_clock_mhz(gpu)] if clocks else []
        return _Timed(ref, cand, result.blocks, len(checked), clocks, time.monotonic() - started)

    def _floor(self) -> float | None:
        if self.settings.device == "cuda" and self.bandwidth_gbs:
            return self.input_bytes / (self.bandwidth_gbs * 1e9) * 1e3
        return None

    def _check_timed_call(self, ref: Lane, cand: Lane, workdir: Path, where: tuple[int, int], outcome: Outcome,
                          deadline: Deadline) -> None:
        """Compare the outputs of call `where` = (block, call) of the last block both lanes timed."""
        if outcome.status != "ok":
            return
        index = where[1]
        expected_file, got_file = self.workdir / "timed_expected.pt", workdir / "timed_out.pt"
        # the candidate answers first: the reference's output never exists on disk while it can still act
        got_reply = _ok(cand.worker.request(WorkerRequest(op="dump", index=index, output_file=str(got_file)),
                                            deadline.left()))
        got = _load_private(got_file)
        expected_reply = _ok(ref.worker.request(WorkerRequest(op="dump", index=index,
                                                              output_file=str(expected_file)), deadline.left()))
        expected = _load_private(expected_file)
        expected_file.unlink()
        where_text = f"timed call {where[1]} of block {where[0]}"
        reported = cand.last.fingerprints[index] if cand.last else []
        if len(reported) != len(got) or not all(
                same_fingerprint(r, fingerprint(g)) for r, g in zip(reported, got, strict=False)):
            _fail(outcome, f"{where_text}: the output read back is not the one produced when the call was timed")
            return
        result = self._compare_loaded(got, expected, expected_reply.outputs, got_reply.outputs, outcome)
        if not result.passed:
            _fail(outcome, f"{where_text}: {result.error} (timed calls are checked too)")

    def _record_timing(self, timed: _Timed, verdict: Judgement, attempts: int, outcome: Outcome) -> None:
        ref, cand, clocks = timed.ref, timed.cand, timed.clocks
        speedup = ref.median() / verdict.runtime_ms if verdict.speedup_trusted and verdict.runtime_ms > 0 else None
        reason = speedup_reason(speedup, self.settings.max_speedup)
        reasons = verdict.reasons + ([reason] if reason else [])
        outcome.runtime_ms = verdict.runtime_ms
        outcome.stats = TimingStats.from_samples(cand.event_ms)
        outcome.timing = Timing(
            candidate=outcome.stats, reference=TimingStats.from_samples(ref.event_ms), speedup=speedup,
            speedup_ci=speedup_ci(ref.event_ms, _shifted(cand.event_ms, verdict.runtime_ms)) if speedup else None,
            blocks=timed.blocks, checked_calls=timed.checks, attempts=attempts, rse=_rse(cand), ref_rse=_rse(ref),
            wall_ms_per_call=cand.wall_per_call(), ref_wall_ms_per_call=ref.wall_per_call(),
            unexplained_ms=cand.unexplained() - ref.unexplained(),
            device_tail_ms=cand.device_tail() if self.settings.device == "cuda" else None,
            ref_device_tail_ms=ref.device_tail() if self.settings.device == "cuda" else None,
            event_overhead_ms=self.event_overhead_ms,
            sm_clock_mhz=(clocks[0], clocks[-1]) if clocks else None,
            cuda_graph=self.settings.cuda_graph and cand.graph_error is None, graph_error=cand.graph_error,
            floor_ms=self._floor(), seconds=timed.seconds)
        if speedup and self.baseline and self.baseline.compiled:
            base = self.baseline
            outcome.speedup_vs_compile = base.compiled.median_ms / base.eager.median_ms * speedup
            outcome.speedup_vs_compile_ci = chained_speedup_ci(
                base.compiled_samples, base.eager_samples, ref.event_ms, _shifted(cand.event_ms, verdict.runtime_ms))
        if reasons:
            outcome.status, outcome.error = "suspicious", "suspicious: " + "; ".join(reasons)


def _load_private(path: Path) -> list:
    """Read outputs into the harness's anonymous memory: no file mapping a candidate could open via /proc."""
    return torch.load(path, weights_only=True, mmap=False)


def _shifted(samples: list[float], runtime_ms: float) -> list[float]:
    """Samples moved so their median is the runtime we stand behind (device-wide when work escaped)."""
    shift = runtime_ms - statistics.median(samples)
    return [s + shift for s in samples] if shift else samples


def _rse(lane: Lane) -> float:
    return rse_of_median(lane.event_ms)


def _fail(outcome: Outcome, error: str) -> bool:
    outcome.status, outcome.error = "incorrect", error
    return False


def _run_request(inputs: Path, output: Path, sentinel: int | None = None) -> WorkerRequest:
    return WorkerRequest(op="run", inputs_file=str(inputs), output_file=str(output), sentinel=sentinel)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def describe_problem(problem: Problem, dims: dict[str, int | float], timeout: float) -> tuple[list[str], str | None]:
    """Input shapes of one problem (for `kbeval problems`), from its own worker; (shapes, error)."""
    with tempfile.TemporaryDirectory(prefix="kbeval-describe-") as tmp:
        req = WorkerRequest(op="prepare", path=str(problem.path.resolve()), dims=dims, trial_seeds=[0],
                            inputs_dir=tmp)
        try:
            with WorkerProcess(Path(tmp), Path(tmp) / "log") as worker:
                reply = worker.request(req, timeout)
        except WorkerFailure as failure:
            return [], failure.message
        if not reply.ok:
            return [], reply.error
        return reply.input_shapes, None
