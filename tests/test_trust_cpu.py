"""Adversarial candidates on the CPU: each tries to look correct, look fast, or hurt the run; each must get its verdict.

One real run of the command line over `fixtures/attack_problems` and a temporary copy of `fixtures/attacks` (plus a
50 MB candidate written into that copy). The run gets a private temporary directory (TMPDIR) holding its results,
so the candidate that forges files finds the verdicts it would like to rewrite, and nothing outside this test.

The run is sandboxed (`sandbox.py`) but for Landlock, whose write rules would refuse fake_files' forgeries
before the harness's own tamper check (the defence where Landlock is missing) could be tested; Landlock's
refusal of the same writes is tested in tests/test_sandbox.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import FIXTURES, kbeval, read_verdicts
from timed import assert_timed_sanely, settled

pytestmark = pytest.mark.slow  # a run over every attack fixture, C++ extensions built

ATTACK_PROBLEMS = FIXTURES / "attack_problems"
ATTACKS = FIXTURES / "attacks"
ORPHAN_MARKER = "kbeval-orphan-marker"
HUGE = "huge_source"  # written by the fixture: a fine candidate, padded to 50 MB
HUGE_BYTES = 50 * 1024 * 1024
FAKE_MARKER = "kbeval-fake-verdict"  # in the JSON line prints_verdict prints

MM_RELU = {
    "honest": "ok",
    "gc_search": "incorrect",
    "patch_compare": "incorrect",
    "prints_verdict": "incorrect",
    "first_n_right": "incorrect",
    "pointer_cache": "incorrect",
    "slow_clock": "suspicious",
    "fake_files": "incorrect",
    "child_left_behind": "ok",
    "host_oom": "runtime_error",
    "subclass_output": "incorrect",
    "lazy_thread": "incorrect",
    "seed_guess": "incorrect",
    "sys_exit": "crashed",
    "empty_out": "incorrect",
    "wrong_init": "load_error",
    "lazy_dump": "suspicious",  # right only when handed over: the hand-over is on the harness's clock
    "scale_cache": "ok",  # its shortcut never fires: timed at its honest speed (checked below)
    "steal_parent": "runtime_error",  # reading the harness's /proc/<pid>/maps is refused (capabilities dropped)
    HUGE: "load_error",
}
EXPECTED = {("mm_relu", name): status for name, status in MM_RELU.items()}
EXPECTED |= {("raises_get_inputs", "identity"): "skipped", ("no_model", "identity"): "skipped"}


@dataclass
class AttackRun:
    run_dir: Path
    proc: subprocess.CompletedProcess[str]
    private_tmp: Path
    cache: Path
    started: float  # seconds since boot when the run began (to recognise processes it started)


def verdict_lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "verdicts.jsonl").read_text().splitlines() if line.strip()]


def by_pair(run_dir: Path) -> dict[tuple[str, str], dict]:
    return {(v["problem"], v["candidate"]): v for v in verdict_lines(run_dir)}


@contextmanager
def env_var(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def marked_processes(run: AttackRun) -> list[int]:
    """Live processes with the orphan marker on their command line that this run started (none of anyone else's)."""
    ticks = os.sysconf("SC_CLK_TCK")
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if ORPHAN_MARKER not in cmdline:
                continue
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] in ("Z", "X"):  # dead, not yet reaped
                continue
            environ = (entry / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        ours = str(run.private_tmp) in environ or str(run.cache) in environ
        scrubbed = "TMPDIR=" not in environ and "KBEVAL_CACHE_DIR=" not in environ
        started = int(fields[19]) / ticks  # field 22 of /proc/<pid>/stat: start time in ticks since boot
        if ours or (scrubbed and started >= run.started - 1):
            found.append(int(entry.name))
    return found


def write_huge_candidate(folder: Path) -> Path:
    path = folder / f"{HUGE}.py"
    head = (ATTACKS / "mm_relu" / "honest.py").read_bytes()
    line = b"# " + b"x" * 1021 + b"\n"
    padding = line * ((HUGE_BYTES - len(head)) // len(line))
    path.write_bytes(head + padding + b"#" * (HUGE_BYTES - len(head) - len(padding) - 1) + b"\n")
    assert path.stat().st_size == HUGE_BYTES
    return path


@pytest.fixture(scope="session")
def attack_run(tmp_path_factory: pytest.TempPathFactory, build_cache: Path) -> Iterator[AttackRun]:
    base = tmp_path_factory.mktemp("trust")
    candidates = base / "candidates"
    shutil.copytree(ATTACKS, candidates)
    write_huge_candidate(candidates / "mm_relu")
    private_tmp = base / "tmp"
    private_tmp.mkdir()
    out = private_tmp / "results"
    started = _uptime()
    with env_var("TMPDIR", str(private_tmp)), env_var("KBEVAL_SANDBOX_OFF", "landlock"):
        proc = kbeval("run", "--device", "cpu", "--problems", str(ATTACK_PROBLEMS), "--candidates", str(candidates),
                      "--trials", "3", "--timeout", "60", "--threads", "1", "--out", str(out), "--run-id", "attacks",
                      cache=build_cache, check=False)
    run = AttackRun(out / "attacks", proc, private_tmp, build_cache, started)
    yield run
    for pid in marked_processes(run):  # whatever child_left_behind managed to leave behind: ours to clean up
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_run_completes(attack_run):
    assert attack_run.proc.returncode == 0, attack_run.proc.stdout + attack_run.proc.stderr
    assert f"{len(EXPECTED)} verdicts" in attack_run.proc.stdout


def test_every_attack_gets_its_status(attack_run):
    verdicts = by_pair(attack_run.run_dir)
    # an honest "ok" may turn suspicious on a loaded host (timing decides that, not the attack); every other
    # expectation, "suspicious" for the attacks on the clock included, is exact
    got = {pair: settled(v["status"]) if EXPECTED.get(pair) == "ok" else v["status"] for pair, v in verdicts.items()}
    want = {pair: settled(status) if status == "ok" else status for pair, status in EXPECTED.items()}
    errors = {f"{p}/{c}": v["error"] for (p, c), v in verdicts.items() if got[(p, c)] != want.get((p, c))}
    assert got == want, errors


def test_one_verdict_line_per_candidate(attack_run):
    """Forged lines appended by fake_files must not survive: exactly one line per candidate, each the harness's."""
    lines = verdict_lines(attack_run.run_dir)
    pairs = [(v["problem"], v["candidate"]) for v in lines]
    assert sorted(pairs) == sorted(EXPECTED)
    assert len({v["run_id"] for v in lines}) == 1


def test_forged_files_change_no_other_verdict(attack_run):
    run_dir = attack_run.run_dir
    verdicts = by_pair(run_dir)
    for (problem, name), v in verdicts.items():
        want = EXPECTED[(problem, name)]  # an honest ok may be suspicious on a loaded host: timing decides that
        assert (settled(v["status"]) == settled(want)) if want == "ok" else v["status"] == want, (name, v["error"])
        if v["status"] == "suspicious":  # correct, but its time is not to be trusted: no claim on those fields
            continue
        assert v["correct"] == (v["status"] == "ok"), name
        if v["status"] != "ok":
            assert v["runtime_ms"] == -1.0 and v["speedup"] is None, name
        two = (run_dir / problem / f"{name}.txt").read_text()
        assert two.startswith(f"Evaluation: {v['status'] == 'ok'}\n"), name
    assert all(v["runtime_ms"] != 0.001 and v["speedup"] != 1000.0 for v in verdicts.values())


FORGED = re.compile(r'"speedup": 1000\.0|,ok,True,0\.001,')  # what fake_files appends to .json/.jsonl and .csv


def test_results_folder_is_left_as_the_harness_wrote_it(attack_run):
    """fake_files also appends to run.json and any other record in the results folder (baselines included):
    none may be left forged or unreadable, or the next --resume or run would trust them."""
    out = attack_run.run_dir.parent
    records = [p for p in out.rglob("*") if p.is_file() and p.suffix in (".json", ".jsonl", ".csv")]
    assert attack_run.run_dir / "run.json" in records
    forged = [str(p.relative_to(out)) for p in records if FORGED.search(p.read_text(errors="replace"))]
    assert not forged, f"forged lines left in {forged}"
    for path in records:
        if path.suffix == ".json":
            json.loads(path.read_text())


def test_stealing_from_the_harness_is_refused(attack_run):
    """steal_parent reads the process that started it (the fork server, or the harness): as root it could,
    before its capabilities were dropped; now opening its memory map raises in the candidate."""
    v = read_verdicts(attack_run.run_dir)["steal_parent"]
    assert v["status"] == "runtime_error" and "PermissionError" in v["error"] and "/maps" in v["error"], v["error"]
    assert v["sandbox"]["caps_dropped"] and "landlock" in v["sandbox"]["missing"]


def test_tampering_is_named(attack_run):
    v = read_verdicts(attack_run.run_dir)["fake_files"]
    assert v["status"] == "incorrect" and not v["correct"]
    assert re.search(r"cheat|tamper", v["error"] or "", re.IGNORECASE), v["error"]


def test_slowed_clock_is_caught(attack_run):
    v = read_verdicts(attack_run.run_dir)["slow_clock"]
    assert v["status"] == "suspicious", (v["status"], v["error"])
    assert "clock" in (v["error"] or "").lower(), v["error"]
    assert v["timing"]["attempts"] == 2  # measured again before it was called suspicious, and caught again


def test_honest_candidates_are_correct_and_timed(attack_run):
    verdicts = read_verdicts(attack_run.run_dir)
    for name in ("honest", "child_left_behind"):
        v = verdicts[name]
        assert_timed_sanely(v, name)
        assert v["trials_passed"] == v["trials"] == 3
        assert v["max_abs_diff"] < 1e-4


def test_errors_say_what_went_wrong(attack_run):
    errors = {name: v["error"] or "" for name, v in read_verdicts(attack_run.run_dir).items()}
    assert re.search(r"alloc|memory", errors["host_oom"], re.IGNORECASE), errors["host_oom"]
    assert "without a verdict" in errors["sys_exit"], errors["sys_exit"]
    assert "positional argument" in errors["wrong_init"], errors["wrong_init"]
    assert "plain torch.Tensor" in errors["subclass_output"] or "read back" in errors["subclass_output"], (
        errors["subclass_output"])


def _alive_with_marker(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX" and ORPHAN_MARKER.encode() in cmdline


def test_no_child_process_outlives_the_run(attack_run):
    log = read_verdicts(attack_run.run_dir)["child_left_behind"]["log"]
    started = re.findall(r"kbeval-orphan-pids (\d+) (\d+)", (attack_run.run_dir / log).read_text(errors="replace"))
    assert started, "child_left_behind never started its children: this test would prove nothing"
    deadline = time.monotonic() + 5  # the harness has exited; give the kernel a moment to deliver its kills
    alive = marked_processes(attack_run) + [int(p) for p in started[0] if _alive_with_marker(int(p))]
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = marked_processes(attack_run) + [int(p) for p in started[0] if _alive_with_marker(int(p))]
    cmdlines = {}
    for pid in alive:
        try:
            cmdlines[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
    assert not cmdlines, f"still running after the run: {cmdlines}"


def test_candidate_prints_stay_in_its_log(attack_run):
    proc, run_dir = attack_run.proc, attack_run.run_dir
    for stream in (proc.stdout, proc.stderr):
        assert FAKE_MARKER not in stream
        lines = [line.strip() for line in stream.splitlines()]
        assert "Evaluation: True" not in lines and "Runtime: 0.001" not in lines
        assert not any(line.startswith(("Evaluation:", "Runtime:")) for line in lines)
    v = read_verdicts(run_dir)["prints_verdict"]
    assert v["status"] == "incorrect"
    assert (run_dir / "mm_relu" / "prints_verdict.txt").read_text() == "Evaluation: False\nRuntime: -1.0\n"
    log = (run_dir / v["log"]).read_text(errors="replace")
    assert "Evaluation: True" in log and FAKE_MARKER in log  # it did print; the output went to its log, unread


def test_broken_problems_skip_their_candidates_with_the_reason(attack_run):
    verdicts = by_pair(attack_run.run_dir)
    raises = verdicts[("raises_get_inputs", "identity")]
    assert raises["status"] == "skipped"
    assert "raises_get_inputs.py" in raises["error"] and "boom" in raises["error"], raises["error"]
    no_model = verdicts[("no_model", "identity")]
    assert no_model["status"] == "skipped"
    assert "no_model.py" in no_model["error"] and "Model" in no_model["error"], no_model["error"]


def test_oversized_source_is_refused_with_its_size(attack_run):
    v = read_verdicts(attack_run.run_dir)[HUGE]
    assert v["status"] == "load_error"
    assert f"{HUGE}.py" in v["error"], v["error"]
    assert re.search(r"52428800|5[02](\.\d+)? ?Mi?B", v["error"]), v["error"]  # 50 MiB = 52.4 MB


def test_run_json_keeps_no_seed(attack_run):
    """The trial and init seeds stay secret: a candidate that finds run.json learns nothing to replay."""
    text = (attack_run.run_dir / "run.json").read_text()
    keys = re.findall(r'"((?:[^"\\]|\\.)*)"\s*:', text)
    assert keys, text[:200]
    assert not [k for k in keys if "seed" in k.lower()], text


def test_a_cache_of_linear_shortcuts_gains_nothing(attack_run):
    """scale_cache answers inputs proportional to ones it saw without a matmul; no timed input ever is.

    Counted, not timed: the candidate prints each shortcut it takes. A trial's second run sees its first run's
    inputs again (proportional, factor 1), so up to one shortcut per trial run is expected; with timed inputs
    that were proportional (no per-element factors) nearly every timed call would take one. Warm-ups never
    repeat an input either, even when a busy host makes the timing run twice (13 shortcuts before that).
    """
    v = read_verdicts(attack_run.run_dir)["scale_cache"]
    assert_timed_sanely(v, "scale_cache")
    log = (attack_run.run_dir / v["log"]).read_text(errors="replace")
    shortcuts = log.count("kbeval-scale-cache-shortcut")
    assert shortcuts <= 2 * v["trials"] < v["runtime_stats"]["calls"], (shortcuts, v["runtime_stats"]["calls"])
