"""Baselines record what they were measured beside, and one measured in bad conditions is measured again.

Everything here is decided by recorded numbers the tests choose (a planted entry, a stubbed measurement),
never by how loaded this machine happens to be.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from conftest import FIXTURES, kbeval, read_verdicts

from kernelbench_eval.budgets import Budgets
from kernelbench_eval.discover.corpus import Problem
from kernelbench_eval.judge import baselines, conditions
from kernelbench_eval.judge.baselines import BaselineStore
from kernelbench_eval.judge.reference_side import ReferenceSide, Secrets
from kernelbench_eval.measured import TimingStats
from kernelbench_eval.records import Baseline, Conditions, RunSettings
from kernelbench_eval.store import keys

CPU = RunSettings(device="cpu", threads=1, target_rse=0.01)
CUDA = RunSettings(device="cuda", target_rse=0.01)
QUIET = Conditions(eager_rse=0.004, compiled_rse=0.006, others_cores=0.1, cores=2, threads=1, seconds=2.0)
BUSY = QUIET.model_copy(update={"others_cores": 2.0})  # two busy neighbours on a 2-core box
NOISY = QUIET.model_copy(update={"eager_rse": 0.2})


def test_quiet_conditions_raise_no_doubt():
    assert conditions.doubts(QUIET, CPU) == [] and conditions.doubts(QUIET, CUDA) == []


def test_a_spread_that_did_not_settle_is_doubted_on_every_device():
    for settings in (CPU, CUDA):
        (reason,) = conditions.doubts(NOISY, settings)
        assert "eager" in reason and "did not settle" in reason
    compiled = QUIET.model_copy(update={"compiled_rse": 0.05})
    assert any("torch.compile" in r for r in conditions.doubts(compiled, CPU))
    assert conditions.doubts(QUIET.model_copy(update={"eager_rse": None}), CPU)  # spread unknown


def test_busy_neighbours_are_doubted_on_the_cpu_only():
    (reason,) = conditions.doubts(BUSY, CPU)
    assert "2 of 2 cores" in reason
    assert conditions.doubts(BUSY, CUDA) == []  # GPU hosts build while baselines are measured, by design
    one = BUSY.model_copy(update={"others_cores": 1.0})  # one neighbour beside one thread: room for both
    assert conditions.doubts(one, CPU) == []
    assert conditions.doubts(one.model_copy(update={"threads": 2}), CPU)


def test_a_baseline_from_before_conditions_were_recorded_is_doubted():
    assert conditions.doubts(None, CPU) == ["stored before baselines recorded their conditions"]


def test_others_cores_is_the_busy_time_not_ours_per_wall_second():
    assert conditions.others_cores(busy_ms=3000, own_ms=1000, seconds=1.0) == pytest.approx(2.0)
    assert conditions.others_cores(busy_ms=500, own_ms=900, seconds=1.0) == 0.0  # accounting skew: not negative
    assert conditions.others_cores(busy_ms=500, own_ms=0, seconds=0.0) == 0.0


def test_host_load_reads_the_machine():
    load = conditions.HostLoad(None)
    sum(i * i for i in range(200_000))  # some of our own work inside the window
    others = load.others_cores()
    assert others is not None and math.isfinite(others) and others >= 0 and load.seconds() > 0


def _baseline(cond: Conditions | None, eager_ms: float) -> Baseline:
    samples = [eager_ms] * 20
    return Baseline(problem="p", source_sha256="0" * 64, device_name="cpu-box", torch_version=torch.__version__,
                    timing_key=CPU.timing_key(), eager=TimingStats.from_samples(samples), eager_samples=samples,
                    conditions=cond)


def test_better_prefers_fewer_doubts_then_less_spread():
    quiet, busy, noisy = _baseline(QUIET, 1.0), _baseline(BUSY, 2.0), _baseline(NOISY, 3.0)
    assert conditions.better(busy, quiet, CPU) is quiet and conditions.better(quiet, busy, CPU) is quiet
    assert conditions.better(_baseline(None, 4.0), busy, CPU) is busy  # unknown conditions lose to any known
    assert conditions.better(busy, _baseline(None, 4.0), CPU) is busy
    wider = _baseline(BUSY.model_copy(update={"eager_rse": 0.02}), 5.0)
    assert conditions.better(busy, wider, CPU) is busy
    assert conditions.better(noisy, noisy.model_copy(), CPU) is not noisy  # a tie: the fresh one


@pytest.fixture
def reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A reference side whose baseline look-up is driven directly: a planted store, a stubbed measurement."""
    monkeypatch.setattr(baselines, "_key_dir", tmp_path)  # the store's signing key lives here
    problem = Problem("p", tmp_path / "p.py", "0" * 64)
    settings = CPU.model_copy(update={"compile_baseline": True})
    ref = ReferenceSide(problem, settings, Secrets.draw(1), tmp_path / "ref.log", Budgets.of(60, 60),
                        BaselineStore(tmp_path / "baselines.json"))
    measured: list[Baseline] = []

    def measure(fresh: Baseline) -> None:
        monkeypatch.setattr(ref.baselines, "_measure", lambda device_name: measured.append(fresh) or fresh)

    yield ref.baselines, measure, measured
    ref.close()


def test_a_baseline_measured_in_good_conditions_is_reused(reference):
    found, measure, measured = reference
    planted = _baseline(QUIET, 1.0)
    found.store.put(planted)
    measure(_baseline(QUIET, 9.0))
    assert found.settle("cpu-box").model_dump() == planted.model_dump() and measured == [] and found.remeasured is None


def test_a_baseline_measured_beside_busy_neighbours_is_measured_again_and_replaced(reference):
    found, measure, measured = reference
    found.store.put(_baseline(BUSY, 18.0))  # 18 ms for a 0.3 ms op, as seen under load
    fresh = _baseline(QUIET, 0.3)
    measure(fresh)
    assert found.settle("cpu-box") is fresh and measured == [fresh] and found.baseline is fresh
    assert "measured again" in found.remeasured and "cores busy" in found.remeasured
    # the next run reuses the good one
    assert BaselineStore(found.store.path).get(fresh.key()).model_dump() == fresh.model_dump()


def test_a_remeasurement_no_better_keeps_the_stored_one(reference):
    found, measure, measured = reference
    stored = _baseline(BUSY, 2.0)
    found.store.put(stored)
    measure(_baseline(BUSY.model_copy(update={"eager_rse": 0.025}), 7.0))
    assert found.settle("cpu-box").model_dump() == stored.model_dump() and len(measured) == 1
    assert "kept" in found.remeasured
    assert BaselineStore(found.store.path).get(stored.key()).model_dump() == stored.model_dump()


def test_without_a_stored_baseline_one_is_measured_and_stored(reference):
    found, measure, measured = reference
    fresh = _baseline(NOISY, 1.0)
    measure(fresh)
    assert found.settle("cpu-box") is fresh and found.remeasured is None
    assert BaselineStore(found.store.path).get(fresh.key()).model_dump() == fresh.model_dump()


@pytest.mark.slow  # two runs with torch.compile baselines
def test_a_run_measures_again_a_stored_baseline_without_conditions(tmp_path: Path):
    """End to end: an entry as an older harness stored it (signed, no conditions) is measured again by the next
    run, which says why in the verdict and stores one that records what it was measured beside."""
    problems, candidates = tmp_path / "problems", tmp_path / "candidates" / "tiny_linear_relu"
    problems.mkdir()
    candidates.mkdir(parents=True)
    shutil.copy(FIXTURES / "problems" / "tiny_linear_relu.py", problems)
    shutil.copy(FIXTURES / "candidates" / "tiny_linear_relu" / "py_honest.py", candidates)
    file, cache = tmp_path / "baselines.json", tmp_path / "cache"
    args = ("--device", "cpu", "--problems", str(problems), "--candidates", str(candidates.parent), "--trials", "1",
            "--timing-budget", "0.5", "--reps", "10", "--threads", "1", "--baselines", str(file))
    kbeval("run", *args, "--out", str(tmp_path / "out"), "--run-id", "first", cache=cache)
    (key, entry), = json.loads(file.read_text()).items()
    assert entry["conditions"]["seconds"] > 0
    older = {k: v for k, v in entry.items() if k not in ("conditions", "mac")} | {"measured_at": "older"}
    file.write_text(json.dumps({key: older | {"mac": keys.sign(keys.load_key(cache), older)}}))

    kbeval("run", *args, "--out", str(tmp_path / "out"), "--run-id", "second", cache=cache)
    verdict = read_verdicts(tmp_path / "out" / "second")["py_honest"]
    assert verdict["baseline_remeasured"] == ("the stored baseline was measured again: stored before baselines "
                                              "recorded their conditions")
    stored = json.loads(file.read_text())[key]
    assert stored["measured_at"] != "older" and stored["conditions"]["seconds"] > 0
    assert verdict["baseline_conditions"] == stored["conditions"]
