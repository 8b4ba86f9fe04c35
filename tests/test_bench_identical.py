"""bench/identical.py's reading of a run: pairs of copies, their difference and mutual interval containment.

Hand-made verdicts (no run, no timing): the device bench reports what these functions say, so they are
checked here where a wrong comparison would otherwise only show up as a wrong table on the H100.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import identical  # noqa: E402
from benchdoc import write_section  # noqa: E402


def verdict(candidate: str, speedup: float | None, ci: tuple[float, float] | None, ms: float = 0.1,
            status: str = "ok", problem: str = "p", rerun: tuple[float, float] | None = None) -> dict:
    return {"problem": problem, "candidate": candidate, "status": status, "error": None, "runtime_ms": ms,
            "ref_runtime_ms": ms * (speedup or 1), "speedup_vs_eager": speedup, "speedup_vs_eager_ci": ci,
            "timing": {"attempts": 1, "speedup_rerun_interval": rerun}}


def test_pairs_compare_copies_and_their_intervals():
    rows = identical.pair_rows([
        # 6 % apart: a outside b's confidence interval, inside its rerun interval
        verdict("k__a", 1.00, (0.97, 1.07), rerun=(0.95, 1.10)),
        verdict("k__b", 1.06, (1.03, 1.09), rerun=(0.99, 1.12)),
        verdict("s__a", 2.0, (1.8, 2.2), ms=0.02), verdict("s__b", 2.1, (1.9, 2.3), ms=0.02),  # 5 %, both inside
        verdict("r__a", 1.0, (0.99, 1.01), rerun=(0.985, 1.025)),
        verdict("r__b", 1.02, (1.01, 1.03), rerun=(1.005, 1.04)),
        verdict("w__a", 1.0, (0.9, 1.1)), verdict("w__b", None, None, status="suspicious"),
        verdict("lone__a", 1.0, (0.9, 1.1)),
    ])
    by = {r["candidate"]: r for r in rows}
    k = by["k"]
    assert k["rel_diff"] == pytest.approx(0.06) and k["target"] == 0.05
    assert not k["a_in_b"] and k["b_in_a"] and k["a_in_b_rerun"] and k["b_in_a_rerun"]
    assert not k["met"]  # 6 % apart: over the 5 % target, whatever the intervals say
    s = by["s"]  # a 20 µs kernel: 10 %; no rerun interval recorded: the confidence interval stands in
    assert s["target"] == 0.10 and s["rerun"] == s["ci"] and s["a_in_b_rerun"] and s["b_in_a_rerun"] and s["met"]
    r = by["r"]
    assert not r["a_in_b_rerun"] and r["b_in_a_rerun"] and not r["met"]
    assert "speedup" not in by["w"] and by["w"]["status"] == ["ok", "suspicious"]
    assert by["lone"]["status"] == ["ok", "missing"]
    lines = identical.verdict_lines(rows)
    assert lines[0].startswith("- MISS") and "1 of 2" in lines[0]
    assert lines[1].startswith("- PASS") and "1 of 1" in lines[1]
    assert lines[2].startswith("- MISS") and "rerun interval: 2 of 3" in lines[2]
    assert "1 of 3 pairs, 3 of 6 one-way" in lines[3]
    assert "p/w (ok / suspicious)" in lines[4]
    table = identical.table(rows)
    assert len(table) == 2 + len(rows) and "**a outside**" in table[2 + [x["candidate"] for x in rows].index("r")]


def test_seed_choice_follows_seeds_md_and_the_device():
    ok = identical.expected_ok(identical.REPO / "candidates" / "SEEDS.md")
    assert ("71", "pytorch_mul.py") in ok and ("21", "fused_ops.py") in ok
    assert ("45", "logsumexp_no_max.py") not in ok and ("71", "cpp_wrong_slope.py") not in ok
    assert identical.runs_on('KBEVAL_DEVICES = ["cpu"]\ncpp_sources = ""', "cpu")
    assert not identical.runs_on('KBEVAL_DEVICES = ["cpu"]', "cuda")
    assert not identical.runs_on("cuda_sources = '__global__'", "cpu") and identical.runs_on("x = 1", "cpu")


def test_write_section_replaces_only_its_own(tmp_path):
    md = tmp_path / "b.md"
    md.write_text("# B\n\n## One\n\nold\n\n## Two\n\nkept\n")
    write_section(md, "## One", "## One\n\nnew\n")
    write_section(md, "## Three", "## Three\n\nadded\n")
    assert md.read_text() == "# B\n\n## One\n\nnew\n\n## Two\n\nkept\n\n## Three\n\nadded\n"


def test_a_kept_section_puts_the_new_run_first_and_the_earlier_ones_below(tmp_path):
    """bench/vs_kernelbench.py's section: the latest ratio lines at its top (issue 38), then the run's tables,
    earlier runs and readings not erased."""
    import vs_kernelbench

    md = tmp_path / "b.md"
    md.write_text("# B\n\n## vs KernelBench\n\nrun 1\n\n### Reading run 1\n\nslow\n\n## Later\n\nkept\n")
    text = vs_kernelbench.section_text(["run 2"], ["| t |"], {"vs_kernelbench_cold_ratio": 2.2171})
    write_section(md, "## vs KernelBench", text, keep_previous=True)
    doc = md.read_text()
    assert doc.startswith("# B\n\n## vs KernelBench\n\n```\nvs_kernelbench_cold_ratio: 2.22\n```\n\nrun 2\n\n| t |\n")
    assert doc.index("vs_kernelbench_cold_ratio: 2.22") < doc.index("run 1") < doc.index("### Reading run 1")
    assert doc.endswith("slow\n\n## Later\n\nkept\n") and doc.count("## vs KernelBench\n") == 1
    write_section(md, "## Later", "## Later\n\nnew\n")  # without keep_previous, a section is replaced
    assert md.read_text().endswith("## Later\n\nnew\n") and "kept" not in md.read_text()
