"""The harness side of an isolated worker: start it, talk to it under a deadline, and always clean up.

Starting one is `spawn`, reading its pipes `pipes`, killing it and whatever it left behind `reaping`.

Each worker is its own process group (session), so a timeout or the end of an evaluation kills the
candidate and every process it may have left behind, not only the Python we started. A candidate's worker
is also confined (`sandbox`): its own cgroup leaf, killed whole, and the layers it applies to itself.

A worker is forked from a server that has already imported torch (`forkserver`) where that works, else
started cold as `python -m kernelbench_eval.worker.main`; both look the same from here (and to the candidate).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from kernelbench_eval import interrupts
from kernelbench_eval.containment import SandboxRecord, SandboxSpec
from kernelbench_eval.isolation import reaping, sandbox
from kernelbench_eval.isolation.cgroups import Leaf
from kernelbench_eval.isolation.forkclient import ForkedChild
from kernelbench_eval.isolation.pipes import ReplyPipe, copy_capped
from kernelbench_eval.isolation.spawn import spawn
from kernelbench_eval.messages import Role, SandboxReply
from kernelbench_eval.requests import ExitRequest, R, Request


class WorkerFailure(Exception):
    """A worker did not do what was asked: it timed out, died, exited without a reply, or answered with an
    error (`status` is then the reply's kind: load_error, runtime_error, compile_error). The one error type
    every caller of a worker handles."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class WorkerProcess:
    """One worker process; use as a context manager so it is killed with its group however we leave."""

    def __init__(self, workdir: Path, log_path: Path, extra_env: dict[str, str] | None = None,
                 time_limit: float | None = None, sandbox: SandboxSpec | None = None, *, role: Role) -> None:
        self.workdir = workdir
        self.role = role  # the ops it answers: the checker's, or a candidate's (`worker.main.ROLES`)
        self.sandbox = sandbox  # a candidate's worker: confined (None: the harness's own, the checker)
        self.sandbox_record: SandboxRecord | None = None  # what held, once its first request was answered
        self._leaf: Leaf | None = None
        self._leaf_error: str | None = None
        self.time_limit = time_limit  # the whole budget, named in timeout messages
        self.log_path = log_path
        self.extra_env = extra_env or {}
        self.proc: subprocess.Popen[bytes] | ForkedChild | None = None  # `.pid` is read by measure.py
        self._replies = ReplyPipe(-1)
        self._token = secrets.token_hex(16)  # marks every process this worker starts, even outside its group
        self._pump: threading.Thread | None = None
        self._tracked: int | None = None  # its handle in `interrupts`: killed at once on a signal

    def __enter__(self) -> WorkerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        interrupts.check()  # nothing new starts once a stop was asked for
        read_fd, write_fd = os.pipe()
        try:
            self.proc = spawn(self.workdir, self.extra_env, self._token, self.sandbox, write_fd, self.role)
        finally:
            os.close(write_fd)
        self._replies = ReplyPipe(read_fd)
        self._tracked = interrupts.track(self._kill_now)
        if self.sandbox is not None:  # before its first request: nothing of the candidate has run yet
            self._leaf, self._leaf_error = sandbox.join_leaf(self.sandbox, self.proc.pid)
        self._pump = threading.Thread(target=copy_capped, args=(self.proc.stdout, self.log_path), daemon=True)
        self._pump.start()

    def request(self, req: Request[R], timeout: float, poll: float = 0.0) -> R:
        """Send one request and wait for its reply (the model the request names); raise WorkerFailure on timeout,
        crash or early exit. `poll`: seconds to wait by polling before sleeping (a timed call, where waking up is
        part of its wall)."""
        deadline = time.monotonic() + timeout
        self._send(_encode(req), timeout)
        return _parse(req, self._read_line(max(0.0, deadline - time.monotonic()), poll))

    def call_each(self, requests: Sequence[Request[R]], timeout: float, poll: float = 0.0) -> list[R]:
        """`call` for each request in turn, one in flight at a time: each is sent the moment its predecessor's
        reply has been read, and that reply parsed after, while the worker already works on the next. Why: a
        timed block's calls go one by one, and parsing and encoding between them kept the device idle. Every
        request is encoded before the first is sent. A failed reply is raised once the request sent after it
        has been answered too, so that replies and requests stay in step."""
        lines = [_encode(req) for req in requests]
        deadline = time.monotonic() + timeout
        replies: list[R] = []
        self._send(lines[0], timeout)
        for i in range(len(lines)):
            line = self._read_line(max(0.0, deadline - time.monotonic()), poll)
            if i + 1 < len(lines):
                self._send(lines[i + 1], 0.0)
            try:
                reply = _ok(_parse(requests[i], line))
            except WorkerFailure:
                if i + 1 < len(lines):
                    with contextlib.suppress(WorkerFailure):
                        self._read_line(max(0.0, deadline - time.monotonic()))
                raise
            replies.append(reply)
        return replies

    def _send(self, line: bytes, timeout: float) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(line)
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # it is already gone; reading the reply reports how it ended
        if self.sandbox is not None and self.sandbox_record is None:
            self._read_sandbox_report(timeout)

    def _read_sandbox_report(self, timeout: float) -> None:
        """The line a confined worker writes before it reads any request (so before any candidate code)."""
        record = _sandbox_report(self._read_line(timeout))
        self.sandbox_record = sandbox.finish(record, self._leaf is not None, self._leaf_error)
        sandbox.warn(self.sandbox_record)

    def call(self, req: Request[R], timeout: float, poll: float = 0.0) -> R:
        """`request`, with an error reply raised as a WorkerFailure of the reply's kind."""
        return _ok(self.request(req, timeout, poll))

    def _read_line(self, timeout: float, poll: float = 0.0) -> bytes:
        try:
            line = self._replies.line(timeout, poll, self._check_interrupt)
        except EOFError:
            self._check_interrupt()  # killed by the stop: no failure of the candidate's
            raise WorkerFailure("crashed", self._exit_description()) from None
        if line is None:
            self.kill()
            raise WorkerFailure("timeout", f"still running at the {self.time_limit or timeout:.0f} s limit; process "
                                "group killed")
        return line

    def _check_interrupt(self) -> None:
        """After a stop was asked for, a worker's silence or death is the stop's doing, never a verdict."""
        if interrupts.requested():
            self._kill_now()
            interrupts.check()

    def _kill_now(self) -> None:
        """SIGKILL its cgroup leaf and its group without waiting (what a signal's handler may do; `kill` waits)."""
        reaping.kill_now(self._leaf, self.proc)

    def _exit_description(self) -> str:
        assert self.proc is not None
        return reaping.exit_description(self.proc, self.kill)

    @property
    def leaf(self) -> Leaf | None:
        """Its cgroup leaf, where the sandbox made one (every process it started is in it)."""
        return self._leaf

    def kill(self) -> None:
        """SIGKILL the worker, everything it started and everything carrying its token (`reaping.kill`)."""
        if self.proc is None:
            return
        leaf, self._leaf = self._leaf, None
        reaping.kill(self.proc, leaf, self._token)

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            _ask_to_exit(self.proc)
        self.kill()  # anything it left behind in its group goes too
        if self.proc.stdin:
            self.proc.stdin.close()
        self._replies.close()
        if self._pump:
            self._pump.join(timeout=5)
            if not self._pump.is_alive() and self.proc.stdout:
                self.proc.stdout.close()
        if self._tracked is not None:
            interrupts.untrack(self._tracked)
            self._tracked = None


def _encode(req: Request[Any]) -> bytes:
    return (req.model_dump_json(exclude_defaults=True) + "\n").encode()


def _parse(req: Request[R], line: bytes) -> R:
    """`line` as the reply `req` names (an error reply has only the fields every reply has)."""
    try:
        return cast(R, req.reply.model_validate_json(line))
    except ValueError as exc:
        raise WorkerFailure("crashed", f"garbled reply from the worker: {str(exc)[:200]}") from exc


def _ok(reply: R) -> R:
    """`reply`, unless it is an error: then a WorkerFailure of the reply's kind."""
    if not reply.ok:
        raise WorkerFailure(reply.error_kind or "runtime_error", reply.error or "failed")
    return reply


def _sandbox_report(line: bytes) -> SandboxRecord:
    try:
        record = SandboxReply.model_validate_json(line).sandbox
    except ValueError as exc:
        raise WorkerFailure("crashed", f"garbled sandbox report from the worker: {str(exc)[:200]}") from exc
    if record is None:
        raise WorkerFailure("crashed", "the worker sent no sandbox report")
    return record


_EXIT = _encode(ExitRequest())  # (made once: written to a worker that may be dying, no time is spent first)


def _ask_to_exit(proc: subprocess.Popen[bytes] | ForkedChild) -> None:
    """The polite end: an `exit` request, and up to 10 s to take it (a kill follows either way)."""
    try:
        assert proc.stdin is not None
        proc.stdin.write(_EXIT)
        proc.stdin.flush()
        proc.wait(timeout=10)
    except (BrokenPipeError, subprocess.TimeoutExpired, OSError):
        pass
