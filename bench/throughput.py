#!/usr/bin/env python3
"""How fast `kbeval run` gets through many candidates: cold and warm runs, `--jobs` and lanes varied.

Generates N distinct CUDA candidates (the same ReLU kernel, each with its own constant, so each is its own
build) for one small problem, then runs the real CLI in phases, each with the wall time measured here:

- `single`: one candidate alone on a fresh cache: the one-compile time the floor is made of (it also
  measures the problem's torch.compile baseline, which every later phase reuses from the same file);
- `cold-jJ`: all N on a fresh cache with `--jobs J`: wall time against the compile floor
  ceil(N / J) x one compile;
- `warm`: a new run of the same folder on the now-warm cache (every build reused, everything judged again);
- `resume`: `--resume` of the finished cold run (every verdict reused);
- `warm-nofork`: `warm` with the fork server off (KBEVAL_FORKSERVER=0), to show what it saves.

While each phase runs, `nvidia-smi` samples every GPU's utilisation (5 Hz): its mean is the share of time the
GPU ran kernels. Per-candidate overhead is a verdict's evaluation wall time (wall_seconds minus
compile_seconds) minus its timing stage's own seconds: process starts, loading, file copies and the
correctness trials. The table goes to the `## Throughput` section of docs/benchmarks.md, raw numbers to
$OUT/throughput.json. Phases past `--deadline` seconds are skipped (and say so).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path

from timing_fidelity import describe_machine, git_commit, update_doc

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Throughput"

PROBLEM = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0


def get_inputs():
    return [torch.randn(4096, 1024)]


def get_init_inputs():
    return []
'''

CANDIDATE = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = """
#include <torch/extension.h>
constexpr int VARIANT = {k};  // one build per candidate
__global__ void relu2_kernel(const float* x, float* y, int64_t n) {{
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = (x[i] > 0.f ? x[i] : 0.f) * 2.f + 0.f * VARIANT;
}}
torch::Tensor relu2(torch::Tensor x) {{
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    int64_t n = xc.numel();
    relu2_kernel<<<(n + 255) / 256, 256>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}}
"""
ext = load_inline(name="relu2_v{k}", cpp_sources="torch::Tensor relu2(torch::Tensor x);",
                  cuda_sources=cuda_source, functions=["relu2"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu2(x)
'''

CPU_CANDIDATE = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
constexpr int VARIANT = {k};  // one build per candidate
torch::Tensor relu2(torch::Tensor x) {{ return torch::relu(x) * 2.0 + 0.0 * VARIANT; }}
"""
ext = load_inline(name="relu2_cpu_v{k}", cpp_sources=source, functions=["relu2"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu2(x)
'''


@dataclass
class Phase:
    name: str
    candidates: int
    jobs: int
    lanes: int
    wall_s: float = 0.0
    verdicts: int = 0
    ok: int = 0
    compiled_cold: int = 0
    one_compile_s: float | None = None  # the median cold compile of this phase
    gpu_busy: list[float] = field(default_factory=list)  # per GPU, mean utilisation / 100
    overhead_s: float | None = None  # median per candidate
    timing_s: float | None = None  # median timing stage per candidate
    note: str = ""


class GpuSampler:
    """`nvidia-smi` utilisation of every GPU, sampled in the background while a phase runs."""

    def __init__(self) -> None:
        self.samples: dict[int, list[float]] = {}
        self.proc: subprocess.Popen[str] | None = None
        self.thread: threading.Thread | None = None

    def __enter__(self) -> GpuSampler:
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=index,utilization.gpu", "--format=csv,noheader,"
                                          "nounits", "-lms", "200"], stdout=subprocess.PIPE, text=True)
            self.thread = threading.Thread(target=self._read, daemon=True)
            self.thread.start()
        return self

    def _read(self) -> None:
        assert self.proc and self.proc.stdout
        for line in self.proc.stdout:
            try:
                index, util = (int(x) for x in line.split(","))
            except ValueError:
                continue
            self.samples.setdefault(index, []).append(util / 100)

    def __exit__(self, *exc: object) -> None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait()

    def busy(self) -> list[float]:
        return [round(statistics.fmean(v), 3) for _, v in sorted(self.samples.items()) if v]


def write_corpus(root: Path, count: int, device: str, first: int = 0) -> tuple[Path, Path]:
    problems, candidates = root / "problems", root / f"candidates-{first}-{count}"
    problems.mkdir(parents=True, exist_ok=True)
    (problems / "relu2.py").write_text(PROBLEM)
    folder = candidates / "relu2"
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(first, first + count):
        (folder / f"v{k:03d}.py").write_text((CANDIDATE if device == "cuda" else CPU_CANDIDATE).format(k=k))
    return problems, candidates


def kbeval(args: list[str], cache: Path, env: dict[str, str] | None = None) -> tuple[float, list[float], str]:
    """One real `kbeval run`; (wall seconds, GPU busy shares, its output)."""
    full_env = dict(os.environ, KBEVAL_CACHE_DIR=str(cache), COLUMNS="200", **(env or {}))
    started = time.perf_counter()
    with GpuSampler() as sampler:
        proc = subprocess.run([sys.executable, "-m", "kernelbench_eval", "run", *args], cwd=REPO, env=full_env,
                              capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"kbeval {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}{proc.stderr}")
    return wall, sampler.busy(), proc.stdout + proc.stderr


def summarise(phase: Phase, run_dir: Path) -> None:
    verdicts = [json.loads(line) for line in (run_dir / "verdicts.jsonl").read_text().splitlines() if line.strip()]
    phase.verdicts = len(verdicts)
    phase.ok = sum(v["status"] == "ok" for v in verdicts)
    cold = [v["compile_seconds"] for v in verdicts if v.get("compile_seconds") and not v.get("compile_cached")]
    phase.compiled_cold = len(cold)
    phase.one_compile_s = round(statistics.median(cold), 1) if cold else None
    timed = [v for v in verdicts if v.get("timing")]
    if timed:
        phase.timing_s = round(statistics.median(v["timing"]["seconds"] for v in timed), 2)
        phase.overhead_s = round(statistics.median(
            v["wall_seconds"] - (v["compile_seconds"] or 0) - v["timing"]["seconds"] for v in timed), 2)


def run_phases(args: argparse.Namespace, root: Path) -> list[Phase]:
    """single, cold (per --jobs), warm, resume, warm-nofork: in that order, the cheap checks before the last."""
    deadline = time.monotonic() + args.deadline
    problems, corpus = write_corpus(root, args.count, args.device)
    _, single = write_corpus(root, 1, args.device, first=1000)
    common = ["--device", args.device, "--problems", str(problems), "--baselines", str(root / "baselines.json")]
    if args.device == "cpu":
        common += ["--trials", "1"]
    jobs, results = args.jobs[0], root / "results"
    warm_cache = root / f"cache-j{jobs}"
    resume = ["--resume", str(results / f"cold-j{jobs}")]
    plan = [("single", single, 1, root / "cache-single", {}, []),
            *[(f"cold-j{j}", corpus, j, root / f"cache-j{j}", {}, []) for j in args.jobs],
            ("warm", corpus, jobs, warm_cache, {}, []),
            ("resume", corpus, jobs, warm_cache, {}, resume),
            ("warm-nofork", corpus, jobs, warm_cache, {"KBEVAL_FORKSERVER": "0"}, [])]
    phases: list[Phase] = []
    for name, cands, jobs, cache, env, extra in plan:
        if args.phases and name.split("-j")[0] not in args.phases:
            continue
        phase = Phase(name, len(list((cands / "relu2").glob("*.py"))), jobs, 1)
        phases.append(phase)
        if time.monotonic() > deadline:
            phase.note = "skipped: past the deadline"
            continue
        where = extra or [*common, "--candidates", str(cands), "--out", str(results), "--run-id", name]
        wall, phase.gpu_busy, out = kbeval([*where, "--jobs", str(jobs), "--lanes", "1"], cache, env)
        phase.wall_s = round(wall, 1)
        (root / f"{name}.log").write_text(out)
        if extra:
            phase.note = "`--resume` of the finished cold run: every verdict reused"
        summarise(phase, Path(extra[1]) if extra else results / name)
        if extra:  # the verdicts it reports are the cold run's: their compile and timing numbers are not its own
            phase.compiled_cold, phase.one_compile_s, phase.timing_s, phase.overhead_s = 0, None, None, None
        print(f"{name}: {phase}", flush=True)
        if os.environ.get("OUT"):  # after every phase: a run cut short keeps what it measured
            Path(os.environ["OUT"], "throughput.json").write_text(json.dumps([asdict(p) for p in phases], indent=1))
    return phases


def table(phases: list[Phase], one_compile: float | None = None) -> str:
    one = next((p.one_compile_s for p in phases if p.name == "single"), one_compile)
    rows = ["| phase | candidates | --jobs | lanes | wall (s) | ok | cold compiles | median compile (s) | "
            "floor (s) | wall / floor | GPU busy | timing stage (s/cand.) | overhead (s/cand.) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in phases:
        floor = math.ceil(p.candidates / p.jobs) * one if one and p.name.startswith("cold") else None
        rows.append(f"| {p.name} | {p.candidates} | {p.jobs} | {p.lanes} | {p.wall_s or '-'} | {p.ok}/{p.verdicts} "
                    f"| {p.compiled_cold} | {p.one_compile_s or '-'} | {round(floor, 1) if floor else '-'} | "
                    f"{round(p.wall_s / floor, 2) if floor and p.wall_s else '-'} | "
                    f"{', '.join(f'{b:.0%}' for b in p.gpu_busy) or '-'} | {p.timing_s or '-'} | "
                    f"{p.overhead_s if p.overhead_s is not None else '-'} |" + (f" {p.note}" if p.note else ""))
    return "\n".join(rows)


def ratios(phases: list[Phase]) -> list[str]:
    by = {p.name: p for p in phases if p.wall_s}
    cold = next((p for p in phases if p.name.startswith("cold") and p.wall_s), None)
    lines = []
    if cold and "warm" in by:
        lines.append(f"- warm new run vs cold ({cold.name}): {cold.wall_s / by['warm'].wall_s:.1f}x faster")
    if cold and "resume" in by:
        lines.append(f"- `--resume` of the finished cold run vs cold: {cold.wall_s / by['resume'].wall_s:.1f}x faster")
    if "warm" in by and "warm-nofork" in by:
        lines.append(f"- fork server: warm run {by['warm-nofork'].wall_s / by['warm'].wall_s:.2f}x faster than with "
                     f"cold worker starts; per-candidate overhead {by['warm'].overhead_s} s vs "
                     f"{by['warm-nofork'].overhead_s} s")
    return lines


def section(phases: list[Phase], args: argparse.Namespace) -> str:
    machine, versions = describe_machine(args.device)
    return "\n".join([
        SECTION, "",
        f"{machine}, {os.cpu_count()} CPU cores; {versions}; {date.today()}; harness {git_commit()}.",
        f"Command: `python3 bench/throughput.py {' '.join(sys.argv[1:])}` "
        "(bench/README.md). Candidates: distinct CUDA `load_inline` ReLU kernels over a 4096x1024 float32 "
        "input (C++ ones on the CPU); floor = ceil(N / jobs) x the `single` phase's compile.", "",
        table(phases, args.one_compile), "", *ratios(phases), ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=32, help="distinct candidates (default 32)")
    parser.add_argument("--jobs", default=str(os.cpu_count() or 1), help="--jobs values, comma-separated; "
                        "the first one's cache serves the warm phases")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--deadline", type=float, default=540, help="start no phase after this many seconds")
    parser.add_argument("--phases", help="only these of single,cold,warm,resume,warm-nofork (comma-separated)")
    parser.add_argument("--one-compile", type=float, help="one compile's seconds for the floor, when `single` is "
                        "not run")
    parser.add_argument("--out-md", type=Path, default=REPO / "docs" / "benchmarks.md")
    parser.add_argument("--workdir", type=Path, help="keep the generated corpus, runs and logs here")
    args = parser.parse_args(argv)
    args.jobs = [int(j) for j in str(args.jobs).split(",")]
    args.phases = args.phases.split(",") if args.phases else None
    root = args.workdir or Path(tempfile.mkdtemp(prefix="kbeval-throughput-"))
    phases = run_phases(args, root)
    text = section(phases, args)
    print(text)
    update_doc(args.out_md, text, SECTION)
    return 0


if __name__ == "__main__":
    sys.exit(main())
