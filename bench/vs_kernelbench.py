"""kbeval against KernelBench's own evaluation flow, side by side on one GPU machine, real problem sizes.

Runs, one after the other on the same machine and the same candidates (the GPU candidates of the seed corpus):
  1. KernelBench's flow (`kb_eval.py` of the yardstick: its eval code driven as `eval_from_generations.py`
     does with build_cache=True; compile phase, then each candidate alone in a fresh process);
  2. `kbeval run --device cuda` cold: fresh build cache, fresh baselines;
  3. `kbeval run` warm: a new run on the warm cache and baselines (everything judged again).
Writes the `## vs KernelBench` section of docs/benchmarks.md (the run's tables, ending with the ratio lines
the issue names; the section's earlier runs and readings stay below them) and raw numbers to
$OUT/vs_kernelbench.json. The yardstick is never part of this project: pass its folder
(a git-excluded copy carried to the GPU machine) with --kb.

    python3 bench/vs_kernelbench.py --kb .anchors/kernelbench            # every GPU candidate of the corpus
    python3 bench/vs_kernelbench.py --kb .anchors/kernelbench --problem 45_Gemm_Sigmoid_LogSumExp \
        --problem 71_Conv2d_Divide_LeakyReLU                              # the issue's first 10 candidates
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchdoc import REPO, usable_cores, write_section

SECTION = "## vs KernelBench"


def gpu_candidates(problems: Path, candidates: Path, only: list[str], tree: Path, copies: int = 1,
                   limit: int | None = None) -> int:
    """problems/<id>.py and candidates/<id>/<name>.py, GPU candidates only (what KernelBench evaluates);
    `copies` > 1 writes each that many times, each with its own trailing comment: distinct bytes, own build."""
    count = 0
    for pdir in sorted(p for p in candidates.iterdir() if p.is_dir() and (not only or p.name in only)):
        found = list(problems.rglob(f"{pdir.name}.py"))
        if not found:
            continue
        (tree / "problems").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(found[0], tree / "problems" / found[0].name)
        for cand in sorted(pdir.glob("*.py")):
            if re.search(r"KBEVAL_DEVICES\s*=\s*\[\s*['\"]cpu['\"]\s*\]", cand.read_text(errors="replace")):
                continue
            (tree / "candidates" / pdir.name).mkdir(parents=True, exist_ok=True)
            for k in range(copies):
                if limit is not None and count >= limit:
                    break
                name = cand.name if copies == 1 else f"{cand.stem}_c{k}.py"
                text = cand.read_text(errors="replace") + (f"\n# distinct copy {k}\n" if copies > 1 else "")
                (tree / "candidates" / pdir.name / name).write_text(text)
                count += 1
    return count


def model_kernelbench(measured: dict, count: int, workers: int = 16) -> dict:
    """KernelBench's time for `count` candidates from a measured run: compile rounds of `workers` builds,
    then its per-candidate evaluation time (the run of many is longer than one device call allows)."""
    n = measured["candidates"]
    rounds = -(-count // workers) / -(-n // workers)
    compile_s, eval_s = measured["compile_phase_s"] * rounds, measured["eval_phase_s"] / n * count
    return {"candidates": count, "compile_phase_s": round(compile_s, 1), "eval_phase_s": round(eval_s, 1),
            "total_s": round(compile_s + eval_s, 1), "rows": [], "modelled_from": n}


def run_kernelbench(kb: Path, tree: Path) -> dict:
    shutil.rmtree("/tmp/kb_build", ignore_errors=True)  # cold: KernelBench's build cache
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(kb / "kb_eval.py"), str(tree / "problems"), str(tree / "candidates"),
                           str(tree / "kb.jsonl")], capture_output=True, text=True, timeout=3000)
    wall = time.monotonic() - started
    print(proc.stdout[-3000:], proc.stderr[-2000:], flush=True)
    phases = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = [json.loads(line) for line in (tree / "kb.jsonl").read_text().splitlines() if line.strip()]
    return {"wall_s": wall, **phases, "rows": rows}


def run_kbeval(tree: Path, cache: Path, run_id: str, jobs: int, root: Path = REPO) -> dict:
    """`kbeval run` of the checkout at `root` (another tree's, for bench/tree_overhead.py) on `tree`'s corpus."""
    path = f"{root}:{os.environ.get('PYTHONPATH', '')}"
    env = dict(os.environ, KBEVAL_CACHE_DIR=str(cache), COLUMNS="200", PYTHONPATH=path)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kernelbench_eval", "run", "--device", "cuda", "--problems",
                           str(tree / "problems"), "--candidates", str(tree / "candidates"), "--out",
                           str(tree / "results"), "--run-id", run_id, "--jobs", str(jobs)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=3000)
    wall = time.monotonic() - started
    print(proc.stdout[-4000:], proc.stderr[-2000:], flush=True)
    path = tree / "results" / run_id / "verdicts.jsonl"
    verdicts = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return {"wall_s": wall, "rc": proc.returncode, "verdicts": verdicts}


def lane_seconds(verdict: dict) -> float:
    """The time a candidate held its lane: its evaluation's wall time, without this run's compile."""
    return verdict["wall_seconds"] - (verdict.get("compile_seconds") or 0.0)


def summarize(kb: dict, cold: dict, warm: dict | None, count: int) -> tuple[list[str], dict]:
    """The tables and the ratio lines; `warm` None: no warm run (`--no-warm`), candidates shown from the cold one."""
    lines = ["| phase | wall (s) | candidates | statuses |", "|---|---:|---:|---|"]
    kb_ok = sum(1 for r in kb["rows"] if r.get("correctness"))
    how = f"modelled from {kb['modelled_from']} measured" if kb.get("modelled_from") else f"{kb_ok} correct"
    lines.append(f"| KernelBench flow, cold (compile {kb['compile_phase_s']} s + evaluation {kb['eval_phase_s']} s) "
                 f"| {kb['total_s']:.1f} | {count} | {how} |")
    which = "warm" if warm else "cold"
    for name, res in (("kbeval run, cold", cold), *((("kbeval run, warm", warm),) if warm else ())):
        statuses: dict[str, int] = {}
        for v in res["verdicts"]:
            statuses[v["status"]] = statuses.get(v["status"], 0) + 1
        lines.append(f"| {name} | {res['wall_s']:.1f} | {len(res['verdicts'])} | "
                     + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())) + " |")
    per = ["", f"| problem | candidate | KB eval s | KB compile s | kbeval lane s ({which}) | "
               f"kbeval compile s (cold) | timed-call wall / kernel (ms) | device busy | phases (s, {which}) |",
           "|---|---|---:|---:|---:|---:|---|---:|---|"]
    kb_by = {(r["problem"], r["candidate"]): r for r in kb["rows"]}
    cold_by = {(v["problem"], v["candidate"]): v for v in cold["verdicts"]}
    lanes: dict[str, list[float]] = {}
    for v in sorted((warm or cold)["verdicts"], key=lambda v: (v["problem"], v["candidate"])):
        key = (v["problem"], v["candidate"])
        k, c, t = kb_by.get(key, {}), cold_by.get(key, {}), v.get("timing") or {}
        lanes.setdefault(v["problem"], []).append(lane_seconds(v))
        call = f"{t['wall_ms_per_call']:.3g} / {v['runtime_ms']:.3g}" if t and v["runtime_ms"] > 0 else ""
        busy = f"{t['device_busy']:.0%}" if t.get("device_busy") is not None else ""
        phases = ", ".join(f"{p} {s:.2f}" for p, s in (t.get("phases") or {}).items())
        per.append(f"| {v['problem'][:24]} | {v['candidate']} | {k.get('eval_wall_s', '')} | "
                   f"{k.get('compile_wall_s', '')} | {lane_seconds(v):.1f} | {c.get('compile_seconds', '')} | {call} | "
                   f"{busy} | {phases} |")
    p71 = [s for p, s in lanes.items() if p.startswith("71_") for s in s]
    numbers = {
        "vs_kernelbench_cold_ratio": kb["total_s"] / cold["wall_s"],
        "vs_kernelbench_warm_ratio": kb["eval_phase_s"] / warm["wall_s"] if warm else float("nan"),
        "lane_seconds_per_candidate_71": statistics.median(p71) if p71 else float("nan"),
    }
    lane_medians = {p: statistics.median(s) for p, s in lanes.items()}
    kb_medians = {p: statistics.median([r["eval_wall_s"] for r in kb["rows"] if r["problem"] == p])
                  for p in lanes if any(r["problem"] == p for r in kb["rows"])}
    notes = ["", f"Median lane seconds per candidate (kbeval, {which}) against KernelBench's evaluation seconds per "
                 "candidate: " + "; ".join(f"{p[:2]}: {lane_medians[p]:.1f} vs {kb_medians.get(p, float('nan')):.1f}"
                                          for p in sorted(lane_medians))]
    return lines + per + notes, numbers


def section_text(header: list[str], body: list[str], numbers: dict, title: str = SECTION) -> str:
    """The run's block: the ratio lines the issue names first (issue 38), then what ran and the tables."""
    return "\n".join([title, "", "```",
                      *(f"{k}: {v:.3g}" if isinstance(v, float) else f"{k}: {v}" for k, v in numbers.items()),
                      "```", "", *header, "", *body, ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kb", type=Path, required=True, help="a copy of the yardstick's kernelbench folder")
    parser.add_argument("--problems", type=Path, default=REPO / "problems")
    parser.add_argument("--candidates", type=Path, default=REPO / "candidates")
    parser.add_argument("--problem", action="append", default=[], help="only these problem ids (repeatable)")
    parser.add_argument("--jobs", type=int, default=usable_cores())
    parser.add_argument("--out-md", type=Path, default=REPO / "docs" / "benchmarks.md")
    parser.add_argument("--copies", type=int, default=1, help="distinct copies of each candidate (own builds)")
    parser.add_argument("--kb-from", type=Path, help="model KernelBench from this earlier vs_kernelbench.json "
                                                      "instead of running it (for --copies runs)")
    parser.add_argument("--limit", type=int, help="at most this many candidates (after --copies)")
    parser.add_argument("--no-warm", action="store_true", help="skip the warm run")
    parser.add_argument("--section", default=SECTION, help="the docs/benchmarks.md section to (re)write")
    args = parser.parse_args()
    tree = Path(tempfile.mkdtemp(prefix="kbeval-vs-kb-"))
    count = gpu_candidates(args.problems, args.candidates, args.problem, tree, args.copies, args.limit)
    out = Path(os.environ.get("OUT", tree))
    if args.kb_from:
        kb = model_kernelbench(json.loads(args.kb_from.read_text())["kb"], count)
    else:
        kb = run_kernelbench(args.kb, tree)
    cache = tree / "cache"
    cold = run_kbeval(tree, cache, "cold", args.jobs)
    warm = None if args.no_warm else run_kbeval(tree, cache, "warm", args.jobs)
    body, numbers = summarize(kb, cold, warm, count)
    if args.no_warm:  # only the cold ratio means anything here; the exact lines of the main section stay its own
        numbers = {f"cold_ratio_{count}_candidates": numbers["vs_kernelbench_cold_ratio"]}
    raw = {"kb": kb, "cold": cold, "warm": warm, "numbers": numbers}
    (out / "vs_kernelbench.json").write_text(json.dumps(raw, indent=1))
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    import torch

    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    header = [f"{gpu}, {usable_cores()} CPU cores, PyTorch {torch.__version__}; {when}.",
              f"{count} GPU candidate{'s' if count != 1 else ''} of the seed corpus "
              f"({', '.join(args.problem) or 'every problem'}), real sizes. "
              f"Command: `python3 bench/vs_kernelbench.py --kb .anchors/kernelbench"
              + "".join(f" --problem {p}" for p in args.problem) + f" --jobs {args.jobs}"
              + (f" --copies {args.copies}" if args.copies > 1 else "")
              + (f" --limit {args.limit}" if args.limit else "") + (" --no-warm" if args.no_warm else "")
              + (f" --kb-from {args.kb_from.name}" if args.kb_from else "") + "`. "
              + ("KernelBench modelled from an earlier measured run (`--kb-from`)" if args.kb_from else
                 "KernelBench runs first (its compile phase on 16 processes, then each candidate alone in a fresh "
                 "process: 5 correctness trials, 100 timed calls)")
              + "; then `kbeval run --device cuda` on a fresh build cache and baselines (cold)"
              + ("." if args.no_warm else ", then again on the warm cache (warm: every candidate judged anew, builds "
                 "and baselines reused). The warm ratio compares KernelBench's evaluation phase (its warm-cache cost) "
                 "with kbeval's whole warm run.")]
    write_section(args.out_md, args.section, section_text(header, body, numbers, args.section), keep_previous=True)
    print(json.dumps(numbers), flush=True)


if __name__ == "__main__":
    main()
