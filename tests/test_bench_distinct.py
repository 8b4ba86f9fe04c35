"""bench/distinct_corpus.py's corpus (issue 38, goal 2): hundreds of distinct, honest candidates generated from a
KernelBench export, in KernelBench's flat generation layout, as kbeval's discovery reads them. No GPU here: the
corpus's shape, its distinctness and its Python are checked; the device runs it."""

from __future__ import annotations

import ast
import hashlib
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import distinct_corpus  # noqa: E402

from kernelbench_eval.discover.corpus import discover  # noqa: E402

PROBLEM = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(8, 8)]


def get_init_inputs():
    return []
'''


def _kb(tmp_path: Path) -> Path:
    kb = tmp_path / "kb"
    for level, names in ((1, ("1_A.py", "2_B.py", "10_C.py")), (2, ("1_X.py",))):
        (kb / f"level{level}").mkdir(parents=True)
        for name in names:
            (kb / f"level{level}" / name).write_text(PROBLEM)
    (kb / "NOTICE").write_text("Problems from KernelBench, MIT licence.\n")
    return kb


def test_problems_are_taken_from_the_levels_in_turn_lowest_numbers_first(tmp_path):
    picked = [(level, number) for level, number, _ in distinct_corpus.pick_problems(_kb(tmp_path), 4, [1, 2])]
    assert picked == [(1, 1), (2, 1), (1, 2), (1, 10)]  # level 2 runs out; 10 after 2, by number


def test_every_sample_is_its_own_build_and_discovery_pairs_it_with_its_problem(tmp_path):
    out = tmp_path / "corpus"
    assert distinct_corpus.write_corpus(_kb(tmp_path), out, 3, 2, [1, 2]) == 6
    files = sorted((out / "candidates").glob("*.py"))
    assert [f.name for f in files][:2] == ["level_1_problem_1_sample_0_kernel.py",
                                           "level_1_problem_1_sample_1_kernel.py"]
    texts = [f.read_text() for f in files]
    assert len({hashlib.sha256(t.encode()).digest() for t in texts}) == 6  # distinct bytes: distinct builds
    names = set()
    for text in texts:
        tree = ast.parse(text)
        classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        assert [b.id for b in classes["ModelNew"].bases] == ["Model"] and "Model" in classes
        names |= {kw.value.value for n in ast.walk(tree) if isinstance(n, ast.Call)
                  for kw in n.keywords if kw.arg == "name"}
    assert len(names) == 6  # each extension's own name: none is another's cached build
    found = discover(out / "problems", out / "candidates")
    assert not found.warnings
    by_problem = sorted((c.problem_id, c.sample) for c in found.candidates)
    assert by_problem == [("level1/1_A", 0), ("level1/1_A", 1), ("level1/2_B", 0), ("level1/2_B", 1),
                          ("level2/1_X", 0), ("level2/1_X", 1)]  # numbers collide across levels: qualified
    assert (out / "problems" / "NOTICE").exists()


def test_the_floor_builds_the_samples_own_kernel():
    cuda = distinct_corpus.cuda_source("floor")
    assert "__global__ void copy_floor(" in cuda and "torch::Tensor scaled_copy(" in cuda
    assert cuda.count("{") == cuda.count("}") and "{{" not in cuda  # the template's escapes resolved


def test_several_gpus_are_judged_against_one_lane_alone():
    """bench/gpu_scaling.py: statuses must match the 1-GPU run's, and a candidate's speedup beside other lanes is
    counted inside or outside the interval it had alone; the judging phases give the speedup lines."""
    import gpu_scaling

    def verdict(status, speedup, ci, lane, lane_s=None):
        return {"status": status, "speedup": speedup, "ci": ci, "lane": lane, "lane_s": lane_s}

    one = {"rc": 0, "wall_s": 20.0, "judge_s": 16.0, "verdicts": {
        "p/a": verdict("ok", 1.0, [0.98, 1.02], "cuda:0"), "p/b": verdict("ok", 1.0, [0.98, 1.02], "cuda:0"),
        "q/c": verdict("incorrect", None, None, "cuda:0")}}
    two = {"rc": 0, "wall_s": 12.0, "judge_s": 8.5, "verdicts": {
        "p/a": verdict("ok", 1.01, [0.99, 1.03], "cuda:0"), "p/b": verdict("ok", 1.05, [1.03, 1.07], "cuda:1"),
        "q/c": verdict("incorrect", None, None, "cuda:1")}}
    check = gpu_scaling.compare(one, two)
    assert check == {"candidates": 3, "statuses_identical": True, "inside": 1, "timed": 2, "lanes": 2,
                     "lane_s_ratio": None}  # no lane seconds recorded: none derived
    worse = {**two, "verdicts": {**two["verdicts"], "q/c": verdict("ok", 1.0, [0.9, 1.1], "cuda:1")}}
    assert gpu_scaling.compare(one, worse)["statuses_identical"] is False
    _, numbers = gpu_scaling.section({1: one, 2: two}, {2: check}, 3, "cmd")
    assert numbers == {"gpus2_judging_speedup": 1.88, "gpus_statuses_identical": True,
                       "gpus_inside_single_lane_interval": "1/2"}
    # a run its deadline cut off judged fewer candidates: no speedup from its seconds, and the table says so (the
    # first device run of this bench gave 1.52 / 2.95 from a 1-GPU run that had judged 34 of 48)
    cut = {**one, "rc": None, "verdicts": dict(list(one["verdicts"].items())[:2])}
    text, numbers = gpu_scaling.section({1: cut, 2: two}, {2: check}, 3, "cmd")
    assert numbers["gpus2_judging_speedup"] == "not measured (the run on 1 GPU(s) was cut off)"
    assert "(cut off: 2/3 judged)" in text
    _, numbers = gpu_scaling.section({1: one, 2: {**two, "rc": None}}, {2: check}, 3, "cmd")
    assert numbers["gpus2_judging_speedup"] == "not measured (the run on 2 GPU(s) was cut off)"



def test_gpu_scaling_tells_lanes_slowing_each_other_from_uneven_lanes():
    """Judging short of linear on N GPUs is either contention (the same candidates take more lane seconds beside
    other lanes) or imbalance (as many lane seconds, but one lane had more of them): the bench tells which."""
    import gpu_scaling

    def run(lanes_s: dict[str, tuple[str, float]]) -> dict:
        return {"rc": 0, "wall_s": 1.0, "judge_s": 1.0, "verdicts": {
            k: {"status": "ok", "speedup": 1.0, "ci": [0.9, 1.1], "lane": lane, "lane_s": s}
            for k, (lane, s) in lanes_s.items()}}

    alone = run({"p/a": ("cuda:0", 2.0), "p/b": ("cuda:0", 2.0), "q/c": ("cuda:0", 4.0)})
    slowed = run({"p/a": ("cuda:0", 3.0), "p/b": ("cuda:0", 3.0), "q/c": ("cuda:1", 6.0)})
    uneven = run({"p/a": ("cuda:0", 2.0), "p/b": ("cuda:0", 2.0), "q/c": ("cuda:1", 4.0)})
    assert gpu_scaling.compare(alone, slowed)["lane_s_ratio"] == 1.5
    assert gpu_scaling.compare(alone, uneven)["lane_s_ratio"] == 1.0
    assert gpu_scaling._busiest(uneven) == 4.0
    text, _ = gpu_scaling.section({1: alone, 2: slowed}, {2: gpu_scaling.compare(alone, slowed)}, 3, "cmd")
    assert "| 2 | 2 | 1.0 | 1.0 | 6.0 | 1.5 | yes | 3/3 |" in text


def test_a_run_finished_in_a_second_call_counts_both_sessions():
    """A device call's limit cuts the 400-candidate run; `--resume` in the next call finishes it, and the account
    adds the two sessions up (phases.json keeps one entry per session), builds finished included."""
    sessions = [{"wall_s": 540.0, "running_s": {"build": 500.0, "reference": 60.0, "judge": 200.0}, "idle_s": 1.0,
                 "done": {"build": 300, "reference": 90, "judge": 250}},
                {"wall_s": 200.0, "running_s": {"build": 20.0, "reference": 10.0, "judge": 180.0}, "idle_s": 0.5,
                 "done": {"build": 100, "reference": 10, "judge": 150}}]
    total = distinct_corpus._summed(sessions)
    assert total == {"running_s": {"build": 520.0, "reference": 70.0, "judge": 380.0}, "idle_s": 1.5,
                     "done": {"build": 400, "reference": 100, "judge": 400}, "bound": "build"}
    assert distinct_corpus._summed([]) == {"running_s": {}, "done": {}, "idle_s": 0.0, "bound": None}


def test_a_cut_run_says_how_far_it_got_and_rates_only_its_finished_builds():
    """52 of 100 judged when the deadline cut it, 68 builds finished in 327 s of building: no minutes line for the
    whole corpus, and the rate is 68 builds', not 100 candidates'."""
    floor = {"wall_s": 64.7, "cpu_s": 70.0, "cores": 16, "builds_per_s": 16 / 70.0}
    run = {"wall_s": 327.3, "sessions": 1, "verdicts": 52, "statuses": {"ok": 52},
           "phases": {"running_s": {"build": 327.0}, "done": {"build": 68}, "idle_s": 0.3, "bound": "build"}}
    text, numbers = distinct_corpus.section(run, floor, 100, 100, "cmd")
    assert numbers == {"distinct_cold_partial": "52/100 judged in 5.46 min",
                       "build_rate_vs_floor": round(68 / 327.0 / (16 / 70.0), 3)}
    whole = {**run, "verdicts": 100, "statuses": {"ok": 100}, "phases": {**run["phases"], "done": {"build": 100}}}
    assert distinct_corpus.section(whole, floor, 100, 100, "cmd")[1]["distinct100_cold_minutes"] == 5.46
    assert "| builds finished, and per second over the build phase | 68, 0.208 |" in text


def test_a_runs_verdicts_and_sessions_are_read_as_far_as_it_got(tmp_path):
    assert distinct_corpus.read_run(tmp_path) == ([], [])  # cut before its first verdict
    (tmp_path / "verdicts.jsonl").write_text('{"status": "ok"}\n\n{"status": "incorrect"}\n')
    (tmp_path / "phases.json").write_text('{"sessions": [{"wall_s": 3.0}]}')
    assert distinct_corpus.read_run(tmp_path) == ([{"status": "ok"}, {"status": "incorrect"}], [{"wall_s": 3.0}])
