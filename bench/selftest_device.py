"""`kbeval selftest` on the seed problems at full size: what this device can resolve, per problem.

Each problem's reference is judged against an identical copy of itself (issue 19); the true speedup is 1, so
the table shows the harness on this machine: whether every copy is `ok`, whether the intervals contain 1 as
often as they claim, the reference's median and spread, and the smallest speedup each problem's measurement
could tell apart from 1 (`resolves`).

    python3 bench/selftest_device.py                          # on the GPU machine: ~2 min on an H100
    python bench/selftest_device.py --device cpu --dry-run    # anywhere: smoke sizes, one thread

Writes the `## Self-test (H100)` section of docs/benchmarks.md (`--out-md`; a dry run writes none unless
given one) and, when OUT is set, $OUT/selftest.json (the command's JSON), $OUT/selftest.md (the section) and
$OUT/selftest.log (its stderr). Stopped at `--deadline`, it reports the problems judged by then (from the
run's verdicts).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from benchdoc import REPO, kbeval_env, machine_line, out_dir, run_bounded, tail, write_section

SECTION_CUDA = "## Self-test (H100)"
SECTION_CPU = "## Self-test (CPU dry run)"


def from_verdicts(results: Path) -> dict | None:
    """The self-test's summary rebuilt from whatever verdicts a stopped run recorded."""
    from kernelbench_eval.records import Verdict
    from kernelbench_eval.run.selftest import CANDIDATE_ID, summarize

    found = sorted(results.glob("*/verdicts.jsonl"))
    if not found:
        return None
    verdicts = [Verdict.model_validate_json(line) for line in found[-1].read_text().splitlines() if line.strip()]
    return summarize([v for v in verdicts if v.candidate == CANDIDATE_ID]).to_json()


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(result: dict) -> list[str]:
    out = ["| problem | status | speedup | 95 % interval | contains 1 | reference median (ms) | reference spread "
           "(IQR / median) | resolves |", "|---|---|---:|---|:-:|---:|---:|---:|"]
    notes = []
    for r in result["rows"]:
        ci = f"[{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]" if r["ci"] else "-"
        inside = "-" if not r["ci"] else ("**no**" if r["excludes_one"] else "yes")
        out.append(f"| {r['problem']} | {r['status']} | {_num(r['speedup'], '.3f')} | {ci} | {inside} | "
                   f"{_num(r['ref_median_ms'], '.4g')} | {_num(r['ref_spread'], '.1%')} | "
                   f"{_num(r['resolution'], '.3f')} |")
        notes += [f"- {r['problem']}: {note}" for note in (r["error"], r["problem_warning"]) if note]
    return out + ([""] + notes if notes else [])


def verdict_line(result: dict) -> str:
    return (f"{'PASS' if result['passed'] else 'FAIL'}: {result['not_ok']} copies not `ok`; {result['excluded']} "
            f"of {sum(1 for r in result['rows'] if r['ci'])} intervals exclude 1, at most {result['allowed']} "
            f"expected by chance (95 % intervals, 1 % false alarm). *resolves*: the interval's geometric half-width "
            "sqrt(high / low), the smallest speedup (or slowdown) a candidate measured with this noise could show "
            "apart from 1.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--dry-run", action="store_true", help="smoke sizes and timing, one thread (for the CPU)")
    parser.add_argument("--problems", type=Path, default=REPO / "problems")
    parser.add_argument("--problem", action="append", default=[], help="only these problems (repeatable)")
    parser.add_argument("--timing-budget", help="kbeval's --timing-budget (default: kbeval's)")
    parser.add_argument("--deadline", type=float, default=180, help="seconds before it is stopped (default 180)")
    parser.add_argument("--out-md", type=Path, help="Markdown file to (re)write the section in "
                                                    "(default: docs/benchmarks.md; a dry run: none)")
    parser.add_argument("--section", help="section title (default: by device)")
    parser.add_argument("--workdir", type=Path, help="keep the results here")
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="kbeval-selftest-device-"))
    work.mkdir(parents=True, exist_ok=True)
    flags = ["--device", args.device, "--problems", str(args.problems), *(a for p in args.problem
                                                                         for a in ("--problem", p))]
    flags += ["--timing-budget", args.timing_budget] if args.timing_budget else []
    flags += ["--smoke", "--threads", "1"] if args.dry_run else []
    out = out_dir()
    log, stdout = (out or work) / "selftest.log", work / "selftest.stdout"
    rc, wall = run_bounded(["selftest", *flags, "--json", "--out", str(work / "results")], kbeval_env(), log,
                           args.deadline, stdout=stdout)
    print(tail(log, 3000), flush=True)
    try:
        result = json.loads(stdout.read_text()) if rc in (0, 1) else None
    except json.JSONDecodeError:
        result = None
    result = result or from_verdicts(work / "results")
    where = args.problems.resolve()
    shown = [str(where.relative_to(REPO)) if a == str(args.problems) and where.is_relative_to(REPO) else a
             for a in flags]
    command = f"kbeval selftest {' '.join(shown)} --json"
    stopped = f", stopped at the {args.deadline:.0f} s deadline" if rc is None else (
        f", exit {rc}" + (" (a copy not ok or too many intervals without 1)" if rc == 1 else ""))
    title = args.section or (SECTION_CUDA if args.device == "cuda" else SECTION_CPU)
    head = [title, "", machine_line(args.device), "",
            f"`python3 bench/selftest_device.py{' --device cpu --dry-run' if args.dry_run else ''}`, that is "
            f"`{command}` (each problem's reference against `class ModelNew(Model): pass` appended to its own "
            f"source, through the whole pipeline; harness defaults otherwise): {wall:.0f} s{stopped}.", ""]
    if result:
        text = "\n".join([*head, *table(result), "", verdict_line(result), ""])
    else:
        text = "\n".join([*head, "No verdict was recorded; the command's last output:", "", "```",
                          tail(log, 1500), "```", ""])
    print(text, flush=True)
    md = args.out_md or (None if args.dry_run else REPO / "docs" / "benchmarks.md")
    if md:
        write_section(md, title, text)
    if out:
        (out / "selftest.md").write_text(text)
        (out / "selftest.json").write_text(json.dumps({"command": command, "rc": rc, "wall_s": wall,
                                                       "result": result}, indent=1))


if __name__ == "__main__":
    main()
