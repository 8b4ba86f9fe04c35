#!/usr/bin/env python3
"""Judging on several GPUs of one host (issue 38, goal 3): the judging phase on 1, 2 and 4 GPUs, the same
candidates, the same warm build cache, with identical verdicts and no cross-lane interference.

The corpus is `distinct_corpus.py`'s (generated from a KernelBench export, never committed): samples of one
problem are the same code (each with its own extension), so they take the same time wherever they are judged.
One cold run on every GPU fills the build cache; then a warm run per GPU count (`--gpus 0`, `0,1`, `0,1,2,3`),
each timed by its own per-phase account (`phases.json`: the judging phase's running seconds). Interference shows
as a candidate judged beside other lanes landing outside the interval it had judged alone: the share of
candidates whose speedup on N GPUs lies inside their 1-GPU interval is reported, and statuses must not change.

Lines `gpus2_judging_speedup:` / `gpus4_judging_speedup:` (1-GPU judging seconds over N-GPU) and
`gpus_statuses_identical:` / `gpus_inside_single_lane_interval:` head the `## Several GPUs` section of
docs/benchmarks.md; raw numbers go to $OUT/gpu_scaling.json.

    python3 bench/gpu_scaling.py --kb .kb/2025-01 --problems 24 --per-problem 2 --gpus 4   # on nvidia-h100-x4
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from benchdoc import REPO, kbeval_env, machine_line, out_dir, run_bounded, write_section
from distinct_corpus import corpus_arguments, read_run, write_corpus

SECTION = "## Several GPUs"


def run_on(tree: Path, gpus: int, run_id: str, jobs: int, deadline: float) -> dict:
    """One `kbeval run` on the first `gpus` GPUs: its wall, its judging phase, its verdicts by candidate."""
    out = tree / "results"
    args = ["run", "--device", "cuda", "--problems", str(tree / "problems"), "--candidates", str(tree / "candidates"),
            "--out", str(out), "--run-id", run_id, "--no-compile-baseline", "--jobs", str(jobs),
            "--gpus", ",".join(str(g) for g in range(gpus))]
    rc, wall = run_bounded(args, kbeval_env(tree / "cache"), tree / f"{run_id}.log", deadline)
    verdicts, sessions = read_run(out / run_id)
    phases = sessions[-1] if sessions else {}
    return {"rc": rc, "wall_s": round(wall, 1), "judge_s": (phases.get("running_s") or {}).get("judge"),
            "verdicts": {f"{v['problem']}/{v['candidate']}": _brief(v) for v in verdicts}}


def _brief(v: dict) -> dict:
    return {"status": v["status"], "speedup": v.get("speedup"), "ci": v.get("speedup_vs_eager_ci"),
            "lane": v.get("lane"), "lane_s": v.get("wall_seconds")}


def compare(single: dict, several: dict) -> dict:
    """Statuses identical, and the share of timed candidates whose speedup on several GPUs lies inside the
    interval they had alone (one lane)."""
    both = sorted(set(single["verdicts"]) & set(several["verdicts"]))
    same = sum(single["verdicts"][k]["status"] == several["verdicts"][k]["status"] for k in both)
    inside = timed = 0
    for k in both:
        alone, beside = single["verdicts"][k], several["verdicts"][k]
        if alone["ci"] and beside["speedup"] is not None:
            timed += 1
            inside += alone["ci"][0] <= beside["speedup"] <= alone["ci"][1]
    return {"candidates": len(both), "statuses_identical": same == len(both) == len(single["verdicts"]),
            "inside": inside, "timed": timed, "lanes": len({v["lane"] for v in several["verdicts"].values()}),
            "lane_s_ratio": _lane_seconds_ratio(single, several, both)}


def _lane_seconds_ratio(single: dict, several: dict, both: list[str]) -> float | None:
    """The same candidates' lane seconds beside other lanes over alone: above 1, the lanes slow each other
    (a shared host, the harness's one process); about 1 with a judging phase short of linear, the lanes were
    unevenly loaded or waited for work (the tail)."""
    alone = sum(single["verdicts"][k].get("lane_s") or 0 for k in both)
    beside = sum(several["verdicts"][k].get("lane_s") or 0 for k in both)
    return round(beside / alone, 3) if alone and beside else None


def _busiest(run: dict) -> float | None:
    """The most lane seconds one lane spent judging: the judging phase can be no shorter."""
    per_lane: dict[str, float] = {}
    for v in run["verdicts"].values():
        per_lane[v["lane"]] = per_lane.get(v["lane"], 0.0) + (v.get("lane_s") or 0.0)
    return round(max(per_lane.values()), 1) if per_lane and any(per_lane.values()) else None


def whole(run: dict, count: int) -> bool:
    """A run that judged every candidate and exited by itself: only such a run's judging seconds compare."""
    return run["rc"] == 0 and len(run["verdicts"]) == count


def section(runs: dict[int, dict], checks: dict[int, dict], count: int, command: str) -> tuple[str, dict]:
    base = runs[1]["judge_s"] if whole(runs[1], count) else None
    numbers: dict[str, object] = {}
    for n in sorted(runs):
        if n == 1:
            continue
        if base and runs[n]["judge_s"] and whole(runs[n], count):
            numbers[f"gpus{n}_judging_speedup"] = round(base / runs[n]["judge_s"], 2)
        else:  # a run cut off by its deadline judged fewer candidates: its seconds say nothing of the whole
            cut = [str(k) for k in (1, n) if not whole(runs[k], count)]
            numbers[f"gpus{n}_judging_speedup"] = f"not measured (the run on {' and '.join(cut)} GPU(s) was cut off)"
    numbers["gpus_statuses_identical"] = all(c["statuses_identical"] for c in checks.values())
    inside = sum(c["inside"] for c in checks.values())
    timed = sum(c["timed"] for c in checks.values())
    numbers["gpus_inside_single_lane_interval"] = f"{inside}/{timed}"
    lines = [SECTION, "", "```", *(f"{k}: {v}" for k, v in numbers.items()), "```", "", machine_line("cuda"),
             f"Command: `{command}`. {count} candidates, warm (builds cached by a cold run first), "
             "`--no-compile-baseline`. *Lane s vs 1 GPU*: the same candidates' lane seconds over their lane seconds "
             "alone (above 1: lanes slow each other); *busiest lane*: the most lane seconds one lane spent (the "
             "judging phase can be no shorter).", "",
             "| GPUs | lanes used | wall (s) | judging phase (s) | busiest lane (s) | lane s vs 1 GPU | "
             "statuses as on 1 | speedup inside its 1-GPU interval |", "|---:|---:|---:|---:|---:|---:|---|---|"]
    for n in sorted(runs):
        c = checks.get(n)
        inside_n = f"{c['inside']}/{c['timed']}" if c else "-"
        judged = "" if whole(runs[n], count) else f" (cut off: {len(runs[n]['verdicts'])}/{count} judged)"
        busiest = _busiest(runs[n])
        ratio = c.get("lane_s_ratio") if c else None
        lines.append(f"| {n} | {c['lanes'] if c else 1} | {runs[n]['wall_s']}{judged} | {runs[n]['judge_s']} | "
                     f"{'-' if busiest is None else busiest} | {'-' if ratio is None else ratio} | "
                     f"{'yes' if not c or c['statuses_identical'] else 'no'} | {inside_n} |")
    return "\n".join([*lines, ""]), numbers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    corpus_arguments(parser, problems=24, per_problem=2)
    parser.add_argument("--gpus", type=int, default=4, help="the most GPUs to use (runs on 1, 2, ... up to it)")
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds each warm kbeval run may take "
                        "(a run cut off is said so and its speedup not given)")
    parser.add_argument("--out-md", type=Path, default=REPO / "docs" / "benchmarks.md")
    args = parser.parse_args()
    tree = Path(tempfile.mkdtemp(prefix="kbeval-gpus-"))
    count = write_corpus(args.kb, tree, args.problems, args.per_problem, [int(x) for x in args.levels.split(",")])
    started = time.monotonic()
    cold = run_on(tree, args.gpus, "cold", args.jobs, 3 * args.deadline)  # fills the build cache
    counts = [n for n in (1, 2, 4, 8) if n <= args.gpus]
    runs = {n: run_on(tree, n, f"warm{n}", args.jobs, args.deadline) for n in counts}
    checks = {n: compare(runs[1], runs[n]) for n in counts if n > 1}
    command = " ".join(["python3 bench/gpu_scaling.py", *sys.argv[1:]])
    text, numbers = section(runs, checks, count, command)
    write_section(args.out_md, SECTION, text)
    raw = {"cold": cold, "runs": runs, "checks": checks, "numbers": numbers, "seconds": time.monotonic() - started}
    if (out := out_dir()) is not None:
        (out / "gpu_scaling.json").write_text(json.dumps(raw, indent=1))
        (out / "gpu_scaling_section.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
