"""Shared fixtures: one real CPU run over the fixture corpus, compiled once and reused by every test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).parent.parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """One rule for every GPU test: skipped where torch sees no CUDA device (CI's machine, a laptop)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def landlock_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """For tests whose fixtures log what they did to a file beside the test (or plant files where Landlock would
    stop them, to test the defence behind it): the harness leaves Landlock out, every other layer stays.
    tests/test_sandbox.py covers Landlock itself."""
    monkeypatch.setenv("KBEVAL_SANDBOX_OFF", "landlock")


def pythonpath() -> str:
    """This checkout first, then what the caller's PYTHONPATH already named (where a machine keeps packages
    outside site-packages, as the GPU machine does with pydantic)."""
    return os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def kbeval(*args: str, cache: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the real command line, as a user would, in a child process."""
    env = dict(os.environ, KBEVAL_CACHE_DIR=str(cache), COLUMNS="200")
    proc = subprocess.run([sys.executable, "-m", "kernelbench_eval", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1200)
    if check and proc.returncode != 0:
        raise AssertionError(f"kbeval {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def read_verdicts(run_dir: Path) -> dict[str, dict]:
    lines = (run_dir / "verdicts.jsonl").read_text().splitlines()
    return {json.loads(line)["candidate"]: json.loads(line) for line in lines}


# One baselines file for the whole session: torch.compile of each reference is timed once, then reused.
BASELINES = Path(tempfile.mkdtemp(prefix="kbeval-test-baselines-")) / "baselines.json"
FIXTURE_RUN_ARGS = ("--device", "cpu", "--problems", str(FIXTURES / "problems"),
                    "--candidates", str(FIXTURES / "candidates"), "--timeout", "20", "--trials", "3",
                    "--baselines", str(BASELINES))


@pytest.fixture(scope="session")
def build_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("build-cache")


@pytest.fixture(scope="session")
def fixture_run(tmp_path_factory: pytest.TempPathFactory, build_cache: Path) -> tuple[Path, subprocess.CompletedProcess]:  # noqa: E501
    """The first (cold) run: every fixture candidate compiled and judged for real."""
    out = tmp_path_factory.mktemp("results")
    proc = kbeval("run", *FIXTURE_RUN_ARGS, "--out", str(out), "--run-id", "cold", cache=build_cache)
    return out / "cold", proc


def serve_requests(monkeypatch: pytest.MonkeyPatch, requests: list, role: str = "candidate") -> list[bytes]:
    """The `serve` loop of a worker of `role` run over these requests (stdin a pipe, replies to another): its reply
    lines."""
    from kernelbench_eval.worker import main as worker_main

    (stdin_read, stdin_write), (reply_read, reply_write) = os.pipe(), os.pipe()
    os.write(stdin_write, "".join(r.model_dump_json() + "\n" for r in requests).encode())
    os.close(stdin_write)
    with open(stdin_read) as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        worker_main.serve(reply_write, role)
    os.close(reply_write)
    with open(reply_read, "rb") as replies:
        return replies.read().splitlines()
