"""How a worker process comes to be: its environment, then forked from the fork server where that works, else a
fresh interpreter. Either way it is its own session, answers on its reply pipe, and looks the same to the candidate.

Apart from `process` (which talks to a worker once it runs) because this is the one place that decides what a
worker inherits (its role among it: which ops it answers) and which entry point it runs: `worker.main`, or the
sandbox's wrapper for a confined one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kernelbench_eval.containment import SandboxSpec
from kernelbench_eval.isolation import forkclient, sandbox
from kernelbench_eval.isolation.forkclient import ForkedChild
from kernelbench_eval.isolation.workerenv import worker_environment
from kernelbench_eval.messages import ROLE_VAR, Role


def spawn(workdir: Path, extra_env: dict[str, str], token: str, confined: SandboxSpec | None, reply_fd: int,
          role: Role) -> subprocess.Popen[bytes] | ForkedChild:
    """A new worker of `role` in `workdir`, writing its replies to `reply_fd`; `confined`: a candidate's, with its
    sandbox."""
    env = environment(workdir, extra_env, token, confined, role)
    return forkclient.spawn(env, workdir, reply_fd) or _start_cold(workdir, env, confined is not None, reply_fd)


def environment(workdir: Path, extra_env: dict[str, str], token: str, confined: SandboxSpec | None, role: Role
                ) -> dict[str, str]:
    env = worker_environment(extra_env, token)
    env[ROLE_VAR] = role
    if confined is not None:
        env[sandbox.SPEC_VAR] = confined.model_dump_json()
        if "landlock" in confined.layers:  # it may write nowhere else (compilers and torch put files there)
            env["TMPDIR"] = str(workdir)
    return env


def _start_cold(workdir: Path, env: dict[str, str], confined: bool, reply_fd: int) -> subprocess.Popen[bytes]:
    """A fresh interpreter: what every worker was before the fork server, and its fallback."""
    entry = "kernelbench_eval.isolation.sandbox" if confined else "kernelbench_eval.worker.main"  # (its docs)
    return subprocess.Popen(
        [sys.executable, "-m", entry, "--reply-fd", str(reply_fd)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,  # a pipe, not the log file: the child never learns where results live
        stderr=subprocess.STDOUT,
        cwd=workdir,
        env=env,
        pass_fds=(reply_fd,),
        start_new_session=True,
    )
