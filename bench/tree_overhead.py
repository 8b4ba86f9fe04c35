#!/usr/bin/env python3
"""The timed path's cost against a previous tree, side by side on one machine (issue 36's "no worse than today's").

Issue 36 added checks to every judged candidate (several input distributions, a float64 truth, exact integer
comparisons, per-call clock checks, fresh timed inputs). This bench runs the same seed-corpus GPU candidates
through `kbeval run --device cuda` of two checkouts on the same machine: each cold once on its own fresh cache,
then warm `--rounds` times, the trees alternating (the first tree to go swaps every round, so a drift of the
machine lands on both). Per candidate and tree, from the warm runs' verdicts:
  - lane seconds: the verdict's wall time without its compile (what a candidate costs its lane);
  - timed-path overhead per call: the harness's own clock for one timed call (`timing.wall_ms_per_call`) minus
    the call's runtime (`runtime_ms`): what the harness adds around each timed call.
Lines `lane_seconds_new_over_old:` and `overhead_per_call_new_over_old:` (medians over candidates of the
per-candidate medians) head the section; raw numbers go to $OUT/tree_overhead.json.

    git archive <old-commit> | (mkdir -p .old && tar x -C .old)      # here; .old is git-excluded, carried
    python3 bench/tree_overhead.py --old .old --old-label <old-commit> --problem 45_Gemm_Sigmoid_LogSumExp \
        --problem 71_Conv2d_Divide_LeakyReLU                           # on the GPU machine
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from benchdoc import REPO, machine_line, usable_cores, write_section
from vs_kernelbench import gpu_candidates, lane_seconds, run_kbeval

SECTION = "## Timed path against the previous tree (issue 36)"


def overhead_ms(verdict: dict) -> float | None:
    """The harness's clock for one timed call minus the call's runtime; None where the verdict was not timed."""
    t = verdict.get("timing") or {}
    if t.get("wall_ms_per_call") is None or not verdict.get("runtime_ms"):
        return None
    return t["wall_ms_per_call"] - verdict["runtime_ms"]


def per_candidate(runs: list[dict]) -> dict[tuple[str, str], dict]:
    """Each candidate's medians over the warm runs of one tree: lane seconds, overhead per call, runtime, status."""
    rows: dict[tuple[str, str], dict] = {}
    for run in runs:
        for v in run["verdicts"]:
            row = rows.setdefault((v["problem"], v["candidate"]), {"lane": [], "over": [], "ms": [], "status": []})
            row["lane"].append(lane_seconds(v))
            row["status"].append(v["status"])
            if (o := overhead_ms(v)) is not None:
                row["over"].append(o)
                row["ms"].append(v["runtime_ms"])
    return {k: {"lane_s": statistics.median(r["lane"]),
                "overhead_ms": statistics.median(r["over"]) if r["over"] else None,
                "runtime_ms": statistics.median(r["ms"]) if r["ms"] else None,
                "statuses": sorted(set(r["status"]))} for k, r in rows.items()}


def phase_medians(runs: list[dict]) -> dict[str, float]:
    """Each timing phase's median seconds over every verdict of the runs that has phases (where a lane's time went)."""
    seen: dict[str, list[float]] = {}
    for run in runs:
        for v in run["verdicts"]:
            for phase, sec in ((v.get("timing") or {}).get("phases") or {}).items():
                seen.setdefault(phase, []).append(sec)
    return {phase: round(statistics.median(secs), 3) for phase, secs in seen.items()}


def ratio_of_medians(old: dict, new: dict, key: str) -> float:
    """Median over the candidates both trees measured of new / old."""
    ratios = [new[k][key] / old[k][key] for k in old.keys() & new.keys()
              if (old[k][key] or 0) > 0 and new[k][key] is not None]
    return statistics.median(ratios) if ratios else float("nan")


def table(old: dict, new: dict, labels: tuple[str, str]) -> list[str]:
    a, b = labels
    lines = [f"| problem | candidate | status {a} / {b} | lane s {a} / {b} | overhead ms per call {a} / {b} "
             f"| runtime ms {a} / {b} |", "|---|---|---|---:|---:|---:|"]

    def num(x: float | None, fmt: str) -> str:
        return "" if x is None else format(x, fmt)

    for key in sorted(old.keys() | new.keys()):
        o, n = old.get(key, {}), new.get(key, {})
        statuses = f"{','.join(o.get('statuses', []))} / {','.join(n.get('statuses', []))}"
        lines.append(f"| {key[0][:24]} | {key[1]} | {statuses} | {num(o.get('lane_s'), '.2f')} / "
                     f"{num(n.get('lane_s'), '.2f')}"
                     f" | {num(o.get('overhead_ms'), '.3f')} / {num(n.get('overhead_ms'), '.3f')}"
                     f" | {num(o.get('runtime_ms'), '.4g')} / {num(n.get('runtime_ms'), '.4g')} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", type=Path, required=True, help="root of a checkout of the previous tree")
    parser.add_argument("--old-label", default="old", help="how the table names the previous tree (its commit)")
    parser.add_argument("--new-label", default=os.environ.get("KBEVAL_TREE", "this tree"))
    parser.add_argument("--problem", action="append", default=[], help="only these seed problems (repeatable)")
    parser.add_argument("--rounds", type=int, default=2, help="warm runs per tree, alternating")
    parser.add_argument("--jobs", type=int, default=usable_cores())
    parser.add_argument("--out-md", type=Path, default=REPO / "docs" / "benchmarks.md")
    args = parser.parse_args()
    corpus = Path(tempfile.mkdtemp(prefix="kbeval-tree-overhead-"))
    count = gpu_candidates(REPO / "problems", REPO / "candidates", args.problem, corpus)
    trees = {args.old_label: args.old.resolve(), args.new_label: REPO}
    cold = {label: run_kbeval(corpus, corpus / f"cache-{i}", f"cold-{i}", args.jobs, root)
            for i, (label, root) in enumerate(trees.items())}
    warm: dict[str, list[dict]] = {label: [] for label in trees}
    for r in range(args.rounds):
        order = list(trees.items()) if r % 2 == 0 else list(reversed(trees.items()))
        for label, root in order:
            i = list(trees).index(label)
            warm[label].append(run_kbeval(corpus, corpus / f"cache-{i}", f"warm-{i}-{r}", args.jobs, root))
    old, new = (per_candidate(warm[label]) for label in trees)
    numbers = {"lane_seconds_new_over_old": ratio_of_medians(old, new, "lane_s"),
               "overhead_per_call_new_over_old": ratio_of_medians(old, new, "overhead_ms")}
    out = Path(os.environ.get("OUT", corpus))
    (out / "tree_overhead.json").write_text(json.dumps(
        {"trees": {k: str(v) for k, v in trees.items()}, "cold": cold, "warm": warm, "numbers": numbers}, indent=1))
    walls = "; ".join(f"{label}: cold {cold[label]['wall_s']:.1f} s, warm "
                      + ", ".join(f"{w['wall_s']:.1f}" for w in warm[label]) + " s" for label in trees)
    text = "\n".join([
        SECTION, "", "```", *(f"{k}: {v:.3g}" for k, v in numbers.items()), "```", "",
        f"{machine_line('cuda')}. {count} GPU candidates of the seed corpus "
        f"({', '.join(args.problem) or 'every problem'}), real sizes; trees {args.old_label} (old) and "
        f"{args.new_label} (new). Command: `python3 bench/tree_overhead.py --old .old --old-label {args.old_label}"
        + "".join(f" --problem {p}" for p in args.problem) + f" --rounds {args.rounds} --jobs {args.jobs}`. "
        f"Each tree cold once on its own cache, then {args.rounds} warm runs each, alternating; medians over the "
        f"warm runs. Run walls: {walls}.", "", *table(old, new, tuple(trees)), "",
        "Timing phases per candidate, median seconds: " + "; ".join(
            f"{label}: " + ", ".join(f"{p} {s}" for p, s in phase_medians(warm[label]).items()) for label in trees),
        ""])
    write_section(args.out_md, SECTION, text)
    print(text, flush=True)


if __name__ == "__main__":
    main()
