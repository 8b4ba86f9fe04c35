"""Issue 37: what the terminal shows at 80 columns, one runtime figure per candidate, `kbeval eval`'s log
tail, fast_p's denominator, and `compare`/`gate` judging speed by the runs' intervals. Hand-made verdicts
only: no compiles, no processes, nothing timed.
"""

from __future__ import annotations

import io
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from kernelbench_eval.cli.app import app
from kernelbench_eval.measured import Timing, TimingStats
from kernelbench_eval.records import Verdict
from kernelbench_eval.results.aggregates import pass_at_k_by_problem
from kernelbench_eval.results.compare import compare
from kernelbench_eval.results.display import print_log_tail, print_verdict_detail, verdict_table
from kernelbench_eval.results.gate import check_gate
from kernelbench_eval.results.record import RunRecorder, two_lines
from kernelbench_eval.results.report import fast_p_frame, fast_p_text, to_html, to_junit, to_markdown, to_table

runner = CliRunner()
LONG_ERROR = ("trial 0: RuntimeError: CUDA error: an illegal memory access was encountered in fused_kernel at "
              "line 42 of the candidate; compile with TORCH_USE_CUDA_DSA to enable device-side assertions. ") * 3


def make(problem: str, candidate: str, status: str, runtime_ms: float = -1.0, speedup: float | None = None,
         ci: tuple[float, float] | None = None, error: str | None = None, **kw: object) -> Verdict:
    return Verdict(run_id="r", problem=problem, candidate=candidate, source_sha256=f"sha-{candidate}",
                   settings_key="k", device="cpu", torch_version="x", status=status,
                   correct=status in ("ok", "suspicious"), runtime_ms=runtime_ms, speedup=speedup,
                   speedup_vs_eager=speedup, speedup_vs_eager_ci=ci, ref_runtime_ms=2.0 if speedup else None,
                   error=error, **kw)  # type: ignore[arg-type]


def render(renderable: object, width: int) -> str:
    out = Console(file=io.StringIO(), width=width, color_system=None)
    out.print(renderable)
    return out.file.getvalue()  # type: ignore[attr-defined]


def mixed() -> list[Verdict]:
    return [make("71_Conv2d_Divide_LeakyReLU", "fused_div_leakyrelu", "runtime_error", error=LONG_ERROR),
            make("71_Conv2d_Divide_LeakyReLU", "fast_one", "ok", 1.0234, 2.0, (1.8, 2.2)),
            make("21_Conv2d_Add_Scale_Sigmoid_GroupNorm", "seed004_fused_elementwise", "compile_error",
                 error='error: identifier "foo" is undefined'),
            make("45_Gemm_Sigmoid_LogSumExp", "cpp_logsumexp", "incorrect", error="trial 0: 3/16384 values outside")]


# --- the narrow table ------------------------------------------------------------------------------------


def test_narrow_table_shows_every_error_and_whole_statuses_at_80_columns():
    text = render(verdict_table(mixed(), width=80), 80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    for status in ("runtime_error", "compile_error", "incorrect", "ok"):
        assert re.search(rf"\b{status}\b", text), status  # never `runtime_err…`
    assert "…  runtime_error" not in text and "runtime_err…" not in text
    assert 'error: identifier "foo" is undefined' in text  # the error column used to be empty, unheaded
    assert "3/16384 values outside" in text
    assert "an illegal memory access" in text
    assert len([line for line in lines if "Conv2d_Div" in line]) == 2  # one line per verdict, errors below it
    error_lines = [line for line in lines[1:] if line.startswith("    ")]  # below the (centred) title
    assert len(error_lines) == 3 + 1 + 1  # the long one cut to 3 lines, ending in an ellipsis
    assert "errors cut to 3 lines; full text in verdicts.jsonl" in text


def test_narrow_table_says_nothing_was_cut_when_nothing_was():
    text = render(verdict_table(mixed()[1:], width=80), 80)
    assert "cut" not in text and "identifier" in text


def test_fast_p_lines_fit_80_columns_broken_between_items():
    verdicts = [make(f"{n}_A_Problem_With_A_Rather_Long_Name_Indeed", "c", "ok", 1.0, 1.2, (1.1, 1.3))
                for n in range(3)] + [make("x", "c", "incorrect", error="e")]
    text = fast_p_text(verdicts, width=80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    items = [token for line in lines for token in line.split() if "=" in token]
    assert len(items) == 5 * 4  # all, three problems and x: each of its four items whole on some line
    assert all(re.fullmatch(r"fast_[\d.]+=\d\.\d\d", item) for item in items)
    assert any(line.startswith("    fast_") for line in lines)  # continued, indented
    assert fast_p_text(verdicts).splitlines()[1] == "  all vs eager: fast_0=0.75  fast_1=0.75  fast_1.5=0.00  " \
                                                    "fast_2=0.00"  # no width: one line per row, as before


# --- one runtime figure ----------------------------------------------------------------------------------


def timed_verdict() -> Verdict:
    cand = TimingStats(median_ms=0.9997, mean_ms=1.03, std_ms=0.05, min_ms=0.95, max_ms=1.4, iqr_ms=0.021, calls=100)
    ref = TimingStats(median_ms=1.51, mean_ms=1.55, std_ms=0.05, min_ms=1.4, max_ms=1.9, iqr_ms=0.03, calls=100)
    timing = Timing(candidate=cand, reference=ref, blocks=10, checked_calls=10, rse=0.013, ref_rse=0.01,
                    wall_ms_per_call=1.1, ref_wall_ms_per_call=1.6, unexplained_ms=0.0)
    return make("p", "c", "ok", 1.0234, 1.4873, (1.41, 1.55), runtime_stats=cand, ref_runtime_stats=ref,
                timing=timing, max_abs_diff=0.0, mean_abs_diff=0.0, trials=5, trials_passed=5)


def test_eval_prints_one_labelled_runtime():
    out = Console(file=io.StringIO(), width=200, color_system=None)
    print_verdict_detail(out, timed_verdict())
    text = out.file.getvalue()
    assert "Runtime: 1.02\n" in text
    assert "0.9997" not in text and "1.0234" not in text  # the median of calls is not a second figure
    assert "Runtime is ms per call ±1.3% (std. error), over 100 calls (single calls' IQR 0.021 ms)" in text
    assert "95% CI 1.41-1.55" in text


def test_every_report_shows_the_same_runtime_digits(tmp_path):
    v = timed_verdict()
    assert two_lines(v) == "Evaluation: True\nRuntime: 1.02\n"
    wide, narrow = render(verdict_table([v], width=200), 200), render(verdict_table([v], width=80), 80)
    junit = ET.fromstring(to_junit([v])).find(".//system-out").text  # type: ignore[union-attr]
    html = re.sub(r' data-sort="[^"]*"', "", to_html([v]))  # sort keys hold the exact value, not shown
    for text in (wide, narrow, to_table([v]), to_markdown([v]), html, junit):
        assert "1.02" in text and "1.023" not in text, text
    assert "1.49x [1.41-1.55]" in wide  # with its interval where there is room
    failed = render(verdict_table([make("p", "bad", "incorrect", error="x")], width=200), 200)
    assert "-1.0" not in failed  # no time prints as nothing in a table (the .txt keeps -1.0)


def test_log_tail_of_an_empty_log_says_so(tmp_path):
    out = Console(file=io.StringIO(), width=120, color_system=None)
    (tmp_path / "empty.log").write_text("\n\n")
    print_log_tail(out, tmp_path / "empty.log")
    (tmp_path / "some.log").write_text("one\ntwo\n")
    print_log_tail(out, tmp_path / "some.log")
    text = out.file.getvalue()
    assert "last 0 lines" not in text and text.startswith("log: empty\n")
    assert "log (last 2 lines; --out DIR keeps the whole log):\n  one\n  two\n" in text


# --- fast_p leaves skipped candidates out, as pass@k does ---------------------------------------------------


def test_fast_p_and_pass_at_k_share_a_denominator():
    verdicts = [make("a", "x", "ok", 1.0, 2.0, (1.5, 2.5)), make("a", "y", "incorrect", error="e"),
                make("a", "later", "skipped", error="needs cuda"), make("b", "gpu", "skipped", error="needs cuda")]
    df = fast_p_frame(verdicts).set_index(["problem", "baseline"])
    assert df.loc[("a", "eager"), "candidates"] == pass_at_k_by_problem(verdicts)["a"]["n"] == 2
    assert df.loc[("a", "eager"), "fast_0"] == pytest.approx(1 / 2)  # was 1/3, skipped counted
    assert df.loc[("all", "eager"), "fast_1"] == pytest.approx(1 / 2)
    assert "b" not in df.index.get_level_values(0)  # only skipped: no row, as it has no pass@k


# --- compare and gate by intervals -----------------------------------------------------------------------


def write_run(path: Path, verdicts: list[Verdict]) -> Path:
    path.mkdir(parents=True)
    for v in verdicts:
        RunRecorder(path).append(v)
    return path


def test_compare_of_two_noisy_runs_of_the_same_sources_passes(tmp_path):
    """Cold against warm on a loaded host: points 2.2x apart, intervals overlapping: noise, exit 0."""
    cold = write_run(tmp_path / "cold", [make("p", "mul", "ok", 1.0, 2.0, (1.2, 3.1))])
    warm = write_run(tmp_path / "warm", [make("p", "mul", "ok", 2.226, 0.9, (0.55, 1.3))])
    result = runner.invoke(app, ["compare", str(cold), str(warm)])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "0 changes, 0 regressions; 1 speed differences within the runs' intervals, not counted" in out
    assert "do not overlap and the speedup moved by more than 5%" in out  # the threshold, stated


def test_compare_still_catches_a_real_separation(tmp_path):
    before = write_run(tmp_path / "a", [make("p", "mul", "ok", 1.0, 2.0, (1.9, 2.1)),
                                        make("p", "add", "ok", 1.0, 1.0, (0.95, 1.05))])
    after = write_run(tmp_path / "b", [make("p", "mul", "ok", 1.6, 1.25, (1.2, 1.3)),
                                       make("p", "add", "ok", 0.5, 2.0, (1.9, 2.1))])
    result = runner.invoke(app, ["compare", str(before), str(after)])
    assert result.exit_code == 1, result.output
    kinds = {c.candidate: c.kind for c in compare(RunRecorder(before).load(), RunRecorder(after).load()).changes}
    assert kinds == {"mul": "slower", "add": "faster"}
    assert "2 changes, 1 regressions" in result.output
    # separated, but by less than the threshold: not a change
    close = compare([make("p", "m", "ok", 1.0, 2.0, (1.99, 2.01))], [make("p", "m", "ok", 1.02, 1.96, (1.95, 1.97))])
    assert close.changes == []


def test_compare_without_intervals_uses_the_points_and_says_so():
    degenerate = compare([make("p", "m", "ok", 1.0, 2.0, (2.0, 2.0))], [make("p", "m", "ok", 2.0, 1.0, (1.0, 1.0))])
    [change] = degenerate.changes  # a zero-width interval is no interval (too few calls)
    assert change.kind == "slower" and change.regression and "no interval: point estimates" in change.detail


def test_gate_states_its_bar_and_what_it_compared(tmp_path):
    run = write_run(tmp_path / "r", [make("p", "sure", "ok", 1.0, 1.5, (1.3, 1.7)),
                                     make("p", "unsure", "ok", 1.0, 1.2)])
    result = runner.invoke(app, ["gate", str(run), "--min-speedup", "1.25"])
    assert result.exit_code == 1
    out = " ".join(result.output.split())
    assert "FAIL p/unsure: speedup 1.2x (point estimate: no interval recorded) < 1.25x over eager" in out
    assert "(bar: correct, not skipped, not suspicious, speedup over eager >= 1.25x at its 95% interval's " \
           "lower bound)" in out
    [failure] = check_gate([make("p", "shaky", "ok", 1.0, 1.5, (0.9, 2.1))], min_speedup=1.0)
    assert "0.9x (95% lower bound) < 1x" in failure.reason


def test_summary_json_fast_p_leaves_skipped_out(tmp_path):
    from kernelbench_eval.results.report import to_summary

    summary = json.loads(to_summary([make("a", "x", "ok", 1.0, 2.0, (1.5, 2.5)),
                                     make("a", "s", "skipped", error="needs cuda")]))
    overall = next(r for r in summary["fast_p"] if r["problem"] == "all")
    assert overall["candidates"] == 1 and overall["fast_0"] == 1.0
    assert summary["candidates"] == 2  # the run's count still holds every verdict
