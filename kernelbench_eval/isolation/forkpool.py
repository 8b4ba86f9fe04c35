"""The harness's fork servers (`forkserver`): one per base environment, each started from one keeper thread,
replaced when it dies (a few times at most), and all stopped at exit.

Apart from `forkclient`, which asks these servers for workers, because keeping the server processes (their
start, their control socket, their registry and their end) is a job of its own.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

READY_TIMEOUT = 180.0  # seconds for a server to import torch and listen (a busy machine is slow at this)
REPLY_TIMEOUT = 30.0  # seconds for a server to answer a spawn request
MAX_STARTS = 3  # servers started per base environment; past that, its workers start cold


class _SpawnRefused(OSError):
    """The server answered, but could not fork this child (it stays up for the next one)."""


class ForkServer:
    """The harness's handle on one server process and its control socket."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.control: socket.socket | None = None  # the harness's end; not inheritable, so no worker holds it
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the server (from the keeper thread) and wait until it is ready; raise if it is not."""
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [sys.executable, "-m", "kernelbench_eval.isolation.forkserver", "--control-fd", str(theirs.fileno()),
                "--parent", str(os.getpid())]
        try:
            self.proc = _KEEPER.call(lambda: subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd="/",
                env=self.env, pass_fds=(theirs.fileno(),),
                start_new_session=True))  # its own session: a Ctrl-C meant for the harness passes it by
        finally:
            theirs.close()
        assert self.proc.stdout is not None
        line = read_line(self.proc.stdout.fileno(), READY_TIMEOUT)
        self.proc.stdout.close()
        if line != b"ready":
            raise RuntimeError(f"fork server did not start: {line.decode(errors='replace')[:300] or 'no answer'}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self, env: dict[str, str], cwd: Path, fds: list[int]) -> tuple[int, socket.socket]:
        """Ask for one child; (its pid, the connection its exit status will arrive on)."""
        if self.control is None:
            raise OSError("fork server not started")
        conn, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.settimeout(REPLY_TIMEOUT)
            try:  # one sendmsg per request: atomic on SEQPACKET, so threads may share the control socket
                socket.send_fds(self.control, [json.dumps({"env": env, "cwd": str(cwd)}).encode()],
                                [theirs.fileno(), *fds])
            finally:
                theirs.close()
            reply = json.loads(conn.recv(4096) or b"{}")
            if "pid" not in reply:
                raise _SpawnRefused(reply.get("error", "the fork server closed the connection"))
            conn.settimeout(None)
            return int(reply["pid"]), conn
        except BaseException:
            conn.close()
            raise

    def stop(self) -> None:
        """Close its lifeline (it then kills its children and exits), then make sure it is gone."""
        if self.proc is not None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.control is not None:
            self.control.close()


class _Keeper:
    """One thread, alive as long as the harness, that starts every server.

    PR_SET_PDEATHSIG fires when the *thread* that started a process exits, not the process: a server started
    from a pool thread would be killed (with every worker it forked) when that pool shuts down.
    """

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[Callable[[], Any], Future[Any]]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def call(self, fn: Callable[[], Any]) -> Any:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kbeval-forkserver-keeper", daemon=True)
                self._thread.start()
        future: Future[Any] = Future()
        self._jobs.put((fn, future))
        return future.result()

    def _run(self) -> None:
        while True:
            fn, future = self._jobs.get()
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller, who falls back to a cold worker
                future.set_exception(exc)


_KEEPER = _Keeper()
_LOCK = threading.Lock()
_SERVERS: dict[tuple[tuple[str, str], ...], ForkServer] = {}
_STARTS: dict[tuple[tuple[str, str], ...], int] = {}
_STARTING: set[ForkServer] = set()  # servers importing torch now (under _STARTING_LOCK: _LOCK is held meanwhile)
_STARTING_LOCK = threading.Lock()


def server_for(env: dict[str, str]) -> ForkServer | None:
    """The running server for this base environment, started now if need be; None if it cannot be had."""
    key = tuple(sorted(env.items()))
    with _LOCK:
        server = _SERVERS.get(key)
        if server is not None and server.alive():
            return server
        if server is not None:  # it died (or was killed): start another, a few times at most
            del _SERVERS[key]
            server.stop()
        if _STARTS.get(key, 0) >= MAX_STARTS:
            return None
        if not _STARTS:
            atexit.register(stop_all)
        _STARTS[key] = _STARTS.get(key, 0) + 1
        server = ForkServer(env)
        with _STARTING_LOCK:
            _STARTING.add(server)
        try:
            server.start()
        except (OSError, RuntimeError, ValueError):
            server.stop()
            return None
        finally:
            with _STARTING_LOCK:
                _STARTING.discard(server)
        _SERVERS[key] = server
        return server


def drop_server(server: ForkServer, exc: BaseException) -> None:
    """After a failed spawn: keep a server that refused one fork, stop one that is dead or does not answer."""
    if isinstance(exc, _SpawnRefused) and server.alive():
        return
    with _LOCK:
        for key, known in list(_SERVERS.items()):
            if known is server:
                del _SERVERS[key]
    server.stop()


def servers() -> list[ForkServer]:
    """The servers running now, one per base environment."""
    with _LOCK:
        return list(_SERVERS.values())


def stop_all() -> None:
    """Stop every server (at exit; their children die with them). One still starting (a harness that ends
    early, on a usage error, say) is killed at once, not waited for: its start then fails, freeing the lock."""
    with _STARTING_LOCK:
        starting = list(_STARTING)
    for server in starting:
        with contextlib.suppress(OSError, AttributeError):
            server.proc.kill()  # type: ignore[union-attr]  (None before its Popen: then it is waited for)
    with _LOCK:
        servers = list(_SERVERS.values())
        _SERVERS.clear()
    for server in servers:
        server.stop()


def read_line(fd: int, timeout: float) -> bytes:
    """One line from `fd` within `timeout` seconds (without its newline); what came so far if not."""
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.partition(b"\n")[0]
