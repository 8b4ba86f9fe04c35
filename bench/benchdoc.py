"""What the device benches share: the machine line, a bounded `kbeval` child, and rewriting one section.

A device call is one shell command with a hard time limit, and only files under $OUT come back, so every
bench here stops its `kbeval` child at its own deadline (keeping what was recorded), and leaves its section
and raw numbers under $OUT as well as in docs/benchmarks.md.
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # this checkout's harness, as `kbeval_env` gives the runs it starts
    sys.path.insert(0, str(REPO))

from kernelbench_eval.isolation.cores import usable as usable_cores  # noqa: E402  (taskset: the cores given)


def out_dir() -> Path | None:
    """$OUT, where a device call's results come back from; None when unset."""
    out = os.environ.get("OUT")
    if not out:
        return None
    Path(out).mkdir(parents=True, exist_ok=True)
    return Path(out)


def machine_line(device: str) -> str:
    """The device, the host's cores, torch and the harness's commit: what a reader needs to compare figures."""
    import torch

    if device == "cuda":
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True)
        except OSError:  # no driver tools here
            smi = subprocess.CompletedProcess([], 1, "", "")
        line = smi.stdout.strip().splitlines()[0] if smi.returncode == 0 and smi.stdout.strip() else ""
        name, _, driver = line.partition(", ")
        what = f"{name} (driver {driver})" if driver else (
            torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU seen")
        if visible := os.environ.get("CUDA_VISIBLE_DEVICES"):  # a share of a larger host
            what += f", GPU {visible} of the host"
    else:
        what = f"CPU {platform.processor() or platform.machine()}"
    git = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True)
    commit = os.environ.get("KBEVAL_TREE") or (git.stdout.strip() if git.returncode == 0 else "no git here")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return (f"{what}, {usable_cores()} CPU cores, PyTorch {torch.__version__}, Python {platform.python_version()}; "
            f"{when}; harness {commit}.")


def kbeval_env(cache: Path | None = None) -> dict[str, str]:
    """The child's environment: this checkout first on the path, the build cache given (or the caller's)."""
    env = dict(os.environ, COLUMNS="200", PYTHONPATH=f"{REPO}:{os.environ.get('PYTHONPATH', '')}".rstrip(":"))
    if cache is not None:
        env["KBEVAL_CACHE_DIR"] = str(cache)
    return env


def run_bounded(args: list[str], env: dict[str, str], log: Path, deadline_s: float,
                stdout: Path | None = None) -> tuple[int | None, float]:
    """`python -m kernelbench_eval ARGS`, output to `log` (stdout alone to `stdout` when given); stopped at the
    deadline (its exit code is then None).

    The harness runs in a session of its own so that the whole group can be stopped; its workers die with it
    (they watch their parent), and what it recorded before (verdicts.jsonl, appended per verdict) stays.
    """
    started = time.monotonic()
    with log.open("w") as sink, (stdout.open("w") if stdout else contextlib.nullcontext(sink)) as out:
        proc = subprocess.Popen([sys.executable, "-m", "kernelbench_eval", *args], cwd=REPO, env=env,
                                stdout=out, stderr=sink, start_new_session=True)
        try:
            return proc.wait(timeout=max(1.0, deadline_s)), time.monotonic() - started
        except subprocess.TimeoutExpired:
            for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 30)):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=grace)
                    break
                except ProcessLookupError:
                    break
                except subprocess.TimeoutExpired:
                    continue
            return None, time.monotonic() - started


def tail(path: Path, chars: int = 3000) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-chars:]


def write_section(md: Path, title: str, text: str, keep_previous: bool = False) -> None:
    """Replace the section `title` (up to the next `## `) with `text`, or add it at the end; the rest stays.
    `keep_previous`: what the section held goes on below `text` (earlier runs and the readings written for
    them), so that a run adds to the record instead of erasing it."""
    doc = md.read_text() if md.exists() else "# Benchmarks\n"
    body = text.rstrip("\n") + "\n"
    start = doc.find(title + "\n")
    if start < 0:
        doc = doc.rstrip("\n") + "\n\n" + body
    else:
        end = doc.find("\n## ", start + len(title))
        if keep_previous and (previous := doc[start + len(title) + 1:end + 1 if end >= 0 else len(doc)].strip("\n")):
            body += "\n" + previous + "\n"
        doc = doc[:start] + body + ("\n" + doc[end + 1:] if end >= 0 else "")
    md.write_text(doc)
