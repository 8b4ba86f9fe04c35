"""Reports over one run's verdicts: a leaderboard frame and writers for table, CSV, JSON, Markdown, JUnit, HTML.

Every writer is a pure function of the verdicts (`kbeval report` and `write_default_reports` only choose
where the text goes), so the same run always renders the same report.
"""

from __future__ import annotations

import io
import json
import math
import textwrap
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pandas as pd
from rich.console import Console

from kernelbench_eval import statuses
from kernelbench_eval.common.stats import FAST_P, fast_p
from kernelbench_eval.records import Verdict
from kernelbench_eval.results import phases as account
from kernelbench_eval.results.aggregates import aggregates, aggregates_text
from kernelbench_eval.results.display import status_counts, verdict_table
from kernelbench_eval.results.formatting import fit_items, number, runtime_text
from kernelbench_eval.results.html_report import render_html
from kernelbench_eval.results.kernelbench import write_eval_results
from kernelbench_eval.results.record import RunRecorder
from kernelbench_eval.store.atomic import write_atomic

FORMATS = ("table", "csv", "json", "markdown", "html", "junit", "summary")
COLUMNS = ["problem", "candidate", "status", "correct", "runtime_ms", "ref_runtime_ms", "speedup", "speedup_low",
           "compile_runtime_ms", "speedup_vs_compile", "speedup_vs_compile_low", "max_abs_diff", "error", "log"]
STRING_COLUMNS = ["problem", "candidate", "status", "error", "log"]
FLOAT_COLUMNS = ["runtime_ms", "ref_runtime_ms", "speedup", "speedup_low", "compile_runtime_ms", "speedup_vs_compile",
                 "speedup_vs_compile_low", "max_abs_diff"]
# The dtypes of `leaderboard()`; pass them to `pd.read_csv`/`pd.read_json` so that a column that happens to be
# empty in this run (say, no logs) reads back as the same type instead of being guessed.
DTYPES: dict[str, str] = {**dict.fromkeys(STRING_COLUMNS, "str"), "correct": "bool",
                          **dict.fromkeys(FLOAT_COLUMNS, "float64")}


def load_run(run_dir: Path) -> list[Verdict]:
    """The verdicts of one run folder; FileNotFoundError when it is not a run folder."""
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no such run folder: {run_dir}")
    recorder = RunRecorder(run_dir)
    if not recorder.verdicts_path.exists():
        raise FileNotFoundError(f"{run_dir} has no {recorder.verdicts_path.name}: not a run folder")
    return recorder.load()


def leaderboard(verdicts: list[Verdict]) -> pd.DataFrame:
    """One row per candidate, sorted by problem, then speedup (fastest first, no speedup last), then name."""
    rows = [_row(v) for v in verdicts]
    df = pd.DataFrame(rows, columns=COLUMNS)
    df = df.astype(DTYPES)
    df = df.sort_values(["problem", "speedup", "candidate"], ascending=[True, False, True], na_position="last",
                        kind="mergesort")
    return df.reset_index(drop=True)


def _row(v: Verdict) -> dict[str, object]:
    row: dict[str, object] = {col: getattr(v, col, None) for col in COLUMNS}
    row["speedup_low"] = v.speedup_vs_eager_ci[0] if v.speedup_vs_eager_ci else None
    row["speedup_vs_compile_low"] = v.speedup_vs_compile_ci[0] if v.speedup_vs_compile_ci else None
    return row


def fast_p_frame(verdicts: list[Verdict]) -> pd.DataFrame:
    """fast_p per problem and overall, against eager and torch.compile: the share of candidates correct,
    not suspicious, and faster than the baseline by more than p at the low end of the 95 % interval.

    `skipped` candidates were never judged, so they are out of the denominator (`candidates` counts the judged
    ones), as they are out of pass@k's n (`aggregates`); a problem whose candidates were all skipped has no
    row, as it has no pass@k."""
    rows = []
    judged = [v for v in verdicts if v.status != "skipped"]
    groups = sorted({v.problem for v in judged})
    baselines = [("eager", "speedup_vs_eager_ci")]
    if any(v.compile_runtime_ms is not None for v in verdicts):  # a run without a compile baseline has no row
        baselines.append(("compile", "speedup_vs_compile_ci"))
    for problem in [*groups, "all"]:
        group = [v for v in judged if problem in ("all", v.problem)]
        for baseline, field in baselines:
            entries = [(v.status == "ok", (getattr(v, field) or (None,))[0]) for v in group]
            row: dict[str, object] = {"problem": problem, "baseline": baseline, "candidates": len(group)}
            row.update({f"fast_{p:g}": fast_p(entries, p) for p in FAST_P})
            rows.append(row)
    return pd.DataFrame(rows, columns=["problem", "baseline", "candidates", *(f"fast_{p:g}" for p in FAST_P)])


def to_summary(verdicts: list[Verdict]) -> str:
    """`summary.json`: counts by status, fast_p, geomean speedups, pass@k per problem and per-folder aggregates,
    for dashboards that want one small file."""
    payload = {"candidates": len(verdicts), "statuses": statuses.counts(v.status for v in verdicts),
               "fast_p": fast_p_frame(verdicts).to_dict(orient="records"), **aggregates(verdicts)}
    return json.dumps(payload, indent=2) + "\n"


def best_per_problem(df: pd.DataFrame) -> pd.DataFrame:
    """One row per problem: its fastest correct candidate and speedup, or NaN in both when none is correct."""
    rows = []
    for problem, group in df.groupby("problem", sort=True):
        good = group[group["correct"] & group["speedup"].notna()]
        if good.empty:
            rows.append({"problem": problem, "candidate": None, "speedup": math.nan})
        else:
            top = good.sort_values(["speedup", "candidate"], ascending=[False, True]).iloc[0]
            rows.append({"problem": problem, "candidate": top["candidate"], "speedup": float(top["speedup"])})
    return pd.DataFrame(rows, columns=["problem", "candidate", "speedup"]).astype(
        {"problem": "str", "candidate": "str", "speedup": "float64"})


# --- writers: verdicts in, text out -----------------------------------------------------------------------


def to_table(verdicts: list[Verdict], title: str = "report", width: int | None = None) -> str:
    """The rich table `kbeval run` prints, plus the best candidate of each problem, rendered to text."""
    buffer = io.StringIO()
    out = Console(file=buffer, width=width or 160, force_terminal=False, color_system=None)
    out.print(verdict_table(verdicts, title=title))
    out.print(f"{len(verdicts)} verdicts ({status_counts(verdicts)})")
    for row in best_per_problem(leaderboard(verdicts)).itertuples():
        best = f"{row.candidate} {row.speedup:.2f}x" if isinstance(row.candidate, str) else "no correct candidate"
        out.print(f"best {row.problem}: {best}", markup=False)
    out.print(fast_p_text(verdicts, width=out.width), markup=False)
    out.print(aggregates_text(verdicts), markup=False)
    return buffer.getvalue()


FAST_P_HEAD = ("fast_p (share of judged candidates correct and faster than the baseline by more than p, at the "
               "95% interval's lower bound; skipped ones not counted):")


def fast_p_text(verdicts: list[Verdict], width: int | None = None) -> str:
    """fast_p as text lines (overall first), the way `kbeval run` ends; with `width`, every line fits it,
    broken between words of the heading and between the `fast_p=` items of a row, never inside one."""
    df = fast_p_frame(verdicts)
    cols = [c for c in df.columns if c.startswith("fast_")]
    lines = textwrap.wrap(FAST_P_HEAD, width) if width else [FAST_P_HEAD]
    order = pd.concat([df[df["problem"] == "all"], df[df["problem"] != "all"]])
    for row in order.to_dict(orient="records"):
        items = [f"{c}={row[c]:.2f}" for c in cols]
        lines += fit_items(f"  {row['problem']} vs {row['baseline']}:", items, width)
    return "\n".join(lines)


def to_csv(verdicts: list[Verdict]) -> str:
    return leaderboard(verdicts).to_csv(index=False)


def to_json(verdicts: list[Verdict]) -> str:
    return leaderboard(verdicts).to_json(orient="records", indent=2) + "\n"


def _md_cell(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    text = str(value).strip().splitlines()[0] if str(value).strip() else ""
    if len(text) > 120:
        text = text[:117] + "..."
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
            .replace("`", "\\`"))


def to_markdown(verdicts: list[Verdict]) -> str:
    """A GitHub-flavoured Markdown table (one line per candidate) to paste into a pull request."""
    df = leaderboard(verdicts)
    header = ["problem", "candidate", "status", "runtime ms", "ref ms", "speedup", "max abs diff", "error"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---", "---", "---", "---:", "---:", "---:", "---:",
                                                                 "---"]) + "|"]
    for row in df.itertuples():
        status = f"**{row.status}**" if row.status != "ok" else "ok"
        numbers = [runtime_text(row.runtime_ms), runtime_text(row.ref_runtime_ms), number(row.speedup, ".2f", "x"),
                   number(row.max_abs_diff, ".2g")]
        cells = [_md_cell(row.problem), _md_cell(row.candidate), status, *numbers, _md_cell(row.error)]
        lines.append("| " + " | ".join(cells) + " |")
    fp = fast_p_frame(verdicts)
    cols = [c for c in fp.columns if c.startswith("fast_")]
    lines += ["", "| problem | baseline | " + " | ".join(cols) + " |", "|---|---|" + "---:|" * len(cols)]
    for row in fp.to_dict(orient="records"):
        lines.append(f"| {_md_cell(row['problem'])} | {row['baseline']} | "
                     + " | ".join(f"{row[c]:.2f}" for c in cols) + " |")
    lines += ["", *(f"- {_md_cell(line.strip())}" for line in aggregates_text(verdicts).splitlines())]
    return "\n".join(lines) + "\n"


def to_junit(verdicts: list[Verdict]) -> str:
    """JUnit XML: one testsuite per problem, one testcase per candidate; incorrect ones fail, skipped ones skip."""
    root = ET.Element("testsuites", name="kbeval")
    by_problem: dict[str, list[Verdict]] = {}
    for v in sorted(verdicts, key=lambda v: (v.problem, v.candidate)):
        by_problem.setdefault(v.problem, []).append(v)
    totals = {"tests": 0, "failures": 0, "skipped": 0}
    total_time = 0.0
    for problem, group in by_problem.items():
        failures = sum(1 for v in group if _junit_failed(v))
        skipped = sum(1 for v in group if v.status == "skipped")
        seconds = sum(v.wall_seconds for v in group)
        suite = ET.SubElement(root, "testsuite", name=problem, tests=str(len(group)), failures=str(failures),
                              errors="0", skipped=str(skipped), time=f"{seconds:.3f}")
        for v in group:
            case = ET.SubElement(suite, "testcase", classname=problem, name=v.candidate, time=f"{v.wall_seconds:.3f}")
            if v.status == "skipped":
                ET.SubElement(case, "skipped", message=v.error or "skipped")
            elif _junit_failed(v):
                failure = ET.SubElement(case, "failure", message=(v.error or v.status).splitlines()[0][:500] if (
                    v.error or v.status).strip() else v.status, type=v.status)
                failure.text = "\n".join(x for x in (v.error, f"log: {v.log}" if v.log else None) if x)
            else:
                out = ET.SubElement(case, "system-out")
                out.text = (f"runtime {runtime_text(v.runtime_ms)} ms, reference {runtime_text(v.ref_runtime_ms)} "
                            f"ms, speedup {number(v.speedup, '.2f', 'x')}")
        totals["tests"] += len(group)
        totals["failures"] += failures
        totals["skipped"] += skipped
        total_time += seconds
    for key, value in totals.items():
        root.set(key, str(value))
    root.set("errors", "0")
    root.set("time", f"{total_time:.3f}")
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _junit_failed(v: Verdict) -> bool:
    """Incorrect, broken, and suspicious candidates fail; a suspicious time is not a pass."""
    return v.status != "skipped" and (not v.correct or v.status == "suspicious")


def to_html(verdicts: list[Verdict], title: str = "kbeval report") -> str:
    return render_html(leaderboard(verdicts), title=title, aggregates=aggregates(verdicts))


WRITERS: dict[str, Callable[[list[Verdict]], str]] = {
    "table": to_table, "csv": to_csv, "json": to_json, "markdown": to_markdown, "junit": to_junit, "html": to_html,
    "summary": to_summary,
}


def render(verdicts: list[Verdict], fmt: str, title: str = "kbeval report") -> str:
    if fmt not in WRITERS:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    if fmt in ("table", "html"):
        return WRITERS[fmt](verdicts, title=title)  # type: ignore[call-arg]
    return WRITERS[fmt](verdicts)


DEFAULT_REPORTS = {"leaderboard.csv": "csv", "leaderboard.json": "json", "report.html": "html", "junit.xml": "junit",
                   "summary.json": "summary"}


def write_default_reports(run_dir: Path) -> list[Path]:
    """Write leaderboard.csv, leaderboard.json, report.html and junit.xml into RUN_DIR; return their paths."""
    verdicts = load_run(run_dir)
    written = []
    for name, fmt in DEFAULT_REPORTS.items():
        path = run_dir / name
        write_atomic(path, render(verdicts, fmt, title=f"kbeval report: {run_dir.name}"))
        written.append(path)
    written += write_eval_results(run_dir, verdicts)  # KernelBench's own results file, for its scripts
    sessions = account.read(run_dir)
    if sessions:  # where each session's wall time went (`run.account`), beside the verdicts' aggregates
        summary = json.loads((run_dir / "summary.json").read_text())
        write_atomic(run_dir / "summary.json", json.dumps(summary | {"phases": sessions}, indent=2) + "\n")
    return written
