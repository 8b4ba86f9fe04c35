"""Honest CPU candidates judged again and again while busy processes hold the cores.

The goal (issue 13): an honest candidate is `ok` in every run, never `suspicious`, whatever else the machine
is doing. Each run is a plain `kbeval run --device cpu` of the seed corpus's honest candidates (at the test's
small dims) and the fixture's, with `--busy` processes spinning beside it; the table of statuses and
speedups goes into the `## Under load (CPU)` section of docs/benchmarks.md.

    python bench/under_load.py --runs 3 --busy 2 --write docs/benchmarks.md
    OMP_WAIT_POLICY=ACTIVE python bench/under_load.py --runs 3   # the spin-waiting workers, for comparison
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchdoc import write_section

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
SEED_DIMS = ("batch_size=2", "height=32", "width=32", "input_size=256", "hidden_size=512", "num_groups=32")
SEED_HONEST = ("cpp_fused_bias_scale_sigmoid", "cpp_fused_epilogue", "cpp_logsumexp", "cpp_groupnorm_leakyrelu_x2",
               "cpp_div_leakyrelu", "pytorch_mul")
FIXTURE_HONEST = ("cpp_honest", "py_honest")
SECTION = "## Under load (CPU)"


def copy_candidates(dest: Path) -> tuple[Path, Path]:
    """The honest candidates only, with their problems, in one problems/candidates pair of folders."""
    problems, candidates = dest / "problems", dest / "candidates"
    problems.mkdir(parents=True)
    for path in (ROOT / "candidates").glob("*/*.py"):
        if path.stem in SEED_HONEST:
            (candidates / path.parent.name).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, candidates / path.parent.name / path.name)
    for path in (ROOT / "problems").rglob("*.py"):
        if (candidates / path.stem).is_dir():
            shutil.copy(path, problems / path.name)
    shutil.copy(FIXTURES / "problems" / "tiny_linear_relu.py", problems)
    (candidates / "tiny_linear_relu").mkdir()
    for name in FIXTURE_HONEST:
        shutil.copy(FIXTURES / "candidates" / "tiny_linear_relu" / f"{name}.py", candidates / "tiny_linear_relu")
    return problems, candidates


def one_run(problems: Path, candidates: Path, out: Path, run_id: str, cache: Path, busy: int,
            extra: list[str]) -> list[dict]:
    """One `kbeval run` with `busy` spinning processes beside it; its verdicts."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        cmd = [sys.executable, "-m", "kernelbench_eval", "run", "--device", "cpu", "--problems", str(problems),
               "--candidates", str(candidates), "--out", str(out), "--run-id", run_id, "--no-compile-baseline",
               "--trials", "2", "--jobs", "2", *[a for d in SEED_DIMS for a in ("--dim", d)], *extra]
        env = dict(os.environ, KBEVAL_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()
    return [json.loads(line) for line in (out / run_id / "verdicts.jsonl").read_text().splitlines()]


def table(runs: list[list[dict]]) -> list[str]:
    names = sorted({(v["problem"], v["candidate"]) for run in runs for v in run})
    head = "| candidate | " + " | ".join(f"run {i + 1}" for i in range(len(runs))) + " | speedup min..max |"
    rows = [head, "|---|" + "---|" * len(runs) + "---:|"]
    for problem, cand in names:
        cells, speedups = [], []
        for run in runs:
            v = next((x for x in run if (x["problem"], x["candidate"]) == (problem, cand)), None)
            if v is None:
                cells.append("-")
                continue
            s = v.get("speedup")
            speedups += [s] if s else []
            cells.append(v["status"] + (f" {s:.2f}x" if s else ""))
        spread = f"{min(speedups):.2f}..{max(speedups):.2f}" if speedups else "-"
        rows.append(f"| {problem[:2]}/{cand} | " + " | ".join(cells) + f" | {spread} |")
    return rows


def summary(runs: list[list[dict]]) -> str:
    verdicts = [v for run in runs for v in run]
    ok = sum(v["status"] == "ok" for v in verdicts)
    suspicious = [v for v in verdicts if v["status"] == "suspicious"]
    ratios = [max(v["speedup"] for v in vs) / min(v["speedup"] for v in vs)
              for vs in _by_candidate(verdicts).values() if all(v.get("speedup") for v in vs) and len(vs) > 1]
    return (f"{ok} of {len(verdicts)} verdicts ok, {len(suspicious)} suspicious; a candidate's largest/smallest "
            f"speedup across runs: median {statistics.median(ratios):.2f}, worst {max(ratios):.2f}"
            if ratios else f"{ok} of {len(verdicts)} verdicts ok, {len(suspicious)} suspicious")


def _by_candidate(verdicts: list[dict]) -> dict[tuple[str, str], list[dict]]:
    out: dict[tuple[str, str], list[dict]] = {}
    for v in verdicts:
        out.setdefault((v["problem"], v["candidate"]), []).append(v)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--busy", type=int, default=2, help="spinning processes beside each run")
    parser.add_argument("--timing-budget", default="2")
    parser.add_argument("--write", type=Path, help="put the table into this Markdown file's section")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kbeval-under-load-") as tmp:
        problems, candidates = copy_candidates(Path(tmp))
        cache = Path(tmp) / "cache"
        started = time.monotonic()
        runs = [one_run(problems, candidates, Path(tmp) / "out", f"run{i}", cache, args.busy,
                        ["--timing-budget", args.timing_budget]) for i in range(args.runs)]
        seconds = time.monotonic() - started
    load = os.getloadavg()
    wait = os.environ.get("OMP_WAIT_POLICY", "PASSIVE (kbeval's default)")
    text = "\n".join([
        SECTION, "",
        f"`python bench/under_load.py --runs {args.runs} --busy {args.busy}`: {os.cpu_count()} cores "
        f"({platform.machine()}), {args.busy} `while True: pass` processes beside each run, other people's work on "
        f"the machine too (load average at the end {load[0]:.1f}); OMP_WAIT_POLICY {wait}; "
        f"`--timing-budget {args.timing_budget} --trials 2`, the seed corpus's test dims; {seconds:.0f} s.", "",
        *table(runs), "", summary(runs), ""])
    print(text)
    if args.write:
        write_section(args.write, SECTION, text)


if __name__ == "__main__":
    main()
