"""The harness side of the fork server (`forkserver`): start it, ask it for workers, and know how each ended.

`process.WorkerProcess` asks `spawn` for a worker; this has `forkpool` start the server for the worker's base
environment once (lazily), sends it a spawn request over the control socketpair and gets back a `ForkedChild`, which
offers the parts of `subprocess.Popen` the worker needs (`pid`, `stdin`, `stdout`, `poll`, `wait`,
`returncode`). Anything that goes wrong returns None, and the caller starts a cold worker as before. Why a
socketpair and not a socket path, and the protocol: see `forkserver`.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from kernelbench_eval.isolation.forkpool import drop_server, server_for

TOKEN_VAR = "KBEVAL_WORKER_TOKEN"
TOKEN_LENGTH = 32  # secrets.token_hex(16)
TOKEN_PLACEHOLDER = "0" * TOKEN_LENGTH
# Read only after the fork (by CUDA at its first initialisation, by load_inline when it builds: MAX_JOBS too)
# or by the harness: one server serves every value. Any other variable a worker sets gets a server of its own.
FORK_SAFE_VARS = frozenset({TOKEN_VAR, "TORCH_EXTENSIONS_DIR", "CUDA_LAUNCH_BLOCKING", "CUDA_VISIBLE_DEVICES",
                            "TORCHINDUCTOR_COMPILE_THREADS", "TRITON_CACHE_DIR", "MAX_JOBS", "TMPDIR",
                            "KBEVAL_SANDBOX_SPEC", "KBEVAL_WORKER_ROLE", "KBEVAL_CPUS", "KBEVAL_PCH_DIR",
                            "PYTORCH_NVCC", "TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES"})
WORKER_MODULE = "kernelbench_eval.worker.main"
SWITCH_VAR = "KBEVAL_FORKSERVER"  # "0" turns forking off: every worker starts cold
MAX_REQUEST_BYTES = 1 << 20


def enabled() -> bool:
    """Forking is on unless KBEVAL_FORKSERVER=0, and possible only where fds can be passed (Linux)."""
    return os.environ.get(SWITCH_VAR, "1") != "0" and sys.platform == "linux" and hasattr(socket, "send_fds")


# -- harness side --------------------------------------------------------------------------------------------


class ForkedChild:
    """A worker forked by the server: the subset of `subprocess.Popen` that `WorkerProcess` uses.

    Its exit status arrives over the server connection, since the harness is not its parent and cannot
    `waitpid` it. `returncode` follows Popen: the exit code, or minus the signal that killed it.
    """

    def __init__(self, pid: int, conn: socket.socket, stdin: Any, stdout: Any) -> None:
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.returncode: int | None = None
        self._conn = conn

    def poll(self) -> int | None:
        if self.returncode is None:
            self._receive_status(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and not self._receive_status(timeout):
            raise subprocess.TimeoutExpired(f"forked worker {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def _receive_status(self, timeout: float | None) -> bool:
        ready, _, _ = select.select([self._conn], [], [], timeout)
        if not ready:
            return False
        try:
            data = self._conn.recv(4096)
        except OSError:
            data = b""
        if data:
            self.returncode = os.waitstatus_to_exitcode(json.loads(data)["status"])
        else:  # the server died: its PR_SET_PDEATHSIG killed this child
            self.returncode = -signal.SIGKILL
        self._conn.close()
        return True


def spawn(env: dict[str, str], cwd: Path, reply_fd: int) -> ForkedChild | None:
    """Fork a worker with environment `env` (what a cold worker would get) in `cwd`, replying on `reply_fd`.

    None when forking is off or fails for any reason: the caller then starts a cold worker.
    """
    if not enabled() or len(env.get(TOKEN_VAR, "")) != TOKEN_LENGTH:
        return None
    child_env = {k: v for k, v in env.items() if k in FORK_SAFE_VARS}
    server = server_for(_server_env(env))
    if server is None:
        return None
    stdin_read, stdin_write = os.pipe()
    out_read, out_write = os.pipe()
    try:
        pid, conn = server.spawn(child_env, cwd, [stdin_read, out_write, reply_fd])
    except (OSError, ValueError, KeyError) as exc:
        os.close(stdin_write)
        os.close(out_read)
        drop_server(server, exc)
        return None
    finally:
        os.close(stdin_read)
        os.close(out_write)
    return ForkedChild(pid, conn, open(stdin_write, "wb"), open(out_read, "rb"))  # noqa: SIM115 (the worker's)


def prestart(env: dict[str, str]) -> threading.Thread | None:
    """Start the server for workers of environment `env` in the background; the first `spawn` for it then
    finds it running, or waits for its start (under the same lock) instead of starting a second one."""
    if not enabled():
        return None
    thread = threading.Thread(target=server_for, args=(_server_env(env),), name="kbeval-forkserver-start",
                              daemon=True)
    thread.start()
    return thread


def _server_env(env: dict[str, str]) -> dict[str, str]:
    """The server's environment for workers of environment `env` (the key its server is found by)."""
    return {k: v for k, v in env.items() if k not in FORK_SAFE_VARS} | {TOKEN_VAR: TOKEN_PLACEHOLDER}
