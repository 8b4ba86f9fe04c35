"""Statuses with host timing factored out, for tests that must not depend on the machine's load.

A correct candidate is `ok` or `suspicious` depending on its timing, and on a shared CPU timing is the
host's mood: these tests compare what timing cannot change (correct or not, and every other status
exactly) and check that the timing fields are sane. Attacks expected to be `suspicious` are asserted
exactly, elsewhere; this module is for honest candidates only.
"""

from __future__ import annotations

TIMED = ("ok", "suspicious")  # correct and timed: which of the two, the host's load may decide


def settled(status: str) -> str:
    """A status with the timing-decided difference removed: `ok` and `suspicious` read as `correct`."""
    return "correct" if status in TIMED else status


def settled_all(statuses: dict) -> dict:
    return {key: settled(status) for key, status in statuses.items()}


def assert_timed_sanely(v: dict, name: str = "") -> None:
    """An honest candidate's verdict: correct, and timed with positive, self-consistent numbers."""
    assert v["status"] in TIMED and v["correct"], (name, v["status"], v["error"])
    assert v["runtime_ms"] > 0 and v["ref_runtime_ms"] > 0, name
    if v["status"] == "ok":  # a suspicious clock mismatch carries no speedup
        assert v["error"] is None and v["speedup"] > 0, name
        low, high = v["speedup_vs_eager_ci"]
        assert low <= v["speedup"] <= high, name
        within = (v["timing"] or {}).get("speedup_ci_within")
        if within:  # the reported interval holds the session's own, widened by what moved between sessions
            assert low <= within[0] <= v["speedup"] <= within[1] <= high, name
    if v["device"] == "cuda":  # every timed call's flush (its launch cover) is timed, on both sides
        assert v["timing"]["gate_ms"] > 0 and v["timing"]["ref_gate_ms"] > 0, name
