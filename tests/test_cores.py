"""Cores kept for the lanes on a GPU host (`isolation/cores.py`): how they are split, that the harness and its
lanes' environments take them, and that a worker, forked or cold, pins itself to what its environment names."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kernelbench_eval.isolation import cores, forkclient
from kernelbench_eval.isolation.process import WorkerProcess
from kernelbench_eval.requests import ExportRequest


@pytest.fixture(autouse=True)
def _fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test is a process that has reserved nothing yet (`cores` remembers the cores it started with)."""
    monkeypatch.setattr(cores, "_started_on", None)
    monkeypatch.setattr(cores, "_one_lane", False)


def test_a_core_per_lane_and_one_for_the_harness_where_there_are_cores_to_spare():
    assert cores.split(1, range(4)) is None  # a small box: builds and timing take turns anyway
    lanes, builds = cores.split(1, range(16))
    assert lanes == {14, 15} and builds == set(range(14))
    lanes, builds = cores.split(8, range(16))
    assert len(lanes) == 4 and not lanes & builds and lanes | builds == set(range(16))  # at most a quarter
    assert cores.split(0, range(16)) is None


def test_the_variable_round_trips_and_nonsense_is_ignored():
    assert cores.parse(cores.env_value({3, 1, 2})) == {1, 2, 3}
    assert cores.parse("") is None and cores.parse("1,x") is None
    assert cores.pin_self({}) is None and cores.pin_self({cores.ENV: "nonsense"}) is None


def test_reserving_names_the_lanes_cores_and_moves_the_harness_there(monkeypatch: pytest.MonkeyPatch):
    moved: dict[int, frozenset[int]] = {}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(os, "sched_setaffinity", lambda tid, cpus: moved.__setitem__(tid, frozenset(cpus)))
    lane_envs, environ = [{}, {}], {}
    lanes, builds = cores.reserve(lane_envs, environ)
    assert all(cores.parse(env[cores.ENV]) == lanes for env in lane_envs) and len(lanes) == 3
    assert cores.parse(environ[cores.ENV]) == builds and cores.build_cores(environ) == 13
    assert set(moved) == set(cores.threads()) and set(moved.values()) == {lanes}  # every thread of the harness


def test_nothing_is_reserved_on_a_small_box(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    lane_envs, environ = [{}], {}
    assert cores.reserve(lane_envs, environ) is None and lane_envs == [{}] and environ == {}
    assert cores.build_cores(environ) == os.cpu_count()


@pytest.mark.parametrize("forking", ["1", "0"])
def test_a_worker_pins_itself_to_the_cores_its_environment_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 forking: str):
    monkeypatch.setenv(forkclient.SWITCH_VAR, forking)
    one = min(os.sched_getaffinity(0))
    with WorkerProcess(tmp_path, tmp_path / "worker.log", {cores.ENV: str(one)}, role="candidate") as worker:
        worker.call(ExportRequest(calls=[]), 60)  # it has started and answered
        assert os.sched_getaffinity(worker.proc.pid) == {one}
        assert worker.call(ExportRequest(calls=[]), 60, poll=0.05).ok  # a reply awaited by polling


def test_a_second_run_in_one_process_splits_the_cores_it_started_with(monkeypatch: pytest.MonkeyPatch):
    """A library user calls `pipeline.run` again and again (an RL loop): the first reservation moved the harness
    onto the lanes' cores, so a second split of what it runs on now would find too few cores, give the lanes no
    cores of their own, and leave them the builds' (inherited from this process's environment)."""
    where = {"cpus": frozenset(range(16))}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(where["cpus"]))
    monkeypatch.setattr(os, "sched_setaffinity", lambda tid, cpus: where.__setitem__("cpus", frozenset(cpus)))
    environ: dict[str, str] = {}
    first = cores.reserve([{}], environ)
    lane_env: dict[str, str] = {}
    assert cores.reserve([lane_env], environ) == first and first is not None
    assert cores.parse(lane_env[cores.ENV]) == first[0] and cores.parse(environ[cores.ENV]) == first[1]


def test_the_harness_polls_only_where_one_lanes_cores_are_kept(monkeypatch: pytest.MonkeyPatch):
    """Polling keeps the harness's core busy while a call runs: its own core with one lane, not with several
    (their lane threads would crowd the timed workers), and not on a small box, where nothing is kept."""
    monkeypatch.setattr(os, "sched_setaffinity", lambda tid, cpus: None)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert not cores.harness_may_poll()
    cores.reserve([{}], {})
    assert cores.harness_may_poll()
    cores.reserve([{}, {}], {})
    assert not cores.harness_may_poll()
    monkeypatch.setattr(cores, "_started_on", None)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    cores.reserve([{}], {})
    assert not cores.harness_may_poll()
