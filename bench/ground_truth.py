"""Ground truth for a runtime: what the GPU did (the profiler's kernel durations) and what a call costs (its latency,
host launch work included), beside what kbeval and KernelBench's `cuda_event` method report (issue 35).

For each (problem, candidate) pair, in this process, on inputs from the problem's `get_inputs()`:
- `kernels_ms`: the sum of the device durations of every kernel one call launches (torch.profiler / CUPTI),
  averaged over CALLS calls: the device-time basis, with nothing of the host in it;
- `latency_ms`: median over CALLS calls of synchronize -> call -> synchronize on the host clock: what a caller
  waits for one call, host launch work and the synchronise included;
- `kb_event_ms`: KernelBench's cuda_event method as its timing.py does it (synchronize, 256 MB L2 thrash, start
  event, call, end event, synchronize), mean over CALLS as KernelBench reports it (also the median);
then kbeval's verdict on the same pair (one `kbeval run` over every pair first, in a process of its own with its
own secret inputs; this process then loads the candidate from the build that run made): its `runtime_ms` and
`ref_runtime_ms`, and the event and device-wide medians its timing recorded. The candidate is exec'd in the
problem's namespace, as KernelBench's evaluation does.

    python3 bench/ground_truth.py PROBLEM.py CANDIDATE.py [PROBLEM.py CANDIDATE.py ...] --out $OUT/ground_truth.json

Prints one table row per model (reference and candidate of each pair).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
CALLS = 100
WARMUP = 20


def load(problem: Path, candidate: Path) -> tuple[torch.nn.Module, torch.nn.Module, list]:
    space: dict = {"__name__": "kb_problem"}
    exec(compile(problem.read_text(), str(problem), "exec"), space)
    init = space["get_init_inputs"]()
    torch.manual_seed(0)
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in space["get_inputs"]()]
    torch.manual_seed(1)
    ref = space["Model"](*init).cuda()
    cand_space = dict(space)  # KernelBench: the candidate's source runs where the problem's names are
    exec(compile(candidate.read_text(), str(candidate), "exec"), cand_space)
    torch.manual_seed(1)
    cand = cand_space["ModelNew"](*init).cuda()
    return ref, cand, inputs


def kernels_ms(model: torch.nn.Module, inputs: list) -> float:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            model(*inputs)
        torch.cuda.synchronize()
    total_us = 0.0
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total_us += event.device_time  # each kernel, memcpy and memset the device ran
    return total_us / 1000.0 / CALLS


def latency_ms(model: torch.nn.Module, inputs: list) -> float:
    times = []
    for _ in range(CALLS):
        torch.cuda.synchronize()
        started = time.perf_counter()
        model(*inputs)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - started) * 1000.0)
    return statistics.median(times)


def kb_event_ms(model: torch.nn.Module, inputs: list) -> tuple[float, float]:
    """KernelBench's time_execution_with_cuda_event, as its timing.py does it (mean, and the median)."""
    times = []
    for _ in range(CALLS + 1):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dummy = torch.empty((32, 1024, 1024), dtype=torch.int64, device="cuda")
        dummy.fill_(42)
        del dummy
        start.record()
        model(*inputs)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times = times[1:]  # discard_first=1
    return statistics.fmean(times), statistics.median(times)


def measure(model: torch.nn.Module, inputs: list) -> dict:
    with torch.no_grad():
        for _ in range(WARMUP):
            model(*inputs)
        torch.cuda.synchronize()
        mean, median = kb_event_ms(model, inputs)
        return {"kernels_ms": kernels_ms(model, inputs), "latency_ms": latency_ms(model, inputs),
                "kb_event_mean_ms": mean, "kb_event_median_ms": median}


def kbeval_run(pairs: list[tuple[Path, Path]], work: Path) -> dict[str, dict]:
    """Every pair judged by one `kbeval run` (its builds side by side); verdicts by problem id."""
    for problem, candidate in pairs:
        (work / "problems").mkdir(parents=True, exist_ok=True)
        (work / "problems" / problem.name).write_bytes(problem.read_bytes())
        folder = work / "candidates" / problem.stem
        folder.mkdir(parents=True, exist_ok=True)
        (folder / candidate.name).write_bytes(candidate.read_bytes())
    env = dict(os.environ, COLUMNS="200", KBEVAL_CACHE_DIR=str(work / "cache"))
    proc = subprocess.run([sys.executable, "-m", "kernelbench_eval", "run", "--problems", str(work / "problems"),
                           "--candidates", str(work / "candidates"), "--out", str(work / "results"), "--run-id", "gt",
                           "--no-compile-baseline", "--jobs", "16"], capture_output=True, text=True, cwd=ROOT, env=env)
    (work / "kbeval.log").write_text(proc.stdout + proc.stderr)
    path = work / "results" / "gt" / "verdicts.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return {(v := json.loads(line))["problem"]: v for line in lines}


def use_build(candidate: Path, work: Path) -> None:
    """Point load_inline at the build kbeval made of this source, so this process loads it instead of compiling."""
    import hashlib

    from kernelbench_eval.building.compile import extension_env

    sha = hashlib.sha256(candidate.read_bytes()).hexdigest()[:24]
    builds = sorted((work / "cache" / "builds").glob(f"{sha}-*"))
    if builds:
        os.environ.update(extension_env(builds[0]))


def summary(verdict: dict) -> dict:
    timing = verdict.get("timing") or {}
    return {"status": verdict["status"], "runtime_ms": verdict["runtime_ms"],
            "ref_runtime_ms": verdict["ref_runtime_ms"],
            "speedup": verdict["speedup"], "speedup_ci": verdict["speedup_vs_eager_ci"], "timing": timing,
            "error": verdict.get("error")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path, help="PROBLEM CANDIDATE pairs")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--no-kbeval", action="store_true")
    args = parser.parse_args()
    if len(args.files) % 2:
        parser.error("files come in pairs: PROBLEM CANDIDATE")
    import tempfile

    pairs = list(zip(args.files[::2], args.files[1::2], strict=True))
    work = Path(tempfile.mkdtemp(prefix="kbeval-gt-"))
    verdicts = {} if args.no_kbeval else kbeval_run(pairs, work)
    rows = []
    for problem, candidate in pairs:
        use_build(candidate, work)
        ref, cand, inputs = load(problem, candidate)
        row = {"problem": problem.stem, "candidate": candidate.stem, "reference": measure(ref, inputs),
               "candidate_model": measure(cand, inputs)}
        del ref, cand, inputs
        torch.cuda.empty_cache()
        if problem.stem in verdicts:
            row["kbeval"] = summary(verdicts[problem.stem])
        rows.append(row)
        print(json.dumps(row)[:2000], flush=True)
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    print(f"{'problem':34} {'model':10} {'kernels':>9} {'latency':>9} {'KB mean':>9} {'KB med':>9} {'kbeval':>9}")
    for row in rows:
        kb = row.get("kbeval", {})
        for role, key, ours in (("reference", "reference", kb.get("ref_runtime_ms")),
                                ("candidate", "candidate_model", kb.get("runtime_ms"))):
            m = row[key]
            print(f"{row['problem'][:34]:34} {role:10} {m['kernels_ms']:9.4f} {m['latency_ms']:9.4f} "
                  f"{m['kb_event_mean_ms']:9.4f} {m['kb_event_median_ms']:9.4f} {ours if ours is not None else '-':>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
