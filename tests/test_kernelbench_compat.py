"""Issue 34 items 2-3 and issue 37 items 5-6: KernelBench's namespace and folder layouts, every candidate file
accounted for, and errors that name the user's files, never the harness's copies.

Problems are KernelBench's own (tests/fixtures/kernelbench, MIT), run on the CPU at tiny `--dim` sizes; candidates
are pure PyTorch. Statuses are asserted only where timing cannot decide them (correct, load_error, skipped).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES, kbeval, read_verdicts

from kernelbench_eval.discover.corpus import Problem, discover, find_problems
from kernelbench_eval.discover.guard import user_paths
from kernelbench_eval.measured import TimingStats
from kernelbench_eval.records import Verdict
from kernelbench_eval.results.kernelbench import eval_results, write_eval_results

KB = FIXTURES / "kernelbench" / "KernelBench"
FAST = ("--device", "cpu", "--no-compile-baseline", "--trials", "1", "--reps", "10", "--timing-budget", "1",
        "--timeout", "60")
DIMS = ("--dim", "batch_size=2", "--dim", "dim=16", "--dim", "input_size=8", "--dim", "hidden_size=8", "--dim",
        "output_size=4")

OURS = FIXTURES / "kernelbench" / "ours"  # candidates (and a broken problem) of ours, each saying what it checks
READS_SIZES, READS_UNDEFINED, SEES_ONLY_THE_PROBLEM, WARMED_UP, MISSES_GET_INPUTS = (
    (OURS / f"{name}.py").read_text()
    for name in ("reads_sizes", "reads_undefined", "sees_only_the_problem", "warmed_up", "misses_get_inputs"))
FAILS_TO_IMPORT = "raise ImportError(f'needs a package this machine lacks (read by {__file__})')\n"


def vanilla_rnn_candidate() -> str:
    """KernelBench's VanillaRNN as ModelNew, reading `batch_size` in __init__ as the published candidate does."""
    source = (KB / "level3" / "33_VanillaRNN.py").read_text().split("\nbatch_size = ")[0]
    return source.replace("class Model(", "class ModelNew(").replace("super(Model, self)", "super()")


def kernelbench_tree(root: Path) -> Path:
    """The fixture tree plus a problem without get_inputs and one that fails to import (level 1, 98 and 99)."""
    tree = root / "KernelBench"
    shutil.copytree(KB, tree)
    (tree / "level1" / "98_No_inputs.py").write_text(MISSES_GET_INPUTS)
    (tree / "level1" / "99_Needs_a_package.py").write_text(FAILS_TO_IMPORT)
    return tree


def generations(run: Path, files: dict[str, str]) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (run / name).write_text(text)
    return run


@pytest.fixture(scope="module")
def kb_run(tmp_path_factory: pytest.TempPathFactory, build_cache: Path) -> tuple[Path, Path, Path]:
    """One CPU run over a KernelBench tree and its runs folder, two run folders: (run dir, tree, run folder a)."""
    root = tmp_path_factory.mktemp("kernelbench")
    tree = kernelbench_tree(root)
    generations(root / "runs" / "b", {"level_1_problem_19_sample_2_kernel.py": READS_SIZES})  # index 2 again
    cands = generations(root / "runs" / "a", {
        "level_1_problem_19_sample_0_kernel.py": READS_SIZES,
        "level_1_problem_19_sample_1_kernel.py": READS_UNDEFINED,
        "level_1_problem_19_sample_2_kernel.py": SEES_ONLY_THE_PROBLEM,
        "level_1_problem_19_sample_3_kernel.py": WARMED_UP,
        "level_1_problem_19_kernel.py": READS_SIZES,  # no sample: the name does not parse
        "level_1_problem_98_sample_0_kernel.py": READS_SIZES,
        "level_1_problem_99_sample_0_kernel.py": READS_SIZES,
        "level_3_problem_33_sample_0_kernel.py": vanilla_rnn_candidate(),
        "level_1_problem_19_sample_0_prompt.txt": "KernelBench's own: not listed",
        "level_1_problem_19_sample_4_kernel.cu": "__global__ void k() {}\n",
    })
    proc = kbeval("run", *FAST, *DIMS, "--problems", str(tree), "--candidates", str(root / "runs"), "--out",
                  str(root / "out"), "--run-id", "kb", cache=build_cache)
    (root / "stderr.txt").write_text(proc.stderr)
    return root / "out" / "kb", tree, cands


# --- A: KernelBench's namespace ---------------------------------------------------------------------------


def test_a_candidate_reads_the_problems_sizes_as_dim_set_them(kb_run):
    verdicts = read_verdicts(kb_run[0])
    assert verdicts["level_1_problem_19_sample_0_kernel"]["correct"] is True, verdicts
    rnn = verdicts["level_3_problem_33_sample_0_kernel"]  # the published case: batch_size in __init__
    assert rnn["correct"] is True and rnn["status"] != "load_error", rnn["error"]


def test_a_name_the_problem_does_not_define_is_still_a_load_error(kb_run):
    verdict = read_verdicts(kb_run[0])["level_1_problem_19_sample_1_kernel"]
    assert verdict["status"] == "load_error"
    assert "NameError" in verdict["error"] and "not_defined_by_the_problem" in verdict["error"]


def test_a_candidate_sees_the_problems_names_and_nothing_of_the_harness(kb_run):
    verdict = read_verdicts(kb_run[0])["level_1_problem_19_sample_2_kernel"]
    assert verdict["correct"] is True, verdict["error"]


def test_the_build_stage_warm_up_sees_the_problems_names(kb_run):
    verdict = read_verdicts(kb_run[0])["level_1_problem_19_sample_3_kernel"]
    assert verdict["correct"] is True, verdict["error"]


# --- B: KernelBench's layouts -----------------------------------------------------------------------------


def test_problem_ids_are_qualified_by_level_only_in_a_tree_of_levels():
    tree = find_problems(KB, [])
    assert {pid: p.level for pid, p in tree.items()} == {
        "level1/19_ReLU": 1, "level2/19_ConvTranspose2d_GELU_GroupNorm": 2, "level3/33_VanillaRNN": 3}
    assert {pid: p.level for pid, p in find_problems(KB / "level1", []).items()} == {"19_ReLU": 1}
    seed = find_problems(Path(__file__).parent.parent / "problems", [])  # one level folder: stems, as before
    assert "71_Conv2d_Divide_LeakyReLU" in seed and seed["71_Conv2d_Divide_LeakyReLU"].level == 2


def test_flat_and_nested_generation_folders_are_read(tmp_path):
    flat = generations(tmp_path / "runs" / "a", {"level_1_problem_19_sample_0_kernel.py": READS_SIZES,
                                                 "level_3_problem_33_sample_5_kernel.py": READS_SIZES,
                                                 "generation_config.yaml": "level: 1\n"})
    generations(tmp_path / "runs" / "b", {"level_1_problem_19_sample_1_kernel.py": READS_SIZES})
    found = discover(KB, flat)
    assert [(c.problem_id, c.candidate_id, c.sample) for c in found.candidates] == [
        ("level1/19_ReLU", "level_1_problem_19_sample_0_kernel", 0),
        ("level3/33_VanillaRNN", "level_3_problem_33_sample_5_kernel", 5)]
    assert found.warnings == []
    nested = discover(KB, tmp_path / "runs")
    assert sorted((c.problem_id, c.sample) for c in nested.candidates) == [
        ("level1/19_ReLU", 0), ("level1/19_ReLU", 1), ("level3/33_VanillaRNN", 5)]
    only = discover(KB, tmp_path / "runs", only=["level3/33_VanillaRNN"])
    assert [c.problem_id for c in only.candidates] == ["level3/33_VanillaRNN"]


def test_kbevals_layout_names_a_level_qualified_problem_by_its_folders_or_its_stem(tmp_path):
    (tmp_path / "c" / "level1" / "19_ReLU").mkdir(parents=True)
    (tmp_path / "c" / "level1" / "19_ReLU" / "mine.py").write_text(READS_SIZES)
    (tmp_path / "c" / "33_VanillaRNN").mkdir()
    (tmp_path / "c" / "33_VanillaRNN" / "level_3_problem_33_sample_7_kernel.py").write_text(READS_SIZES)
    found = discover(KB, tmp_path / "c")
    assert [(c.problem_id, c.candidate_id, c.sample) for c in found.candidates] == [
        ("level3/33_VanillaRNN", "level_3_problem_33_sample_7_kernel", 7), ("level1/19_ReLU", "mine", None)]


def test_samples_are_per_problem_in_verdicts_and_pass_at_k(kb_run):
    run_dir = kb_run[0]
    samples = {name: v["sample"] for name, v in read_verdicts(run_dir).items()}
    assert samples["level_1_problem_19_sample_3_kernel"] == 3 and samples["level_3_problem_33_sample_0_kernel"] == 0
    pass_at_k = json.loads((run_dir / "summary.json").read_text())["pass_at_k"]["problems"]
    assert pass_at_k["level1/19_ReLU"]["n"] == 4  # its four samples (run b's claims index 2 again: not judged)
    assert pass_at_k["level3/33_VanillaRNN"] == {"n": 1, "c": 1, "pass@1": 1.0}


def test_eval_results_json_reads_back_as_kernelbenchs_scripts_read_it(kb_run):
    run_dir = kb_run[0]
    assert not (run_dir / "eval_results.json").exists()  # two levels: one file each, as KernelBench keeps them
    level1 = json.loads((run_dir / "level1" / "eval_results.json").read_text())
    level3 = json.loads((run_dir / "level3" / "eval_results.json").read_text())
    assert list(level1) == ["19"] and list(level3) == ["33"]  # 98's and 99's candidates were skipped: left out
    for results in (level1, level3):
        for problem_id, samples in results.items():
            assert int(problem_id) > 0 and isinstance(samples, list)
            for r in samples:  # every key and type of `add_to_eval_results_file`
                assert set(r) == {"sample_id", "compiled", "correctness", "metadata", "runtime", "runtime_stats"}
                assert type(r["sample_id"]) is int and type(r["compiled"]) is bool
                assert type(r["correctness"]) is bool and type(r["runtime"]) is float
                assert isinstance(r["metadata"], dict) and isinstance(r["runtime_stats"], dict)
    # calculate_pass_at_k: n samples, c those correct and compiled; benchmark_eval_analysis: sample_id 0's entry
    samples = level1["19"]
    assert [r["sample_id"] for r in samples] == [0, 1, 2, 3]
    assert sum(1 for r in samples if r["correctness"] and r["compiled"]) == 3
    (first,) = [r for r in samples if r["sample_id"] == 0]
    assert first["runtime"] > 0 and first["runtime_stats"]["num_trials"] >= 1
    assert set(first["runtime_stats"]) >= {"mean", "std", "min", "max", "num_trials"}
    failed = samples[1]
    assert failed["correctness"] is False and failed["runtime"] == -1.0 and failed["runtime_stats"] == {}
    assert "not_defined_by_the_problem" in json.dumps(failed["metadata"])
    assert level3["33"][0]["correctness"] is True


def test_eval_results_file_per_level_and_sample_ids(tmp_path):
    def verdict(problem: str, candidate: str, status: str = "ok", group: str | None = None) -> Verdict:
        stats = TimingStats.from_samples([1.0, 1.2, 1.1])
        return Verdict(status=status, correct=status == "ok", compiled=True, runtime_ms=1.1, runtime_stats=stats,
                       run_id="r", problem=problem, candidate=candidate, source_sha256="s", settings_key="k",
                       device="cpu", torch_version="t", trials=5, trials_passed=5, problem_group=group)

    one_level = [verdict("19_ReLU", "b"), verdict("19_ReLU", "level_1_problem_19_sample_0_kernel"),
                 verdict("19_ReLU", "c", "skipped"), verdict("relu_without_number", "x")]
    (results,) = eval_results(one_level).values()
    assert [(r["sample_id"], r["metadata"]["correctness_trials"]) for r in results["19"]] == [(0, "(5 / 5)"),
                                                                                               (1, "(5 / 5)")]
    assert write_eval_results(tmp_path, one_level) == [tmp_path / "eval_results.json"]
    ordered = eval_results([verdict("10_b", "x"), verdict("2_a", "x"), verdict("1_c", "x")])[None]
    assert list(ordered) == ["1", "2", "10"]  # numeric order, as KernelBench sorts its keys
    two = [verdict("level1/19_ReLU", "a", group="level1"), verdict("level2/19_Conv", "a", group="level2")]
    assert write_eval_results(tmp_path, two) == [tmp_path / "level1" / "eval_results.json",
                                                 tmp_path / "level2" / "eval_results.json"]


# --- C and D: every file accounted for, errors naming the user's files, bad input ---------------------------


def test_every_file_in_a_problem_folder_gets_a_verdict_or_a_named_reason(tmp_path):
    folder = tmp_path / "c" / "19_ReLU"
    (folder / "__pycache__").mkdir(parents=True)
    (folder / "old").mkdir()
    for name in ("fused.py", "fused.cu", "notes.txt", ".hidden.py", "fused.py~", "#fused.py#"):
        (folder / name).write_text(READS_SIZES)
    found = discover(KB / "level1", tmp_path / "c")
    by_id = {c.candidate_id: c for c in found.candidates}
    assert sorted(by_id) == ["fused", "fused.cu", "notes.txt"]
    assert by_id["fused"].invalid is None
    assert "not a Python source (.cu)" in by_id["fused.cu"].invalid and str(folder) in by_id["notes.txt"].invalid
    (warning,) = found.warnings
    for named in (".hidden.py (hidden)", "__pycache__ (Python's cache)", "fused.py~ (editor backup)",
                  "#fused.py# (editor backup)", "old (a folder: not searched)"):
        assert named in warning


def test_non_python_files_in_a_problem_folder_are_load_errors_in_a_run(build_cache, tmp_path):
    cands = tmp_path / "c" / "19_ReLU"
    cands.mkdir(parents=True)
    (cands / "ok.py").write_text(READS_SIZES)
    (cands / "ok.cu").write_text("__global__ void k() {}\n")
    kbeval("run", *FAST, "--dim", "batch_size=2", "--dim", "dim=16", "--problems", str(KB / "level1"),
           "--candidates", str(tmp_path / "c"), "--out", str(tmp_path / "out"), "--run-id", "r", cache=build_cache)
    verdicts = read_verdicts(tmp_path / "out" / "r")
    assert verdicts["ok"]["correct"] is True
    assert verdicts["ok.cu"]["status"] == "load_error" and "not a Python source" in verdicts["ok.cu"]["error"]


def test_bad_kernelbench_input_costs_one_line_each_and_the_rest_is_judged(kb_run):
    run_dir, tree, cands = kb_run
    stderr = (run_dir.parent.parent / "stderr.txt").read_text()
    assert f"{cands / 'level_1_problem_19_kernel.py'}: the name does not parse" in stderr
    duplicate = cands.parent / "b" / "level_1_problem_19_sample_2_kernel.py"
    assert f"{duplicate}: sample 2 of level1/19_ReLU is already {cands / duplicate.name}; not judged" in stderr
    assert "not judged: level_1_problem_19_sample_4_kernel.cu" in stderr and "prompt.txt" not in stderr
    verdicts = read_verdicts(run_dir)
    assert "level_1_problem_19_kernel" not in verdicts and len(verdicts) == 7  # 4 + 98 + 99 + 33
    broken = verdicts["level_1_problem_99_sample_0_kernel"]
    assert broken["status"] == "skipped" and "needs a package this machine lacks" in broken["error"]
    assert verdicts["level_1_problem_19_sample_0_kernel"]["correct"] is True  # the rest judged


def test_problem_errors_name_the_users_file_not_the_harness_copy(kb_run):
    run_dir, tree, _ = kb_run
    verdicts = read_verdicts(run_dir)
    lacks = verdicts["level_1_problem_98_sample_0_kernel"]["error"]
    assert lacks.startswith(f"{tree / 'level1' / '98_No_inputs.py'}: reference:") and "get_inputs" in lacks
    broken = verdicts["level_1_problem_99_sample_0_kernel"]["error"]
    assert f"read by {tree / 'level1' / '99_Needs_a_package.py'}" in broken  # the file named inside the message
    for error in (lacks, broken):
        assert "kbeval-run-" not in error and "/problems/" not in error


def test_user_paths_maps_the_private_copy_back(tmp_path):
    user = tmp_path / "problems" / "p.py"
    copy = Problem("p", tmp_path / "private" / "0123" / "p.py", "sha", origin=user)  # as `pinned` makes it
    assert copy.shown == user
    text = f"{copy.path.resolve()}: line 3; again {copy.path}"
    assert user_paths(copy, text) == f"{user}: line 3; again {user}"
    assert user_paths(Problem("p", user, "sha"), text) == text  # not a copy: nothing to map


STATEFUL = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """A VanillaRNN in KernelBench's level 3 style: the hidden state lives in the module, from call to call."""

    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(2 * n, n)
        self.hidden = torch.randn(batch_size, n)

    def forward(self, x):
        self.hidden = self.hidden.to(x.device)
        self.hidden = torch.tanh(self.fc(torch.cat([x, self.hidden], dim=1)))
        return self.hidden


batch_size = 4
n = 8


def get_inputs():
    return [torch.randn(batch_size, n)]


def get_init_inputs():
    return [n]
'''

FORGETFUL = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(2 * n, n)
        self.hidden = torch.randn(batch_size, n)

    def forward(self, x):  # the state it started with, every call: right only at the first
        return torch.tanh(self.fc(torch.cat([x, self.hidden.to(x.device)], dim=1)))
'''


def test_a_reference_that_keeps_state_is_judged_as_kernelbench_calls_it(build_cache, tmp_path):
    """KernelBench's level 3 RNNs (33, 34) keep their hidden state in the module: the second run of a trial saw
    another state, and an identical copy was `incorrect` ("passed once and failed over memory filled with 0x00").
    Each model is now called once per trial from a fresh start; a candidate that drops the state is still caught
    at its second trial."""
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "rnn.py").write_text(STATEFUL)
    (tmp_path / "c" / "rnn").mkdir(parents=True)
    (tmp_path / "c" / "rnn" / "copy.py").write_text(STATEFUL + "\n\nclass ModelNew(Model):\n    pass\n")
    (tmp_path / "c" / "rnn" / "forgetful.py").write_text(FORGETFUL)
    args = [a if a != "1" or i != FAST.index("--trials") + 1 else "3" for i, a in enumerate(FAST)]
    kbeval("run", *args, "--problems", str(tmp_path / "p"), "--candidates", str(tmp_path / "c"), "--out",
           str(tmp_path / "r"), "--run-id", "state", cache=build_cache)
    verdicts = read_verdicts(tmp_path / "r" / "state")
    assert verdicts["copy"]["correct"], verdicts["copy"]["error"]
    assert "keeps state between calls" in verdicts["copy"]["problem_warning"]
    assert verdicts["forgetful"]["status"] == "incorrect" and verdicts["forgetful"]["error"].startswith("trial 1")
