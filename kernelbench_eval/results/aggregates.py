"""Run-level numbers over verdicts: geometric-mean speedup, pass@k per problem, and per-folder (level) aggregates.

- **Geomean speedup**: over candidates with status `ok` and a speedup (a `suspicious` time is not
  believed, so it is not averaged), against eager and against torch.compile. Speedups are ratios, so their
  mean is geometric: 2x and 0.5x average to 1x.
- **pass@k** (Chen et al. 2021, the unbiased estimator): from n candidates of a problem, c of them correct,
  the chance that at least one of k drawn without replacement is correct, 1 - C(n-c, k) / C(n, k), for
  k = 1, 5, 10 as far as k <= n. Skipped candidates were never judged and are not counted in n; a
  `suspicious` one is correct (its time is what is doubted).
- **Groups**: when problems sit in sub-folders of the problems dir (`level1/`, `level2/`), the same numbers
  per folder (`Verdict.problem_group`).
"""

from __future__ import annotations

import math
from pathlib import Path

from kernelbench_eval.records import RunManifest, Verdict

PASS_KS = (1, 5, 10)


def problem_group(problem_path: Path, problems_dir: Path) -> str | None:
    """The problem's folder relative to the problems dir ("level2"), or None for a problem at its top."""
    try:
        parent = problem_path.resolve().parent.relative_to(problems_dir.resolve())
    except ValueError:
        return None
    return None if str(parent) in ("", ".") else parent.as_posix()


def verdict_context(problems: dict, problem_id: str, manifest: RunManifest) -> dict[str, str | None]:
    """The verdict fields the pipeline knows from the run, not the judging: precision and problem folder."""
    problem = problems.get(problem_id)
    group = problem_group(problem.path, Path(manifest.problems_dir)) if problem is not None else None
    return {"precision": manifest.settings.precision, "problem_group": group}


def geomean(values: list[float]) -> float | None:
    positive = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in positive) / len(positive)) if positive else None


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k): at least one correct among k of n candidates drawn without replacement."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} candidates, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def geomean_speedups(verdicts: list[Verdict]) -> dict[str, object]:
    """Geometric-mean speedup of the `ok` candidates, vs eager and (when measured) vs torch.compile."""
    ok = [v for v in verdicts if v.status == "ok"]
    eager = [v.speedup_vs_eager for v in ok if v.speedup_vs_eager]
    compiled = [v.speedup_vs_compile for v in ok if v.speedup_vs_compile]
    return {"vs_eager": geomean(eager), "vs_compile": geomean(compiled), "candidates": len(eager),
            "candidates_vs_compile": len(compiled)}


def pass_at_k_by_problem(verdicts: list[Verdict]) -> dict[str, dict[str, float | int]]:
    """{problem: {"n", "c", "pass@1", "pass@5", "pass@10" (those with k <= n)}}."""
    by_problem: dict[str, list[Verdict]] = {}
    for v in verdicts:
        if v.status != "skipped":
            by_problem.setdefault(v.problem, []).append(v)
    out: dict[str, dict[str, float | int]] = {}
    for problem in sorted(by_problem):
        group = by_problem[problem]
        n, c = len(group), sum(1 for v in group if v.correct)
        entry: dict[str, float | int] = {"n": n, "c": c}
        entry.update({f"pass@{k}": pass_at_k(n, c, k) for k in PASS_KS if k <= n})
        out[problem] = entry
    return out


def mean_pass_at_k(per_problem: dict[str, dict[str, float | int]]) -> dict[str, float]:
    """pass@k averaged over the problems that have it (those with at least k candidates)."""
    means: dict[str, float] = {}
    for k in PASS_KS:
        values = [float(e[f"pass@{k}"]) for e in per_problem.values() if f"pass@{k}" in e]
        if values:
            means[f"pass@{k}"] = sum(values) / len(values)
    return means


def group_aggregates(verdicts: list[Verdict]) -> dict[str, dict[str, object]]:
    """Per problem folder: candidates, problems, correct, geomean speedups and mean pass@k; {} when flat."""
    groups = sorted({v.problem_group for v in verdicts if v.problem_group})
    out: dict[str, dict[str, object]] = {}
    for group in groups:
        members = [v for v in verdicts if v.problem_group == group]
        out[group] = {"candidates": len(members), "problems": len({v.problem for v in members}),
                      "correct": sum(1 for v in members if v.correct),
                      "geomean_speedup": geomean_speedups(members),
                      "pass_at_k": mean_pass_at_k(pass_at_k_by_problem(members))}
    return out


def aggregates(verdicts: list[Verdict]) -> dict[str, object]:
    """Everything above, in the shape `summary.json` stores it."""
    per_problem = pass_at_k_by_problem(verdicts)
    return {"geomean_speedup": geomean_speedups(verdicts),
            "pass_at_k": {"mean": mean_pass_at_k(per_problem), "problems": per_problem},
            "groups": group_aggregates(verdicts)}


def aggregates_text(verdicts: list[Verdict]) -> str:
    """Aggregates as a few text lines, for the terminal table and Markdown."""
    agg = aggregates(verdicts)
    lines = [f"geomean speedup (ok candidates): {_geo_text(agg['geomean_speedup'])}"]  # type: ignore[arg-type]
    lines.append("pass@k: " + _pass_text(agg["pass_at_k"]["mean"]))  # type: ignore[index]
    for problem, entry in agg["pass_at_k"]["problems"].items():  # type: ignore[index]
        lines.append(f"  {problem}: {entry['c']}/{entry['n']} correct, "
                     + _pass_text({k: v for k, v in entry.items() if k.startswith("pass@")}))
    for group, entry in agg["groups"].items():  # type: ignore[union-attr]
        lines.append(f"{group}: {entry['correct']}/{entry['candidates']} correct over {entry['problems']} problems, "
                     f"geomean {_geo_text(entry['geomean_speedup'])}, {_pass_text(entry['pass_at_k'])}")
    return "\n".join(lines)


def _geo_text(geo: dict[str, object]) -> str:
    parts = [f"{geo[key]:.3g}x vs {label}" for key, label in (("vs_eager", "eager"), ("vs_compile", "compile"))
             if geo.get(key) is not None]
    return ", ".join(parts) + f" (over {geo['candidates']})" if parts else "none (no ok candidate with a speedup)"


def _pass_text(values: dict[str, object]) -> str:
    return "  ".join(f"{k}={float(v):.2f}" for k, v in values.items()) or "n/a"  # type: ignore[arg-type]
