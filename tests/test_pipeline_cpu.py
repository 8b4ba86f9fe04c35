"""End to end on the CPU: real load_inline compiles, real subprocesses, every status a candidate can earn."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import BASELINES, FIXTURE_RUN_ARGS, FIXTURES, ROOT, kbeval, read_verdicts
from timed import assert_timed_sanely, settled, settled_all

from kernelbench_eval.building.compile import compile_candidate, warm_build
from kernelbench_eval.building.jitwarmup import WarmupSpec
from kernelbench_eval.discover.corpus import Problem, make_candidate
from kernelbench_eval.judge.conditions import doubts
from kernelbench_eval.records import Conditions, RunManifest, RunSettings

pytestmark = pytest.mark.slow  # the fixture corpus built (C++ extensions) and judged end to end: minutes

EXPECTED = {
    "cpp_honest": "ok",
    "py_honest": "ok",
    "cpp_wrong": "incorrect",
    "py_wrong_shape": "incorrect",
    "py_nan": "incorrect",
    "py_empty": "incorrect",
    "py_mutates_input": "ok",
    "cpp_compile_error": "compile_error",
    "cpp_runtime_error": "runtime_error",
    "cpp_hang": "timeout",
    "cpp_segfault": "crashed",
    "py_exit": "crashed",
    "missing_modelnew": "load_error",
    "syntax_error": "load_error",
    "empty": "load_error",
    "py_wrong_init": "load_error",
    "cuda_relu": "skipped",
    "identity": "skipped",  # its problem breaks the contract
}


def test_every_candidate_gets_its_status(fixture_run):
    run_dir, _ = fixture_run
    verdicts = read_verdicts(run_dir)
    assert settled_all({name: v["status"] for name, v in verdicts.items()}) == settled_all(EXPECTED)
    for name, status in EXPECTED.items():
        if status == "ok":
            assert_timed_sanely(verdicts[name], name)


def test_errors_say_what_went_wrong(fixture_run):
    verdicts = read_verdicts(fixture_run[0])
    errors = {name: v["error"] or "" for name, v in verdicts.items()}
    assert errors["cpp_compile_error"].startswith("main.cpp:")
    assert "error:" in errors["cpp_compile_error"] and "‘i’" in errors["cpp_compile_error"]
    assert "picky: expected a 3-D input" in errors["cpp_runtime_error"]
    assert "SIGSEGV" in errors["cpp_segfault"]
    assert "20 s limit" in errors["cpp_hang"] and errors["cpp_hang"].startswith("trial 0")
    assert "without a verdict" in errors["py_exit"]
    assert "(it defines FusedModel)" in errors["missing_modelnew"]
    assert "SyntaxError" in errors["syntax_error"] and "line 8" in errors["syntax_error"]
    assert "empty" in errors["empty"]
    assert "takes 2 positional arguments" in errors["py_wrong_init"]
    assert "shape (1, 8, 16), expected (8, 16)" in errors["py_wrong_shape"]
    assert "NaN" in errors["py_nan"] and "(0, 0)" in errors["py_nan"]
    assert "values outside atol=0.01 rtol=0.01" in errors["cpp_wrong"] and "max |diff|" in errors["cpp_wrong"]
    assert "needs cuda" in errors["cuda_relu"]
    assert "broken_problem.py" in errors["identity"] and "get_inputs" in errors["identity"]


def test_correct_candidates_are_timed_and_others_are_not(fixture_run):
    verdicts = read_verdicts(fixture_run[0])
    for name, v in verdicts.items():
        if v["status"] == "ok":
            assert v["correct"] and v["trials_passed"] == v["trials"] == 3
            assert v["runtime_ms"] > 0 and v["ref_runtime_ms"] > 0
            timing = v["timing"]
            assert v["runtime_stats"]["calls"] == timing["reference"]["calls"]  # interleaved lanes
            # --reps 100 (the default) unless the timing budget (10 s) ran out first: then at least one block
            assert v["runtime_stats"]["calls"] >= (100 if timing["seconds"] < 10 else 10), (name, timing["seconds"])
            assert abs(v["speedup"] - v["ref_runtime_ms"] / v["runtime_ms"]) < 1e-9
            assert v["speedup_vs_eager"] == v["speedup"]
            low, high = v["speedup_vs_eager_ci"]
            assert low <= v["speedup"] <= high
            assert v["compile_runtime_ms"] > 0 and v["speedup_vs_compile"] > 0
            assert timing["checked_calls"] >= 2 and timing["blocks"] >= 10
            assert v["max_abs_diff"] < 1e-5
        elif v["status"] == "suspicious":  # host load may decide this; correctness it may not
            assert v["correct"] and v["trials_passed"] == v["trials"] == 3 and v["runtime_ms"] > 0, name
        else:
            assert not v["correct"] and v["runtime_ms"] == -1.0 and v["speedup"] is None, name


def test_inputs_mutated_in_place_are_recorded_not_rewarded(fixture_run):
    verdicts = read_verdicts(fixture_run[0])
    assert verdicts["py_mutates_input"]["mutates_inputs"] and verdicts["py_mutates_input"]["correct"]
    assert not any(v["mutates_inputs"] for n, v in verdicts.items() if n != "py_mutates_input")


def test_two_line_files_match_the_seed_format(fixture_run):
    run_dir = fixture_run[0]
    verdicts = read_verdicts(run_dir)
    ok = (run_dir / "tiny_linear_relu" / "cpp_honest.txt").read_text().splitlines()
    assert ok[0] == "Evaluation: True"
    assert ok[1].startswith("Runtime: ") and float(ok[1].split()[1]) > 0
    bad = (run_dir / "tiny_linear_relu" / "cpp_wrong.txt").read_text()
    assert bad == "Evaluation: False\nRuntime: -1.0\n"
    assert len(list(run_dir.glob("*/*.txt"))) == len(verdicts)


def test_logs_hold_the_candidates_output(fixture_run):
    run_dir = fixture_run[0]
    verdicts = read_verdicts(run_dir)
    compile_log = (run_dir / verdicts["cpp_compile_error"]["log"]).read_text()
    assert "error:" in compile_log
    runtime_log = (run_dir / verdicts["cpp_runtime_error"]["log"]).read_text()
    assert "Traceback" in runtime_log and "picky" in runtime_log


def test_summary_and_exit_code(fixture_run):
    _, proc = fixture_run
    assert proc.returncode == 0
    assert f"{len(EXPECTED)} verdicts" in proc.stdout
    assert "no problem named 'no_such_problem'" in proc.stderr


def test_rerun_reuses_the_build_cache(fixture_run, build_cache, tmp_path):
    """A second run of unchanged sources recompiles nothing: same .so files, untouched, and marked cached."""
    cold = read_verdicts(fixture_run[0])
    libs = {p: p.stat().st_mtime_ns for p in (build_cache / "builds").rglob("*.so")}
    baselines_mtime = BASELINES.stat().st_mtime_ns
    assert len(libs) == 5  # honest, wrong, runtime error, hang, segfault
    kbeval("run", *FIXTURE_RUN_ARGS, "--out", str(tmp_path), "--run-id", "warm", cache=build_cache)
    warm = read_verdicts(tmp_path / "warm")
    assert settled_all({n: v["status"] for n, v in warm.items()}) == settled_all(
        {n: v["status"] for n, v in cold.items()})
    for name, v in warm.items():
        if cold[name]["compile_seconds"] is not None:
            assert v["compile_cached"], name
    assert {p: p.stat().st_mtime_ns for p in (build_cache / "builds").rglob("*.so")} == libs
    # a look-up, not a build: faster than the cold g++ build whatever the load (no fixed limit a busy host could miss)
    assert 0 <= warm["cpp_honest"]["compile_seconds"] < cold["cpp_honest"]["compile_seconds"]
    # the baselines the cold run used say what they were measured beside; measured in good conditions they are
    # reused (same numbers, file untouched), in bad ones (a busy host) measured again, and the verdict says why
    recorded = cold["cpp_honest"]["baseline_conditions"]
    assert recorded is not None and recorded["seconds"] > 0 and recorded["cores"] >= 1
    settings = RunManifest.model_validate_json((fixture_run[0] / "run.json").read_text()).settings
    if not doubts(Conditions.model_validate(recorded), settings):
        assert warm["cpp_honest"]["baseline_remeasured"] is None
        assert warm["cpp_honest"]["compile_runtime_ms"] == cold["cpp_honest"]["compile_runtime_ms"] > 0
        assert json.loads(BASELINES.read_text()) and BASELINES.stat().st_mtime_ns == baselines_mtime
    else:
        assert warm["cpp_honest"]["baseline_remeasured"].startswith("the stored baseline was measured again")
        assert warm["cpp_honest"]["compile_runtime_ms"] > 0


def test_resume_judges_only_what_is_missing(fixture_run, build_cache, tmp_path):
    """Drop some verdicts and tear the last line, as a killed harness would; --resume fills exactly the gap."""
    run_dir = tmp_path / "cold"
    shutil.copytree(fixture_run[0], run_dir)
    lines = (run_dir / "verdicts.jsonl").read_text().splitlines()
    kept = [line for line in lines if not json.loads(line)["candidate"].startswith("py_")]
    (run_dir / "verdicts.jsonl").write_text("\n".join(kept) + "\n" + kept[-1][:40])
    kbeval("run", "--resume", str(run_dir), cache=build_cache)
    final_lines = (run_dir / "verdicts.jsonl").read_text().splitlines()
    final = [json.loads(line) for line in final_lines]
    names = [v["candidate"] for v in final]
    assert len(names) == len(set(names)) == len(EXPECTED)  # every verdict exactly once
    assert final_lines[: len(kept)] == kept  # what was recorded is kept, untouched
    before = read_verdicts(fixture_run[0])
    assert settled_all({v["candidate"]: v["status"] for v in final}) == settled_all(
        {n: v["status"] for n, v in before.items()})  # timing may turn an honest ok into suspicious, nothing else


def test_eval_prints_the_two_lines(build_cache, tmp_path):
    proc = kbeval("eval", str(FIXTURES / "problems" / "tiny_linear_relu.py"),
                  str(FIXTURES / "candidates" / "tiny_linear_relu" / "py_honest.py"),
                  "--device", "cpu", "--out", str(tmp_path), cache=build_cache)
    lines = proc.stdout.splitlines()
    assert lines[0] == "Evaluation: True"
    assert lines[1].startswith("Runtime: ") and float(lines[1].split()[1]) > 0
    assert "speedup" in proc.stdout


def test_problems_lists_input_shapes(build_cache):
    proc = kbeval("problems", "--problems", str(FIXTURES / "problems"), "--dim", "batch_size=3", cache=build_cache)
    assert "float32[3, 32]" in proc.stdout
    assert "lacks get_inputs" in proc.stdout


def test_usage_errors_exit_2(build_cache, tmp_path):
    missing = kbeval("run", "--device", "cpu", "--problems", str(tmp_path / "nope"), cache=build_cache, check=False)
    assert missing.returncode == 2 and "problems folder not found" in missing.stderr
    bad_dim = kbeval("run", "--device", "cpu", "--dim", "batch_size", cache=build_cache, check=False)
    assert bad_dim.returncode == 2 and "NAME=NUMBER" in bad_dim.stderr


def test_sigkill_mid_run_then_resume_equals_an_uninterrupted_run(fixture_run, build_cache, tmp_path):
    """Kill the real harness with SIGKILL part-way, resume, and get every verdict exactly once."""
    env = dict(os.environ, KBEVAL_CACHE_DIR=str(build_cache))
    args = [sys.executable, "-m", "kernelbench_eval", "run", *FIXTURE_RUN_ARGS, "--out", str(tmp_path),
            "--run-id", "killed", "--no-compile-baseline"]
    harness = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = tmp_path / "killed" / "verdicts.jsonl"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 9):
        time.sleep(0.2)
    harness.send_signal(signal.SIGKILL)
    harness.wait()
    before = log.read_text().splitlines()
    assert 9 <= len(before) < len(EXPECTED), "the kill must land mid-run"
    time.sleep(2)
    assert not _workers_of(build_cache), "workers must not outlive a killed harness"
    kbeval("run", "--resume", str(tmp_path / "killed"), cache=build_cache)
    after = log.read_text().splitlines()
    assert after[: len(before)] == before  # recorded verdicts kept, untouched
    names = [json.loads(line)["candidate"] for line in after]
    assert len(names) == len(set(names)) == len(EXPECTED)
    resumed = {json.loads(line)["candidate"]: json.loads(line)["status"] for line in after}
    assert settled_all(resumed) == settled_all({n: v["status"] for n, v in read_verdicts(fixture_run[0]).items()})


def _workers_of(cache: Path) -> list[str]:
    """Command lines of live kbeval workers started by a harness that used this build cache."""
    needle = f"KBEVAL_CACHE_DIR={cache}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle in (entry / "environ").read_bytes().split(b"\0"):
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if "kernelbench_eval.worker.main" in cmdline:
                    found.append(cmdline)
        except OSError:
            continue
    return found


def test_a_compile_that_never_ends_is_a_compile_error(build_cache, tmp_path):
    hang = tmp_path / "compile_hang.py"
    hang.write_text("while True:  # stands for a build that never finishes\n    pass\n")
    proc = kbeval("eval", str(FIXTURES / "problems" / "tiny_linear_relu.py"), str(hang), "--device", "cpu",
                  "--compile-timeout", "5", "--out", str(tmp_path / "out"), "--json", cache=build_cache)
    verdict = json.loads(proc.stdout)
    assert verdict["status"] == "compile_error" and "5 s limit" in verdict["error"]


def test_candidate_output_is_capped_in_its_log(tmp_path, monkeypatch):
    import io

    from kernelbench_eval.isolation import pipes
    monkeypatch.setattr(pipes, "LOG_CAP_BYTES", 1000)
    log = tmp_path / "x.log"
    pipes.copy_capped(io.BufferedReader(io.BytesIO(b"Evaluation: True\n" * 10_000)), log)
    text = log.read_text()
    assert len(text) < 1200 and "log capped at 1000 bytes" in text


def test_identical_sources_share_a_build_but_are_each_judged(build_cache, tmp_path):
    """A copy never inherits a verdict (it could behave differently under its own name: test_defence_cpu)."""
    cands = tmp_path / "candidates" / "tiny_linear_relu"
    cands.mkdir(parents=True)
    source = FIXTURES / "candidates" / "tiny_linear_relu" / "py_honest.py"
    for name in ("a_original.py", "b_copy.py"):
        shutil.copyfile(source, cands / name)
    kbeval("run", "--device", "cpu", "--problems", str(FIXTURES / "problems"),
           "--candidates", str(tmp_path / "candidates"), "--trials", "1", "--no-compile-baseline", "--jobs", "1",
           "--out", str(tmp_path / "out"), "--run-id", "dedupe", cache=build_cache)
    verdicts = read_verdicts(tmp_path / "out" / "dedupe")
    original, copy = verdicts["a_original"], verdicts["b_copy"]
    assert_timed_sanely(original, "a_original")
    assert original["correct"] and copy["correct"]
    assert original["duplicate_of"] is None and copy["duplicate_of"] is None
    assert copy["compile_cached"]  # one build for both
    logs = tmp_path / "out" / "dedupe" / "logs" / "tiny_linear_relu"
    assert (logs / "a_original.eval.log").exists() and (logs / "b_copy.eval.log").exists()


def test_a_stale_extension_lock_does_not_hang_the_next_run(build_cache, tmp_path):
    """A process killed inside `load_inline` leaves its lock file; later imports of that build must not wait on it."""
    cands = tmp_path / "candidates" / "tiny_linear_relu"
    cands.mkdir(parents=True)
    shutil.copyfile(FIXTURES / "candidates" / "tiny_linear_relu" / "cpp_honest.py", cands / "cpp_honest.py")
    args = ("run", "--device", "cpu", "--problems", str(FIXTURES / "problems"), "--candidates",
            str(tmp_path / "candidates"), "--trials", "1", "--no-compile-baseline", "--timeout", "30",
            "--out", str(tmp_path / "out"))
    kbeval(*args, "--run-id", "first", cache=build_cache)
    sha = hashlib.sha256((cands / "cpp_honest.py").read_bytes()).hexdigest()
    ext_dirs = [p for p in build_cache.glob(f"builds/{sha[:24]}-*-cpu/ext/*") if p.is_dir()]
    assert ext_dirs
    for ext in ext_dirs:
        (ext / "lock").write_text("")  # as left by a worker SIGKILLed while it held torch's FileBaton
    kbeval(*args, "--run-id", "second", cache=build_cache)
    assert settled(read_verdicts(tmp_path / "out" / "second")["cpp_honest"]["status"]) == "correct"


# --- build-stage warm-up (Triton-like candidates, faked on the CPU: fixtures/candidates_warmup) -----------

WARMUP = FIXTURES / "candidates_warmup"
QUICK = ("--device", "cpu", "--problems", str(FIXTURES / "problems"), "--trials", "1", "--no-compile-baseline",
         "--timing-budget", "0.2", "--reps", "5", "--max-reps", "20", "--warmup", "1", "--warmup-seconds", "0.1",
         "--timeout", "60", "--jobs", "1")


def _jit_candidates(folder: Path, events: Path, **modes: str) -> Path:
    """`fake_triton.py` as candidates NAME.py of the tiny problem, each in MODE, logging its JIT events."""
    cands = folder / "tiny_linear_relu"
    cands.mkdir(parents=True, exist_ok=True)
    for name, mode in modes.items():
        text = (WARMUP / "fake_triton.py").read_text().replace("__EVENTS__", str(events)).replace("__MODE__", mode)
        (cands / f"{name}.py").write_text(text)
    return folder


def _events(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.usefixtures("landlock_off")
def test_a_jit_candidate_is_built_by_a_warmup_call_and_judged_from_its_build_cache(tmp_path):
    """The fake kernel compiles once, in the build worker (its time in the build record); the evaluation finds
    it in the build's cache; a rerun reuses the build; other input settings get a build of their own."""
    cache, events = tmp_path / "cache", tmp_path / "events"  # a cache of its own: every compile is counted
    cands = _jit_candidates(tmp_path / "c", events, fake_triton="honest")
    out = tmp_path / "out"
    kbeval("run", *QUICK, "--candidates", str(cands), "--out", str(out), "--run-id", "first", cache=cache)
    verdict = read_verdicts(out / "first")["fake_triton"]
    assert verdict["correct"] and verdict["compiled"] and not verdict["compile_cached"]
    assert _events(events) == ["compile jit", "eval hit"]  # the first trial did not compile it again
    (build,) = cache.glob("builds/*-cpu-w*")
    record = json.loads((build / "compile.json").read_text())["record"]
    assert record["warmup_seconds"] >= 0.3 and record["seconds"] >= record["warmup_seconds"]  # it slept 0.3 s
    assert verdict["compile_seconds"] >= 0.3
    assert (build / "triton" / "FAKEKEY" / "relu.bin").read_text() == "relu"

    kbeval("run", *QUICK, "--candidates", str(cands), "--out", str(out), "--run-id", "again", cache=cache)
    assert read_verdicts(out / "again")["fake_triton"]["compile_cached"]
    kbeval("run", *QUICK, "--dim", "batch_size=4", "--candidates", str(cands), "--out", str(out), "--run-id", "dims",
           cache=cache)
    assert read_verdicts(out / "dims")["fake_triton"]["correct"]
    assert _events(events) == ["compile jit", "eval hit", "eval hit", "compile jit", "eval hit"]
    assert len(list(cache.glob("builds/*-cpu-w*"))) == 2  # other inputs, another build: never one shared cache


def test_a_failing_warmup_build_is_a_verdict_not_a_traceback(tmp_path):
    cands = _jit_candidates(tmp_path / "c", tmp_path / "events", fake_triton="warm_fails")
    kbeval("run", *QUICK, "--candidates", str(cands), "--out", str(tmp_path / "out"), "--run-id", "r",
           cache=tmp_path / "cache")
    verdict = read_verdicts(tmp_path / "out" / "r")["fake_triton"]
    assert verdict["status"] == "runtime_error" and not verdict["compiled"]
    assert re.fullmatch(r"warm-up call on problem-shaped inputs: RuntimeError: fake kernel: shapes do not fit the "
                        r"launch grid \(fake_triton\.py:\d+\)", verdict["error"]), verdict["error"]
    assert not (tmp_path / "out" / "r" / "logs" / "tiny_linear_relu" / "fake_triton.eval.log").exists()


@pytest.mark.usefixtures("landlock_off")
def test_kernels_compiled_while_judged_stay_out_of_the_signed_build(tmp_path):
    """A JIT candidate that compiles more while judged writes into a private copy of its build's cache, so its
    build still verifies next time (a changed build would be thrown away and rebuilt)."""
    cache, events = tmp_path / "cache", tmp_path / "events"
    cands = _jit_candidates(tmp_path / "c", events, fake_triton="eval_jit")
    for run_id in ("first", "second"):
        proc = kbeval("run", *QUICK, "--candidates", str(cands), "--out", str(tmp_path / "out"), "--run-id", run_id,
                      cache=cache)
        assert "do not match" not in proc.stdout + proc.stderr
    assert read_verdicts(tmp_path / "out" / "second")["fake_triton"]["compile_cached"]
    assert _events(events) == ["compile jit", "eval hit", "eval hit"]
    assert not list(cache.glob("builds/*/triton/*/other.bin"))


@pytest.mark.usefixtures("landlock_off")
def test_a_kernel_planted_in_another_builds_cache_is_never_loaded(tmp_path):
    """`aa_poison_triton_cache` rewrites every build's cached fake kernel while judged (before the victim): the
    victim's build no longer verifies, is rebuilt, and is judged on its own kernel."""
    events = tmp_path / "events"
    cands = _jit_candidates(tmp_path / "c", events, zz_victim="honest")
    shutil.copyfile(WARMUP / "aa_poison_triton_cache.py", cands / "tiny_linear_relu" / "aa_poison_triton_cache.py")
    proc = kbeval("run", *QUICK, "--candidates", str(cands), "--out", str(tmp_path / "out"), "--run-id", "r",
                  cache=tmp_path / "cache")
    verdicts = read_verdicts(tmp_path / "out" / "r")
    assert verdicts["aa_poison_triton_cache"]["correct"]  # it ran (and planted) first
    assert verdicts["zz_victim"]["correct"], verdicts["zz_victim"]
    assert "do not match the harness's record" in proc.stdout + proc.stderr  # the plant was seen
    assert _events(events) == ["compile jit", "compile jit", "eval hit"]  # built, rebuilt, judged on its own


@pytest.mark.usefixtures("landlock_off")
def test_a_build_made_without_its_warmup_is_warmed_where_it_is_judged(tmp_path):
    """The Ray path (a compile task holds no GPU): built without the warm-up, then `warm_build` on the judging
    node runs it once, adds its time to the signed record, and is a no-op after that."""
    events = tmp_path / "events"
    cands = _jit_candidates(tmp_path / "c", events, fake_triton="honest")
    problem = FIXTURES / "problems" / "tiny_linear_relu.py"
    prob = Problem("tiny_linear_relu", problem, hashlib.sha256(problem.read_bytes()).hexdigest())
    cand = make_candidate(prob, cands / "tiny_linear_relu" / "fake_triton.py")
    warm = WarmupSpec.of(prob, RunSettings(device="cpu"))
    cache = tmp_path / "cache"
    built = compile_candidate(cand, "cpu", cache, tmp_path / "compile.log", 60, warm, warm_here=False)
    assert built.record.ok and built.record.warmup_seconds is None and built.build_dir.name.endswith(warm.key())
    assert not (built.build_dir / "triton").exists() and _events(events) == []
    record = warm_build(cand, built.build_dir, warm, "cpu", tmp_path / "warm.log", 60)
    assert record.ok and record.warmup_seconds >= 0.3 and record.seconds >= built.record.seconds + 0.3
    assert warm_build(cand, built.build_dir, warm, "cpu", tmp_path / "warm.log", 60) == record  # once only
    assert _events(events) == ["compile jit"]
    again = compile_candidate(cand, "cpu", cache, tmp_path / "again.log", 60, warm)
    assert again.cached and again.record == record  # signed as warmed
