"""Adversarial CUDA candidates (skipped where torch sees no GPU): side streams, faults, hangs, forged timers.

Real runs over `fixtures/attack_problems_gpu` and `fixtures/attacks_gpu`: first every `tiny_relu_cuda` candidate,
`spin_kernel`'s killed kernel included, then `tiny_relu_cuda_after` (the same problem under another id) on the
same GPU, so its candidate (`honest_cuda2`) is judged after the kill. Two runs, not one: within one run a lane
takes candidates as their builds finish, so which came first was the compilers' race.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import FIXTURES, kbeval
from timed import assert_timed_sanely, settled

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

EXPECTED = {
    ("tiny_relu_cuda", "honest_cuda"): "ok",
    ("tiny_relu_cuda", "empty_cuda"): "incorrect",
    ("tiny_relu_cuda", "illegal_access"): "runtime_error",
    ("tiny_relu_cuda", "cuda_oom"): "runtime_error",
    ("tiny_relu_cuda", "spin_kernel"): "timeout",
    ("tiny_relu_cuda", "silent_launch_failure"): "incorrect",
    ("tiny_relu_cuda", "patched_events"): "suspicious",
    ("tiny_relu_cuda_after", "honest_cuda2"): "ok",
}
SIDE_STREAM = ("tiny_relu_cuda", "side_stream")  # suspicious, or timed at the honest kernel's speed


@pytest.fixture(scope="module")
def gpu_attack_run(tmp_path_factory: pytest.TempPathFactory,
                   build_cache: Path) -> tuple[list[Path], list[subprocess.CompletedProcess[str]]]:
    out = tmp_path_factory.mktemp("trust-gpu")
    runs, procs = [], []
    for problem, run_id in (("tiny_relu_cuda", "gpu-attacks"), ("tiny_relu_cuda_after", "gpu-after")):
        procs.append(kbeval("run", "--device", "cuda", "--problems", str(FIXTURES / "attack_problems_gpu"),
                            "--candidates", str(FIXTURES / "attacks_gpu"), "--problem", problem, "--trials", "3",
                            "--timeout", "60", "--jobs", "16", "--out", str(out), "--run-id", run_id,
                            cache=build_cache, check=False))
        runs.append(out / run_id)
    return runs, procs


def lines(run_dirs: list[Path]) -> list[dict]:
    return [json.loads(line) for run_dir in run_dirs
            for line in (run_dir / "verdicts.jsonl").read_text().splitlines() if line.strip()]


def by_pair(run_dirs: list[Path]) -> dict[tuple[str, str], dict]:
    return {(v["problem"], v["candidate"]): v for v in lines(run_dirs)}


def test_run_completes_with_one_verdict_each(gpu_attack_run):
    run_dirs, procs = gpu_attack_run
    for proc in procs:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    pairs = sorted((v["problem"], v["candidate"]) for v in lines(run_dirs))
    assert pairs == sorted([*EXPECTED, SIDE_STREAM])


def test_every_attack_gets_its_status(gpu_attack_run):
    verdicts = by_pair(gpu_attack_run[0])
    # an honest ok turned suspicious is timing's call, and test_honest_kernels_are_not_flagged's to catch;
    # every other expectation, "suspicious" for the forged events included, is exact
    got = {pair: settled(v["status"]) if EXPECTED.get(pair) == "ok" else v["status"]
           for pair, v in verdicts.items() if pair != SIDE_STREAM}
    want = {pair: settled(status) if status == "ok" else status for pair, status in EXPECTED.items()}
    errors = {f"{p}/{c}": v["error"] for (p, c), v in verdicts.items()
              if (p, c) in want and got[(p, c)] != want[(p, c)]}
    assert got == want, errors


def test_side_stream_work_is_not_free(gpu_attack_run):
    verdicts = by_pair(gpu_attack_run[0])
    side = verdicts[SIDE_STREAM]
    if side["status"] == "suspicious":
        assert re.search(r"stream|after the call", side["error"] or "", re.IGNORECASE), side["error"]
    else:
        # timed at the kernel's real cost: its events alone would see only the launch, far below the time its
        # input takes to read once at peak bandwidth (the floor); compared with physics, not with another
        # candidate's timing, so no load can decide it
        assert_timed_sanely(side, "side_stream")
        assert side["runtime_ms"] >= side["timing"]["floor_ms"] > 0, (side["runtime_ms"], side["timing"])


def test_faults_are_named(gpu_attack_run):
    verdicts = by_pair(gpu_attack_run[0])
    error = {c: v["error"] or "" for (_, c), v in verdicts.items()}
    assert re.search(r"illegal memory access|CUDA error", error["illegal_access"]), error["illegal_access"]
    assert "out of memory" in error["cuda_oom"].lower(), error["cuda_oom"]
    assert re.search(r"clock|event", error["patched_events"], re.IGNORECASE), error["patched_events"]
    assert "60 s" in error["spin_kernel"] or "limit" in error["spin_kernel"], error["spin_kernel"]


def test_gpu_works_after_a_killed_kernel(gpu_attack_run):
    first, after = (by_pair([run_dir]) for run_dir in gpu_attack_run[0])
    assert first[("tiny_relu_cuda", "spin_kernel")]["status"] == "timeout"  # its kernel was killed mid-run
    assert list(after) == [("tiny_relu_cuda_after", "honest_cuda2")]
    assert_timed_sanely(by_pair(gpu_attack_run[0])[("tiny_relu_cuda_after", "honest_cuda2")], "honest_cuda2")


def test_honest_kernels_are_not_flagged(gpu_attack_run):
    verdicts = by_pair(gpu_attack_run[0])
    for pair in (("tiny_relu_cuda", "honest_cuda"), ("tiny_relu_cuda_after", "honest_cuda2")):
        v = verdicts[pair]
        assert v["status"] == "ok" and v["error"] is None and v["correct"], (pair, v["status"], v["error"])
        assert v["max_abs_diff"] == 0.0  # relu is exact


@pytest.fixture(scope="module")
def early_run(tmp_path_factory: pytest.TempPathFactory, build_cache: Path) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("early")
    proc = kbeval("run", "--device", "cuda", "--problems", str(FIXTURES / "attack_problems_gpu"),
                  "--candidates", str(FIXTURES / "attacks_gpu"), "--problem", "matmul_early", "--trials", "3",
                  "--no-compile-baseline", "--timeout", "120", "--out", str(out), "--run-id", "early",
                  cache=build_cache, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {v["candidate"]: v for v in lines([out / "early"])}


def test_no_work_starts_under_the_flush(early_run):
    """Issue 36, class 6: a matmul on a stream that does not wait for the caller's starts while the flush still
    covers the launch, before the start event. It must be timed at what it costs (its honest twin's time, the
    same kernel on the current stream, within the same run: without the defence it measured 0.3-0.5 of it) or
    be `suspicious`; never `ok` faster than its twin."""
    honest, early = early_run["honest_matmul"], early_run["early_side_stream"]
    assert_timed_sanely(honest, "honest_matmul")
    assert early["correct"], early["error"]
    if early["status"] == "suspicious":
        return
    assert early["status"] == "ok", (early["status"], early["error"])
    assert early["runtime_ms"] >= 0.8 * honest["runtime_ms"], (early["runtime_ms"], honest["runtime_ms"])
