"""Scale-out on the CPU, for real: two evaluation lanes, two runs sharing one cold build cache, and the Ray
backend on a local Ray instance (no mock), each giving the verdicts of the plain single-lane run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURE_RUN_ARGS, FIXTURES, ROOT, kbeval, read_verdicts
from test_pipeline_cpu import EXPECTED
from timed import assert_timed_sanely, settled, settled_all

PROBLEMS = FIXTURES / "problems"
SOURCES = FIXTURES / "candidates" / "tiny_linear_relu"


def statuses(run_dir: Path) -> dict[str, str]:
    return {name: v["status"] for name, v in read_verdicts(run_dir).items()}


@pytest.mark.slow
def test_two_lanes_judge_every_candidate_once_with_the_same_verdicts(fixture_run, build_cache, tmp_path):
    kbeval("run", *FIXTURE_RUN_ARGS, "--lanes", "2", "--out", str(tmp_path), "--run-id", "lanes", cache=build_cache)
    lines = (tmp_path / "lanes" / "verdicts.jsonl").read_text().splitlines()
    assert len(lines) == len(EXPECTED)  # each exactly once
    assert settled_all(statuses(tmp_path / "lanes")) == settled_all(EXPECTED)
    lanes = {v["lane"] for v in read_verdicts(tmp_path / "lanes").values() if v["status"] not in (
        "load_error", "compile_error", "skipped")}
    assert lanes == {"cpu:0", "cpu:1"}  # both lanes judged candidates


@pytest.mark.slow
def test_two_runs_sharing_a_cold_cache_build_each_source_once(tmp_path):
    """Two concurrent runs over the same C++ candidates and one empty cache: one builds, the other waits for it."""
    cands = tmp_path / "candidates" / "tiny_linear_relu"
    cands.mkdir(parents=True)
    for name in ("cpp_honest.py", "cpp_wrong.py"):
        shutil.copyfile(SOURCES / name, cands / name)
    cache = tmp_path / "cache"
    args = ["run", "--device", "cpu", "--problems", str(PROBLEMS), "--candidates", str(tmp_path / "candidates"),
            "--trials", "1", "--no-compile-baseline", "--jobs", "2", "--out", str(tmp_path / "out")]
    env = {"KBEVAL_CACHE_DIR": str(cache), "COLUMNS": "200"}
    procs = [subprocess.Popen([sys.executable, "-m", "kernelbench_eval", *args, "--run-id", run_id], cwd=ROOT,
                              env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for run_id in ("first", "second")]
    for proc in procs:
        out, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, out
    first, second = read_verdicts(tmp_path / "out" / "first"), read_verdicts(tmp_path / "out" / "second")
    for name, status in (("cpp_honest", "ok"), ("cpp_wrong", "incorrect")):
        assert settled(first[name]["status"]) == settled(second[name]["status"]) == settled(status)
        assert sorted([first[name]["compile_cached"], second[name]["compile_cached"]]) == [False, True], name
    assert len(list(cache.rglob("*.so"))) == 2  # one build per source, none torn or doubled


@pytest.mark.slow
def test_ray_backend_end_to_end_and_resume(fixture_run, build_cache, tmp_path):
    """Compiles as Ray tasks, evaluation in a Ray actor lane, verdicts recorded by the driver; then a resume."""
    pytest.importorskip("ray")
    only = ("--problem", "tiny_linear_relu")
    kbeval("run", *FIXTURE_RUN_ARGS, *only, "--backend", "ray", "--lanes", "1", "--out", str(tmp_path),
           "--run-id", "ray", cache=build_cache)
    run_dir = tmp_path / "ray"
    got = read_verdicts(run_dir)
    want = {name: status for name, status in EXPECTED.items() if name != "identity"}
    assert settled_all(statuses(run_dir)) == settled_all(want)
    judged = [v for v in got.values() if v["status"] in ("ok", "suspicious", "incorrect", "timeout", "crashed",
                                                         "runtime_error")]
    assert judged and all(v["lane"].startswith("ray:") for v in judged)
    assert all(v["built_on"] and v["lane"].startswith(f"ray:{v['built_on']}/") for v in judged)  # one node here
    assert_timed_sanely(got["cpp_honest"], "cpp_honest")

    lines = (run_dir / "verdicts.jsonl").read_text().splitlines()
    kept = [line for line in lines if json.loads(line)["candidate"] not in ("py_honest", "cpp_wrong")]
    (run_dir / "verdicts.jsonl").write_text("\n".join(kept) + "\n")
    kbeval("run", "--resume", str(run_dir), "--backend", "ray", "--lanes", "1", cache=build_cache)
    final = (run_dir / "verdicts.jsonl").read_text().splitlines()
    assert final[: len(kept)] == kept and len(final) == len(want)
    assert settled_all(statuses(run_dir)) == settled_all(want)


def test_unknown_backend_is_a_usage_error(build_cache, tmp_path):
    proc = kbeval("run", *FIXTURE_RUN_ARGS, "--backend", "slurm", "--out", str(tmp_path), cache=build_cache,
                  check=False)
    assert proc.returncode == 2 and "unknown backend 'slurm'" in proc.stderr



def test_the_phase_account_splits_wall_time_by_what_ran(monkeypatch, tmp_path):
    """Issue 38: two builds overlapping a lane's judging, then idle time: each mix of phases gets its seconds, each
    phase its worker-seconds, and the phase running longest is the bound; sessions accumulate in phases.json."""
    from kernelbench_eval.results import phases

    now = [100.0]
    monkeypatch.setattr(phases.time, "monotonic", lambda: now[0])
    book = phases.Account()
    with book.phase("build"):
        now[0] += 10  # one build alone: 10 s
        with book.phase("build"):
            now[0] += 5  # two builds: 5 s, 10 build-s
            with book.phase("judge"):
                now[0] += 4  # two builds and a lane: 4 s
        now[0] += 1  # one build again
    now[0] += 2  # nothing
    summary = book.summary()
    assert summary["wall_s"] == 22 and summary["idle_s"] == 2
    assert summary["running_s"] == {"build": 20, "reference": 0, "judge": 4}
    assert summary["alone_s"] == {"build": 16, "reference": 0, "judge": 0}
    assert summary["worker_s"] == {"build": 29, "reference": 0, "judge": 4} and summary["bound"] == "build"
    assert summary["done"] == {"build": 2, "reference": 0, "judge": 1}
    with pytest.raises(KeyboardInterrupt), book.phase("build"):  # cut short: ran, but did not finish
        raise KeyboardInterrupt
    assert book.summary()["done"]["build"] == 2
    assert phases.line(summary) == "time 22 s: build 20 s, references 0 s, judge 4 s, idle 2 s (build-bound)"
    phases.record(tmp_path, summary)
    phases.record(tmp_path, summary)  # a resumed run adds its session
    assert phases.read(tmp_path) == [summary, summary]
