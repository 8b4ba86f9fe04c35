"""Defence in depth (issue 20): nothing a candidate touches may change another verdict, a later run, or stop the run.

Each fixture under `fixtures/attacks_defence/<problem>/` is an attack that worked against the harness before
this change (every one uses only what a process of the same user can reach); `zz_victim`/`aa_victim` are
honest candidates it aims at. One real CPU run judges most of them together (`attack_run`); the forged
baseline and the resume redirection need runs of their own. Statuses of honest candidates are asserted as
correct (ok or suspicious: CPU timing on a shared machine is not asserted), those of attackers exactly.

These are the defences that hold where the OS sandbox does not (a machine that refuses its layers), so
they run with it off (`KBEVAL_SANDBOX_OFF=all`): with it on, most of these attacks cannot even start (their
writes, signals and daemons are refused: tests/test_sandbox.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT

from kernelbench_eval.building.compile import BuildTampered, build_dir, build_lock, compile_candidate
from kernelbench_eval.building.signed import RECORD_NAME
from kernelbench_eval.discover.corpus import Problem, make_candidate
from kernelbench_eval.store import keys

pytestmark = pytest.mark.slow  # runs over the defence fixtures, extensions built

PROBLEMS = FIXTURES / "defence_problems"
ATTACKS = FIXTURES / "attacks_defence"
SHARED_RUN = ["twins", "forge_compile", "lock_dir", "poison_inputs", "toctou", "env_leak", "squat", "fork_hijack"]
FAST = ("--device", "cpu", "--jobs", "1", "--timeout", "20", "--trials", "2", "--timing-budget", "0.3",
        "--reps", "5", "--max-reps", "20", "--warmup", "1", "--warmup-seconds", "0.1", "--threads", "1")
CORRECT = {"ok", "suspicious"}


def kbeval(root: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The real command line, with the test's private TMPDIR and cache, and a credential in its environment."""
    full = dict(os.environ, KBEVAL_CACHE_DIR=str(root / "cache"), TMPDIR=str(root / "tmp"), COLUMNS="200",
                AWS_SECRET_ACCESS_KEY="kbeval-test-canary", KBEVAL_SANDBOX_OFF="all", **env)
    return subprocess.run([sys.executable, "-m", "kernelbench_eval", *args], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=900)


def workspace(root: Path, problems: list[str]) -> Path:
    """problems/, candidates/ and defence_lib/ side by side, as the fixtures expect (they edit their copies)."""
    (root / "problems").mkdir(parents=True)
    (root / "tmp").mkdir()
    for name in problems:
        shutil.copy(PROBLEMS / f"{name}.py", root / "problems")
        shutil.copytree(ATTACKS / name, root / "candidates" / name)
    shutil.copytree(FIXTURES / "defence_lib", root / "defence_lib")
    return root


def verdicts(run_dir: Path) -> dict[tuple[str, str], dict]:
    lines = (run_dir / "verdicts.jsonl").read_text().splitlines()
    return {(v["problem"], v["candidate"]): v for v in map(json.loads, lines)}


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture(scope="module")
def attack_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, subprocess.CompletedProcess, Path]]:
    root = workspace(tmp_path_factory.mktemp("defence"), SHARED_RUN)
    stale = root / "tmp" / f"kbeval-run-{dead_pid()}-leftover"  # as a SIGKILLed harness leaves it
    (stale / "kbeval-ref-x").mkdir(parents=True)
    stale.chmod(0o300)
    proc = kbeval(root, "run", *FAST, "--no-compile-baseline", "--problems", str(root / "problems"),
                  "--candidates", str(root / "candidates"), "--out", str(root / "out"), "--run-id", "r")
    yield root / "out" / "r", proc, root
    pidfile = root / "squatter.pid"
    if pidfile.exists():  # the squatter's daemon (started by the fixture) would hold its lock for a minute
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


def test_run_completes_with_every_candidate_judged_and_every_report(attack_run) -> None:
    """lock_dir/aa_blocker turns the victim's build-lock path into a folder: the run used to die (no reports)."""
    run_dir, proc, _ = attack_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = {(p, f.stem) for p in SHARED_RUN for f in (ATTACKS / p).glob("*.py")}
    assert set(verdicts(run_dir)) == expected
    for name in ("leaderboard.csv", "leaderboard.json", "report.html", "junit.xml", "summary.json"):
        assert (run_dir / name).is_file(), name
    assert verdicts(run_dir)[("lock_dir", "zz_victim")]["status"] in CORRECT


def test_twins_are_each_judged_in_their_own_right(attack_run) -> None:
    """twins/: byte-identical files, honest only under the name aa_*; the copy used to inherit `ok`."""
    got = verdicts(attack_run[0])
    assert got[("twins", "aa_twin")]["status"] in CORRECT
    copy = got[("twins", "zz_twin")]
    assert copy["status"] == "incorrect" and copy["duplicate_of"] is None
    assert copy["source_sha256"] == got[("twins", "aa_twin")]["source_sha256"]


def test_a_forged_compile_record_is_not_trusted(attack_run) -> None:
    """forge_compile/aa_forger writes a failed compile.json into the victim's build folder before it builds."""
    victim = verdicts(attack_run[0])[("forge_compile", "zz_victim")]
    assert victim["status"] in CORRECT, victim["error"]
    assert "FORGED" not in (victim["error"] or "")


def test_the_reference_imports_the_bytes_discovered(attack_run) -> None:
    """toctou/aa_editor edits its problem file (mtime kept) before the reference is imported."""
    got = verdicts(attack_run[0])
    assert got[("toctou", "aa_editor")]["status"] == "incorrect"  # it computes the edited problem's output
    assert got[("toctou", "zz_victim")]["status"] in CORRECT
    assert "EDITED" in (attack_run[2] / "problems" / "toctou.py").read_text()  # the edit did happen


def test_reference_inputs_are_in_no_file_a_candidate_can_poison(attack_run) -> None:
    """poison_inputs/aa_poisoner scales every tensor file in the references' folders by 1.1 (the inputs once
    lay there): it finds none, and the next candidate is judged on the reference's own inputs."""
    got = verdicts(attack_run[0])
    assert got[("poison_inputs", "zz_victim")]["status"] in CORRECT
    log = attack_run[0] / got[("poison_inputs", "aa_poisoner")]["log"]
    assert "poisoned 0 reference files" in log.read_text(), log.read_text()[-500:]


def test_workers_get_no_credentials(attack_run) -> None:
    """env_leak/aa_env answers wrongly when it sees AWS_SECRET_ACCESS_KEY (set in the harness's environment)."""
    assert verdicts(attack_run[0])[("env_leak", "aa_env")]["status"] in CORRECT


def test_a_squatted_lock_is_not_the_victims_wait(attack_run) -> None:
    """squat/zz_squatter leaves a daemon holding the victim's (computable) build lock; it used to time out."""
    victim = verdicts(attack_run[0])[("squat", "aa_victim")]
    assert victim["status"] in CORRECT, victim["error"]
    assert (attack_run[2] / "squatter.pid").exists()  # the daemon did start


def test_the_fork_server_cannot_be_replaced(attack_run) -> None:
    """fork_hijack/aa_hijacker renames its own socket over the server's (path read from its command line)."""
    victim = verdicts(attack_run[0])[("fork_hijack", "zz_victim")]
    assert victim["status"] in CORRECT, victim["error"]


def test_temp_folders_of_a_dead_harness_are_removed_and_none_left(attack_run) -> None:
    tmp = attack_run[2] / "tmp"
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith("kbeval")) == []


def test_a_forged_baseline_is_not_used_nor_kept(tmp_path: Path) -> None:
    """forge_baseline/aa_forger writes the problem's baselines.json entry (compile 6x eager) at import."""
    root = workspace(tmp_path, ["forge_baseline"])
    baselines = root / "baselines.json"
    proc = kbeval(root, "run", *FAST, "--problems", str(root / "problems"), "--candidates", str(root / "candidates"),
                  "--out", str(root / "out"), "--run-id", "b", "--baselines", str(baselines))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = verdicts(root / "out" / "b")
    assert all(v["compile_runtime_ms"] != 6000.0 for v in got.values())
    assert got[("forge_baseline", "zz_victim")]["status"] in CORRECT
    entries = json.loads(baselines.read_text())
    assert entries and all(e["measured_at"] != "forged" and "mac" in e for e in entries.values())


def test_resume_refuses_a_redirected_manifest(tmp_path: Path) -> None:
    """resume_redirect/aa_redirect points run.json at forged problems and SIGKILLs the harness."""
    root = workspace(tmp_path, ["resume_redirect"])
    args = ("--problems", str(root / "problems"), "--candidates", str(root / "candidates"))
    first = kbeval(root, "run", *FAST, "--no-compile-baseline", *args, "--out", str(root / "out"), "--run-id", "k")
    assert first.returncode == -signal.SIGKILL  # the attack ran
    assert "forged_problems" in (root / "out" / "k" / "run.json").read_text()
    again = kbeval(root, "run", "--resume", str(root / "out" / "k"), *args)
    assert again.returncode == 2
    text = " ".join(again.stderr.split())  # one message (the terminal may wrap it), beside the progress bar
    assert text.count("error:") == 1 and "refusing to resume" in text, again.stderr
    assert not (root / "out" / "k" / "verdicts.jsonl").exists()


def test_tampered_build_artifacts_are_rebuilt_not_loaded(tmp_path: Path) -> None:
    """A file planted in a built candidate's extension folder (a trojan .so) fails verification: rebuilt."""
    problem = Problem("twins", PROBLEMS / "twins.py", "0" * 64)
    cand = make_candidate(problem, ATTACKS / "forge_compile" / "zz_victim.py")
    cache, log = tmp_path / "cache", tmp_path / "compile.log"
    first = compile_candidate(cand, "cpu", cache, log, 120)
    assert first.record.ok and not first.cached
    build = build_dir(cache, cand, "cpu")
    assert keys.key_path(cache).stat().st_mode & 0o077 == 0  # the signing key is the owner's alone
    with build_lock(build):  # as built: verifies
        pass
    trojan = build / "ext" / "victim_ext" / "victim_ext.so"
    trojan.parent.mkdir(parents=True)
    trojan.write_bytes(b"\x7fELF not what was built")
    with pytest.raises(BuildTampered), build_lock(build):
        pass
    again = compile_candidate(cand, "cpu", cache, log, 120)
    assert again.record.ok and not again.cached and not trojan.exists()
    record = json.loads((build / RECORD_NAME).read_text())
    record["record"]["ok"] = False  # a forged edit of the harness's own record
    (build / RECORD_NAME).write_text(json.dumps(record))
    assert not compile_candidate(cand, "cpu", cache, log, 120).cached
