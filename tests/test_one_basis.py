"""One stated basis (issue 35): every runtime a verdict reports is the figure its timing record names for that
model, on the basis `timing.basis` says; the other basis is recorded only under `latency_*` names; single-call
statistics (median, spread) stay inside the per-model records. Before, 1_MLP's `ref_runtime_ms` was 0.057 while
`timing.reference.median_ms` read 0.0295, and nothing said which one the speedup used."""

from __future__ import annotations

import math

import pytest
from conftest import read_verdicts

pytestmark = pytest.mark.slow  # it reads the whole fixture run, which only the slow set makes (about 90 s)


def test_every_reported_time_is_its_records_figure_on_the_named_basis(fixture_run) -> None:
    verdicts = [v for v in read_verdicts(fixture_run[0]).values() if v.get("timing") and v.get("runtime_ms")]
    assert verdicts, "the fixture run timed no candidate"
    for v in verdicts:
        timing = v["timing"]
        assert timing["basis"] == "wall"  # the CPU's basis; CUDA's is "device" (tests/test_gpu.py)
        assert v["runtime_ms"] == timing["candidate"]["per_call_ms"]
        assert v["ref_runtime_ms"] == timing["reference"]["per_call_ms"]
        assert math.isclose(v["speedup_vs_eager"], timing["speedup"], rel_tol=1e-9)
        assert math.isclose(timing["speedup"], v["ref_runtime_ms"] / v["runtime_ms"], rel_tol=1e-6)
        shown = {k for k, x in v.items() if k.endswith("_ms") and isinstance(x, float)}
        # no other top-level time: a reader meets exactly the two the speedup is made of (and torch.compile's)
        assert shown <= {"runtime_ms", "ref_runtime_ms", "compile_runtime_ms"}, shown
        other = {k for k in timing if "latency" in k}
        assert other <= {"latency_ms", "ref_latency_ms", "latency_speedup"}, other
