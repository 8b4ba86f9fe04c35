"""Reference outputs holding -inf are judged (issue 12, item 5): one real CPU run of the command line over
`fixtures/nonfinite_problems/masked_scores.py` (attention scores masked with -inf) and three candidates: the
honest one is correct, +inf where -inf belongs and NaN where -inf belongs are `incorrect`, saying so."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FIXTURES, kbeval, read_verdicts
from timed import assert_timed_sanely


@pytest.fixture(scope="module")
def masked_run(tmp_path_factory: pytest.TempPathFactory, build_cache: Path) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("nonfinite")
    kbeval("run", "--device", "cpu", "--problems", str(FIXTURES / "nonfinite_problems"),
           "--candidates", str(FIXTURES / "nonfinite_candidates"), "--trials", "3", "--timeout", "60",
           "--threads", "1", "--timing-budget", "2", "--no-compile-baseline", "--out", str(out), "--run-id", "m",
           cache=build_cache)
    return read_verdicts(out / "m")


def test_the_problem_is_judged_not_skipped(masked_run):
    assert sorted(masked_run) == ["honest", "nan_for_inf", "wrong_sign"]
    assert not [v["error"] for v in masked_run.values() if v["status"] == "skipped"]


def test_honest_masked_scores_are_correct(masked_run):
    v = masked_run["honest"]
    assert_timed_sanely(v, "honest")
    assert v["trials_passed"] == 3 and v["timing"]["checked_calls"] > 0  # the timed calls' -inf checked too
    assert v["max_abs_diff"] < 1e-4


def test_plus_inf_where_the_reference_has_minus_inf_is_incorrect(masked_run):
    v = masked_run["wrong_sign"]
    assert v["status"] == "incorrect" and not v["correct"], (v["status"], v["error"])
    assert v["error"].startswith("trial 0:") and "where the reference has Inf" in v["error"], v["error"]
    assert "got inf, expected -inf" in v["error"], v["error"]


def test_nan_where_the_reference_has_minus_inf_is_incorrect(masked_run):
    v = masked_run["nan_for_inf"]
    assert v["status"] == "incorrect" and not v["correct"], (v["status"], v["error"])
    assert "NaN values where the reference has none" in v["error"], v["error"]
