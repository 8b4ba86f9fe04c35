"""Ending a worker: SIGKILL for its cgroup leaf, its process group and every process carrying its token, and how
it ended, in words.

Apart from `process` because killing must reach what a candidate left behind wherever it went (a new session,
outside any cgroup), which takes its own scan of every process; and because a signal's handler kills through
here too (`kill_now`: nothing that waits).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable

from kernelbench_eval.isolation import linux
from kernelbench_eval.isolation.cgroups import Leaf
from kernelbench_eval.isolation.forkclient import TOKEN_VAR, ForkedChild

KILL_WAIT = 30.0  # seconds to wait for a killed worker's exit status before giving up on it
KILL_ROUNDS = 50  # scans for processes carrying a worker's token, at most, until one finds none (`kill_marked`)

Proc = subprocess.Popen[bytes] | ForkedChild


def kill_now(leaf: Leaf | None, proc: Proc | None) -> None:
    """SIGKILL a worker's cgroup leaf and its group without waiting (what a signal's handler may do)."""
    if leaf is not None:
        with contextlib.suppress(OSError):
            leaf.kill()
    if proc is not None:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)


def kill(proc: Proc, leaf: Leaf | None, token: str) -> None:
    """SIGKILL the worker's cgroup leaf (all it started), its process group and every process carrying its token
    (escaped via setsid: the fallback where there is no cgroup), waiting for the worker's exit status."""
    if leaf is not None:
        leaf.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):  # a forked one's status comes from its server
        proc.wait(timeout=KILL_WAIT)
    kill_marked(token)


def exit_description(proc: Proc, kill_it: Callable[[], None]) -> str:
    """How a worker that closed its reply pipe ended; `kill_it` when it has not exited 10 s later."""
    try:
        code = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        kill_it()
        return "closed its reply channel without a verdict; killed"
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        return f"killed by signal {name}"
    return f"exited with code {code} without a verdict"


def kill_marked(token: str, rounds: int = KILL_ROUNDS) -> None:
    """Kill any process whose environment carries `token`: what a worker left behind outside its group (where
    no cgroup holds it). Scanned again until a scan finds none: a marked process that forks while a scan runs,
    or is in the middle of an exec, shows (its child, its new image) only to the next scan."""
    needle = f"{TOKEN_VAR}={token}".encode()
    for _ in range(rounds):
        found = [pid for pid, environ in linux.environments() if needle in environ.split(b"\0")]
        if not found:
            return
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.001)  # a killed process's /proc entry stays readable until it has died
