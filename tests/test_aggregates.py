"""Geomean speedup, pass@k, per-folder aggregates, and `gate --require-custom`, over hand-made verdicts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernelbench_eval.cli.app import app
from kernelbench_eval.records import KernelCount, RunManifest, RunSettings, Verdict
from kernelbench_eval.results.aggregates import (
    aggregates,
    geomean,
    pass_at_k,
    pass_at_k_by_problem,
    problem_group,
    verdict_context,
)
from kernelbench_eval.results.gate import check_gate
from kernelbench_eval.results.record import RunRecorder
from kernelbench_eval.results.report import to_html, to_markdown, to_summary, to_table

runner = CliRunner()


def v(problem: str, candidate: str, status: str, speedup: float | None = None, group: str | None = None,
      **kw: object) -> Verdict:
    correct = status in ("ok", "suspicious")
    fields: dict[str, object] = dict(run_id="r", problem=problem, candidate=candidate, source_sha256="s",
                                     settings_key="k", device="cpu", torch_version="2", status=status,
                                     correct=correct, problem_group=group)
    if speedup is not None:
        fields.update(speedup=speedup, speedup_vs_eager=speedup, runtime_ms=1.0 / speedup, ref_runtime_ms=1.0)
    fields.update(kw)
    return Verdict(**fields)  # type: ignore[arg-type]


def corpus() -> list[Verdict]:
    return [
        v("1_a", "fast", "ok", 4.0, "level1", speedup_vs_compile=2.0),
        v("1_a", "slow", "ok", 0.25, "level1", speedup_vs_compile=0.5),
        v("1_a", "wrong", "incorrect", group="level1"),
        v("2_b", "fine", "ok", 2.0, "level2"),
        v("2_b", "doubted", "suspicious", 50.0, "level2"),  # correct, but its speedup is not averaged
        v("2_b", "later", "skipped", group="level2"),  # never judged: not one of n
    ]


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - math.comb(7, 5) / math.comb(10, 5))
    assert pass_at_k(10, 0, 5) == 0.0 and pass_at_k(10, 6, 5) == 1.0  # fewer wrong than k: always a hit
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 5)


def test_geomean_and_pass_at_k_per_problem() -> None:
    assert geomean([2.0, 0.5]) == pytest.approx(1.0) and geomean([]) is None
    per = pass_at_k_by_problem(corpus())
    assert per["1_a"] == {"n": 3, "c": 2, "pass@1": pytest.approx(2 / 3)}  # no pass@5 with 3 candidates
    assert per["2_b"]["n"] == 2 and per["2_b"]["c"] == 2  # skipped left out, suspicious is correct
    agg = aggregates(corpus())
    geo = agg["geomean_speedup"]
    assert geo["vs_eager"] == pytest.approx((4.0 * 0.25 * 2.0) ** (1 / 3)) and geo["candidates"] == 3
    assert geo["vs_compile"] == pytest.approx(1.0)
    assert set(agg["groups"]) == {"level1", "level2"}
    assert agg["groups"]["level1"]["correct"] == 2 and agg["groups"]["level1"]["problems"] == 1
    assert agg["groups"]["level2"]["geomean_speedup"]["vs_eager"] == pytest.approx(2.0)


def test_flat_problems_have_no_groups() -> None:
    assert aggregates([v("1_a", "x", "ok", 2.0)])["groups"] == {}


def test_problem_group_from_the_problem_path(tmp_path: Path) -> None:
    (tmp_path / "level2").mkdir()
    assert problem_group(tmp_path / "level2" / "71_x.py", tmp_path) == "level2"
    assert problem_group(tmp_path / "1_x.py", tmp_path) is None
    assert problem_group(Path("/elsewhere/1_x.py"), tmp_path) is None
    manifest = RunManifest(run_id="r", settings=RunSettings(device="cpu", precision="bf16"),
                           problems_dir=str(tmp_path), candidates_dir="c", torch_version="2", created_at="")

    class Prob:
        path = tmp_path / "level2" / "71_x.py"

    assert verdict_context({"71_x": Prob()}, "71_x", manifest) == {"precision": "bf16", "problem_group": "level2"}


def test_reports_carry_the_aggregates() -> None:
    summary = json.loads(to_summary(corpus()))
    assert summary["pass_at_k"]["problems"]["1_a"]["c"] == 2
    assert summary["geomean_speedup"]["candidates"] == 3 and "level2" in summary["groups"]
    assert "fast_p" in summary and summary["candidates"] == 6  # what was there stays
    assert "geomean speedup" in to_table(corpus()) and "pass@1" in to_markdown(corpus())
    html = to_html(corpus())
    assert 'id="pass-at-k"' in html and 'id="groups"' in html and "level1" in html


def _with_kernels(custom: int) -> Verdict:
    return v("1_a", f"k{custom}", "ok", 2.0, kernels=KernelCount(custom=custom, library=3, custom_share=0.5 * custom),
             kernels_warning=None if custom else "no custom kernel ran")


def test_gate_require_custom(tmp_path: Path) -> None:
    verdicts = [_with_kernels(0), _with_kernels(2), v("1_a", "unmeasured", "ok", 2.0), v("1_a", "bad", "incorrect")]
    failed = {f.candidate: f.reason for f in check_gate(verdicts, require_custom=True)}
    assert set(failed) == {"k0", "unmeasured", "bad"}
    assert "no custom kernel" in failed["k0"] and "no launch accounting" in failed["unmeasured"]
    assert {f.candidate for f in check_gate(verdicts)} == {"bad"}  # off by default
    run = tmp_path / "run"
    run.mkdir()
    recorder = RunRecorder(run)
    for verdict in verdicts[:2]:
        recorder.append(verdict)
    result = runner.invoke(app, ["gate", str(run), "--require-custom"])
    assert result.exit_code == 1 and "FAIL 1_a/k0" in result.output and "k2" not in result.output
    assert runner.invoke(app, ["gate", str(run)]).exit_code == 0
