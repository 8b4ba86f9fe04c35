"""The self-test's bench tools. bench/kernelbench_selftest.py's issue-35 lines, on known rows: the interval widths of
identical copies by the reference's time a call, and how many cover 1.0 (a copy that did not resolve counts against
the goal); bench/process_spread.py, which times one problem in fresh processes, on the CPU; bench/tree_overhead.py's
reading of two trees' verdicts, on known verdicts."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import kernelbench_selftest as ks  # noqa: E402


def _row(level: str, ms: float | None, ci: tuple[float, float] | None, status: str = "ok") -> dict:
    return {"level": level, "problem": f"p{ms}", "status": status, "ref_median_ms": ms, "ci": ci, "speedup": 1.0}


def test_half_width_is_geometric() -> None:
    assert abs(ks.half_width({"ci": (0.98, 1.02)}) - 0.0202) < 1e-3
    assert abs(ks.half_width({"ci": (1 / 1.1, 1.1)}) - 0.1) < 1e-9
    assert ks.half_width({"ci": None}) is None


def test_width_lines_count_each_band_and_the_misses() -> None:
    rows = [
        _row("level1", 0.5, (0.985, 1.015)),        # >= 20 us, +-1.5 %: within
        _row("level1", 0.030, (0.95, 1.05)),       # >= 20 us, +-5.1 %: outside +-3 %
        _row("level2", 0.025, None, "runtime_error"),  # >= 20 us, no verdict: counts against
        _row("level2", 0.010, (0.95, 1.05)),        # 5-20 us, +-5.1 %: within +-10 %
        _row("level1", 0.006, (1.02, 1.30)),        # 5-20 us, +-13 %, excludes 1
        _row("level1", 0.002, (0.5, 2.0)),          # under 5 us: in no band
        _row("level3", 0.5, (0.5, 0.6)),            # level 3: not counted
    ]
    twenty, five, covering = ks.width_lines(rows, "2025")
    assert twenty.startswith("small_kernel_ci_halfwidth_20us: 1/3 within +-3% (widest +-5.1%")
    assert five.startswith("small_kernel_ci_halfwidth_5us: 1/2 within +-10% (widest +-12.9%")
    assert "under 20 us" in five
    assert covering.startswith("selftest_2025_covering_one: 4/5 (80.0%")


def test_width_lines_say_when_nothing_resolved() -> None:
    twenty, five, covering = ks.width_lines([_row("level1", 0.1, None, "crashed")], "current")
    assert twenty.startswith("small_kernel_ci_halfwidth_20us: 0/1 within +-3% (no interval")
    assert five.startswith("small_kernel_ci_halfwidth_5us: 0/0")
    assert covering.startswith("selftest_current_covering_one: 0/0")


def test_process_spread_times_a_problem_in_fresh_processes(tmp_path: Path) -> None:
    """bench/process_spread.py, on the CPU: each child reports its calls' median and the operators one call ran;
    the summary gives the spread between processes and how many distinct kernel lists they ran. A problem that
    fails in a child is a row with its error, not a crash."""
    import process_spread

    good = tmp_path / "relu.py"
    good.write_text("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                    "        return torch.relu(x)\ndef get_inputs():\n    return [torch.randn(64, 64)]\n"
                    "def get_init_inputs():\n    return []\n")
    rows = [process_spread.one_process(good, 0.0, 20, "cpu", 120.0) for _ in range(2)]
    assert all(r["median_ms"] > 0 and "aten::relu" in r["kernels"] for r in rows)
    summary = process_spread.summarize(rows)
    assert summary["processes"] == 2 and summary["failed"] == 0 and summary["kernel_lists"] == 1
    assert summary["spread"] >= 1.0
    bad = tmp_path / "bad.py"
    bad.write_text(good.read_text().replace("return [torch.randn(64, 64)]", "raise ValueError('no inputs')"))
    failed = process_spread.one_process(bad, 0.0, 5, "cpu", 120.0)
    assert "no inputs" in failed["error"]
    assert process_spread.summarize([failed, rows[0]])["failed"] == 1
    held_after = process_spread.one_process(good, 0.01, 5, "cpu", 120.0, where="after")
    assert held_after["median_ms"] > 0 and "error" not in held_after


def _verdict(candidate: str, status: str, wall: float, compile_s: float, call_wall: float | None = None,
             runtime: float = -1.0, phases: dict | None = None) -> dict:
    timing = {"wall_ms_per_call": call_wall, "phases": phases or {}} if call_wall is not None else None
    return {"problem": "71_x", "candidate": candidate, "status": status, "wall_seconds": wall,
            "compile_seconds": compile_s, "runtime_ms": runtime, "timing": timing}


def test_tree_overhead_reads_lane_seconds_and_the_overhead_per_call() -> None:
    """Per candidate and tree: medians over the warm runs of its lane seconds (wall without compile) and of the
    harness's clock per timed call minus the runtime; the ratio line is the median over shared candidates of new
    over old; an untimed verdict has no overhead, and a candidate only one tree judged is left out of the ratio."""
    import tree_overhead as to

    old_runs = [{"verdicts": [_verdict("a", "ok", 2.0, 0.5, 2.0, 1.5, {"timing": 0.8}),
                              _verdict("b", "incorrect", 0.7, 0.0)]},
                {"verdicts": [_verdict("a", "ok", 2.2, 0.0, 2.1, 1.5, {"timing": 1.0}),
                              _verdict("b", "incorrect", 0.9, 0.0)]}]
    new_runs = [{"verdicts": [_verdict("a", "ok", 3.0, 0.0, 3.0, 1.5, {"timing": 1.2}),
                              _verdict("c", "ok", 1.0, 0.0, 1.1, 1.0)]}]
    old, new = to.per_candidate(old_runs), to.per_candidate(new_runs)
    assert old[("71_x", "a")]["lane_s"] == 1.85 and abs(old[("71_x", "a")]["overhead_ms"] - 0.55) < 1e-9
    assert old[("71_x", "b")]["overhead_ms"] is None and old[("71_x", "b")]["statuses"] == ["incorrect"]
    assert abs(to.ratio_of_medians(old, new, "overhead_ms") - 1.5 / 0.55) < 1e-9  # b untimed, c only new
    assert abs(to.ratio_of_medians(old, new, "lane_s") - 3.0 / 1.85) < 1e-9
    assert to.phase_medians(old_runs) == {"timing": 0.9}
    lines = to.table(old, new, ("old", "new"))
    assert len(lines) == 2 + 3 and "ok / ok" in lines[2] and "/ ok" in lines[4]
