"""Reports, compare and gate over a hand-made run folder: no compiles, no processes."""

from __future__ import annotations

import io
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest
from pandas.testing import assert_frame_equal
from typer.testing import CliRunner

from kernelbench_eval.cli.app import app
from kernelbench_eval.records import Verdict
from kernelbench_eval.results.compare import compare_runs
from kernelbench_eval.results.gate import check_gate
from kernelbench_eval.results.record import RunRecorder
from kernelbench_eval.results.report import (
    DTYPES,
    best_per_problem,
    fast_p_frame,
    fast_p_text,
    leaderboard,
    load_run,
    to_csv,
    to_html,
    to_json,
    to_junit,
    to_markdown,
    write_default_reports,
)

runner = CliRunner()
NASTY = 'RuntimeError: expected <float> got "double" & \'half\' </td><script>alert(1)</script>'


def verdict(problem: str, candidate: str, status: str, speedup: float | None = None, **kw: object) -> Verdict:
    correct = status in ("ok", "suspicious")
    ref = 2.0
    fields: dict[str, object] = dict(
        run_id="fixture", problem=problem, candidate=candidate, source_sha256=f"sha-{candidate}", settings_key="k",
        device="cpu", torch_version="2.13.0", status=status, correct=correct, wall_seconds=1.5,
        ref_runtime_ms=ref, trials=5, trials_passed=5 if correct else 0)
    if correct:
        assert speedup is not None
        fields.update(runtime_ms=ref / speedup, speedup=speedup, speedup_vs_eager=speedup, max_abs_diff=1e-6)
    if status not in ("ok", "skipped"):
        fields.update(error=f"{status}: something failed", log=f"logs/{problem}/{candidate}.log")
    fields.update(kw)
    return Verdict(**fields)  # type: ignore[arg-type]


def fixture_verdicts() -> list[Verdict]:
    return [
        verdict("1_matmul", "fast", "ok", 3.5),
        verdict("1_matmul", "slow", "ok", 0.6),
        verdict("1_matmul", "wrong", "incorrect", max_abs_diff=0.5),
        verdict("1_matmul", "nobuild", "compile_error"),
        verdict("2_relu", "fine", "ok", 1.25),
        verdict("2_relu", "tortoise", "ok", 0.2),
        verdict("2_relu", "hang", "timeout"),
        verdict("2_relu", "boom", "crashed"),
        verdict("2_relu", "nasty", "runtime_error", error=NASTY),
        verdict("3_conv", "later", "skipped", error="no CUDA device"),
    ]


def write_run(path: Path, verdicts: list[Verdict]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    recorder = RunRecorder(path)
    for v in verdicts:
        recorder.append(v)
    return path


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return write_run(tmp_path / "run-a", fixture_verdicts())


# --- leaderboard -----------------------------------------------------------------------------------------


def test_leaderboard_rows_and_order(run_dir: Path) -> None:
    df = leaderboard(load_run(run_dir))
    assert len(df) == 10
    assert list(df.columns) == ["problem", "candidate", "status", "correct", "runtime_ms", "ref_runtime_ms",
                                "speedup", "speedup_low", "compile_runtime_ms", "speedup_vs_compile",
                                "speedup_vs_compile_low", "max_abs_diff", "error", "log"]
    assert list(df["candidate"][:4]) == ["fast", "slow", "nobuild", "wrong"]  # speedup desc, then no speedup
    assert list(df["problem"]) == sorted(df["problem"])
    assert df["speedup"].isna().sum() == 6


def test_best_per_problem(run_dir: Path) -> None:
    best = best_per_problem(leaderboard(load_run(run_dir)))
    assert list(best["problem"]) == ["1_matmul", "2_relu", "3_conv"]
    assert list(best["candidate"][:2]) == ["fast", "fine"]
    assert pd.isna(best["candidate"][2]) and pd.isna(best["speedup"][2])
    assert best["speedup"][0] == pytest.approx(3.5)


# --- formats ---------------------------------------------------------------------------------------------


def test_csv_roundtrip(run_dir: Path, tmp_path: Path) -> None:
    verdicts = load_run(run_dir)
    path = tmp_path / "lb.csv"
    path.write_text(to_csv(verdicts))
    assert_frame_equal(pd.read_csv(path, dtype=DTYPES), leaderboard(verdicts))
    assert_frame_equal(pd.read_csv(path), leaderboard(verdicts))  # no column is all-empty here: plain read works


def test_json_roundtrip(run_dir: Path) -> None:
    verdicts = load_run(run_dir)
    text = to_json(verdicts)
    assert isinstance(json.loads(text), list)
    back = pd.read_json(io.StringIO(text), orient="records", dtype=DTYPES)
    assert_frame_equal(back, leaderboard(verdicts))


def test_roundtrip_with_an_empty_column(tmp_path: Path) -> None:
    verdicts = [verdict("p", "a", "ok", 2.0), verdict("p", "b", "ok", 1.0)]  # no errors, no logs at all
    (tmp_path / "x.csv").write_text(to_csv(verdicts))
    assert_frame_equal(pd.read_csv(tmp_path / "x.csv", dtype=DTYPES), leaderboard(verdicts))
    assert_frame_equal(pd.read_json(io.StringIO(to_json(verdicts)), orient="records", dtype=DTYPES),
                       leaderboard(verdicts))


def test_markdown(run_dir: Path) -> None:
    md = to_markdown(load_run(run_dir))
    lines = md.strip().split("\n\n")[0].splitlines()  # the leaderboard; fast_p follows
    assert lines[0].startswith("| problem | candidate | status")
    assert re.fullmatch(r"\|(:?-+:?\|)+", lines[1])
    assert len(lines) == 2 + 10
    assert all(line.count(" | ") == lines[0].count(" | ") for line in lines[2:])  # a | in an error is escaped
    assert "<script>" not in md and "&lt;float&gt;" in md
    assert "| 1_matmul | fast | ok |" in md and "3.50x" in md


def test_junit(run_dir: Path) -> None:
    root = ET.fromstring(to_junit(load_run(run_dir)))
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == ["1_matmul", "2_relu", "3_conv"]
    assert len(root.findall(".//testcase")) == 10
    assert len(root.findall(".//failure")) == 5  # incorrect, compile_error, timeout, crashed, runtime_error
    assert len(root.findall(".//skipped")) == 1
    assert root.get("tests") == "10" and root.get("failures") == "5" and root.get("skipped") == "1"
    nasty = root.find(".//testcase[@name='nasty']/failure")
    assert nasty is not None and nasty.get("type") == "runtime_error" and nasty.get("message") == NASTY
    assert root.find(".//testcase[@name='fast']").get("time") == "1.500"


def test_html_is_self_contained_and_escaped(run_dir: Path) -> None:
    page = to_html(load_run(run_dir))
    for v in fixture_verdicts():
        assert f">{v.candidate}<" in page
    assert "http://" not in page and "https://" not in page
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", page)
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&quot;double&quot;" in page
    assert "<svg" in page and "1x (reference)" in page
    assert page.count("<rect") == 4  # one bar per correct candidate
    assert 'document.title = "kbeval report ok"' in page


def test_write_default_reports(run_dir: Path) -> None:
    paths = write_default_reports(run_dir)
    assert sorted(p.name for p in paths) == ["eval_results.json", "junit.xml", "leaderboard.csv", "leaderboard.json",
                                             "report.html", "summary.json"]
    assert all(p.parent == run_dir and p.stat().st_size > 0 for p in paths)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["candidates"] == 10 and summary["statuses"]["ok"] == 4


def test_fast_p_per_problem_and_overall() -> None:
    verdicts = [verdict("a", "x", "ok", 2.5, speedup_vs_eager_ci=(2.2, 2.8)),
                verdict("a", "y", "ok", 1.2, speedup_vs_eager_ci=(0.9, 1.5)),
                verdict("a", "z", "incorrect"),
                verdict("b", "w", "suspicious", 30.0, speedup_vs_eager_ci=(25.0, 35.0)),
                verdict("b", "v", "ok", 1.6, speedup_vs_eager_ci=(1.55, 1.65), speedup_vs_compile=1.1,
                        speedup_vs_compile_ci=(1.05, 1.15), compile_runtime_ms=2.2)]
    assert set(fast_p_frame(verdicts[:3])["baseline"]) == {"eager"}  # no compile baseline measured: no rows
    df = fast_p_frame(verdicts).set_index(["problem", "baseline"])
    assert df.loc[("a", "eager"), "fast_0"] == pytest.approx(2 / 3)
    assert df.loc[("a", "eager"), "fast_1"] == pytest.approx(1 / 3)  # y's interval reaches below 1
    assert df.loc[("b", "eager"), "fast_1.5"] == pytest.approx(1 / 2)  # the suspicious one never counts
    assert df.loc[("all", "eager"), "fast_2"] == pytest.approx(1 / 5)
    assert df.loc[("all", "compile"), "fast_1"] == pytest.approx(1 / 5)
    assert df.loc[("all", "compile"), "fast_0"] == pytest.approx(3 / 5)
    assert "all vs eager: fast_0=0.60  fast_1=0.40" in fast_p_text(verdicts)


# --- the report command ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["table", "csv", "json", "markdown", "junit"])
def test_report_cmd_stdout(run_dir: Path, fmt: str) -> None:
    result = runner.invoke(app, ["report", str(run_dir), "--format", fmt])
    assert result.exit_code == 0, result.output
    assert "tortoise" in result.stdout


def test_report_cmd_output_and_html_default(run_dir: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["report", str(run_dir), "--format", "csv", "--output", str(tmp_path / "o.csv")])
    assert result.exit_code == 0, result.output
    assert_frame_equal(pd.read_csv(tmp_path / "o.csv", dtype=DTYPES), leaderboard(load_run(run_dir)))
    result = runner.invoke(app, ["report", str(run_dir), "--format", "html"])
    assert result.exit_code == 0, result.output
    assert (run_dir / "report.html").exists()


def test_report_cmd_usage_errors(run_dir: Path, tmp_path: Path) -> None:
    assert runner.invoke(app, ["report", str(tmp_path / "nope")]).exit_code == 2
    assert runner.invoke(app, ["report", str(run_dir), "--format", "pdf"]).exit_code == 2


# --- compare ---------------------------------------------------------------------------------------------


def test_compare_regressions(run_dir: Path, tmp_path: Path) -> None:
    changed = [v.model_copy() for v in fixture_verdicts() if v.candidate != "boom"]
    for i, v in enumerate(changed):
        if v.candidate == "fast":  # broken
            changed[i] = verdict("1_matmul", "fast", "incorrect", source_sha256="sha-new")
        elif v.candidate == "fine":  # 50% slower
            changed[i] = verdict("2_relu", "fine", "ok", 1.25 / 1.5)
        elif v.candidate == "wrong":  # fixed
            changed[i] = verdict("1_matmul", "wrong", "ok", 1.1)
        elif v.candidate == "slow":  # within threshold
            changed[i] = verdict("1_matmul", "slow", "ok", 0.61)
    changed.append(verdict("4_new", "fresh", "ok", 2.0))
    run_b = write_run(tmp_path / "run-b", changed)
    kinds = {(c.candidate, c.kind) for c in compare_runs(load_run(run_dir), load_run(run_b))}
    assert kinds == {("fast", "broken"), ("fast", "source_changed"), ("fine", "slower"), ("wrong", "fixed"),
                     ("boom", "removed"), ("fresh", "added")}
    result = runner.invoke(app, ["compare", str(run_dir), str(run_b)])
    assert result.exit_code == 1, result.output
    assert "broken" in result.stdout and "slower" in result.stdout


def test_compare_improvement_only(run_dir: Path, tmp_path: Path) -> None:
    better = [verdict(v.problem, v.candidate, "ok", (v.speedup or 1.0) * 2) if v.status == "ok" or
              v.candidate == "wrong" else v for v in fixture_verdicts()]
    run_b = write_run(tmp_path / "run-b", better)
    result = runner.invoke(app, ["compare", str(run_dir), str(run_b)])
    assert result.exit_code == 0, result.output
    assert "faster" in result.stdout and "fixed" in result.stdout
    assert runner.invoke(app, ["compare", str(run_dir), str(run_dir)]).exit_code == 0


def test_compare_threshold(run_dir: Path, tmp_path: Path) -> None:
    run_b = write_run(tmp_path / "run-b", [verdict("2_relu", "fine", "ok", 1.25 / 1.5)])
    assert runner.invoke(app, ["compare", str(run_dir), str(run_b)]).exit_code == 1
    assert runner.invoke(app, ["compare", str(run_dir), str(run_b), "--threshold", "0.6"]).exit_code == 0


def test_compare_missing_dir(run_dir: Path, tmp_path: Path) -> None:
    assert runner.invoke(app, ["compare", str(run_dir), str(tmp_path / "nope")]).exit_code == 2
    assert runner.invoke(app, ["compare", str(tmp_path / "nope"), str(run_dir)]).exit_code == 2


# --- gate ------------------------------------------------------------------------------------------------


def gate(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["gate", *args])
    return result.exit_code, result.output


def test_gate_pass(tmp_path: Path) -> None:
    good = write_run(tmp_path / "good", [verdict("p", "a", "ok", 2.0), verdict("p", "b", "ok", 1.5)])
    assert gate(str(good))[0] == 0
    assert gate(str(good), "--min-speedup", "1.5")[0] == 0
    code, out = gate(str(good), "--min-speedup", "1.6")
    assert code == 1 and "p/b" in out and "p/a" not in out


def test_gate_require_correct(run_dir: Path) -> None:
    code, out = gate(str(run_dir))
    assert code == 1
    fails = [line for line in out.splitlines() if line.startswith("FAIL ")]
    assert len(fails) == 6  # five wrong ones and the skipped one
    assert any("2_relu/nasty" in line and "runtime_error" in line for line in fails)
    code, out = gate(str(run_dir), "--no-require-correct")
    assert code == 1 and sum(line.startswith("FAIL ") for line in out.splitlines()) == 1  # skipped
    assert gate(str(run_dir), "--no-require-correct", "--allow-skipped")[0] == 0
    code, out = gate(str(run_dir), "--no-require-correct", "--allow-skipped", "--min-speedup", "1.0")
    assert code == 1 and "1_matmul/slow" in out and "2_relu/tortoise" in out and "fast" not in out


def test_gate_usage_errors(run_dir: Path, tmp_path: Path) -> None:
    assert gate(str(tmp_path / "nope"))[0] == 2
    (tmp_path / "empty").mkdir()
    assert gate(str(tmp_path / "empty"))[0] == 2  # no verdicts.jsonl
    (tmp_path / "empty" / "verdicts.jsonl").write_text("")
    assert gate(str(tmp_path / "empty"))[0] == 2  # no verdicts
    assert gate(str(run_dir), "--baseline", "inductor")[0] == 2
    code, out = gate(str(run_dir), "--baseline", "compile")
    assert code == 2 and "torch.compile baseline" in out


def test_gate_compile_baseline_when_present() -> None:
    good = verdict("p", "a", "ok", 2.0, speedup_vs_compile=0.9, compile_runtime_ms=1.8)
    assert check_gate([good], baseline="compile") == []
    failures = check_gate([good], baseline="compile", min_speedup=1.0)
    assert len(failures) == 1 and "compile" in failures[0].reason
    assert check_gate([good], baseline="eager", min_speedup=1.0) == []


def test_gate_judges_the_interval_not_the_point() -> None:
    shaky = verdict("p", "a", "ok", 1.3, speedup_vs_eager_ci=(0.95, 1.6))
    failures = check_gate([shaky], min_speedup=1.0)
    assert len(failures) == 1 and "0.95x (95% lower bound) < 1x" in failures[0].reason
    assert check_gate([verdict("p", "a", "ok", 1.3, speedup_vs_eager_ci=(1.2, 1.4))], min_speedup=1.0) == []


def test_gate_refuses_suspicious_unless_allowed() -> None:
    fishy = verdict("p", "a", "suspicious", 40.0, error="suspicious: speedup 40x is above the 10x limit")
    failures = check_gate([fishy])
    assert len(failures) == 1 and "above the 10x limit" in failures[0].reason
    assert check_gate([fishy], allow_suspicious=True) == []


def test_gate_help_documents_exit_codes() -> None:
    result = runner.invoke(app, ["gate", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "Exit codes: 0 every candidate meets the bar; 1 at least one does not; 2 usage error" in text
