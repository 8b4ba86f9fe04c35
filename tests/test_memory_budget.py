"""Issue 34: the memory budget. The plan is a pure function tested on known sizes (KernelBench's 23_Softmax at
its current size among them); a forced small budget makes the checker draw input sets again and compute expected
outputs again, with the verdicts of an unconstrained run; a reference that cannot fit is `skipped` with the
sizes, a candidate that runs out where the reference fits is a `runtime_error` naming memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from conftest import pythonpath

from kernelbench_eval.common import memory
from kernelbench_eval.common.memory import Footprint, parse_bytes, peak_bytes, plan
from kernelbench_eval.requests import CloseExchangeRequest, OpenExchangeRequest, TimeRequest
from kernelbench_eval.worker.reference import CheckerWorker

GB = 10**9

# 23_Softmax at KernelBench's current size: batch 4096 x dim 393216 fp32, one input and one output of 6.4 GB
SOFTMAX = Footprint(input_bytes=6_442_450_944, output_bytes=6_442_450_944, transient_bytes=0, trials=5,
                    timing_sets=3, placements=2)


def test_small_problems_keep_everything() -> None:
    fp = Footprint(input_bytes=64 << 20, output_bytes=64 << 20, transient_bytes=0, trials=5, timing_sets=3,
                   placements=2)
    got = plan(fp, 80 * GB)
    assert (got.trial_inputs, got.expected, got.timing_sets, got.placements, got.fits) == (True, True, 3, 2, True)


def test_softmax_at_full_size_fits_an_80_gb_card_by_dropping_in_order() -> None:
    """Everything resident would be ~135 GB; on an H100 (80 GB, ~72 GB budget) trial inputs go, then expected
    outputs, then the second placement, then timing bases, until it fits."""
    everything = peak_bytes(SOFTMAX, True, True, 3, 2)
    assert everything > 120 * GB
    got = plan(SOFTMAX, int(0.9 * 80 * GB))
    assert got.fits and not got.trial_inputs and not got.expected
    assert got.need_bytes <= 0.9 * 80 * GB
    # three bases and one placement: 4 x 6.4 GB live in each worker, 3 x 6.4 more in the checker (kept, copy,
    # exchange) and 1 x 6.4 in the candidate, 77.8 GB in all: over; two bases: 65 GB
    assert (got.timing_sets, got.placements) == (2, 1)
    on_h200 = plan(SOFTMAX, int(0.9 * 140 * GB))
    assert on_h200.fits and on_h200.expected and not on_h200.trial_inputs and on_h200.placements == 2


def test_a_budget_below_the_least_plan_says_it_does_not_fit() -> None:
    got = plan(SOFTMAX, 10 * GB)
    assert not got.fits
    assert (got.trial_inputs, got.expected, got.timing_sets, got.placements) == (False, False, 1, 1)
    assert got.need_bytes == peak_bytes(SOFTMAX, False, False, 1, 1) > 10 * GB


def test_a_plan_over_the_budget_goes_lean_where_that_takes_less() -> None:
    """45_Average_Pooling_2D at its current size (one 17.2 GB input, 142 MB outputs) on an 80 GB card: the least
    plan needs about 92 GB; lean (the candidate reads its input sets in the exchange) about 76. Where a block of
    outputs is as large as an input set (23_Softmax), lean takes no less and is not used."""
    avgpool = Footprint(input_bytes=17_179_869_184, output_bytes=141_557_760, transient_bytes=0, trials=5,
                        timing_sets=3, placements=2, block_bytes=memory.block_bytes(141_557_760, "cuda"))
    least = peak_bytes(avgpool, False, False, 1, 1)
    got = plan(avgpool, int(0.9 * 78.5 * (1 << 30)))
    assert got.lean and (got.trial_inputs, got.expected, got.timing_sets, got.placements) == (False, False, 1, 1)
    assert got.need_bytes == peak_bytes(avgpool, False, False, 1, 1, lean=True)
    assert least - got.need_bytes == avgpool.input_bytes - avgpool.block_bytes  # its copy, less the outputs' room
    assert least > 90 * GB and got.need_bytes < 77 * GB
    assert plan(avgpool, 80 * GB).fits and plan(avgpool, 80 * GB).lean  # (an 80 GB budget: lean fits)
    assert not plan(avgpool, 200 * GB).lean  # where a plan fits, never lean
    assert not plan(SOFTMAX, 10 * GB).lean


def test_the_plan_counts_a_block_of_outputs() -> None:
    """A block's outputs are held four times (the checker's kept outputs and its copies, the exchange, the
    candidate's), up to the cap a block is sized by."""
    one = Footprint(input_bytes=GB, output_bytes=GB, transient_bytes=0, trials=1, timing_sets=1)
    three = Footprint(input_bytes=GB, output_bytes=GB, transient_bytes=0, trials=1, timing_sets=1,
                      block_bytes=memory.block_bytes(GB, "cuda"))
    assert memory.block_bytes(GB, "cuda") == 3 << 30 and memory.block_bytes(GB, "cpu") == GB
    assert memory.block_bytes(1 << 20, "cpu") == 10 << 20
    assert peak_bytes(three, False, False, 1, 1) - peak_bytes(one, False, False, 1, 1) == 4 * ((3 << 30) - GB)


def test_budget_text() -> None:
    assert parse_bytes("512M") == 512 << 20 and parse_bytes("2G") == 2 << 30 and parse_bytes("1.5GiB") == 3 << 29
    assert parse_bytes("4096") == 4096
    with pytest.raises(ValueError, match=memory.BUDGET_VAR):
        parse_bytes("lots")


# --- end to end on the CPU ------------------------------------------------------------------------------------

PROBLEM = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)

    def forward(self, x):
        return torch.tanh(self.fc(x))


batch_size = 64
n = 32


def get_inputs():
    return [torch.randn(batch_size, n)]


def get_init_inputs():
    return [n]
'''

HONEST = PROBLEM.split("\n\n\nbatch_size")[0].replace("class Model(", "class ModelNew(") + "\n"
# right for its first four calls (trials 0 and 1, twice each), then wrong: fails on trial 2, whose expected outputs
# a constrained checker computes again when it needs them
LATE = HONEST.replace("    def forward(self, x):\n        return torch.tanh(self.fc(x))", '''    calls = 0

    def forward(self, x):
        ModelNew.calls += 1
        out = torch.tanh(self.fc(x))
        return out if ModelNew.calls <= 4 else out + 0.5''')
GREEDY = HONEST.replace("        return torch.tanh(self.fc(x))", "        torch.empty(10**14, dtype=torch.uint8)\n"
                                                                   "        return torch.tanh(self.fc(x))")
# runs out asking for 1 KiB, less than an input set (8 KiB): as a copy of the reference runs out where the
# harness left it no room (45_Average_Pooling_2D on an 80 GB card); a CUDA allocator's words, raised on the CPU
NO_ROOM = HONEST.replace("        return torch.tanh(self.fc(x))",
                         "        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 1.00 KiB.')")
TOO_BIG = PROBLEM.replace("        return torch.tanh(self.fc(x))", "        torch.empty(10**14, dtype=torch.uint8)\n"
                                                                    "        return torch.tanh(self.fc(x))")

# inputs far larger than outputs: under the tight budget the plan goes lean, and the candidate reads its input
# sets where they lie in the exchange (a mean over rows, as 45_Average_Pooling_2D shrinks its input)
MEAN = PROBLEM.replace("        return torch.tanh(self.fc(x))", "        return torch.tanh(self.fc(x)).mean(dim=0)") \
    .replace("batch_size = 64", "batch_size = 4096")
MEAN_HONEST = MEAN.split("\n\n\nbatch_size")[0].replace("class Model(", "class ModelNew(") + "\n"
# changes its input in place (the trial's copy, the timed call's live buffer): judged on untouched inputs anyway
MEAN_MUTATES = MEAN_HONEST.replace("        return torch.tanh(self.fc(x)).mean(dim=0)",
                                   "        out = torch.tanh(self.fc(x)).mean(dim=0)\n        x.zero_()\n"
                                   "        return out")

ARGS = ("--device", "cpu", "--no-compile-baseline", "--trials", "4", "--reps", "10", "--timing-budget", "1",
        "--warmup", "1")


def _run(root: Path, name: str, env: dict[str, str]) -> dict[str, dict]:
    full = dict(os.environ, KBEVAL_CACHE_DIR=str(root / "cache"), COLUMNS="200", PYTHONPATH=pythonpath(), **env)
    proc = subprocess.run([sys.executable, "-m", "kernelbench_eval", "run", *ARGS, "--problems", str(root / "p"),
                           "--candidates", str(root / "c"), "--out", str(root / "r"), "--run-id", name],
                          env=full, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = (root / "r" / name / "verdicts.jsonl").read_text().splitlines()
    return {(v := json.loads(line))["problem"] + "/" + v["candidate"]: v for line in lines}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, dict], dict[str, dict]]:
    root = tmp_path_factory.mktemp("budget")
    (root / "p").mkdir()
    (root / "p" / "tanh.py").write_text(PROBLEM)
    (root / "p" / "too_big.py").write_text(TOO_BIG)
    (root / "p" / "mean.py").write_text(MEAN)
    for problem, candidates in (("tanh", {"honest": HONEST, "late": LATE, "greedy": GREEDY, "no_room": NO_ROOM}),
                                ("too_big", {"honest": HONEST}),
                                ("mean", {"honest": MEAN_HONEST, "mutates": MEAN_MUTATES})):
        (root / "c" / problem).mkdir(parents=True)
        for name, source in candidates.items():
            (root / "c" / problem / f"{name}.py").write_text(source)
    return _run(root, "free", {}), _run(root, "tight", {memory.BUDGET_VAR: "1"})


def test_a_forced_small_budget_gives_the_same_verdicts(runs: tuple[dict[str, dict], dict[str, dict]]) -> None:
    free, tight = runs
    assert set(free) == set(tight)
    for key in set(free) - {"tanh/no_room"}:  # the one the budget decides, by design (below)
        same = ("status", "correct", "trials_passed")
        assert {f: free[key][f] for f in same} == {f: tight[key][f] for f in same}, key
    assert free["tanh/honest"]["correct"] and free["tanh/late"]["status"] == "incorrect"
    assert free["tanh/late"]["trials_passed"] == 2 and free["tanh/late"]["error"].startswith("trial 2")
    loose, constrained = free["tanh/honest"]["memory"], tight["tanh/honest"]["memory"]
    assert loose["fits"] and loose["trial_inputs_resident"] and loose["expected_resident"]
    assert loose["timing_sets"] == 3
    assert not constrained["fits"] and not constrained["trial_inputs_resident"]
    assert not constrained["expected_resident"] and constrained["timing_sets"] == 1
    assert not constrained["lean"]  # a block of its outputs takes as much as an input set: lean saves nothing
    lean, roomy = tight["mean/honest"], free["mean/honest"]
    assert lean["memory"]["lean"] and not roomy["memory"]["lean"]  # read its inputs in the exchange, no copy
    # correct: every trial and every timed call matched (whether the CPU's timing then trusts the speedup, ok or
    # suspicious, is the host's load, not the plan's)
    assert lean["correct"] and roomy["correct"] and lean["trials_passed"] == 4
    for verdicts in (free, tight):  # its trials' copies and its timed calls' live buffers, never the exchange's
        assert verdicts["mean/mutates"]["correct"] and verdicts["mean/mutates"]["mutates_inputs"]
    assert constrained["reference_peak_bytes"] > 0 and constrained["candidate_peak_bytes"] > 0


def test_a_reference_that_cannot_fit_is_skipped_with_the_sizes(runs: tuple[dict[str, dict], dict[str, dict]]) -> None:
    for verdicts in runs:
        v = verdicts["too_big/honest"]
        assert v["status"] == "skipped", v
        assert "out of memory: the reference needs more than this device has" in v["error"]
        assert "GB in all" in v["error"] and "one input set takes" in v["error"]


def test_a_candidate_that_runs_out_is_a_runtime_error_naming_memory(
        runs: tuple[dict[str, dict], dict[str, dict]]) -> None:
    for verdicts in runs:
        v = verdicts["tanh/greedy"]
        assert v["status"] == "runtime_error" and "allocate memory" in v["error"], v


def test_running_out_where_the_harness_left_no_room_is_skipped_not_blamed(
        runs: tuple[dict[str, dict], dict[str, dict]]) -> None:
    """Issue 34: where even the least plan is over the budget, a candidate that ran out asking for no more than
    an input set or the reference's own call takes is `skipped` with the sizes; where the plan fit, the same
    shortfall is its `runtime_error`, and asking for more (`greedy`: 10^14 bytes) is one either way."""
    free, tight = runs
    assert free["tanh/no_room"]["status"] == "runtime_error", free["tanh/no_room"]
    v = tight["tanh/no_room"]
    assert v["status"] == "skipped" and not v["correct"], v
    assert v["error"].startswith("skipped: judging this problem needs about ")
    assert "over the 0.0 GB budget" in v["error"]
    assert "asking for 0.0 GB, no more than an input set or the reference's own call takes" in v["error"]
    assert "Tried to allocate 1.00 KiB" in v["error"]
    assert tight["tanh/greedy"]["status"] == "runtime_error"


def test_an_allocators_words_are_read() -> None:
    assert memory.asked_bytes("CUDA out of memory. Tried to allocate 16.00 GiB. GPU 0 has") == 16 << 30
    assert memory.asked_bytes("DefaultCPUAllocator: can't allocate memory: you tried to allocate 5000 bytes") == 5000
    assert memory.asked_bytes("Tried to allocate 512.00 MiB") == 512 << 20 and memory.asked_bytes("no size") is None
    assert memory.names_memory("OutOfMemoryError: CUDA out of memory.") and memory.names_memory("can't allocate memory")
    assert not memory.names_memory("illegal memory access")


# --- the lean checker holds what the plan counts, no more (45_Average_Pooling_2D ran out holding 3 sets, asking a 4th)


class _Double(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x)
        return x * 2


def _lean_checker(lean: bool) -> CheckerWorker:
    worker = CheckerWorker()
    worker.set_seeds = {"trial0": 11, "timing0": 12}
    worker.draw_from = (lambda: [torch.rand(64)], "cpu", None)
    worker.models["main"], worker.lean = _Double(), lean
    return worker


def test_a_lean_checker_draws_its_timing_set_for_each_candidate_and_lets_its_buffers_go(tmp_path: Path) -> None:
    """Its timing base set is not kept but drawn (the same values from its seed); a new candidate's exchange
    frees the last timing's live buffers, kept outputs and graph; a plan that is not lean keeps them."""
    for lean in (True, False):
        worker = _lean_checker(lean)
        worker.op_time(TimeRequest(input_sets=["timing0"], warmup=1, warmup_seconds=60))
        worker.op_time(TimeRequest(input_sets=["timing0"], schedule=[(0, 1.0, 5)]))
        assert "timing0" not in worker.sets and worker.rotation is not None and worker.kept
        assert torch.equal(worker.rotation.bases[0][0], worker.draw("timing0")[0])  # its seed's values
        worker.leave_timing()
        worker.op_open_exchange(OpenExchangeRequest(size=1024, shm_dir=str(tmp_path)))
        assert (worker.rotation is None and not worker.kept) == lean
        worker.op_close_exchange(CloseExchangeRequest())


def test_a_set_drawn_for_one_reference_call_is_not_copied_first() -> None:
    """Expected outputs computed again (not resident) run the reference on the set drawn for them, no second copy;
    a kept set is copied first (the reference may write its inputs)."""
    worker = _lean_checker(True)
    worker.expected = [None]
    made: list[torch.Tensor] = []
    draw = worker.draw
    worker.draw = lambda name: made.append(draw(name)[0]) or [made[-1]]  # type: ignore[method-assign]
    out = worker.expected_outputs(0)
    assert worker.models["main"].seen[-1] is made[-1] and torch.equal(out[0], made[-1] * 2)
    kept = worker.sets["trial0"] = draw("trial0")
    worker.recent = None
    worker.expected_outputs(0)
    assert worker.models["main"].seen[-1] is not kept[0] and torch.equal(worker.models["main"].seen[-1], kept[0])


def test_a_lean_plan_keeps_no_timing_set_between_candidates() -> None:
    fp = Footprint(input_bytes=GB, output_bytes=1 << 20, transient_bytes=0, trials=5, timing_sets=1)
    kept = memory.Residency(False, False, 1, 1, 0, 0, True)
    assert kept.resident_bytes(fp) == GB and memory.Residency(False, False, 1, 1, 0, 0, True, lean=True
                                                              ).resident_bytes(fp) == 0
