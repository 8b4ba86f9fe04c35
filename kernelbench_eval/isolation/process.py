"""The harness side of an isolated worker: start it, talk to it under a deadline, and always clean up.

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
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from kernelbench_eval import interrupts
from kernelbench_eval.containment import SandboxRecord, SandboxSpec
from kernelbench_eval.isolation import forkclient, linux, sandbox
from kernelbench_eval.isolation.cgroups import Leaf
from kernelbench_eval.isolation.forkclient import TOKEN_VAR, ForkedChild
from kernelbench_eval.isolation.workerenv import worker_environment
from kernelbench_eval.messages import WorkerReply, WorkerRequest

LOG_CAP_BYTES = int(os.environ.get("KBEVAL_LOG_CAP", 1 << 20))  # of one worker's output; the rest is dropped
KILL_WAIT = 30.0  # seconds to wait for a killed worker's exit status before giving up on it
KILL_ROUNDS = 50  # scans for processes carrying a worker's token, at most, until one finds none (`_kill_marked`)
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
                 time_limit: float | None = None, sandbox: SandboxSpec | None = None) -> None:
        self.workdir = workdir
        self.sandbox = sandbox  # a candidate's worker: confined (None: the harness's own, the checker)
        self.sandbox_record: SandboxRecord | None = None  # what held, once its first request was answered
        self._leaf: Leaf | None = None
        self._leaf_error: str | None = None
        self.time_limit = time_limit  # the whole budget, named in timeout messages
        self.log_path = log_path
        self.extra_env = extra_env or {}
        self.proc: subprocess.Popen[bytes] | ForkedChild | None = None  # `.pid` is read by measure.py
        self._reply_fd = -1
        self._buffer = b""
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
        env = self._env()
        try:
            self.proc = forkclient.spawn(env, self.workdir, write_fd) or self._start_cold(env, write_fd)
        finally:
            os.close(write_fd)
        self._reply_fd = read_fd
        self._tracked = interrupts.track(self._kill_now)
        if self.sandbox is not None:  # before its first request: nothing of the candidate has run yet
            self._leaf, self._leaf_error = sandbox.join_leaf(self.sandbox, self.proc.pid)
        self._pump = threading.Thread(target=_copy_capped, args=(self.proc.stdout, self.log_path), daemon=True)
        self._pump.start()

    def _env(self) -> dict[str, str]:
        env = worker_environment(self.extra_env, self._token)
        if self.sandbox is not None:
            env[sandbox.SPEC_VAR] = self.sandbox.model_dump_json()
            if "landlock" in self.sandbox.layers:  # it may write nowhere else (compilers and torch put files there)
                env["TMPDIR"] = str(self.workdir)
        return env

    def _start_cold(self, env: dict[str, str], write_fd: int) -> subprocess.Popen[bytes]:
        """A fresh interpreter: what every worker was before the fork server, and its fallback."""
        entry = ("kernelbench_eval.isolation.sandbox" if self.sandbox is not None  # (its docs)
                 else "kernelbench_eval.worker.main")
        return subprocess.Popen(
            [sys.executable, "-m", entry, "--reply-fd", str(write_fd)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,  # a pipe, not the log file: the child never learns where results live
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            env=env,
            pass_fds=(write_fd,),
            start_new_session=True,
        )

    def request(self, req: WorkerRequest, timeout: float, poll: float = 0.0) -> WorkerReply:
        """Send one request and wait for its reply; raise WorkerFailure on timeout, crash or early exit.
        `poll`: seconds to wait by polling before sleeping (a timed call, where waking up is part of its wall)."""
        deadline = time.monotonic() + timeout
        self._send(_encode(req), timeout)
        return _parse(self._read_line(max(0.0, deadline - time.monotonic()), poll))

    def call_each(self, requests: list[WorkerRequest], timeout: float, poll: float = 0.0) -> list[WorkerReply]:
        """`call` for each request in turn, one in flight at a time: each is sent the moment its predecessor's
        reply has been read, and that reply parsed after, while the worker already works on the next. Why: a
        timed block's calls go one by one, and parsing and encoding between them kept the device idle. Every
        request is encoded before the first is sent. A failed reply is raised once the request sent after it
        has been answered too, so that replies and requests stay in step."""
        lines = [_encode(req) for req in requests]
        deadline = time.monotonic() + timeout
        replies: list[WorkerReply] = []
        self._send(lines[0], timeout)
        for i in range(len(lines)):
            line = self._read_line(max(0.0, deadline - time.monotonic()), poll)
            if i + 1 < len(lines):
                self._send(lines[i + 1], 0.0)
            try:
                reply = _parse(line)
                if not reply.ok:
                    raise WorkerFailure(reply.error_kind or "runtime_error", reply.error or "failed")
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
        line = self._read_line(timeout)
        try:
            record = WorkerReply.model_validate_json(line).sandbox
        except ValueError as exc:
            raise WorkerFailure("crashed", f"garbled sandbox report from the worker: {str(exc)[:200]}") from exc
        if record is None:
            raise WorkerFailure("crashed", "the worker sent no sandbox report")
        self.sandbox_record = sandbox.finish(record, self._leaf is not None, self._leaf_error)
        sandbox.warn(self.sandbox_record)

    def call(self, req: WorkerRequest, timeout: float, poll: float = 0.0) -> WorkerReply:
        """`request`, with an error reply raised as a WorkerFailure of the reply's kind."""
        reply = self.request(req, timeout, poll)
        if not reply.ok:
            raise WorkerFailure(reply.error_kind or "runtime_error", reply.error or "failed")
        return reply

    def _read_line(self, timeout: float, poll: float = 0.0) -> bytes:
        deadline = time.monotonic() + timeout
        limit = self.time_limit or timeout
        if poll and b"\n" not in self._buffer:
            linux.poll_readable(self._reply_fd, min(poll, timeout))
        while b"\n" not in self._buffer:
            self._check_interrupt()
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise WorkerFailure("timeout", f"still running at the {limit:.0f} s limit; process group killed")
            ready, _, _ = select.select([self._reply_fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(self._reply_fd, 1 << 16)
            if not chunk:
                self._check_interrupt()  # killed by the stop: no failure of the candidate's
                raise WorkerFailure("crashed", self._exit_description())
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _check_interrupt(self) -> None:
        """After a stop was asked for, a worker's silence or death is the stop's doing, never a verdict."""
        if interrupts.requested():
            self._kill_now()
            interrupts.check()

    def _kill_now(self) -> None:
        """SIGKILL its cgroup leaf and its group without waiting (what a signal's handler may do; `kill` waits)."""
        leaf, proc = self._leaf, self.proc
        if leaf is not None:
            with contextlib.suppress(OSError):
                leaf.kill()
        if proc is not None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)

    def _exit_description(self) -> str:
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
            return "closed its reply channel without a verdict; killed"
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
            return f"killed by signal {name}"
        return f"exited with code {code} without a verdict"

    @property
    def leaf(self) -> Leaf | None:
        """Its cgroup leaf, where the sandbox made one (every process it started is in it)."""
        return self._leaf

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """The worker's whole group stopped (SIGSTOP) while the harness checks what it handed over."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the worker's cgroup leaf (all it started), its process group and every process carrying
        its token (escaped via setsid: the fallback where there is no cgroup)."""
        if self.proc is None:
            return
        if self._leaf is not None:
            self._leaf.kill()
            self._leaf = None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):  # a forked one's status comes from its server
            self.proc.wait(timeout=KILL_WAIT)
        _kill_marked(self._token)

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(b'{"op": "exit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (BrokenPipeError, subprocess.TimeoutExpired, OSError):
                pass
        self.kill()  # anything it left behind in its group goes too
        if self.proc.stdin:
            self.proc.stdin.close()
        if self._reply_fd >= 0:
            os.close(self._reply_fd)
            self._reply_fd = -1
        if self._pump:
            self._pump.join(timeout=5)
            if not self._pump.is_alive() and self.proc.stdout:
                self.proc.stdout.close()
        if self._tracked is not None:
            interrupts.untrack(self._tracked)
            self._tracked = None


def _encode(req: WorkerRequest) -> bytes:
    return (req.model_dump_json(exclude_defaults=True) + "\n").encode()


def _parse(line: bytes) -> WorkerReply:
    try:
        return WorkerReply.model_validate_json(line)
    except ValueError as exc:
        raise WorkerFailure("crashed", f"garbled reply from the worker: {str(exc)[:200]}") from exc


def _copy_capped(stream: object, log_path: Path) -> None:
    """Copy the worker's output to its log, up to LOG_CAP_BYTES; drain (and drop) the rest."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with open(log_path, "ab") as log:
        for chunk in iter(lambda: stream.read1(1 << 16), b""):  # type: ignore[attr-defined]
            if written < LOG_CAP_BYTES:
                part = chunk[: LOG_CAP_BYTES - written]
                log.write(part)
                log.flush()
                written += len(part)
                if written >= LOG_CAP_BYTES:
                    log.write(f"\n[kbeval: log capped at {LOG_CAP_BYTES} bytes; the rest was dropped]\n".encode())
                    log.flush()


def _kill_marked(token: str, rounds: int = KILL_ROUNDS) -> None:
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

