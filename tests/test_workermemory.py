"""What a worker gives back to the device between requests (`worker/workermemory.py`): cached memory after a phase,
never between a timing measurement's requests, whose timed calls would otherwise allocate from the device inside
the timed region (on an H200 left 78.5 GiB, 21_Sigmoid's identical copy read 0.73 [0.18, 1.88] that way)."""

from __future__ import annotations

from kernelbench_eval.worker import main as worker_main
from kernelbench_eval.worker import workermemory


def _ops() -> set[str]:
    return {op for worker in worker_main.ROLES.values() for op in worker.OPS}


def test_memory_goes_back_only_after_requests_that_end_a_phase() -> None:
    ops = _ops()
    assert ops >= workermemory.GIVE_BACK_AFTER  # every name is a request the workers answer
    timing = {"time", "warmup", "export", "compare_timed", "put", "take", "open_exchange"}
    assert timing <= ops and not timing & workermemory.GIVE_BACK_AFTER
    assert {"expect", "compare", "run"} <= workermemory.GIVE_BACK_AFTER  # the trials' slack goes back


def test_on_the_cpu_nothing_is_given_back_or_traced(capsys) -> None:
    workermemory.give_back("compare", "cpu")
    workermemory.trace("compare", "cpu")
    assert capsys.readouterr().out == ""
    assert workermemory.peak("cpu") > 0
