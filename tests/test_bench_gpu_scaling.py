"""bench/gpu_scaling.py's lines: a run cut off by its deadline judged fewer candidates, so no speedup is derived
from its seconds (the first device run of this bench reported 1.52 / 2.95 from a 1-GPU run that judged 34 of 48)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import gpu_scaling  # noqa: E402


def _run(rc: int | None, judged: int, judge_s: float) -> dict:
    return {"rc": rc, "wall_s": judge_s + 5, "judge_s": judge_s,
            "verdicts": {f"p/c{i}": {"status": "ok", "speedup": 1.0, "ci": [0.99, 1.01], "lane": 0}
                         for i in range(judged)}}


def _check(lanes: int) -> dict:
    return {"candidates": 4, "statuses_identical": True, "inside": 4, "timed": 4, "lanes": lanes}


def test_whole_runs_give_speedups() -> None:
    runs = {1: _run(0, 4, 100.0), 2: _run(0, 4, 50.0), 4: _run(0, 4, 26.0)}
    _, numbers = gpu_scaling.section(runs, {2: _check(2), 4: _check(4)}, 4, "cmd")
    assert numbers["gpus2_judging_speedup"] == 2.0
    assert numbers["gpus4_judging_speedup"] == 3.85


def test_a_cut_off_run_gives_no_speedup_and_says_so() -> None:
    runs = {1: _run(None, 3, 100.0), 2: _run(0, 4, 50.0), 4: _run(0, 4, 26.0)}
    text, numbers = gpu_scaling.section(runs, {2: _check(2), 4: _check(4)}, 4, "cmd")
    assert numbers["gpus2_judging_speedup"].startswith("not measured")
    assert numbers["gpus4_judging_speedup"].startswith("not measured")
    assert "cut off: 3/4 judged" in text
    runs = {1: _run(0, 4, 100.0), 2: _run(0, 4, 50.0), 4: _run(None, 4, 26.0)}
    _, numbers = gpu_scaling.section(runs, {2: _check(2), 4: _check(4)}, 4, "cmd")
    assert numbers["gpus2_judging_speedup"] == 2.0
    assert "4 GPU(s) was cut off" in numbers["gpus4_judging_speedup"]
