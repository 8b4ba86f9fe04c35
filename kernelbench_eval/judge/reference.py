"""The reference side of judging: one problem on one lane, its checker worker, its secrets and baselines.

The checker (the reference's worker) makes every input set from secret seeds, computes the expected
outputs once, keeps both in its own memory (on the GPU for a CUDA run) and does every comparison. The
harness holds only seeds, metadata and verdicts, and lends each candidate the checker's exchange buffer.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch

from kernelbench_eval.discover.corpus import Problem
from kernelbench_eval.discover.guard import user_paths
from kernelbench_eval.isolation.process import WorkerFailure, WorkerProcess
from kernelbench_eval.judge import conditions, memory
from kernelbench_eval.judge.baselines import BaselineStore
from kernelbench_eval.judge.carve import SEGMENT_ALIGN, in_place_enabled, pool_bytes
from kernelbench_eval.judge.exchange import layout_bytes, output_layout
from kernelbench_eval.judge.measure import Deadline, TimedModel, block_calls, measure
from kernelbench_eval.judge.refguard import Sched, snapshot
from kernelbench_eval.judge.stats import finite, per_call_ms, rse_per_call
from kernelbench_eval.messages import CheckResult, ExchangeInfo, MemoryPlan, Slot, TensorMeta, WorkerRequest
from kernelbench_eval.records import (
    Baseline,
    Conditions,
    MemoryRecord,
    RunSettings,
    TimingStats,
    baseline_key,
    now_utc,
)

STATEFUL_WARNING = ("the reference keeps state between calls (its outputs change on the same inputs): each model is "
                    "called once per trial from a fresh start, as KernelBench does, and timed calls are not compared")
TIMING_SETS = 3  # base input sets the timing loop rotates through (each call also gets a fresh scale)
COMPILE_MODE = "default"
SLACK_BYTES = 64 * 256  # alignment padding for the input sets' tensors in the exchange


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


class ReferenceFailure(WorkerFailure):
    """The checker failed while a candidate was being judged: the reference must be opened again."""


class ReferenceSide:
    """The reference of one problem, kept alive (in its checker worker) while the problem's candidates are judged."""

    def __init__(self, problem: Problem, settings: RunSettings, seeds: Secrets, log: Path, timeout: float,
                 compile_timeout: float, store: BaselineStore, env: dict[str, str] | None = None,
                 memory_share: float = 1.0) -> None:
        self.problem, self.settings, self.seeds, self.log = problem, settings, seeds, log
        self.timeout, self.compile_timeout, self.store = timeout, compile_timeout, store
        self.env = env or {}  # the lane's: CUDA_VISIBLE_DEVICES names its GPU
        self.workdir = Path(tempfile.mkdtemp(prefix="kbeval-ref-"))
        self.worker: WorkerProcess | None = None
        self.metas: list[list[TensorMeta]] = []  # per trial, the expected outputs' structure
        self.baseline: Baseline | None = None
        self.baseline_key: str | None = None
        self.baseline_remeasured: str | None = None  # why the stored baseline was not reused, when it was not
        self.alone: list[float] = []  # the reference's calls timed alone, what its interleaved time is checked against
        # the reference's time per call in each timing session so far (`stats.between_sessions`): on a GPU its
        # time alone is one (the flush makes alone and interleaved the same measurement), then one per candidate
        self.session_ms: list[float] = []
        self.sched: dict[int, Sched] = {}  # how its worker's threads were scheduled once opened (`refguard`)
        self.device_name: str | None = None
        self.input_bytes = 0
        self.memory_bytes: int | None = None  # the device's (the host's on the CPU), as the checker reports it
        self.parked = False  # its checker freed what only a timing needed (until its lane uses it again)
        self.bandwidth_gbs: float | None = None
        self.event_overhead_ms: float | None = None
        self.warning: str | None = None
        self.stateful = False  # its outputs change from call to call on the same inputs (`worker.trials`)
        self.error: str | None = None
        self.init_bytes = b""  # the init arguments, as the reference wrote them (each candidate gets a copy)
        self.broken = False  # the checker died mid-candidate: open the problem again for the next one
        self.ipc = settings.device == "cuda"  # lend the exchange by CUDA IPC until that is refused once
        self.ipc_refused: str | None = None  # why, when it was
        self.memory_share = memory_share  # of the device's budget: lanes sharing one device split it
        self.residency: MemoryPlan | None = None  # what the checker keeps resident (`memory`), once expected
        self.peak_bytes: int | None = None  # the checker's peak memory, as its replies reported it
        self.distributions: list[str] = []  # each trial's input distribution, as the checker settled them (`draws`)
        self.distributions_note: str | None = None  # those the reference refused, and why
        self.timed_error: float | None = None  # the judged candidate's largest error over its timed calls so far
        self._stack = ExitStack()

    # -- opening -------------------------------------------------------------------------------------

    def open(self) -> ReferenceSide:
        """Inputs, expected outputs and baselines; on failure `error` says why and candidates are skipped."""
        deadline = Deadline(self.timeout)
        try:
            self.worker = self._stack.enter_context(WorkerProcess(self.workdir, self.log, self.env,
                                                                  time_limit=self.timeout))
            prepared = self.worker.call(WorkerRequest(
                op="prepare", path=str(self.problem.path.resolve()), dims=self.settings.dims,
                trial_seeds=self.seeds.trial_seeds, timing_seeds=self.seeds.timing_seeds, device=self.settings.device,
                inputs_dir=str(self.workdir), precision=self.settings.precision), deadline.left())
            self.input_bytes = prepared.input_bytes
            loaded = self.worker.call(self.load_request("Model", self.problem.path), deadline.left())
            self.device_name, self.bandwidth_gbs = loaded.device_name, loaded.memory_bandwidth_gbs
            self.memory_bytes = loaded.memory_bytes
            self.event_overhead_ms = loaded.event_overhead_ms
            expected = self.worker.call(WorkerRequest(op="expect", trial_seeds=self.seeds.trial_seeds,
                                                      timing_seeds=self.seeds.timing_seeds,
                                                      atol=self.settings.atol, rtol=self.settings.rtol,
                                                      memory_budget=memory.forced_budget(),
                                                      memory_share=self.memory_share),
                                        deadline.left())
            self.metas, self.warning, self.residency = expected.expected, expected.warning, expected.residency
            self.stateful = expected.stateful
            if self.stateful:  # said once per problem, with the verdicts it shapes
                self.warning = "; ".join(filter(None, [self.warning, STATEFUL_WARNING]))
            self.distributions, self.distributions_note = expected.distributions, expected.distributions_note
            self._note_peak(expected.peak_bytes)
            self.baseline = self._baseline()
            self.alone = self.baseline.eager_samples if self.baseline else self.time_alone()
            if self.settings.device == "cuda" and self.alone:
                self.session_ms = [per_call_ms(self.alone)]
            self.sched = snapshot(self.worker.proc.pid) if self.worker.proc else {}
            init = self.workdir / "init.pt"  # read once, then gone: nothing in this folder for a candidate to alter
            self.init_bytes = init.read_bytes()
            init.unlink()
        except (WorkerFailure, OSError) as exc:
            self.error = user_paths(self.problem, f"{self.problem.shown}: reference: {getattr(exc, 'message', exc)}")
        return self

    def close(self) -> None:
        self._stack.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def park(self) -> None:
        """Free the checker's timing leftovers while other problems are judged; a failure marks it broken."""
        if self.parked or self.worker is None or self.broken or self.error:
            return
        try:
            self._call(WorkerRequest(op="park"))
            self.parked = True
        except ReferenceFailure:
            pass  # broken now: the next candidate of this problem opens it again

    def footprint(self) -> int:
        """Bytes its checker keeps while open: the input sets and expected outputs its memory plan keeps."""
        if self.residency is not None:
            return self.residency.resident_bytes
        sets = len(self.seeds.trial_seeds) + len(self.seeds.timing_seeds)
        return self.input_bytes * sets + self.output_bytes() * len(self.metas)

    @property
    def placements(self) -> int:
        """Live input buffers per worker in the timed calls, as the memory plan allows (0: the worker's own)."""
        return self.residency.placements if self.residency else 0

    def memory_record(self, candidate_peak: int | None) -> MemoryRecord | None:
        """The plan and both workers' peaks, for a verdict."""
        plan = self.residency
        if plan is None:
            return None
        return MemoryRecord(budget_bytes=plan.budget_bytes, need_bytes=plan.need_bytes, fits=plan.fits,
                            trial_inputs_resident=plan.trial_inputs, expected_resident=plan.expected,
                            timing_sets=plan.timing_sets, placements=plan.placements,
                            reference_peak_bytes=self.peak_bytes, candidate_peak_bytes=candidate_peak)

    def _note_peak(self, peak: int | None) -> None:
        if peak is not None:
            self.peak_bytes = max(self.peak_bytes or 0, peak)

    def load_request(self, class_name: str, path: Path, compile_mode: str | None = None,
                     model: str = "main", init_dir: Path | None = None) -> WorkerRequest:
        return WorkerRequest(op="load", path=str(path.resolve()), class_name=class_name, model=model,
                             init_file=str((init_dir or self.workdir) / "init.pt"), init_seed=self.seeds.init_seed,
                             device=self.settings.device, threads=self.settings.threads, compile_mode=compile_mode,
                             precision=self.settings.precision, problem=str(self.problem.path.resolve()),
                             dims=self.settings.dims)  # the names a candidate sees (`worker.namespace`)

    # -- what candidates are fed and checked against -----------------------------------------------

    def timing_sets(self) -> list[str]:
        """The base sets the timed calls rotate through: as many as the memory plan keeps."""
        count = self.residency.timing_sets if self.residency else len(self.seeds.timing_seeds)
        return [f"timing{k}" for k in range(count)]

    def output_bytes(self) -> int:
        return layout_bytes(output_layout(self.metas[0])[0]) if self.metas else 0

    def calls_per_block(self, in_place: bool = True) -> int:
        """Calls a timing block holds (`measure.block_calls`): with `in_place`, as this lane's candidates are timed
        (large outputs left in place where CUDA IPC lends the exchange and the device has room for its pool
        area), so that the reference alone keeps their cadence; else as where outputs are copied."""
        calls, area = self._in_place_block() if in_place else (0, 0)
        return calls if area else block_calls(self.output_bytes())

    def _in_place_block(self) -> tuple[int, int]:
        """(calls, pool area bytes) of the largest in-place block the device has room for; (0, 0): none (outputs
        small enough to copy, no CUDA IPC, the CPU, or no room). Room is the device's share (`carve.POOL_SHARE`)
        and what the memory plan left spare: the area is raw device memory of the checker's, beyond the exchange
        the plan counted (KernelBench's 23_Softmax at its current size: 19 GB, the difference between fitting an
        H200 and running out)."""
        if (block_calls(self.output_bytes()) > 1 or not self.ipc or self.settings.device != "cuda"
                or not in_place_enabled()):
            return 0, 0
        plan = self.residency
        spare = plan.budget_bytes - plan.need_bytes if plan else None
        for calls in sorted({block_calls(self.output_bytes(), in_place=True), 1}, reverse=True):  # the most that fit
            area = pool_bytes(self._slots(calls), self.output_bytes(), self.memory_bytes, calls)
            if area and (spare is None or area <= spare):
                return calls, area
        return 0, 0

    def timed_layout(self, calls: int) -> list[list[Slot]]:
        return output_layout(self.metas[0], calls)

    def lend(self, shm_dir: Path, pool: bool = True) -> ExchangeInfo:
        """A fresh exchange buffer for one candidate, big enough for an input set or a block's outputs; on a GPU,
        with `pool`, where outputs are large, followed by the area its timed calls allocate from (`carve`: outputs
        compared where the call put them, in blocks of several calls). `calls` says how many a block holds."""
        copied = self.calls_per_block(in_place=False)
        calls, area = self._in_place_block() if pool else (0, 0)
        calls = calls if area else copied
        slots = self._slots(calls)
        offset = -(-slots // SEGMENT_ALIGN) * SEGMENT_ALIGN if area else 0
        req = WorkerRequest(op="open_exchange", size=offset + area if area else slots, shm_dir=str(shm_dir),
                            name=None if self.ipc else "shm")
        exchange = self._call(req).exchange
        assert exchange is not None
        if area and exchange.kind == "cuda_ipc":
            exchange.pool_offset, exchange.calls = offset, calls
        else:
            exchange.calls = copied
        return exchange

    def _slots(self, calls: int) -> int:
        return max(self.input_bytes + SLACK_BYTES, self.output_bytes() * calls)

    def reclaim(self) -> None:
        if self.worker is not None and not self.broken:
            self._call(WorkerRequest(op="close_exchange"))

    def put(self, name: str) -> list[Slot]:
        return self._call(WorkerRequest(op="put", name=name)).slots

    def compare(self, trial: int, slots: list[Slot], outputs: list[TensorMeta]) -> CheckResult:
        check = self._call(WorkerRequest(op="compare", trial=trial, slots=slots, outputs=outputs)).check
        assert check is not None
        return check

    def compare_timed(self, calls: list[int], layout: list[list[Slot]], metas: list[list[TensorMeta]]
                      ) -> CheckResult:
        check = self._call(WorkerRequest(op="compare_timed", calls=calls, layout=layout, metas=metas)).check
        assert check is not None
        error = check.precision.candidate_error if check.precision else None
        if error is not None and (self.timed_error is None or error > self.timed_error):
            self.timed_error = error  # the candidate's precision over its timed calls (`judging`)
        return check

    def feed(self, worker: WorkerProcess, names: list[str], deadline: Deadline, drop: bool = False) -> None:
        """Give `worker` (attached to the lent exchange) its own copies of these input sets; `drop`: it lets go of
        those it held first (a candidate holds one trial's set at a time, then the timing's: `memory`)."""
        for i, name in enumerate(names):
            worker.call(WorkerRequest(op="take", name=name, slots=self.put(name), drop=drop and i == 0),
                        deadline.left())

    def floor_ms(self) -> float | None:
        if self.settings.device == "cuda" and self.bandwidth_gbs:
            return self.input_bytes / (self.bandwidth_gbs * 1e9) * 1e3
        return None

    def _call(self, req: WorkerRequest):  # noqa: ANN202 (a WorkerReply)
        assert self.worker is not None
        try:
            reply = self.worker.call(req, self.timeout)
            self._note_peak(reply.peak_bytes)
            return reply
        except WorkerFailure as exc:
            self.broken = True
            raise ReferenceFailure("crashed", f"the reference's worker failed ({exc.message})") from exc

    # -- baselines -----------------------------------------------------------------------------------

    def _baseline(self) -> Baseline | None:
        """From `baselines.json` when this machine measured it before in good conditions, else measured now
        (and stored, unless the stored one was measured in better conditions still: that one is used)."""
        if not self.settings.compile_baseline:
            return None
        key = self.baseline_key = baseline_key(self.problem.source_sha256, self.device_name or "",
                                               torch.__version__, self.settings.timing_key())
        with self.store.claim(key):  # another lane (or run) measuring it now: wait, then reuse its numbers
            stored = self.store.get(key)
            doubts = conditions.doubts(stored.conditions, self.settings) if stored else []
            if stored and not doubts:
                return stored
            fresh = self._measure_baseline()
            if stored is None:
                self.store.put(fresh)
                return fresh
            self.baseline_remeasured = "the stored baseline was measured again: " + "; ".join(doubts)
            kept = conditions.better(stored, fresh, self.settings)
            if kept is fresh:
                self.store.put(fresh)
            else:
                self.baseline_remeasured += " (and kept: this run's measurement was no better)"
            return kept

    def _measure_baseline(self) -> Baseline:
        assert self.worker is not None
        load = conditions.HostLoad(self.worker.proc.pid if self.worker.proc else None)
        eager = self._measure_alone(self.worker, Deadline(self.timeout))
        found = Conditions(eager_rse=finite(rse_per_call(eager)), others_cores=load.others_cores(),
                           cores=os.cpu_count() or 1, threads=self.settings.threads or 1, seconds=load.seconds())
        baseline = Baseline(problem=self.problem.problem_id, source_sha256=self.problem.source_sha256,
                            device_name=self.device_name or "", torch_version=torch.__version__,
                            timing_key=self.settings.timing_key(), eager=TimingStats.from_samples(eager),
                            eager_samples=eager, compile_mode=COMPILE_MODE, measured_at=now_utc(), conditions=found)
        self._measure_compiled(baseline)
        if baseline.compiled_samples:
            found.compiled_rse = finite(rse_per_call(baseline.compiled_samples))
        return baseline

    def time_alone(self, budget: float | None = None, between: Callable[[], None] | None = None) -> list[float]:
        """The reference's calls timed with nothing interleaved (no candidate, or one stopped), within `budget` s;
        `between` runs before each block, outside its clock (`refguard.StandIn`)."""
        assert self.worker is not None
        settings = self.settings if budget is None else self.settings.model_copy(update={"timing_budget": budget})
        return self._measure_alone(self.worker, Deadline(self.timeout), settings, between)

    def _measure_alone(self, worker: WorkerProcess, deadline: Deadline, settings: RunSettings | None = None,
                       between: Callable[[], None] | None = None) -> list[float]:
        timed = TimedModel(worker, before=between)
        measure([timed], self.timing_sets(), settings or self.settings, deadline, self.calls_per_block())
        return timed.event_ms

    def _measure_compiled(self, baseline: Baseline) -> None:
        """torch.compile in a worker of its own: a compiler crash or hang must not take the checker with it."""
        deadline = Deadline(self.compile_timeout)
        try:
            env = self.env | {"TORCHINDUCTOR_COMPILE_THREADS": "1"}  # leave the cores to the candidates' builds
            with WorkerProcess(self.workdir, self.log, env, time_limit=self.compile_timeout) as worker:
                worker.call(self.load_request("Model", self.problem.path, COMPILE_MODE), deadline.left())
                worker.call(WorkerRequest(op="attach", exchange=self.lend(self.workdir, pool=False),
                                          placements=self.placements), deadline.left())
                self.feed(worker, self.timing_sets(), deadline)
                samples = self._measure_alone(worker, deadline)
            baseline.compiled, baseline.compiled_samples = TimingStats.from_samples(samples), samples
        except WorkerFailure as exc:
            baseline.compile_error = user_paths(self.problem, f"torch.compile baseline: {exc.message}")
        finally:
            self.reclaim()


def describe_problem(problem: Problem, dims: dict[str, int | float], timeout: float) -> tuple[list[str], str | None]:
    """Input shapes of one problem (for `kbeval problems`), from its own worker; (shapes, error)."""
    with tempfile.TemporaryDirectory(prefix="kbeval-describe-") as tmp:
        req = WorkerRequest(op="prepare", path=str(problem.path.resolve()), dims=dims, trial_seeds=[0], inputs_dir=tmp)
        try:
            with WorkerProcess(Path(tmp), Path(tmp) / "log") as worker:
                reply = worker.call(req, timeout)
        except WorkerFailure as failure:
            return [], failure.message
        return reply.input_shapes, None
