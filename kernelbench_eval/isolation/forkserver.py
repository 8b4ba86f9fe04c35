"""Start workers by forking a server that has already imported torch, instead of a cold interpreter each time.

Why: every candidate costs two workers (check, then timing), and a cold `python -m kernelbench_eval.worker.main`
spends seconds importing torch before it can answer. A fork of an interpreter that has imported torch (and
never touched CUDA) answers in milliseconds.

Three roles: the harness side lives in `forkclient` and `forkpool` (imported from there, not here), the server in this
file, the child in `forkchild`:

- **Harness side** (`spawn`, `ForkedChild`): `process.WorkerProcess` asks for a worker; `forkclient` has
  `forkpool` start the server for the worker's base environment once and gets back a `ForkedChild` (or None:
  start cold).
- **Server** (`python -m kernelbench_eval.isolation.forkserver`): imports torch and the worker, then reads spawn
  requests from a control socket, one end of a socketpair the harness created and passed it at start. It
  never runs candidate code and never initialises CUDA (checked before every fork: a CUDA context does not
  survive `fork`). It dies with the harness (PR_SET_PDEATHSIG, EOF on its stdin or control socket, or a new
  parent), and is not dumpable, so a candidate cannot write into it to change every worker forked after it.
  There is no socket path: a filesystem socket (its path in the server's argv) could be renamed over by a
  candidate's own, which would then start every later worker; a pre-connected pair cannot be replaced.
- **Child**: set up exactly like a cold worker (own session, fds 0/1/2 on the harness's pipes, only the reply
  pipe besides, working directory, environment, PR_SET_PDEATHSIG, fresh random seeds), then `worker.serve`.

Protocol: per child, the harness makes a SOCK_SEQPACKET socketpair and sends, over the control socket,
`{"env": {...}, "cwd": "..."}` with four fds (SCM_RIGHTS): its end of that pair, the child's stdin read end,
its stdout/stderr write end and its reply-pipe write end. The server answers on the pair `{"pid": N}` (or
`{"error": "..."}`), and `{"status": S}` (a raw wait status) when the child has exited and been reaped. If
the server dies first, the connection closes without a status: its children got SIGKILL through their own
PR_SET_PDEATHSIG.

The worker's token (`TOKEN_VAR`) must show in `/proc/<pid>/environ`, which lists the environment a process was
*exec'd* with, not what it later set; that is how the harness finds what a worker left behind, even outside
its group. So the server is started with a placeholder token of the same length, and each child overwrites
the placeholder in its own copy of that memory: it, and anything it forks, then carries its real token.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import select
import signal
import socket
import sys
from typing import Any

from kernelbench_eval.isolation.forkchild import child, token_address
from kernelbench_eval.isolation.forkclient import MAX_REQUEST_BYTES, TOKEN_VAR, WORKER_MODULE
from kernelbench_eval.isolation.forkpool import REPLY_TIMEOUT, read_line
from kernelbench_eval.isolation.linux import die_with_parent, keep_memory_private, open_fds
from kernelbench_eval.isolation.teardown import skip_library_finalizers

# Imported by the server too, once (`preload`): `load_inline`'s module pulls in setuptools, and compiling those
# sources in every worker cost each extension candidate's load 0.37 s of its 0.42 s on an H200 host
PRELOADED = "torch.utils.cpp_extension"

# -- server --------------------------------------------------------------------------------------------------


class _Server:
    """Takes spawn requests from the harness's control socket, forks children, reports how each one ended."""

    def __init__(self, control: socket.socket, parent: int, import_fds: frozenset[int]) -> None:
        self.control = control
        self.parent = parent
        self.import_fds = import_fds  # opened by the imports: a cold worker would have them too
        self.children: dict[int, socket.socket] = {}  # pid -> the connection its status goes back on
        self.pid = os.getpid()
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_read, False)
        os.set_blocking(self.wake_write, False)
        signal.set_wakeup_fd(self.wake_write)  # a SIGCHLD wakes poll() at once
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def run(self) -> None:
        poller = select.poll()
        for fd in (0, self.wake_read, self.control.fileno()):
            poller.register(fd, select.POLLIN)
        while os.getppid() == self.parent:
            for fd, _ in poller.poll(1000):
                if fd == 0 and not os.read(0, 4096):
                    return  # EOF on the lifeline: the harness is gone
                if fd == self.wake_read:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_read, 4096)
                if fd == self.control.fileno() and not self._accept():
                    return  # the harness closed its end: it is gone
            self._reap()

    def shutdown(self) -> None:
        for pid in self.children:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)

    def _accept(self) -> bool:
        """Serve one request from the control socket; False on its EOF (the harness is gone)."""
        try:
            message, fds, flags, _ = socket.recv_fds(self.control, MAX_REQUEST_BYTES, 4)
        except OSError:  # out of fds, say: the harness times out on that one and starts it cold
            return True
        if not message and not fds:
            return False
        if not fds:
            return True  # nowhere to answer
        conn = socket.socket(fileno=fds.pop(0))
        conn.settimeout(5)
        try:
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) != 3:
                raise ValueError("malformed spawn request")
            pid = self._fork(json.loads(message), fds, conn)
        except (OSError, ValueError, RuntimeError) as exc:
            with contextlib.suppress(OSError):
                conn.send(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
            conn.close()
            return True
        finally:
            for fd in fds:
                os.close(fd)
        try:
            conn.send(json.dumps({"pid": pid}).encode())
        except OSError:  # the harness gave up on it: nobody would ever talk to this child
            conn.close()
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)  # its session, set up before the fork returned
            return True
        self.children[pid] = conn
        return True

    def _fork(self, request: dict[str, Any], fds: list[int], conn: socket.socket) -> int:
        import torch

        if torch.cuda.is_initialized():  # a CUDA context cannot be used after fork: never fork one
            raise RuntimeError("CUDA is initialised in the fork server")
        env, cwd = dict(request["env"]), str(request["cwd"])
        sys.stdout.flush()
        sys.stderr.flush()
        started_read, started_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(started_read)
            child(self, conn, fds, env, cwd, started_write)
        os.close(started_write)
        try:  # wait for its setsid: the harness may killpg(pid) as soon as it has the pid
            if read_line(started_read, REPLY_TIMEOUT) != b"started":
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                raise RuntimeError("the forked child died before it started")
        finally:
            os.close(started_read)
        return pid

    def close_in_child(self, conn: socket.socket) -> None:
        """The server's own fds, closed in a fresh child: a candidate gets no handle on the server."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for sock in (self.control, conn, *self.children.values()):
            sock.close()  # only this process's copy: the server keeps its own
        os.close(self.wake_read)
        os.close(self.wake_write)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.send(json.dumps({"status": status}).encode())
                conn.close()


def preload() -> None:
    """Import PRELOADED without the one CUDA call it makes: on import it asks `torch.cuda.is_available()` (a
    `cudaGetDeviceCount`, only to warn when CUDA_HOME is set but no GPU is seen), which initialises the driver
    here, and every fork of a process that did that fails its first CUDA call ("Cannot re-initialize CUDA in
    forked subprocess", torch 2.11 on an H200 host). Nothing else of the module depends on the answer."""
    import torch

    asked = torch.cuda.is_available
    torch.cuda.is_available = lambda: True
    try:
        importlib.import_module(PRELOADED)
    finally:
        torch.cuda.is_available = asked


def serve_forever(control_fd: int, parent: int) -> None:
    """The server's life: die with the harness, import, say ready, fork on request."""
    signal.signal(signal.SIGTERM, _exit_on_signal)  # so the cleanup below runs (children die either way)
    die_with_parent(signal.SIGTERM)
    if os.getppid() != parent:  # the harness died before the line above took effect
        return
    keep_memory_private()  # candidates (same user) cannot write into this process's memory
    try:
        import torch  # noqa: F401  (the point of the server: imported once, before any fork)

        preload()
        importlib.import_module(WORKER_MODULE)  # its imports (timing binds its clocks here); rerun per child
        skip_library_finalizers()  # what the imports registered: no worker spends its exit tearing them down

        if token_address() is None:
            raise RuntimeError(f"no {TOKEN_VAR} placeholder in this process's environment block")
        control = socket.socket(fileno=control_fd)
        import_fds = frozenset(open_fds()) - {0, 1, 2, control_fd}
    except Exception as exc:
        os.write(1, f"error: {type(exc).__name__}: {exc}\n".encode())
        return
    server = _Server(control, parent, import_fds)
    os.write(1, b"ready\n")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # nothing more to say; the harness stops reading
    os.close(devnull)
    try:
        server.run()
    finally:
        # The harness's death closes our lifeline (EOF) before the kernel sends PR_SET_PDEATHSIG: a SIGTERM
        # landing in here must not cut the children's cleanup short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        server.shutdown()


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    parser = argparse.ArgumentParser(description="kbeval fork server (started by the harness, not by hand)")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    args = parser.parse_args()
    serve_forever(args.control_fd, args.parent)
    # Its children are killed and it has nothing to flush: skip the interpreter's teardown of torch (a second
    # or more, which the harness would wait for at its own exit).
    os._exit(0)


if __name__ == "__main__":
    main()
