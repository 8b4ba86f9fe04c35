#!/usr/bin/env python3
"""One problem's reference timed in several fresh processes, outside the harness: how far apart processes land, and
whether they run the same kernels (issues 34 and 35).

The KernelBench self-test at 80 GB (docs/benchmarks.md) found identical copies of ConvTranspose3d problems 4-29 %
apart with tight intervals, and 20-80 us models +-1-2.5 us apart: the same source, in two processes, at two steady
speeds. Each child here builds the model (seed 0), holds `--hold-gib` of device memory first (as a checker or a
ballast would: PyTorch picks a cuDNN engine only among those whose workspace fits the memory free when a shape is
first seen), times `--calls` calls between CUDA events after an L2 flush, and lists the kernels one call launches
(torch.profiler). Processes that differ in time but not in kernels point at placement; different kernels at the
library's choice. On the CPU, wall time and the profiler's operator names (the plumbing, for tests).

    python3 bench/process_spread.py .kb/current/level2/77_ConvTranspose3d_Scale_BatchNorm_GlobalAvgPool.py \\
        --processes 6 --hold-gib 0,60        # on the GPU machine; raw rows to $OUT/process_spread.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

from benchdoc import machine_line, out_dir

CHILD = r"""
import importlib.util, json, sys, time, torch
path, hold_gib, calls, device, where = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
spec = importlib.util.spec_from_file_location("problem", path)
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
hold = lambda: torch.empty(int(hold_gib * 2**30), dtype=torch.uint8, device=device) if hold_gib else None
held = hold() if where == "before" else None
torch.manual_seed(0)
model = mod.Model(*mod.get_init_inputs()).to(device)
torch.manual_seed(1)
inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in mod.get_inputs()]
flush = torch.empty(256 << 20, dtype=torch.uint8, device=device) if device == "cuda" else None
held = hold() if where == "after" else held
times = []
with torch.no_grad():
    for i in range(calls + 10):
        if device == "cuda":
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(); model(*inputs); end.record(); end.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter_ns(); model(*inputs); ms = (time.perf_counter_ns() - t0) / 1e6
        if i >= 10:
            times.append(ms)
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch.profiler.profile(activities=activities) as prof:
        model(*inputs)
        if device == "cuda":
            torch.cuda.synchronize()
kinds = "cuda" if device == "cuda" else "cpu"
names = sorted({e.name for e in prof.events()
                if (e.device_type.name.lower() == kinds) and (kinds == "cuda" or e.name.startswith("aten::"))})
free = torch.cuda.mem_get_info()[0] if device == "cuda" else None
print(json.dumps({"times": times, "kernels": names, "free_bytes": free}))
"""


BALLAST = r"""
import sys, torch
held = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda")
print("held", flush=True); sys.stdin.read()
"""


def one_process(problem: Path, hold_gib: float, calls: int, device: str, timeout: float,
                where: str = "before") -> dict:
    """One child; `where` the memory is held: in the child `before` or `after` it builds the model and inputs,
    or in another process (`other`: a ballast, as the KernelBench self-test's, started here for this child)."""
    ballast = None
    if where == "other" and hold_gib:
        ballast = subprocess.Popen([sys.executable, "-c", BALLAST, str(hold_gib)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
        ballast.stdout.readline()
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, str(problem), str(hold_gib), str(calls), device, where],
                              capture_output=True, text=True, timeout=timeout)
    finally:
        if ballast is not None:
            ballast.kill()
            ballast.wait()
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:300]}
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    times = sorted(row.pop("times"))
    return row | {"median_ms": statistics.median(times), "iqr_ms": times[3 * len(times) // 4] - times[len(times) // 4]}


def summarize(rows: list[dict]) -> dict:
    """Per hold level: the processes' medians, their spread (largest over smallest, and the sd of their logs), and
    how many distinct kernel lists they ran."""
    good = [r for r in rows if "median_ms" in r]
    medians = [r["median_ms"] for r in good]
    logs = [math.log(m) for m in medians if m > 0]
    return {"processes": len(rows), "failed": len(rows) - len(good),
            "spread": round(max(medians) / min(medians), 4) if medians and min(medians) > 0 else None,
            "log_sd": round(statistics.stdev(logs), 5) if len(logs) > 1 else None,
            "kernel_lists": len({tuple(r["kernels"]) for r in good})}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problem", type=Path)
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--hold-gib", default="0", help="comma-separated: device memory each child holds first")
    parser.add_argument("--hold-where", default="before", choices=["before", "after", "other"],
                        help="held in the child before or after it builds the model, or by another process")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when there is one)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a child may take")
    args = parser.parse_args()
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if not args.problem.is_file():
        print(f"process_spread: {args.problem}: no such problem file", file=sys.stderr)
        return 2
    report: dict = {"problem": args.problem.name, "machine": machine_line(args.device), "hold_where": args.hold_where,
                    "levels": {}}
    for hold in [float(h) for h in args.hold_gib.split(",")]:
        rows = [one_process(args.problem, hold, args.calls, args.device, args.timeout, args.hold_where)
                for _ in range(args.processes)]
        summary = summarize(rows)
        report["levels"][str(hold)] = {"summary": summary, "rows": rows}
        medians = ", ".join(f"{r['median_ms']:.4f}" if "median_ms" in r else "failed" for r in rows)
        print(f"{args.problem.stem} hold {hold:g} GiB {args.hold_where}: per-process median ms [{medians}]; spread "
              f"{summary['spread']}, {summary['kernel_lists']} distinct kernel list(s)", flush=True)
        for r in rows:
            if "error" in r:
                print(f"  failed: {r['error']}")
        lists = {tuple(r["kernels"]) for r in rows if "kernels" in r}
        if len(lists) > 1:  # which kernels differ: the library's choice
            common = set.intersection(*(set(k) for k in lists))
            for k in lists:
                print(f"  only in some processes: {sorted(set(k) - common)[:6]}")
    if (out := out_dir()) is not None:
        with (out / "process_spread.json").open("a") as sink:
            sink.write(json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
