"""Issue 37: every option is checked before anything runs: a number out of range, or a folder that cannot be
written, is one line on stderr naming the option (and the path) and exit 2, never a traceback, and no folder
is made.

All through typer's CliRunner in this process, on the tiny corpus of test_newcomer; nothing here compiles or
judges (a refused command stops before it would).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import kbeval
from test_newcomer import FAST, write_corpus
from typer.testing import CliRunner

from kernelbench_eval.cli import options
from kernelbench_eval.cli.app import app
from kernelbench_eval.cli.options import check_values, folder_problem
from kernelbench_eval.records import Verdict
from kernelbench_eval.results.record import RunRecorder

runner = CliRunner()


@pytest.fixture
def corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    monkeypatch.setenv("KBEVAL_CACHE_DIR", str(tmp_path / "cache"))
    return write_corpus(tmp_path)


def refused(args: list[str], *expected: str) -> str:
    """Run `kbeval ARGS`, which must be refused in one line naming `expected`; return that line."""
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (args, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.stderr)
    assert "Traceback" not in result.output
    for text in expected:
        assert text in lines[0], (text, lines[0])
    return lines[0]


BAD_NUMBERS = [
    (["--timeout", "-1"], "--timeout: must be more than 0 (got -1)"),
    (["--timeout", "0"], "--timeout: must be more than 0"),
    (["--timeout", "nan"], "--timeout: must be more than 0 (got nan)"),
    (["--compile-timeout", "0"], "--compile-timeout: must be more than 0"),
    (["--jobs", "0"], "--jobs: must be at least 1 (got 0)"),
    (["--trials", "0"], "--trials: must be at least 1"),
    (["--reps", "0"], "--reps: must be at least 1"),
    (["--max-reps", "0"], "--max-reps: must be at least 1"),
    (["--reps", "50", "--max-reps", "10"], "--max-reps: must be at least --reps (10 < 50)"),
    (["--lanes", "0"], "--lanes: must be at least 1"),
    (["--threads", "0"], "--threads: must be at least 1"),
    (["--warmup", "-1"], "--warmup: must be at least 0"),
    (["--warmup-seconds", "-0.5"], "--warmup-seconds: must be at least 0 (got -0.5)"),
    (["--timing-budget", "0"], "--timing-budget: must be more than 0"),
    (["--target-rse", "0"], "--target-rse: must be more than 0"),
    (["--max-speedup", "-1"], "--max-speedup: must be at least 0"),
    (["--atol", "-0.001"], "--atol: must be at least 0"),
    (["--rtol", "-1"], "--rtol: must be at least 0"),
]


@pytest.mark.parametrize(("args", "message"), BAD_NUMBERS, ids=[" ".join(a) for a, _ in BAD_NUMBERS])
def test_run_refuses_numbers_out_of_range_before_anything_runs(corpus, tmp_path, args, message):
    problems, candidates = corpus
    out = tmp_path / "results"
    refused(["run", "--problems", str(problems), "--candidates", str(candidates), "--out", str(out), *args],
            message)
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_the_other_commands_refuse_them_too(corpus, tmp_path):
    problems, candidates = corpus
    problem, candidate = str(problems / "tiny.py"), str(candidates / "tiny" / "py_ok.py")
    before = sorted(tmp_path.rglob("*"))
    lines = [refused(["eval", problem, candidate, "--timeout", "-1"], "--timeout"),
             refused(["eval", problem, candidate, "--reps", "20", "--max-reps", "5"], "--max-reps"),
             refused(["selftest", "--problems", str(problems), "--trials", "0"], "--trials"),
             refused(["selftest", "--problems", str(problems), "--target-rse", "-1"], "--target-rse"),
             refused(["profile", problem, candidate, "--warmup", "-1"], "--warmup"),  # profile's own --warmup
             refused(["profile", problem, candidate, "--threads", "0"], "--threads"),
             refused(["problems", "--problems", str(problems), "--timeout", "0"], "--timeout"),
             refused(["compare", str(tmp_path), str(tmp_path), "--threshold", "-0.1"], "--threshold"),
             refused(["gate", str(tmp_path), "--min-speedup", "-1"], "--min-speedup")]
    assert lines[1] == "error: --max-reps: must be at least --reps (5 < 20)"
    assert lines[7].endswith("--threshold: must be at least 0 (got -0.1)")
    assert sorted(tmp_path.rglob("*")) == before  # refused before anything was made: no results, no cache


def test_boundary_values_are_accepted():
    check_values({"warmup": 0, "warmup_seconds": 0.0, "max_speedup": 0.0, "atol": 0.0, "rtol": 0.0, "jobs": 1,
                  "reps": 10, "max_reps": 10, "timeout": 0.5, "threads": None, "trials": None})


def test_out_naming_a_file_is_one_line_for_run_and_eval(corpus, tmp_path):
    problems, candidates = corpus
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    run = ["run", "--problems", str(problems), "--candidates", str(candidates), *FAST]
    refused([*run, "--out", str(a_file)], f"--out: {a_file} is a file, not a folder")
    refused([*run, "--out", str(a_file / "sub")], "--out", str(a_file / "sub"), f"cannot be made: {a_file} is a file")
    one = ["eval", str(problems / "tiny.py"), str(candidates / "tiny" / "py_ok.py"), *FAST]
    refused([*one, "--out", str(a_file)], "--out", "is a file, not a folder")
    refused(["selftest", "--problems", str(problems), "--out", str(a_file / "x")], "--out", "is a file")
    assert a_file.is_file() and a_file.read_text() == ""  # the user's file is left as it was
    assert not (tmp_path / "cache").exists()  # nothing ran: no build cache was made


def _deny_writes(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """`folder` as a read-only folder looks to `os.access` (tests run as root on CI, where chmod stops nothing)."""
    real = os.access

    def access(path: object, mode: int, *args: object, **kwargs: object) -> bool:
        if Path(str(path)).absolute() == folder.absolute() and mode & os.W_OK:
            return False
        return real(path, mode, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(options.os, "access", access)


def test_read_only_out_and_cache_dir_are_refused(corpus, tmp_path, monkeypatch):
    problems, candidates = corpus
    locked = tmp_path / "locked"
    locked.mkdir()
    _deny_writes(monkeypatch, locked)
    run = ["run", "--problems", str(problems), "--candidates", str(candidates), *FAST]
    refused([*run, "--out", str(locked)], "--out", f"{locked} is not writable")
    refused([*run, "--out", str(locked / "results")], "--out", f"cannot be made: {locked} is not writable")
    one = ["eval", str(problems / "tiny.py"), str(candidates / "tiny" / "py_ok.py"), *FAST]
    refused([*one, "--out", str(locked / "r")], "--out", "is not writable")
    refused([*run, "--out", str(tmp_path / "r"), "--cache-dir", str(locked)], "--cache-dir", str(locked))
    refused(["profile", str(problems / "tiny.py"), str(candidates / "tiny" / "py_ok.py"), "--cache-dir",
             str(locked / "c")], "--cache-dir", "cannot be made", "is not writable")
    refused([*run, "--out", str(tmp_path / "r"), "--baselines", str(locked / "b.json")], "--baselines",
            f"its folder {locked} is not writable")
    assert not (tmp_path / "r").exists() and not list(locked.iterdir())


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a 0o555 folder; the test above covers it")
def test_a_really_read_only_folder(tmp_path):
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        assert folder_problem(locked) == "is not writable"
        assert folder_problem(locked / "a" / "b") == f"cannot be made: {locked} is not writable"
    finally:
        locked.chmod(0o755)


def test_unusable_cache_dir_from_the_environment(corpus, tmp_path, monkeypatch):
    problems, candidates = corpus
    (tmp_path / "f").write_text("")
    monkeypatch.setenv("KBEVAL_CACHE_DIR", str(tmp_path / "f" / "cache"))
    line = refused(["run", "--problems", str(problems), "--candidates", str(candidates), "--out",
                    str(tmp_path / "r"), *FAST], "--cache-dir", "$KBEVAL_CACHE_DIR", "is a file")
    assert str(tmp_path / "f" / "cache") in line
    refused(["eval", str(problems / "tiny.py"), str(candidates / "tiny" / "py_ok.py"), "--cache-dir",
             str(tmp_path / "f")], "--cache-dir", "is a file, not a folder")


def test_baselines_and_resume_paths(corpus, tmp_path, monkeypatch):
    problems, candidates = corpus
    run = ["run", "--problems", str(problems), "--candidates", str(candidates), "--out", str(tmp_path / "r"), *FAST]
    refused([*run, "--baselines", str(tmp_path)], "--baselines", "is a folder, not a file")
    (tmp_path / "f").write_text("")
    refused([*run, "--baselines", str(tmp_path / "f" / "b.json")], "--baselines",
            f"its folder {tmp_path / 'f'} is a file")
    old = tmp_path / "old_run"
    old.mkdir()
    _deny_writes(monkeypatch, old)
    refused(["run", "--resume", str(old)], "--resume", f"{old} is not writable")
    assert not (tmp_path / "r").exists() and list(old.iterdir()) == []  # nothing made, nothing written
    assert (tmp_path / "f").read_text() == ""


def test_report_output_folder(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    RunRecorder(run_dir).append(Verdict(run_id="r", problem="p", candidate="c", source_sha256="s", settings_key="k",
                                        device="cpu", torch_version="x", status="ok", correct=True, runtime_ms=1.0))
    (tmp_path / "f").write_text("")
    before = sorted(tmp_path.rglob("*"))
    refused(["report", str(run_dir), "--format", "csv", "--output", str(tmp_path / "f" / "x.csv")], "--output",
            "is a file")
    refused(["report", str(run_dir), "--format", "csv", "--output", str(tmp_path)], "--output",
            "is a folder, not a file")
    assert list(tmp_path.glob("**/x.csv")) == [] and (tmp_path / "f").read_text() == ""  # nothing written
    assert sorted(tmp_path.rglob("*")) == before
    (run_dir / "verdicts.jsonl").unlink()
    (run_dir / "verdicts.jsonl").mkdir()  # unreadable as a file: one line, not IsADirectoryError
    line = refused(["report", str(run_dir)], str(run_dir))
    assert "verdicts.jsonl" in line


def test_profile_accepts_smoke_as_its_help_says(corpus, monkeypatch):
    """`profile --help` offered --smoke (through --dim's help) and the command refused it."""
    problems, candidates = corpus
    assert "--smoke" in runner.invoke(app, ["profile", "--help"]).output
    seen: dict[str, object] = {}

    def fake_profile_pair(problem: Path, candidate: Path, device: str, cache: Path, **kwargs: object) -> None:
        seen.update(kwargs)
        raise SystemExit(0)

    monkeypatch.setattr("kernelbench_eval.run.profile.profile_pair", fake_profile_pair)
    result = runner.invoke(app, ["profile", str(problems / "tiny.py"), str(candidates / "tiny" / "py_ok.py"),
                                 "--device", "cpu", "--smoke"])
    assert result.exit_code == 0, result.output
    assert seen["dims"] == {"batch_size": 2}  # the problem's KBEVAL_SMOKE_DIMS


def test_click_usage_errors_are_one_line_and_exit_2(tmp_path):
    """A missing argument, a file that does not exist, an unknown option or command: click's own usage block (four
    lines and a blank) was what a user got; now one line naming what is wrong, exit 2. `kbeval` alone is the help."""
    for args, says in ((("eval", "nope.py", "nope.py"), "file 'nope.py' does not exist"),
                       (("eval",), "Missing argument"), (("run", "--bogus"), "No such option: --bogus"),
                       (("nosuchcmd",), "No such command")):
        proc = kbeval(*args, cache=tmp_path / "cache", check=False)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (args, proc.stderr)
        assert says in lines[0] and "--help says more" in lines[0], lines
    alone = kbeval(cache=tmp_path / "cache", check=False)
    assert alone.returncode == 0 and alone.stdout.startswith("Usage: kbeval")
