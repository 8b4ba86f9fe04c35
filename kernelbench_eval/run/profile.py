"""`kbeval profile PROBLEM CANDIDATE`: what ran, kernel by kernel, in one forward of the candidate and the reference.

Each model runs in its own worker process (`process.WorkerProcess`), as in judging: the candidate is
untrusted code and may crash, hang or poison its CUDA context. The reference's worker makes the inputs
(one secret seed, the `--dim` overrides and the precision); both models are built after the same seed,
warmed up, then profiled once by `launches.profile_model` (worker op `profile`). The candidate imports from
its build in the build cache, under the build's lock, so a profile reuses (or leaves) the judged build.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from rich.table import Table

from kernelbench_eval.budgets import DEFAULT as DEFAULT_BUDGETS
from kernelbench_eval.budgets import Budgets
from kernelbench_eval.building.compile import build_lock, compile_candidate, extension_env, private_triton
from kernelbench_eval.building.jitwarmup import WarmupSpec
from kernelbench_eval.discover.corpus import Candidate, Problem, make_candidate, sha256_file
from kernelbench_eval.isolation import sandbox
from kernelbench_eval.isolation.process import WorkerFailure, WorkerProcess
from kernelbench_eval.messages import ProfileReply
from kernelbench_eval.records import Device, KernelCount, KernelRow
from kernelbench_eval.requests import LoadRequest, PrepareRequest, ProfileRequest, Request


class ModelProfile(BaseModel):
    """One model's side of the profile: its per-kernel rows and counts, or why it could not be profiled."""

    role: str  # "reference" or "candidate"
    kernels: KernelCount | None = None
    rows: list[KernelRow] = Field(default_factory=list)
    error: str | None = None
    log: str | None = None


class ProfileReport(BaseModel):
    problem: str
    candidate: str
    device: Device
    precision: str
    reference: ModelProfile
    candidate_profile: ModelProfile


def profile_pair(problem_path: Path, candidate_path: Path, device: Device, cache_dir: Path, *,
                 dims: dict[str, int | float] | None = None, precision: str = "fp32", threads: int | None = None,
                 budgets: Budgets = DEFAULT_BUDGETS, warmup: int = 3) -> ProfileReport:
    """Profile the reference and the candidate, each in a fresh worker; never raises for the candidate's faults.
    `budgets`: the reference's worker, the candidate's and the candidate's build each get theirs."""
    seed = secrets.randbits(31)
    work = Path(tempfile.mkdtemp(prefix="kbeval-profile-"))
    prob = Problem(problem_id=problem_path.stem, path=problem_path, source_sha256=sha256_file(problem_path))
    cand = make_candidate(prob, candidate_path)
    common = dict(device=device, threads=threads, precision=precision, init_seed=seed, dims=dims or {},
                  problem=str(problem_path.resolve()))  # each load's; the candidate's module sees the problem's names
    inputs = work / "inputs"
    inputs.mkdir()
    prepare = PrepareRequest(path=str(problem_path.resolve()), trial_seeds=[seed], inputs_dir=str(inputs),
                             save_inputs=True, device=device, precision=precision, dims=dims or {})
    ref = _profile_one("reference", problem_path, "Model", work, inputs, {}, budgets.reference, warmup, common,
                       prepare)
    if cand.invalid or (cand.devices and device not in cand.devices):
        why = cand.invalid or f"{candidate_path} needs {', '.join(cand.devices or ())}, not {device}"
        got = ModelProfile(role="candidate", error=why)
    elif ref.error:
        got = ModelProfile(role="candidate", error="not profiled: the reference could not be")
    else:
        warm = WarmupSpec(problem_path, prob.source_sha256, tuple(sorted((dims or {}).items())), precision)
        got = _profile_candidate(cand, device, cache_dir, work, inputs, budgets, warmup, common, warm)
    if not ref.error and not got.error:
        shutil.rmtree(work, ignore_errors=True)  # logs are kept only when something failed
    return ProfileReport(problem=prob.problem_id, candidate=cand.candidate_id, device=device, precision=precision,
                         reference=ref, candidate_profile=got)


def _profile_candidate(cand: Candidate, device: Device, cache_dir: Path, work: Path, inputs: Path, budgets: Budgets,
                       warmup: int, common: dict, warm: WarmupSpec) -> ModelProfile:
    """Built (or found built, warmed up for these inputs) as a run builds it, then profiled from its verified
    build, with a private copy of its Triton cache (`compile.private_triton`)."""
    compiled = compile_candidate(cand, device, cache_dir, work / "candidate.compile.log", budgets.build, warm)
    if not compiled.record.ok:
        return ModelProfile(role="candidate", error=f"{compiled.record.status}: {compiled.record.error}")
    try:
        with build_lock(compiled.build_dir):
            private_triton(compiled.build_dir, work / "candidate-triton")
            env = extension_env(compiled.build_dir, triton=work / "candidate-triton")
            return _profile_one("candidate", cand.path, "ModelNew", work, inputs, env, budgets.candidate, warmup,
                                common, build=compiled.build_dir)
    except OSError as exc:  # a build altered since it was recorded, a lock that never came
        return ModelProfile(role="candidate", error=str(exc))


def _profile_one(role: str, path: Path, class_name: str, work: Path, inputs: Path, env: dict[str, str],
                 timeout: float, warmup: int, common: dict, prepare: PrepareRequest | None = None,
                 build: Path | None = None) -> ModelProfile:
    own = work / role
    own.mkdir()
    confined = None if build is None else sandbox.spec(  # a candidate's: as when it is judged
        [own, work / f"{role}-triton", build / "ext"], common["device"], "evaluate")
    log = work / f"{role}.log"
    if prepare is None:  # the candidate reads copies, never the folder the reference writes
        for name in ("init.pt", "trial0.pt"):
            shutil.copyfile(inputs / name, own / name)
    source = inputs if prepare else own
    requests: list[Request[Any]] = [prepare] if prepare else []
    requests += [LoadRequest(path=str(path.resolve()), class_name=class_name, init_file=str(source / "init.pt"),
                             **common),
                 ProfileRequest(inputs_file=str(source / "trial0.pt"), warmup=warmup)]
    reply = None
    try:
        with WorkerProcess(own, log, env, time_limit=timeout, sandbox=confined,
                           role="checker" if prepare else "candidate") as worker:
            for req in requests:
                reply = worker.request(req, timeout)
                if not reply.ok:
                    return ModelProfile(role=role, error=f"{reply.error_kind}: {reply.error}", log=str(log))
    except WorkerFailure as failure:
        return ModelProfile(role=role, error=f"{failure.status}: {failure.message}", log=str(log))
    assert isinstance(reply, ProfileReply)
    return ModelProfile(role=role, kernels=reply.kernels, rows=reply.kernel_rows)


def profile_tables(report: ProfileReport) -> list[Table | str]:
    """A rich table per model (candidate first), or the line saying why there is none."""
    out: list[Table | str] = []
    for side in (report.candidate_profile, report.reference):
        name = report.candidate if side.role == "candidate" else f"{report.problem} (reference)"
        if side.error:
            out.append(f"{side.role} {name}: {side.error}" + (f" (log: {side.log})" if side.log else ""))
            continue
        k = side.kernels
        unit = "kernels" if report.device == "cuda" else "calls"
        caption = (f"{k.custom} custom, {k.library} library {unit}; custom share {k.custom_share:.0%} of "
                   f"{'device' if report.device == 'cuda' else 'CPU op'} time") if k else None
        table = Table(title=f"{side.role}: {name} ({report.device}, {report.precision})", caption=caption)
        for col, justify in (("kernel", "left"), ("kind", "left"), ("calls", "right"), ("total ms", "right"),
                             ("mean ms", "right"), ("share", "right")):
            table.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
        for row in side.rows:
            table.add_row(row.name, row.kind, str(row.calls), f"{row.total_ms:.4g}", f"{row.mean_ms:.4g}",
                          f"{row.share:.1%}")
        out.append(table)
    return out
