"""The fork server's child: a fork of the server made into what a cold `python -m kernelbench_eval.worker.main`
would be, then the worker itself (`forkserver` explains the three roles and the protocol).

Set up like a cold worker: its own session, fds 0/1/2 on the harness's pipes and only the reply pipe besides, the
working directory, the environment (its token written over the placeholder in its exec'd environment, where
/proc/<pid>/environ shows it), PR_SET_PDEATHSIG, fresh random seeds, and the worker module run afresh as
`__main__`. It never returns into the server's loop.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import os
import random
import runpy
import signal
import socket
import sys
import tempfile
import traceback
from typing import NoReturn, Protocol

from kernelbench_eval.isolation.forkclient import TOKEN_LENGTH, TOKEN_PLACEHOLDER, TOKEN_VAR, WORKER_MODULE
from kernelbench_eval.isolation.linux import die_with_parent, environment_block, keep_memory_private, open_fds


class _Server(Protocol):
    """What a child needs of the server it was forked from (`forkserver._Server`, not imported: it imports this)."""

    pid: int

    def close_in_child(self, conn: socket.socket) -> None: ...


def token_address() -> int | None:
    """Where this process's exec'd environment holds the placeholder token (what /proc/<pid>/environ shows)."""
    start, end = environment_block()
    block = b"\0" + ctypes.string_at(start, end - start)
    at = block.find(f"\0{TOKEN_VAR}={TOKEN_PLACEHOLDER}\0".encode())
    return None if at < 0 else start + at + len(TOKEN_VAR) + 1


def child(server: _Server, conn: socket.socket, fds: list[int], env: dict[str, str], cwd: str,
          started_fd: int) -> NoReturn:
    """Become a worker, serve, and exit: this never returns into the server's loop, whatever happens."""
    code = 1
    try:
        reply_fd = _become_worker(server, conn, fds, env, cwd, started_fd)
        code = _serve(reply_fd)
    except BaseException:
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        _exit(code)


def _become_worker(server: _Server, conn: socket.socket, fds: list[int], env: dict[str, str], cwd: str,
                   started_fd: int) -> int:
    """The state a cold `python -m kernelbench_eval.worker.main` starts in; the reply pipe's fd."""
    os.setsid()  # its own session and group: killpg reaches all it starts
    die_with_parent(signal.SIGKILL)
    if os.getppid() != server.pid:  # the server died before the line above took effect
        os._exit(1)
    os.write(started_fd, b"started\n")
    os.close(started_fd)
    server.close_in_child(conn)
    reply_fd = _install_fds(fds, keep=server.import_fds)
    keep_memory_private(False)  # as after exec: the harness reads its /proc files (environ, CPU time)
    os.chdir(cwd)
    _apply_env(env)
    _fresh_interpreter_state()
    return reply_fd


def _install_fds(fds: list[int], keep: frozenset[int]) -> int:
    """stdin, stdout and stderr on the harness's pipes; close every fd but those and the reply pipe."""
    stdin_read, out_write, reply_fd = fds
    os.dup2(stdin_read, 0)
    os.dup2(out_write, 1)
    os.dup2(out_write, 2)
    for fd in open_fds():
        if fd > 2 and fd != reply_fd and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)
    return reply_fd


def _apply_env(env: dict[str, str]) -> None:
    """The per-worker variables; the token is also written over the placeholder in /proc/<pid>/environ."""
    os.environ.update(env)
    token = env.get(TOKEN_VAR, "")
    address = token_address()
    if address is not None and len(token) == TOKEN_LENGTH:
        ctypes.memmove(address, token.encode(), TOKEN_LENGTH)


def _fresh_interpreter_state() -> None:
    """What differs between a fork of the server and a cold worker, as far as a candidate could notice."""
    sys.path[0] = os.getcwd()  # `python -m` puts the working directory first
    importlib.invalidate_caches()
    tempfile.tempdir = None  # TMPDIR is the worker's own: found again at first use
    sys.stdin = open(0, encoding=sys.stdin.encoding, errors=sys.stdin.errors, closefd=False)  # noqa: SIM115
    random.seed()  # every fork would otherwise draw the server's random numbers
    import torch

    torch.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _serve(reply_fd: int) -> int:
    """Run the worker module as `python -m kernelbench_eval.worker.main --reply-fd N` would; its exit code.

    The module runs afresh as `__main__` (its imports are warm), so the worker is what a cold one would be,
    down to `sys.modules["__main__"].CandidateWorker`, `sys.argv` and a `kernelbench_eval` package without `worker`.
    """
    sys.modules.pop(WORKER_MODULE, None)
    vars(sys.modules["kernelbench_eval"]).pop("worker", None)
    sys.argv = ["", "--reply-fd", str(reply_fd)]  # argv[0] becomes the module's path, as with -m
    try:
        runpy.run_module(WORKER_MODULE, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _exit(code: int) -> NoReturn:
    """Leave as an interpreter would (atexit handlers, flushed output), but never through the server's code."""
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code & 0xFF)
