"""How well does kbeval time a kernel? Repeatability, and agreement with triton's do_bench and Nsight Compute.

For a handful of kernels of known length (about 5 us to 5 ms) this writes, in a temporary folder, one
KernelBench problem per kernel and one pure-PyTorch candidate doing the same single op (plus a seed
candidate), then:

(a) measures each with the harness `--repeats` times and reports the median of the medians, their
    coefficient of variation, how long timing one candidate took, and how many calls it timed. By default
    (`--mode session`) each kernel is compiled, checked and timed by the harness's own session (`CandidateRun`), as
    `kbeval run` does, with the timing stage repeated on the same workers; `--mode runs` makes every repeat a
    separate `kbeval run` instead (also catching what differs between processes, but each run spends about
    15 s per kernel starting workers, so ten runs of five kernels take some 14 minutes on an H100);
(b) times the same op, on the same sizes, with `triton.testing.do_bench` in this process, and with Nsight
    Compute (`ncu --clock-control none`), summing `gpu__time_duration` over the kernels of one call;
(c) writes a Markdown table (with pass/miss for each target) into the `## Timing fidelity` section of
    `docs/benchmarks.md`, and the raw numbers to `$OUT/timing_fidelity.json` when `OUT` is set.

    python bench/timing_fidelity.py                          # on an H100: about 3.5 minutes
    python bench/timing_fidelity.py --device cpu --dry-run   # the whole pipeline on a CPU, tiny sizes

Run from anywhere; the harness is imported from this checkout. `--ncu-driver` is internal: the process
Nsight Compute profiles.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import importlib.util
import inspect
import json
import math
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Timing fidelity"

# Rough H100 SXM rates, only to size the kernels: effective DRAM bandwidth and cuBLAS SGEMM throughput.
COPY_BYTES_PER_S = 2.5e12
FP32_GEMM_FLOPS = 5.0e13

# copy_500us is not in the default set: its 625 MB output makes each timing stage take about 20 s on an H100
# (one call per block, timed calls read back through files), so ten repeats alone take 3.5 minutes.
DEFAULT_KERNELS = ["copy_5us", "copy_50us", "gemm_500us", "gemm_5ms", "seed71_pytorch_mul"]
DRY_RUN_KERNELS = ["copy_5us", "gemm_500us", "seed71_pytorch_mul"]
HARNESS_FLAGS = ["--no-compile-baseline", "--trials", "1", "--max-speedup", "0"]
DRY_RUN_FLAGS = ["--timing-budget", "2"]  # a pipeline test, not a measurement: keep a CPU run short
SEPARATOR_KERNEL = "spin_kernel"  # what torch.cuda._sleep launches: marks where each op's call begins in ncu
NCU_METRIC = "gpu__time_duration.sum"
TIME_UNITS_MS = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0,
                 "s": 1e3, "second": 1e3}

# Targets from the issue.
CV_TARGET_LONG, CV_TARGET_SHORT, LONG_MS = 0.01, 0.03, 0.1
NCU_TARGET, TIMING_SECONDS_TARGET, SHORT_FOR_SECONDS_MS = 0.03, 5.0, 1.0


# --- the kernels ------------------------------------------------------------------------------------------

ELEMENTWISE_PROBLEM = '''"""Timing-fidelity probe {name}: y = 2 * x over {numel} float32 values (a copy's traffic)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2


numel = {numel}


def get_inputs():
    return [torch.rand(numel)]


def get_init_inputs():
    return []
'''

# Each candidate names its probe, so no two share a source: the build cache is keyed by the source's hash, and
# identical sources compiled at the same time would race on one build folder.
ELEMENTWISE_CANDIDATE = '''"""The same op as the reference ({name}): one elementwise kernel."""

import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x * 2
'''

GEMM_PROBLEM = '''"""Timing-fidelity probe {name}: a float32 GEMM of two {n} x {n} matrices."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return torch.mm(a, b)


n = {n}


def get_inputs():
    return [torch.rand(n, n), torch.rand(n, n)]


def get_init_inputs():
    return []
'''

GEMM_CANDIDATE = '''"""The same op as the reference ({name}): one cuBLAS GEMM."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b):
        return torch.mm(a, b)
'''


@dataclass
class Kernel:
    """One probe: a problem and a candidate on disk, and what to call it in the table."""

    name: str
    size: str
    problem_id: str
    candidate_id: str
    problem_file: str = ""
    candidate_file: str = ""
    dims: dict[str, int] = field(default_factory=dict)  # --dim overrides (the seed's size)
    problem_source: str | None = None  # generated probes; seeds are copied from the repository instead
    candidate_source: str | None = None
    seed_problem: str | None = None
    seed_candidate: str | None = None


def copy_kernel(name: str, seconds: float, dry_run: bool) -> Kernel:
    """`x * 2` sized to move `seconds` of DRAM traffic; not `clone()`, which is a cudaMemcpy ncu cannot see."""
    numel = max(1024, int(seconds * 2e8)) if dry_run else int(seconds * COPY_BYTES_PER_S / 2 / 4) // 1024 * 1024
    size = f"fp32 {numel / 1e6:.3g}M ({numel * 4 / 1e6:.3g} MB read + written)"
    return Kernel(name, size, name, "torch_op", problem_source=ELEMENTWISE_PROBLEM.format(name=name, numel=numel),
                  candidate_source=ELEMENTWISE_CANDIDATE.format(name=name))


def gemm_kernel(name: str, seconds: float, dry_run: bool) -> Kernel:
    """A square SGEMM sized to take `seconds` at cuBLAS's usual fp32 rate (TF32 stays off, torch's default)."""
    n = (64 if seconds < 1e-3 else 128) if dry_run else round((seconds * FP32_GEMM_FLOPS / 2) ** (1 / 3) / 128) * 128
    return Kernel(name, f"fp32 {n}x{n} @ {n}x{n}", name, "torch_op", problem_source=GEMM_PROBLEM.format(name=name, n=n),
                  candidate_source=GEMM_CANDIDATE.format(name=name))


def seed_kernel(name: str, problem: str, candidate: str, what: str, dims: dict[str, int]) -> Kernel:
    """A seed-corpus candidate judged against its own problem (several kernels per call), at sizes set by --dim."""
    return Kernel(name, f"{what} ({', '.join(f'{k}={v}' for k, v in dims.items())})", problem, candidate, dims=dims,
                  seed_problem=f"problems/level2/{problem}.py", seed_candidate=f"candidates/{problem}/{candidate}.py")


REGISTRY: dict[str, Callable[[bool], Kernel]] = {
    "copy_5us": lambda d: copy_kernel("copy_5us", 5e-6, d),
    "copy_50us": lambda d: copy_kernel("copy_50us", 50e-6, d),
    "copy_500us": lambda d: copy_kernel("copy_500us", 500e-6, d),
    "copy_5ms": lambda d: copy_kernel("copy_5ms", 5e-3, d),  # 6 GB per input set: slow to prepare, off by default
    "gemm_500us": lambda d: gemm_kernel("gemm_500us", 500e-6, d),
    "gemm_5ms": lambda d: gemm_kernel("gemm_5ms", 5e-3, d),
    # batch 16 of the problem's 128: about 0.25 ms and a 65 MB output (the full 520 MB one times as slowly as
    # copy_500us); the problems generated here have no `batch_size`, so the override touches only this one
    "seed71_pytorch_mul": lambda d: seed_kernel(
        "seed71_pytorch_mul", "71_Conv2d_Divide_LeakyReLU", "pytorch_mul", "seed: conv2d + mul_ + leaky_relu",
        {"batch_size": 2, "height": 32, "width": 32} if d else {"batch_size": 16}),
}


def write_suite(kernels: list[Kernel], root: Path) -> tuple[Path, Path]:
    """Problems and candidates folders in the harness's layout; fills each kernel's file paths."""
    problems, candidates = root / "problems", root / "candidates"
    for k in kernels:
        k.problem_file = str(problems / f"{k.problem_id}.py")
        k.candidate_file = str(candidates / k.problem_id / f"{k.candidate_id}.py")
        Path(k.candidate_file).parent.mkdir(parents=True, exist_ok=True)
        problems.mkdir(parents=True, exist_ok=True)
        if k.seed_problem and k.seed_candidate:
            shutil.copyfile(REPO / k.seed_problem, k.problem_file)
            shutil.copyfile(REPO / k.seed_candidate, k.candidate_file)
        else:
            Path(k.problem_file).write_text(k.problem_source or "")
            Path(k.candidate_file).write_text(k.candidate_source or "")
    return problems, candidates


# --- (a) the harness, repeated ----------------------------------------------------------------------------


@dataclass
class Result:
    """Everything measured for one kernel; the table and the targets are computed from this."""

    name: str
    size: str
    medians_ms: list[float] = field(default_factory=list)
    ref_medians_ms: list[float] = field(default_factory=list)
    timing_seconds: list[float] = field(default_factory=list)
    wall_seconds: list[float] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    event_overhead_ms: list[float] = field(default_factory=list)
    sm_clock_mhz: list[Any] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # verdicts other than ok, and failed runs
    do_bench_ms: float | None = None
    do_bench_note: str | None = None
    ncu_ms: float | None = None
    ncu_kernels: int | None = None
    ncu_note: str | None = None

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.medians_ms) if self.medians_ms else None

    @property
    def cv(self) -> float | None:
        """Sample standard deviation of the run medians over their mean."""
        if len(self.medians_ms) < 2:
            return None
        return statistics.stdev(self.medians_ms) / statistics.fmean(self.medians_ms)


def harness_command(rep: int, device: str, problems: Path, candidates: Path, out: Path, kernels: list[Kernel],
                    dry_run: bool = False) -> list[str]:
    dims = sorted({f"{k}={v}" for kern in kernels for k, v in kern.dims.items()})
    return [sys.executable, "-m", "kernelbench_eval", "run", "--device", device, "--problems", str(problems),
            "--candidates", str(candidates), "--out", str(out), "--run-id", f"rep{rep}", *HARNESS_FLAGS,
            *(DRY_RUN_FLAGS if dry_run else []), "--jobs", str(len(kernels)),
            *(arg for d in dims for arg in ("--dim", d))]


def run_harness(rep: int, args: argparse.Namespace, kernels: list[Kernel], root: Path, problems: Path,
                candidates: Path) -> list[dict[str, Any]]:
    """One `kbeval run` over every probe, in its own run folder; the build cache is shared between runs."""
    cmd = harness_command(rep, args.device, problems, candidates, root / "runs", kernels, args.dry_run)
    env = {**os.environ, "KBEVAL_CACHE_DIR": str(root / "cache"), "PYTHONUNBUFFERED": "1", "COLUMNS": "200",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    log = root / f"rep{rep}.log"
    with log.open("w") as fh:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, check=False)
    verdicts = root / "runs" / f"rep{rep}" / "verdicts.jsonl"
    if proc.returncode != 0 or not verdicts.exists():
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"kbeval run exited {proc.returncode} (log {log}):\n{tail}")
    return [json.loads(line) for line in verdicts.read_text().splitlines() if line.strip()]


def collect(verdicts: list[dict[str, Any]], kernels: list[Kernel], results: dict[str, Result], rep: int) -> None:
    """Add one run's verdicts to the per-kernel results."""
    by_key = {(v.get("problem"), v.get("candidate")): v for v in verdicts}
    for k in kernels:
        v = by_key.get((k.problem_id, k.candidate_id))
        if v is None:
            results[k.name].problems.append(f"run {rep}: no verdict")
        else:
            add_verdict(results[k.name], v, f"run {rep}")


def add_verdict(res: Result, v: dict[str, Any], label: str) -> None:
    """One measurement, from a verdict (or the same fields of an Outcome); ok and suspicious both carry a time."""
    if v.get("status") != "ok":
        res.problems.append(f"{label}: {v.get('status')}: {(v.get('error') or '')[:300]}")
    timing = v.get("timing") or {}
    if v.get("status") not in ("ok", "suspicious") or not timing or (v.get("runtime_ms") or -1) <= 0:
        return
    res.medians_ms.append(v["runtime_ms"])
    res.ref_medians_ms.append(timing["reference"]["median_ms"])
    res.timing_seconds.append(timing.get("seconds", math.nan))
    if v.get("wall_seconds") is not None:
        res.wall_seconds.append(v["wall_seconds"] - (v.get("compile_seconds") or 0.0))
    res.calls.append(timing["candidate"]["calls"])
    if timing.get("event_overhead_ms") is not None:
        res.event_overhead_ms.append(timing["event_overhead_ms"])
    res.sm_clock_mhz.append(timing.get("sm_clock_mhz"))


@dataclass
class Bench:
    """What one invocation works on, and its progress; `save` runs after every phase so a run cut short by a
    time limit still leaves its numbers in $OUT."""

    args: argparse.Namespace
    kernels: list[Kernel]
    root: Path
    problems: Path
    candidates: Path
    results: dict[str, Result]
    meta: dict[str, Any]
    seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        print(f"[{datetime.now():%H:%M:%S}] {name} ...", file=sys.stderr, flush=True)
        try:
            yield
        finally:
            self.seconds[name] = round(time.monotonic() - started, 1)
            print(f"[{datetime.now():%H:%M:%S}] {name}: {self.seconds[name]} s", file=sys.stderr, flush=True)
            self.save()

    def save(self) -> Path | None:
        """Raw numbers to $OUT/timing_fidelity.json, when OUT is set."""
        if not os.environ.get("OUT"):
            return None
        raw = {"meta": {**self.meta, "phase_seconds": self.seconds, "notes": self.notes},
               "kernels": [asdict(k) for k in self.kernels],
               "results": [{**asdict(r), "median_ms": r.median_ms, "cv": r.cv} for r in self.results.values()]}
        out = Path(os.environ["OUT"]) / "timing_fidelity.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(raw, indent=1, default=str))
        return out


def measure_with_runs(bench: Bench) -> None:
    """(a) as separate `kbeval run`s: every repeat pays for the harness's and its workers' start-up."""
    args, kernels, results = bench.args, bench.kernels, bench.results
    for rep in range(args.repeats):
        with bench.phase(f"kbeval run {rep + 1}/{args.repeats}"):
            try:
                verdicts = run_harness(rep, args, kernels, bench.root, bench.problems, bench.candidates)
                collect(verdicts, kernels, results, rep)
            except RuntimeError as exc:
                print(exc, file=sys.stderr)
                bench.notes.append(f"run {rep} failed: {str(exc).splitlines()[0]}")
                for r in results.values():
                    r.problems.append(f"run {rep}: kbeval run failed")


def measure_in_session(bench: Bench) -> None:
    """(a) inside one harness session per kernel: the candidate is compiled, checked and timed as `kbeval run`
    does it (`judge.CandidateRun`: start, trials), and the timing stage (`judge.timing_stage.time_candidate`:
    interleaved lanes, stopping rule, timed-call checks) is repeated on the same workers. Ten separate runs
    would spend most of their time starting workers, which is why this is the default."""
    import torch

    args, kernels, results, root = bench.args, bench.kernels, bench.results, bench.root
    if str(REPO) not in sys.path:  # this checkout's harness, for this process and for its workers
        sys.path.insert(0, str(REPO))
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    from kernelbench_eval.building.compile import compile_candidate
    from kernelbench_eval.discover.corpus import discover
    from kernelbench_eval.judge.baselines import BaselineStore
    from kernelbench_eval.judge.candidate_run import CandidateRun
    from kernelbench_eval.judge.judging import ReferenceSide, Secrets, verdict
    from kernelbench_eval.judge.measure import Deadline
    from kernelbench_eval.judge.timing_stage import time_candidate
    from kernelbench_eval.records import RunSettings

    repeats = args.repeats

    def judge_repeating(ref: Any, compiled: Any, path: Path, log: Path) -> tuple[Any, list[tuple[Any, float]]]:
        """`judge`, except that its timing stage runs `repeats` times; every repeat's findings are kept."""
        done: list[tuple[Any, float]] = []
        with CandidateRun(ref, compiled, path, log, args.timeout * repeats) as run:
            if run.start() and run.check_trials():
                for _ in range(repeats):
                    run.deadline = Deadline(args.timeout)
                    started = time.monotonic()
                    found = verdict(ref, run.checked(), time_candidate(run))
                    done.append((found, time.monotonic() - started))
                    if found.status not in ("ok", "suspicious"):
                        break
            return (done[-1][0] if done else verdict(ref, run.checked(), None)), done

    dims = {k: v for kern in kernels for k, v in kern.dims.items()}
    threads = torch.get_num_threads() if args.device == "cpu" else None
    settings = RunSettings(device=args.device, trials=1, compile_baseline=False, max_speedup=0.0, dims=dims,
                           threads=threads, **({"timing_budget": 2.0} if args.dry_run else {}))
    found = discover(bench.problems, bench.candidates)
    by_key = {(c.problem_id, c.candidate_id): c for c in found.candidates}
    logs = root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    def build(k: Kernel) -> Any:
        try:
            return compile_candidate(by_key[(k.problem_id, k.candidate_id)], args.device, root / "cache",
                                     logs / f"{k.name}.compile.log", args.timeout)
        except Exception as exc:  # one probe's failure must not lose the others
            return exc

    with bench.phase("compile (import) candidates"), ThreadPoolExecutor(len(kernels)) as pool:
        builds = list(pool.map(build, kernels))
    for k, compiled in zip(kernels, builds, strict=True):
        res, cand = results[k.name], by_key[(k.problem_id, k.candidate_id)]
        if isinstance(compiled, Exception) or not compiled.record.ok:
            record = getattr(compiled, "record", None)
            res.problems.append(f"compile: {f'{record.status}: {record.error}' if record else repr(compiled)}")
            continue
        with bench.phase(f"{k.name}: judge, timing stage x{repeats}"):
            log = logs / f"{k.name}.eval.log"
            session = ReferenceSide(found.problems[k.problem_id], settings, Secrets.draw(settings.trials), log,
                                    args.timeout, args.timeout, BaselineStore(root / "baselines.json")).open()
            try:
                if session.error:
                    res.problems.append(f"reference: {session.error}")
                    continue
                started = time.monotonic()
                outcome, done = judge_repeating(session, compiled, cand.path, log)
                wall = time.monotonic() - started
            finally:
                session.close()
        if not done:
            res.problems.append(f"judge: {outcome.status}: {outcome.error}")
        extra = sum(t for _, t in done[1:])  # judge's wall time, less the repeats it would not have made
        for i, (trial, _) in enumerate(done):
            add_verdict(res, {"status": trial.status, "error": trial.error, "runtime_ms": trial.runtime_ms,
                              "timing": trial.timing.model_dump() if trial.timing else None,
                              "wall_seconds": wall - extra if i == 0 else None}, f"repeat {i}")


# --- (b) the same ops under do_bench and Nsight Compute ---------------------------------------------------


def load_module(path: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def build_call(kernel: dict[str, Any], device: str) -> Callable[[], object]:
    """The candidate on its problem's inputs, built as the harness builds it (sizes overridden, seeded init)."""
    import torch

    problem = load_module(kernel["problem_file"], f"fidelity_problem_{kernel['name']}")
    for key, value in kernel["dims"].items():
        if hasattr(problem, key):
            setattr(problem, key, value)
    candidate = load_module(kernel["candidate_file"], f"fidelity_candidate_{kernel['name']}")
    torch.manual_seed(0)
    model = candidate.ModelNew(*problem.get_init_inputs()).to(device)
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in problem.get_inputs()]
    return lambda: model(*inputs)


def do_bench_ms(fn: Callable[[], object]) -> float:
    """triton's median, with the arguments this triton takes (return_mode is newer than quantiles)."""
    from triton.testing import do_bench

    params = inspect.signature(do_bench).parameters
    if "return_mode" in params:
        return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    out = do_bench(fn, warmup=25, rep=100, quantiles=[0.5])
    return float(out[0] if isinstance(out, (list, tuple)) else out)


def run_do_bench(kernels: list[Kernel], results: dict[str, Result]) -> None:
    """One op at a time, freeing its memory before the next."""
    try:
        import torch
        import triton.testing  # noqa: F401
    except ImportError as exc:
        for k in kernels:
            results[k.name].do_bench_note = f"triton not importable: {exc}"
        return
    for k in kernels:
        try:
            with torch.no_grad():
                fn = build_call(asdict(k), "cuda")
                results[k.name].do_bench_ms = do_bench_ms(fn)
        except Exception as exc:  # one failing op must not lose the others' numbers
            results[k.name].do_bench_note = f"do_bench failed: {type(exc).__name__}: {exc}"[:300]
        finally:
            fn = None
            torch.cuda.empty_cache()


def find_ncu(explicit: str | None) -> str | None:
    candidates = [explicit] if explicit else []
    candidates += [shutil.which("ncu"), "/usr/local/cuda/bin/ncu"]
    candidates += sorted(str(p) for p in Path("/usr/local").glob("cuda*/bin/ncu"))
    candidates += sorted(str(p) for p in Path("/opt/nvidia").glob("nsight-compute/*/ncu"))
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def ncu_driver(spec_file: str) -> None:
    """Inside ncu: warm every op up, then call each once inside the profiled range, after a separator kernel."""
    import torch

    spec = json.loads(Path(spec_file).read_text())
    with torch.no_grad():
        calls = [build_call(k, "cuda") for k in spec["kernels"]]
        for fn in calls:
            for _ in range(3):
                fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        for fn in calls:
            torch.cuda._sleep(1000)
            torch.cuda.synchronize()
            fn()
            torch.cuda.synchronize()
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


def ncu_rows(text: str) -> list[tuple[int, str, float]]:
    """(ID, kernel name, gpu__time_duration in ms) per profiled kernel, from ncu's CSV (details or raw page)."""
    lines = [line for line in text.splitlines() if line.startswith('"')]  # ncu's own messages start with ==
    table = list(csv.reader(lines))
    if not table:
        return []
    header, rows = table[0], table[1:]
    col = {name: i for i, name in enumerate(header)}
    out: list[tuple[int, str, float]] = []
    if "Metric Name" in col:  # details page: one row per (kernel, metric), the unit in its own column
        for row in rows:
            if len(row) == len(header) and row[col["Metric Name"]] == NCU_METRIC:
                value = to_ms(row[col["Metric Value"]], row[col.get("Metric Unit", col["Metric Value"])])
                out.append((int(row[col["ID"]]), row[col["Kernel Name"]], value))
    elif NCU_METRIC in col:  # raw page: one row per kernel, units in the row under the header
        units, rows = rows[0], rows[1:]
        for row in rows:
            if len(row) == len(header):
                value = to_ms(row[col[NCU_METRIC]], units[col[NCU_METRIC]])
                out.append((int(row[col["ID"]]), row[col["Kernel Name"]], value))
    return sorted(out)


def to_ms(value: str, unit: str) -> float:
    scale = TIME_UNITS_MS.get(unit.strip().lower())
    if scale is None:
        raise ValueError(f"unknown time unit {unit!r} in ncu's CSV")
    return float(value.replace(",", "")) * scale


def split_calls(rows: list[tuple[int, str, float]], count: int) -> list[tuple[float, int]]:
    """Kernels between consecutive separators: (summed ms, kernel count) for each of the `count` calls."""
    groups: list[list[float]] = []
    for _, name, ms in rows:
        if SEPARATOR_KERNEL in name:
            groups.append([])
        elif groups:
            groups[-1].append(ms)
    if groups and not groups[-1]:
        groups.pop()  # the closing separator
    if len(groups) != count:
        raise ValueError(f"ncu reported {len(groups)} separated calls, expected {count}")
    return [(sum(g), len(g)) for g in groups]


def run_ncu(kernels: list[Kernel], results: dict[str, Result], root: Path, ncu: str | None,
            timeout: float) -> str:
    """All ops in one profiled process (starting ncu is the slow part); returns ncu's version or why not."""
    def note_all(why: str) -> str:
        for k in kernels:
            results[k.name].ncu_note = why
        return why

    if ncu is None:
        return note_all("ncu not found (PATH, /usr/local/cuda*/bin, /opt/nvidia/nsight-compute)")
    try:
        version = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return note_all(f"{ncu} does not run: {exc}")
    found = re.search(r"Version (\S+)", version)
    version = f"Nsight Compute {found.group(1)}" if found else "Nsight Compute (version unknown)"
    spec = root / "ncu_spec.json"
    spec.write_text(json.dumps({"kernels": [asdict(k) for k in kernels]}))
    cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--metrics", NCU_METRIC, "--csv",
           sys.executable, str(Path(__file__).resolve()), "--ncu-driver", str(spec)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        return note_all(f"ncu timed out after {timeout:.0f} s")
    (root / "ncu.log").write_text(f"$ {shlex.join(cmd)}\n{proc.stdout}\n--- stderr ---\n{proc.stderr}")
    text = proc.stdout + "\n" + proc.stderr
    if "ERR_NVGPUCTRPERM" in text:
        return note_all("ncu: ERR_NVGPUCTRPERM, no permission for GPU performance counters "
                        "(needs root or NVreg_RestrictProfilingToAdminUsers=0)")
    try:
        calls = split_calls(ncu_rows(proc.stdout), len(kernels))
    except ValueError as exc:
        errors = [line for line in text.splitlines() if "==ERROR==" in line or "Error" in line][:3]
        return note_all(f"ncu exit {proc.returncode}: {exc}; {' '.join(errors)}"[:400])
    for k, (ms, count) in zip(kernels, calls, strict=True):
        results[k.name].ncu_ms, results[k.name].ncu_kernels = ms, count
    return version


# --- (c) the report ---------------------------------------------------------------------------------------


def fmt(x: float | None, digits: int = 4, note: str | None = None) -> str:
    """A number, or why there is none (the note's first clause, so a cell stays short)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return re.split(r"[;,(]", note)[0].strip().replace("|", "/")[:60] if note else "-"
    return f"{x:.{digits}g}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f} %"


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return statistics.fmean(xs) if xs else None


def table(results: list[Result], repeats: int) -> str:
    head = ["kernel", "size", "our median (ms)", f"CV of median ({repeats} repeats)", "do_bench median (ms)",
            "ours / do_bench", "ncu kernel time (ms)", "ncu kernels", "ours / ncu", "ours - ncu (us)",
            "event pair (us)", "timing s / candidate", "wall s / candidate", "calls"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---", "---"] + ["---:"] * (len(head) - 2)) + "|"]
    for r in results:
        diff = (r.median_ms - r.ncu_ms) * 1e3 if r.median_ms is not None and r.ncu_ms is not None else None
        overhead = mean(r.event_overhead_ms)
        cells = [r.name, r.size, fmt(r.median_ms), pct(r.cv), fmt(r.do_bench_ms, note=r.do_bench_note),
                 fmt(ratio(r.median_ms, r.do_bench_ms)), fmt(r.ncu_ms, note=r.ncu_note), fmt(r.ncu_kernels),
                 fmt(ratio(r.median_ms, r.ncu_ms)), fmt(diff, 3),
                 fmt(overhead * 1e3 if overhead is not None else None, 2), fmt(mean(r.timing_seconds), 3),
                 fmt(statistics.median(r.wall_seconds) if r.wall_seconds else None, 3),
                 fmt(statistics.median(r.calls) if r.calls else None)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def target_lines(results: list[Result]) -> list[str]:
    """Pass or miss for each target of the issue, computed from the numbers (and by how much a miss missed)."""
    timed = [r for r in results if r.median_ms is not None]
    long = [r for r in timed if r.median_ms >= LONG_MS]
    short = [r for r in timed if r.median_ms < LONG_MS]
    lines = [
        check_cv(long, CV_TARGET_LONG, f"CV of the median <= {CV_TARGET_LONG:.0%} for kernels of 100 us and more"),
        check_cv(short, CV_TARGET_SHORT, f"CV of the median <= {CV_TARGET_SHORT:.0%} for kernels under 100 us"),
        check_ncu([r for r in long if r.ncu_kernels == 1], [r for r in long if r.ncu_ms is None]),
        check_seconds([r for r in timed if r.median_ms < SHORT_FOR_SECONDS_MS]),
    ]
    multi = [r for r in timed if r.ncu_kernels and r.ncu_kernels > 1]
    if multi:
        lines.append("- Multi-kernel candidates (not under the ncu target): " + "; ".join(
            f"{r.name} ({r.ncu_kernels} kernels) ours / ncu = {fmt(ratio(r.median_ms, r.ncu_ms))}, the rest is the "
            "launch gaps between its kernels and host work between them" for r in multi) + ".")
    for r in results:
        alarms = [p for p in r.problems if ": suspicious:" in p]
        others = [p for p in r.problems if p not in alarms]
        if alarms:
            lines.append(f"- {r.name}: {len(alarms)} of {len(r.medians_ms)} measurements came back `suspicious`, "
                         f"a false alarm on an honest candidate (their times are kept above); e.g. {alarms[0]}")
        if others:
            lines.append(f"- {r.name}: {len(others)} measurement(s) without a verdict, e.g. {others[0]}")
    return lines


def check_cv(rows: list[Result], limit: float, what: str) -> str:
    rows = [r for r in rows if r.cv is not None]
    if not rows:
        return f"- NOT MEASURED: {what} (no kernel in range with two or more runs)."
    misses = [r for r in rows if r.cv > limit]
    worst = max(rows, key=lambda r: r.cv)
    if not misses:
        return f"- PASS: {what}: worst {worst.name} {pct(worst.cv)} ({len(rows)} kernels)."
    return f"- MISS: {what}: " + "; ".join(
        f"{r.name} {pct(r.cv)} ({100 * (r.cv - limit):.2f} points over)" for r in misses) + "."


def check_ncu(single: list[Result], missing: list[Result]) -> str:
    what = f"our median within {NCU_TARGET:.0%} of ncu's kernel time, single-kernel candidates of 100 us and more"
    if not single:
        why = (missing[0].ncu_note or "ncu not run") if missing else "no single-kernel candidate of 100 us or more"
        return f"- NOT MEASURED: {what} ({why})."
    parts, misses = [], 0
    for r in single:
        assert r.median_ms is not None and r.ncu_ms is not None
        off = r.median_ms / r.ncu_ms - 1
        misses += abs(off) > NCU_TARGET
        overhead = mean(r.event_overhead_ms)
        dob = f"do_bench {(r.do_bench_ms - r.ncu_ms) * 1e3:+.3g} us from ncu, " if r.do_bench_ms is not None else ""
        parts.append(f"{r.name} {100 * off:+.2f} % ({(r.median_ms - r.ncu_ms) * 1e3:+.3g} us over ncu; {dob}"
                     f"empty event pair {fmt(overhead * 1e3 if overhead is not None else None, 2)} us)"
                     + (f", {100 * (abs(off) - NCU_TARGET):.2f} points over" if abs(off) > NCU_TARGET else ""))
    verdict = "MISS" if misses else "PASS"
    return (f"- {verdict}: {what}: " + "; ".join(parts) + ". Where the remainder comes from: the harness "
            "enqueues the L2 flush just before the start event, so the host launches the call while the device is "
            "still flushing, as do_bench does; what the host does beyond the flush's length (the Python call, the "
            "dispatcher, allocation, library set-up such as cuBLAS heuristics) still falls inside our interval, as "
            "does the event pair's own cost. ncu times the kernel alone. The candidate's outputs are also copied "
            "after each call for the checks, and inputs refilled before it, which leaves other data in the memory "
            "system than do_bench's loop does.")


def check_seconds(rows: list[Result]) -> str:
    what = f"timing one candidate (after compile) in under {TIMING_SECONDS_TARGET:g} s, kernels under 1 ms"
    rows = [r for r in rows if mean(r.timing_seconds) is not None]
    if not rows:
        return f"- NOT MEASURED: {what}."
    walls = [w for r in rows for w in r.wall_seconds]
    whole = (f" A whole evaluation after compile (starting the check and timing workers, the correctness checks, "
             f"one timing stage) took {fmt(min(walls), 3)} to {fmt(max(walls), 3)} s." if walls else "")
    slow = [r for r in rows if (mean(r.timing_seconds) or 0) >= TIMING_SECONDS_TARGET]
    worst = max(rows, key=lambda r: mean(r.timing_seconds) or 0)
    if not slow:
        slowest = fmt(mean(worst.timing_seconds), 3)
        return f"- PASS: {what} (the timing stage): slowest {worst.name} {slowest} s." + whole
    return f"- MISS: {what} (the timing stage): " + "; ".join(
        f"{r.name} {fmt(mean(r.timing_seconds), 3)} s ({(mean(r.timing_seconds) or 0) - TIMING_SECONDS_TARGET:.2f} s "
        "over)" for r in slow) + "." + whole


def how_measured(meta: dict[str, Any]) -> str:
    """The paragraph under the command: what each column means, for the mode that produced it."""
    if meta["mode"] == "runs":
        ours = (f"judged by `kbeval run --device {meta['device']} {' '.join(HARNESS_FLAGS)}` (default timing "
                f"settings) in {meta['repeats']} separate runs. *Our median*: the median over the runs of each "
                "run's `runtime_ms`; *CV*: sample standard deviation of those run medians over their mean")
    else:
        ours = (f"compiled, checked and timed in the harness's own session (`judge.candidate_run.CandidateRun`, "
                f"settings as `kbeval run --device {meta['device']} {' '.join(HARNESS_FLAGS)}`, default timing "
                f"settings), with the timing stage (`judge.timing_stage.time_candidate`: interleaved candidate and "
                f"reference lanes, stopping rule, timed calls checked) repeated {meta['repeats']} times on the same "
                "two workers. "
                "*Our median*: the median of the repeats' `runtime_ms`; *CV*: sample standard deviation of the "
                f"{meta['repeats']} medians over their mean (same processes, so it leaves out what changes "
                "between runs: allocation addresses, process start-up; `--mode runs` measures that, slowly)")
    return (
        f"Each kernel is a problem plus a pure-PyTorch candidate doing the same op, {ours}. *do_bench*: "
        "`triton.testing.do_bench(fn, warmup=25, rep=100, return_mode=\"median\")` on the same op and sizes, in "
        "the benchmark's process. *ncu*: `gpu__time_duration.sum` summed over the kernels of one call "
        "(`ncu --clock-control none`, caches flushed between kernels, its default). *Event pair*: the harness's "
        "reading of an empty start/end event pair. *Timing s*: `timing.seconds`, the timing stage alone "
        "(after compile and checks), mean over repeats; *wall s*: one whole evaluation after compile "
        "(worker start-up, correctness checks, one timing stage), median.")


def section(results: list[Result], meta: dict[str, Any]) -> str:
    clocks = sorted({c for r in results for pair in r.sm_clock_mhz if pair for c in pair if c})
    clock_note = f" SM clock read by the harness: {clocks[0]}-{clocks[-1]} MHz." if clocks else ""
    return "\n".join([
        SECTION,
        "",
        f"{meta['gpu']}, {meta['versions']}; {meta['date']}; harness at {meta['commit']}. Command:",
        "",
        "```bash",
        meta["command"],
        "```",
        "",
        how_measured(meta) + clock_note,
        "",
        table(results, meta["repeats"]),
        "",
        "### Targets",
        "",
        *target_lines(results),
        "",
        *(["Notes:", "", *(f"- {n}" for n in meta["notes"])] if meta["notes"] else []),
    ]).rstrip() + "\n"


def update_doc(path: Path, text: str, section: str = SECTION) -> None:
    """Replace the `section` heading's section (up to the next level-2 heading), or append it."""
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    lines = old.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == section), None)
    if start is None:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        tail = "".join(lines[end:])
        new = "".join(lines[:start]) + text + ("\n" + tail if tail else "")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new)


# --- the run ----------------------------------------------------------------------------------------------


def describe_machine(device: str) -> tuple[str, str]:
    import torch

    versions = f"PyTorch {torch.__version__}"
    if device != "cuda":
        return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)", versions
    name = torch.cuda.get_device_name()
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True, check=False).stdout.strip().splitlines()
    versions += f" (CUDA {torch.version.cuda})"
    with contextlib.suppress(ImportError):
        import triton

        versions += f", triton {triton.__version__}"
    return name + (f" (driver {driver[0]})" if driver else ""), versions


def harness_digest() -> str:
    """SHA-256 (first 12) of the harness's sources: names the code measured even when the checkout is dirty."""
    digest = hashlib.sha256()
    for path in sorted((REPO / "kernelbench_eval").glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def git_commit() -> str:
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True, check=False).stdout.strip()

    sha = git("rev-parse", "--short", "HEAD") or "unknown commit"
    dirty = " with uncommitted changes" if git("status", "--porcelain", "--", "kernelbench_eval") else ""
    return f"{sha}{dirty} (kernelbench_eval/*.py sha256 {harness_digest()})"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeats", type=int, default=None, help="measurements per kernel (default 10; 2 with --dry-run)")
    p.add_argument("--kernels", default=None,
                   help=f"comma-separated, from: {', '.join(REGISTRY)} (default {','.join(DEFAULT_KERNELS)}; "
                        f"with --dry-run {','.join(DRY_RUN_KERNELS)})")
    p.add_argument("--out-md", type=Path, default=None,
                   help="Markdown file whose '## Timing fidelity' section is replaced (default docs/benchmarks.md; "
                        "with --dry-run, nothing is written unless given)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--mode", choices=["session", "runs"], default="session",
                   help="session (default): per kernel, one harness session whose timing stage is repeated;\n"
                        "runs: a separate `kbeval run` per repeat (about 15-20 s per kernel per run on an H100)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds for one compile or one judge() call")
    p.add_argument("--dry-run", action="store_true",
                   help="tiny sizes, 2 repeats, 2 s timing budget; do_bench and ncu only on cuda")
    p.add_argument("--ncu", default=None, help="path of ncu (default: PATH, then /usr/local/cuda/bin/ncu)")
    p.add_argument("--ncu-timeout", type=float, default=300.0)
    p.add_argument("--skip-do-bench", action="store_true")
    p.add_argument("--skip-ncu", action="store_true")
    p.add_argument("--workdir", type=Path, default=None, help="keep problems, run folders and logs here")
    p.add_argument("--ncu-driver", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.repeats = args.repeats or (2 if args.dry_run else 10)
    args.kernels = args.kernels or ",".join(DRY_RUN_KERNELS if args.dry_run else DEFAULT_KERNELS)
    unknown = [k for k in args.kernels.split(",") if k not in REGISTRY]
    if unknown:
        p.error(f"unknown kernels {unknown}; known: {', '.join(REGISTRY)}")
    if args.out_md is None and not args.dry_run:
        args.out_md = REPO / "docs" / "benchmarks.md"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.ncu_driver:
        ncu_driver(args.ncu_driver)
        return 0
    kernels = [REGISTRY[name](args.dry_run) for name in args.kernels.split(",")]
    root = args.workdir or Path(tempfile.mkdtemp(prefix="kbeval-fidelity-"))
    root.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(root / "runs", ignore_errors=True)  # a reused --workdir keeps its build cache, not its runs
    problems, candidates = write_suite(kernels, root)
    meta = {"device": args.device, "mode": args.mode, "repeats": args.repeats, "commit": git_commit(),
            "command": shlex.join(["python", "bench/timing_fidelity.py", *(sys.argv[1:] if argv is None else argv)]),
            "workdir": str(root)}
    bench = Bench(args, kernels, root, problems, candidates, {k.name: Result(k.name, k.size) for k in kernels}, meta)
    (measure_in_session if args.mode == "session" else measure_with_runs)(bench)
    on_gpu = args.device == "cuda"
    if not on_gpu:
        bench.notes.append("do_bench and ncu skipped: they need a GPU")
    if on_gpu and not args.skip_do_bench:
        with bench.phase("do_bench"):
            run_do_bench(kernels, bench.results)
    ncu_version = "ncu skipped"
    if on_gpu and not args.skip_ncu:
        with bench.phase("ncu"):
            ncu_version = run_ncu(kernels, bench.results, root, find_ncu(args.ncu), args.ncu_timeout)
    gpu, versions = describe_machine(args.device)
    meta.update(gpu=gpu, versions=versions + (f", {ncu_version}" if on_gpu else ""),
                date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    bench.notes.append("phase wall seconds: " + ", ".join(f"{k} {v}" for k, v in bench.seconds.items())
                       + f"; total {sum(bench.seconds.values()):.0f} s")
    text = section(list(bench.results.values()), {**meta, "notes": bench.notes})
    print(text)
    if args.out_md:
        update_doc(args.out_md, text)
        print(f"wrote {args.out_md}", file=sys.stderr)
    saved = bench.save()
    if saved:
        print(f"wrote {saved}", file=sys.stderr)
    if args.workdir is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
