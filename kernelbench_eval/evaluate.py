"""Stages 3 and 4: check a compiled candidate against its problem's reference, then time both.

The reference runs first, in its own worker, once per problem: it writes the init arguments and one
input set per trial seed, and its outputs are loaded into the harness (then deleted from disk) before
any candidate starts. Each candidate then gets a fresh worker in a private directory holding copies of
the inputs only; the harness compares what it sends back.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kernelbench_eval.check import compare_outputs
from kernelbench_eval.compile import Compiled, extension_env
from kernelbench_eval.discover import Problem
from kernelbench_eval.models import RunManifest, TensorMeta, TimingStats, WorkerReply, WorkerRequest
from kernelbench_eval.process import WorkerFailure, WorkerProcess


@dataclass
class Reference:
    problem: Problem
    workdir: Path
    log: Path
    outputs: list[list[torch.Tensor]] = field(default_factory=list)
    metas: list[list[TensorMeta]] = field(default_factory=list)
    stats: TimingStats | None = None
    device_name: str | None = None
    error: str | None = None

    def input_file(self, trial: int) -> Path:
        return self.workdir / f"inputs_{trial}.pt"

    def discard(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)


@dataclass
class Outcome:
    """What evaluating one candidate found; the pipeline turns it into a Verdict."""

    status: str
    error: str | None = None
    trials_passed: int = 0
    max_abs_diff: float | None = None
    mean_abs_diff: float | None = None
    stats: TimingStats | None = None
    device_name: str | None = None
    mutates_inputs: bool = False


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return max(self.end - time.monotonic(), 0.1)


def prepare_reference(problem: Problem, manifest: RunManifest, log: Path, timeout: float) -> Reference:
    """Run the problem's Model in its own worker: inputs for every trial, expected outputs, timing."""
    settings = manifest.settings
    ref = Reference(problem, Path(tempfile.mkdtemp(prefix="kbeval-ref-")), log)
    deadline = _Deadline(timeout)
    requests = [
        WorkerRequest(op="prepare", path=str(problem.path.resolve()), dims=settings.dims,
                      trial_seeds=manifest.trial_seeds, inputs_dir=str(ref.workdir)),
        _load_request(problem.path, "Model", ref.workdir, manifest),
    ]
    try:
        with WorkerProcess(ref.workdir, log, time_limit=timeout) as worker:
            for req in requests:
                reply = worker.request(req, deadline.left())
                if not reply.ok:
                    ref.error = f"{problem.path}: {reply.error}"
                    return ref
                ref.device_name = reply.device_name or ref.device_name
            for trial in range(len(manifest.trial_seeds)):
                out_file = ref.workdir / f"expected_{trial}.pt"
                reply = _ok(worker.request(_run_request(ref.input_file(trial), out_file), deadline.left()))
                ref.metas.append(reply.outputs)
                ref.outputs.append(torch.load(out_file, weights_only=True, mmap=True))
                out_file.unlink()  # expected values live only in the harness from here on
            reply = _ok(worker.request(_time_request(ref.input_file(0), settings), deadline.left()))
            ref.stats = TimingStats.from_samples(reply.samples_ms)
    except (WorkerFailure, _ReplyError) as exc:
        ref.error = f"{problem.path}: reference {exc}"
    return ref


def evaluate_candidate(compiled: Compiled, path: Path, ref: Reference, manifest: RunManifest,
                       log: Path, timeout: float) -> Outcome:
    """Load, check over every trial, and (only when all pass) time one candidate in a fresh worker."""
    settings = manifest.settings
    deadline = _Deadline(timeout)
    with tempfile.TemporaryDirectory(prefix="kbeval-cand-") as tmp:
        workdir = Path(tmp)
        for name in ["init.pt"] + [ref.input_file(k).name for k in range(len(ref.outputs))]:
            shutil.copyfile(ref.workdir / name, workdir / name)
        outcome = Outcome(status="ok")
        stage = "loading"
        try:
            with WorkerProcess(workdir, log, extension_env(compiled.build_dir), time_limit=timeout) as worker:
                reply = worker.request(_load_request(path, "ModelNew", workdir, manifest), deadline.left())
                if not reply.ok:
                    return Outcome(status=reply.error_kind or "load_error", error=reply.error)
                outcome.device_name = reply.device_name
                for trial in range(len(ref.outputs)):
                    stage = f"trial {trial}"
                    if not _check_trial(worker, workdir, trial, ref, settings, outcome, deadline):
                        return outcome
                stage = "timing"
                reply = _ok(worker.request(_time_request(workdir / "inputs_0.pt", settings), deadline.left()))
                outcome.stats = TimingStats.from_samples(reply.samples_ms)
        except WorkerFailure as failure:
            outcome.status, outcome.error = failure.status, f"{stage}: {failure.message}"
        except _ReplyError as exc:
            outcome.status, outcome.error = exc.kind, f"{stage}: {exc}"
        return outcome


def _check_trial(worker: WorkerProcess, workdir: Path, trial: int, ref: Reference, settings,
                 outcome: Outcome, deadline: _Deadline) -> bool:
    out_file = workdir / f"out_{trial}.pt"
    reply = _ok(worker.request(_run_request(workdir / f"inputs_{trial}.pt", out_file), deadline.left()))
    outcome.mutates_inputs = outcome.mutates_inputs or reply.mutated_inputs
    try:
        got = torch.load(out_file, weights_only=True, mmap=True)
    except Exception as exc:  # a forged or unpicklable output is the candidate's failure
        outcome.status, outcome.error = "incorrect", f"trial {trial}: outputs could not be read back ({exc})"
        return False
    result = compare_outputs(ref.outputs[trial], ref.metas[trial], got, reply.outputs, settings.atol, settings.rtol)
    out_file.unlink(missing_ok=True)
    if result.max_abs_diff is not None:
        outcome.max_abs_diff = max(outcome.max_abs_diff or 0.0, result.max_abs_diff)
        outcome.mean_abs_diff = max(outcome.mean_abs_diff or 0.0, result.mean_abs_diff or 0.0)
    if not result.passed:
        outcome.status, outcome.error = "incorrect", f"trial {trial}: {result.error}"
        return False
    outcome.trials_passed += 1
    return True


class _ReplyError(Exception):
    def __init__(self, reply: WorkerReply) -> None:
        super().__init__(reply.error or "failed")
        self.kind = reply.error_kind or "runtime_error"


def _ok(reply: WorkerReply) -> WorkerReply:
    if not reply.ok:
        raise _ReplyError(reply)
    return reply


def _load_request(path: Path, class_name: str, workdir: Path, manifest: RunManifest) -> WorkerRequest:
    settings = manifest.settings
    return WorkerRequest(op="load", path=str(path.resolve()), class_name=class_name,
                         init_file=str(workdir / "init.pt"), init_seed=manifest.init_seed,
                         device=settings.device, threads=settings.threads)


def _run_request(inputs: Path, output: Path) -> WorkerRequest:
    return WorkerRequest(op="run", inputs_file=str(inputs), output_file=str(output))


def _time_request(inputs: Path, settings) -> WorkerRequest:
    return WorkerRequest(op="time", inputs_file=str(inputs), warmup=settings.warmup, reps=settings.reps)


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
