"""Issue 15: a newcomer's first hour. Bad input is one line and exit 2, resume works from any folder, `--smoke`
runs the seed corpus on a laptop, and what the terminal shows stays readable at 80 columns.

CLI runs use a tiny pure-PyTorch problem written to tmp_path (no C++ compile) at small sizes.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, kbeval, pythonpath, read_verdicts
from rich.console import Console
from test_seed_corpus_cpu import CPU_DIMS
from typer.testing import CliRunner

from kernelbench_eval.cli.app import app
from kernelbench_eval.cli.progress import RunProgress
from kernelbench_eval.discover.corpus import Problem, merged_smoke_dims, sha256_file, smoke_dims
from kernelbench_eval.records import RunManifest, RunSettings, Verdict
from kernelbench_eval.results.display import verdict_table
from kernelbench_eval.results.record import seal_manifest
from kernelbench_eval.run.plan import Plan
from kernelbench_eval.run.setup import manifest_dirs

FAST = ("--device", "cpu", "--no-compile-baseline", "--trials", "1", "--reps", "10", "--timing-budget", "1")

PROBLEM = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)

    def forward(self, x):
        return torch.relu(self.fc(x))


batch_size = 4096
n = 16
KBEVAL_SMOKE_DIMS = {"batch_size": 2}


def get_inputs():
    return [torch.rand(batch_size, n) * 2 - 1]


def get_init_inputs():
    return [n]
'''

CANDIDATE = PROBLEM.split("\n\n\nbatch_size")[0].replace("class Model(", "class ModelNew(") + "\n"


def write_corpus(root: Path) -> tuple[Path, Path]:
    (root / "p").mkdir(parents=True)
    (root / "c" / "tiny").mkdir(parents=True)
    (root / "p" / "tiny.py").write_text(PROBLEM)
    (root / "c" / "tiny" / "py_ok.py").write_text(CANDIDATE)
    return root / "p", root / "c"


def no_traceback(proc: subprocess.CompletedProcess[str]) -> bool:
    return "Traceback" not in proc.stdout + proc.stderr


def kbeval_at(cwd: Path, *args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    """The command line started from another folder than the repository (conftest.kbeval runs in ROOT)."""
    env = dict(os.environ, KBEVAL_CACHE_DIR=str(cache), COLUMNS="200", PYTHONPATH=pythonpath())
    return subprocess.run([sys.executable, "-m", "kernelbench_eval", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory, build_cache: Path) -> Path:
    """One real --smoke run of the tiny corpus; explicit options given here must win over smoke's."""
    root = tmp_path_factory.mktemp("newcomer")
    problems, candidates = write_corpus(root)
    proc = kbeval("run", "--smoke", *FAST, "--dim", "n=8", "--problems", str(problems), "--candidates",
                  str(candidates), "--out", str(root / "results"), "--run-id", "smoke", cache=build_cache)
    assert no_traceback(proc) and "judging" in proc.stderr  # the progress rows, rendered once at the end
    return root / "results" / "smoke"


def test_smoke_run_records_its_settings_and_explicit_options_win(smoke_run):
    manifest = json.loads((smoke_run / "run.json").read_text())
    settings = manifest["settings"]
    assert settings["smoke"] is True
    assert settings["dims"] == {"batch_size": 2, "n": 8}  # the problem's smoke size, plus an explicit --dim
    assert settings["trials"] == 1 and settings["timing_budget"] == 1  # typed: they win over smoke's
    assert settings["warmup"] == 2 and settings["max_reps"] == 100 and settings["compile_baseline"] is False
    assert Path(manifest["problems_dir"]).is_absolute() and Path(manifest["candidates_dir"]).is_absolute()
    assert read_verdicts(smoke_run)["py_ok"]["correct"] is True


def test_resume_works_from_any_folder_and_keeps_the_settings(smoke_run, build_cache, tmp_path):
    proc = kbeval_at(tmp_path, "run", "--resume", str(smoke_run), "--trials", "4", cache=build_cache)
    assert proc.returncode == 0 and no_traceback(proc), proc.stderr
    assert "1 reused from before" in proc.stdout
    assert "ignored: --trials" in proc.stderr
    assert json.loads((smoke_run / "run.json").read_text())["settings"]["trials"] == 1


def test_resume_of_an_old_manifest_with_relative_paths(smoke_run, build_cache, tmp_path):
    """Old manifests hold the folders as typed; they are found next to the results folder (RUN_DIR/../..)."""
    layout = tmp_path / "project"
    shutil.copytree(smoke_run.parent.parent / "p", layout / "p")
    shutil.copytree(smoke_run.parent.parent / "c", layout / "c")
    run_dir = layout / "results" / smoke_run.name  # a run id must name its folder (issue 20)
    shutil.copytree(smoke_run, run_dir)
    manifest = json.loads((run_dir / "run.json").read_text()) | {"problems_dir": "p", "candidates_dir": "c"}
    (run_dir / "run.json").write_text(json.dumps(manifest, indent=2))
    refused = kbeval_at(tmp_path, "run", "--resume", str(run_dir), cache=build_cache)
    assert refused.returncode == 2 and no_traceback(refused)  # a run.json this harness did not write (issue 20)
    assert "refusing to resume" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    seal_manifest(build_cache, run_dir)  # as if this installation had written the old manifest
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = kbeval_at(elsewhere, "run", "--resume", str(run_dir), cache=build_cache)
    assert proc.returncode == 0 and no_traceback(proc), proc.stderr
    assert "1 reused from before" in proc.stdout
    shutil.rmtree(layout / "p")
    gone = kbeval_at(elsewhere, "run", "--resume", str(run_dir), cache=build_cache)
    assert gone.returncode == 2 and no_traceback(gone)
    assert "problems folder 'p' not found" in gone.stderr and len(gone.stderr.strip().splitlines()) == 1


def test_manifest_dirs_prefers_absolute_then_current_then_beside_the_results(tmp_path, monkeypatch):
    (tmp_path / "proj" / "p").mkdir(parents=True)
    (tmp_path / "proj" / "c").mkdir()
    run_dir = tmp_path / "proj" / "results" / "r"
    manifest = RunManifest(run_id="r", settings=RunSettings(device="cpu"), problems_dir="p", candidates_dir="c",
                           torch_version="x", created_at="")
    monkeypatch.chdir(tmp_path)
    assert manifest_dirs(manifest, run_dir) == (tmp_path / "proj" / "p", tmp_path / "proj" / "c")
    (tmp_path / "p").mkdir()
    assert manifest_dirs(manifest, run_dir)[0] == tmp_path / "p"  # as older versions did: the current folder
    absolute = manifest.model_copy(update={"problems_dir": str(tmp_path / "proj" / "p")})
    assert manifest_dirs(absolute, run_dir)[0] == tmp_path / "proj" / "p"


def test_resume_of_a_missing_run_folder_is_one_line(build_cache, tmp_path):
    for target in (tmp_path / "nope", tmp_path):  # no folder; a folder without run.json
        proc = kbeval("run", "--resume", str(target), cache=build_cache, check=False)
        assert proc.returncode == 2 and no_traceback(proc)
        assert len(proc.stderr.strip().splitlines()) == 1 and str(target) in proc.stderr


def test_runs_with_nothing_to_judge_are_usage_errors(build_cache, tmp_path):
    problems, candidates = write_corpus(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "orphans" / "no_such_problem").mkdir(parents=True)
    (tmp_path / "orphans" / "no_such_problem" / "x.py").write_text(CANDIDATE)
    out = tmp_path / "results"
    cases = {
        "empty": ("--candidates", str(tmp_path / "empty")),
        "orphans": ("--candidates", str(tmp_path / "orphans")),
        "unknown id": ("--candidates", str(candidates), "--problem", "nosuch"),
        "unknown dim": ("--candidates", str(candidates), "--dim", "nosuchname=3"),
    }
    procs = {name: kbeval("run", *FAST, "--problems", str(problems), "--out", str(out), *args, cache=build_cache,
                          check=False) for name, args in cases.items()}
    for name, proc in procs.items():
        assert proc.returncode == 2 and no_traceback(proc), (name, proc.stderr)
        assert "verdicts:" not in proc.stdout, name  # no path of a file never written
    assert not out.exists()  # nothing was started, so no run folder
    assert "no candidates to judge" in procs["empty"].stderr
    assert "no problem named 'no_such_problem'" in procs["orphans"].stderr
    assert "no candidates to judge" in procs["orphans"].stderr.splitlines()[-1]
    assert "unknown problem id 'nosuch'; known: tiny" in procs["unknown id"].stderr
    assert "--dim: nosuchname is in no problem of this run; known: batch_size, n" in procs["unknown dim"].stderr


def test_eval_of_a_non_python_file_and_no_leftover_folder(build_cache, tmp_path, monkeypatch):
    problems, _ = write_corpus(tmp_path)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))  # where `eval` makes (and must remove) its folder
    for name in ("kernel.cu", "notes.txt"):
        (tmp_path / name).write_text("__global__ void k() {}\n")
        proc = kbeval("eval", str(problems / "tiny.py"), str(tmp_path / name), "--json", *FAST, cache=build_cache)
        verdict = json.loads(proc.stdout)
        assert verdict["status"] == "load_error" and "not a Python source" in verdict["error"]
    ok = kbeval("eval", str(problems / "tiny.py"), str(tmp_path / "c" / "tiny" / "py_ok.py"), "--smoke", *FAST,
                cache=build_cache)
    assert ok.stdout.startswith("Evaluation: True") and no_traceback(ok)
    assert not list(scratch.glob("kbeval-eval-*"))
    bad_problem = kbeval("eval", str(tmp_path / "notes.txt"), str(tmp_path / "c" / "tiny" / "py_ok.py"), *FAST,
                         cache=build_cache, check=False)
    assert bad_problem.returncode == 2 and "not a Python source" in bad_problem.stderr and no_traceback(bad_problem)


def test_seed_problems_declare_the_cpu_sizes_of_the_seed_test():
    problems = [Problem(p.stem, p, sha256_file(p)) for p in sorted((ROOT / "problems" / "level2").glob("*.py"))]
    assert len(problems) == 4 and all(smoke_dims(p.path) for p in problems)
    expected = dict(item.split("=") for item in CPU_DIMS if item != "--dim")
    warnings: list[str] = []
    assert merged_smoke_dims(problems, {}, warnings) == {k: int(v) for k, v in expected.items()}
    assert not warnings


def test_smoke_sizes_conflicting_across_problems_need_a_dim(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("batch_size = 8\nKBEVAL_SMOKE_DIMS = {'batch_size': 2}\n")
    b.write_text("batch_size = 8\nKBEVAL_SMOKE_DIMS = {'batch_size': 4}\n")
    probs = [Problem("a", a, ""), Problem("b", b, "")]
    with pytest.raises(ValueError, match="a sets batch_size=2 but b sets batch_size=4"):
        merged_smoke_dims(probs, {}, [])
    assert merged_smoke_dims(probs, {"batch_size": 3}, []) == {"batch_size": 3}
    b.write_text("KBEVAL_SMOKE_DIMS = {'batch_size': open('x')}\n")  # never executed: rejected as not literal
    with pytest.raises(ValueError, match="must be a dict of name: number literals"):
        smoke_dims(b)


def test_problems_smoke_lists_small_shapes(build_cache, tmp_path):
    problems, _ = write_corpus(tmp_path)
    proc = kbeval("problems", "--problems", str(problems), "--smoke", cache=build_cache)
    assert "float32[2, 16]" in proc.stdout


def _verdict(n: int, error: str | None) -> Verdict:
    return Verdict(run_id="r", problem="45_Gemm_Sigmoid_LogSumExp_With_A_Long_Name", candidate=f"candidate_{n}_" * 3,
                   source_sha256="0", settings_key="k", device="cpu", torch_version="x",
                   status="incorrect" if error else "ok", correct=not error, error=error)


def test_results_table_keeps_one_line_per_verdict_at_80_columns():
    error = "trial 0: 16384/16384 values outside tolerance, max |diff| 1.4 at [3, 7], got 0.1 expected 1.5 " * 3
    verdicts = [_verdict(n, error if n % 2 else None) for n in range(6)]
    out = Console(file=io.StringIO(), width=80, color_system=None)
    out.print(verdict_table(verdicts, width=80))
    lines = out.file.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80
    assert len([line for line in lines if "45_Gemm" in line]) == len(verdicts)  # one line each, none wrapped
    assert "…" in out.file.getvalue() and "full text in verdicts.jsonl" in out.file.getvalue()
    wide = Console(file=io.StringIO(), width=200, color_system=None)
    wide.print(verdict_table(verdicts, width=200))
    assert "ref ms" in wide.file.getvalue() and "…" not in wide.file.getvalue()


def test_progress_shows_each_phase_with_names_in_flight_at_80_columns():
    out = Console(file=io.StringIO(), width=80, color_system=None)
    with RunProgress(out, Plan(judge=9, build=7, problems=2)) as progress:
        for name in ("45/a_very_long_candidate_name_indeed", "45/second", "71/third", "71/fourth"):
            progress.start(progress.build, name)
        progress.finish(progress.build, "45/second")
        progress.start(progress.baselines, "71")
    text = out.file.getvalue()
    lines = [line for line in text.splitlines() if line.strip()]
    assert max(len(line) for line in lines) <= 80
    assert any(line.startswith("building") and "1/7" in line and "45/a_very" in line for line in lines)
    assert any(line.startswith("baselines") and "0/2" in line and "71" in line for line in lines)
    assert any(line.startswith("judging") and "0/9" in line for line in lines)


def test_run_help_fits_80_columns_and_keeps_brackets():
    result = CliRunner().invoke(app, ["run", "--help"], terminal_width=80)
    assert result.exit_code == 0
    assert max(len(line) for line in result.output.splitlines()) <= 80
    for option in ("--no-compile-baseline", "--smoke", "--resume", "--address", "eval[ray]"):
        assert option in result.output, option  # nothing cut off, and `[ray]` not eaten as markup
