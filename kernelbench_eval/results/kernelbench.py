"""KernelBench's `eval_results.json`, written beside our reports so that its analysis scripts read a kbeval run.

The format is the one `add_to_eval_results_file` in KernelBench's scripts/eval_from_generations.py writes
(commit 423217d, lines 722-755), per level, as its runs are: a JSON object keyed by the problem's number as a
string, in numeric order, each a list of samples `{"sample_id": int, "compiled": bool, "correctness": bool,
"metadata": dict, "runtime": float, "runtime_stats": dict}`, indented by 4. Its pass@k counts a sample when
`correctness and compiled`; its benchmark_eval_analysis.py reads `sample_id`, `compiled`, `correctness` and
`runtime` (ms, -1.0 when not timed), comparing `runtime` with its baselines' mean.

Where: `RUN_DIR/eval_results.json` when the run's problems are of one level (or none says its level); with
several, `RUN_DIR/levelN/eval_results.json` for each (`eval_results_dir=RESULTS run_name=RUN_ID/levelN` in
its scripts), beside those problems' own folders. Problems whose file name has no number (`19_ReLU` has 19)
have no key there and are left out; so are `skipped` candidates, never judged (as pass@k leaves them out).
"""

from __future__ import annotations

import json
from pathlib import Path

from kernelbench_eval.discover import names
from kernelbench_eval.records import Verdict
from kernelbench_eval.store.atomic import write_atomic

FILE = "eval_results.json"
TRIALS_RUN = ("ok", "suspicious", "incorrect")  # where KernelBench records "correctness_trials"
ERROR_KEYS = {"compile_error": "compilation_error", "runtime_error": "runtime_error", "incorrect": "correctness_issue"}
Results = dict[str, list[dict[str, object]]]


def write_eval_results(run_dir: Path, verdicts: list[Verdict]) -> list[Path]:
    """Write one `eval_results.json` per level (see the module's docstring); the paths written."""
    by_level = eval_results(verdicts)
    written = []
    for level, results in sorted(by_level.items(), key=lambda item: (item[0] is not None, item[0] or 0)):
        path = run_dir / FILE if len(by_level) == 1 or level is None else run_dir / f"level{level}" / FILE
        write_atomic(path, json.dumps(results, indent=4))
        written.append(path)
    return written


def eval_results(verdicts: list[Verdict]) -> dict[int | None, Results]:
    """{level: {"<problem number>": [sample, ...]}}, the last verdict of each candidate, skipped ones left out."""
    last = {(v.problem, v.candidate): v for v in verdicts if v.status != "skipped"}
    problems: dict[tuple[int | None, int], dict[str, list[Verdict]]] = {}
    for (problem, _), v in sorted(last.items()):
        number = names.number_of(problem.rsplit("/", 1)[-1])
        if number is not None:  # two problems of one number in one level: the first keeps it
            problems.setdefault((_level(v), number), {}).setdefault(problem, []).append(v)
    by_level: dict[int | None, Results] = {}
    for (level, number), held in sorted(problems.items(), key=lambda item: (item[0][0] or 0, item[0][1])):
        first = held[min(held)]
        by_level.setdefault(level, {})[str(number)] = [entry(v, s) for s, v in sorted(_sample_ids(first).items())]
    return by_level


def entry(v: Verdict, sample_id: int) -> dict[str, object]:
    """One sample, with the six keys KernelBench writes."""
    stats: dict[str, object] = {}
    if v.runtime_stats is not None:
        s = v.runtime_stats
        stats = {"mean": _3g(s.mean_ms), "std": _3g(s.std_ms), "min": _3g(s.min_ms), "max": _3g(s.max_ms),
                 "num_trials": s.calls, **_where(v)}
    return {"sample_id": sample_id, "compiled": bool(v.compiled), "correctness": bool(v.correct),
            "metadata": metadata(v), "runtime": _3g(v.runtime_ms) if v.runtime_ms > 0 else -1.0,
            "runtime_stats": stats}


def metadata(v: Verdict) -> dict[str, object]:
    """KernelBench's keys where they mean the same (hardware, device, correctness_trials, the error by kind), and
    kbeval's status, which says more than its two booleans."""
    meta: dict[str, object] = dict(_where(v))
    if v.status in TRIALS_RUN:
        meta["correctness_trials"] = f"({v.trials_passed} / {v.trials})"
    if v.error:
        key = ERROR_KEYS.get(v.status, "other_error")
        if v.status == "load_error":
            key = "runtime_error" if v.compiled else "compilation_error"
        meta[key] = v.error
    meta["kbeval_status"] = v.status
    return meta


def _sample_ids(verdicts: list[Verdict]) -> dict[int, Verdict]:
    """Each candidate's sample index: its own (`Verdict.sample`), else the next free one, in candidate order."""
    ids: dict[int, Verdict] = {}
    for v in verdicts:
        if v.sample is not None and v.sample not in ids:
            ids[v.sample] = v
    free = (n for n in range(len(verdicts) + len(ids) + 1) if n not in ids)
    for v in verdicts:
        if v.sample is None or ids.get(v.sample) is not v:
            ids[next(free)] = v
    return ids


def _level(v: Verdict) -> int | None:
    """The level of a verdict's problem: its `levelN` folder (the id's, else the problems folder's group)."""
    parts = v.problem.split("/")[:-1] + (v.problem_group or "").split("/")
    found = [n for n in map(names.level_of, parts) if n is not None]
    return found[0] if found else None


def _where(v: Verdict) -> dict[str, str]:
    where = {"hardware": v.device_name, "device": v.lane or v.device}
    return {k: value for k, value in where.items() if value}


def _3g(value: float) -> float:
    """Three significant digits, as KernelBench's timing stats are written (`float(f"{x:.3g}")`)."""
    return float(f"{value:.3g}")
