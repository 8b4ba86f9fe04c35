"""The reference on a GPU cannot be slowed by work a candidate queued before it was stopped (skipped without a GPU).

One real run over `fixtures/attack_problems_gpu` and `fixtures/attacks_reference_gpu`: `spin_beside_reference`
queues a 10 ms kernel on every SM right after the hand-over of each block that the reference's block follows;
stopping its process does not stop the kernel, so the reference's calls share the GPU with it. Either the
reference timed alone again (the candidate stopped) shows the difference (`suspicious`), or the spin bought no
speedup. On the H100 (2026-11-24) it is the latter, 1.005x [0.999, 1.012]: each timed call synchronises and
flushes the L2 before its start event, so the reference's events only start once the GPU has switched to its
context. The honest kernel beside it is judged correct, its reference never called disturbed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import FIXTURES, kbeval, read_verdicts
from timed import assert_timed_sanely

from kernelbench_eval.judge.refguard import SLACK

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def gpu_guarded_run(tmp_path_factory: pytest.TempPathFactory, build_cache: Path) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("refguard-gpu")
    kbeval("run", "--device", "cuda", "--problems", str(FIXTURES / "attack_problems_gpu"),
           "--candidates", str(FIXTURES / "attacks_reference_gpu"), "--trials", "2", "--timeout", "120",
           "--max-speedup", "0", "--no-compile-baseline", "--out", str(out), "--run-id", "g", cache=build_cache)
    return read_verdicts(out / "g")


def test_work_queued_before_the_stop_is_caught_or_buys_nothing(gpu_guarded_run):
    v = gpu_guarded_run["spin_beside_reference"]
    assert v["correct"], v["error"]
    if "alone with the candidate stopped" in (v["error"] or ""):  # caught by the reference timed alone
        assert v["status"] == "suspicious", v["status"]
        assert v["timing"]["attempts"] == 2 and v["timing"]["ref_alone_check"] == "disturbed", v["timing"]
    else:  # not caught: whatever else timing said, no speedup beyond what the alone check forgives was reported
        ci = v["timing"]["speedup_ci"]
        assert ci is None or ci[1] < SLACK["cuda"], v["timing"]


def test_an_honest_kernel_leaves_the_reference_alone(gpu_guarded_run):
    v = gpu_guarded_run["honest_cuda"]
    assert_timed_sanely(v, "honest_cuda")
    assert v["timing"]["ref_alone_check"] in ("agrees", "refreshed"), v["timing"]
    assert not any(s in (v["error"] or "") for s in ("found stopped", "rescheduled", "alone with the candidate"))
