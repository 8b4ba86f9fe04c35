"""Interrupts (SIGINT, SIGTERM, SIGHUP) as a normal way for a command to end: it stops within seconds, every
process it started is killed (compilers included), nothing is recorded for a candidate not judged to the end,
and one line says how to finish the work (`kbeval run --resume`).

Why a flag first and an exception only after: a signal's handler runs in the main thread while compiles and
lanes run in others. Raised there at once, an exception unwinds the main thread while the others go on and
record what the dying workers made of their candidates (the one being judged `crashed`, the rest `skipped`
once the temp folder was gone: issue 37). So the handler sets the flag first and only then kills the workers
(`track`); every place that would turn a worker's death into a verdict asks the flag first and raises
`Interrupted` instead (a `BaseException`, so no `except Exception` that makes failures into verdicts takes
it), and the recorder records nothing once the flag is set. Inside `deferred()` (the run's judging) the main
thread is not interrupted at all: the work winds down by itself and `deferred` raises at its end. A second
signal, or `GRACE` seconds without the work ending, leaves at once (the workers killed again, the exit
handlers run).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
GRACE = 20.0  # seconds the work may take to wind down after the first signal before the process leaves anyway

Kill = Callable[[], None]


class Interrupted(BaseException):
    """The command was interrupted by a signal; nothing unfinished was recorded."""

    def __init__(self, signum: int, detail: str = "", run_dir: object = None) -> None:
        super().__init__(signum, detail)
        self.signum = signum
        self.detail = detail  # what was and was not recorded
        self.run_dir = run_dir  # the run folder a resume would finish, where there is one
        self.hint = ""  # how to finish the work, said by the command that knows (`kbeval run --resume ...`)

    def __str__(self) -> str:
        return "; ".join(filter(None, [f"interrupted by {self.signal_name}" + (f": {self.detail}" if self.detail
                                                                               else ""), self.hint]))

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name if self.signum in signal.valid_signals() else str(self.signum)

    @property
    def exit_code(self) -> int:
        """What a shell reports for a process killed by that signal (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + self.signum


_lock = threading.Lock()
_event = threading.Event()
_signum = 0
_kills: dict[int, Kill] = {}
_next = 0
_deferring = 0


def requested() -> bool:
    """Whether a stop was asked for (by a signal, or `request`)."""
    return _event.is_set()


def check() -> None:
    """Raise `Interrupted` if a stop was asked for: call it before starting work that would be lost."""
    if _event.is_set():
        raise Interrupted(_signum)


def current() -> Interrupted | None:
    """The interruption asked for, if any (to raise with more detail)."""
    return Interrupted(_signum) if _event.is_set() else None


def track(kill: Kill) -> int:
    """Register how to kill a process tree this command started; returns the handle for `untrack`.

    If a stop was already asked for, the tree is killed now (it started after the kill round)."""
    global _next
    with _lock:
        _next += 1
        _kills[_next] = kill
        handle = _next
    if _event.is_set():
        _quietly(kill)
    return handle


def untrack(handle: int) -> None:
    with _lock:
        _kills.pop(handle, None)


def request(signum: int) -> bool:
    """Ask every part of the command to stop and kill every tracked process tree; False if already asked."""
    global _signum
    with _lock:
        if _event.is_set():
            return False
        _signum = signum
        _event.set()  # first: whatever a kill below causes is seen after the flag
    threading.Thread(target=_kill_all, name="kbeval-interrupt", daemon=True).start()
    return True


def reset() -> None:
    """Forget a stop (tests, and a process that judges again after handling one)."""
    global _signum
    with _lock:
        _event.clear()
        _signum = 0


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """The command's signal handlers, in place while it runs (main thread only; elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _on_signal) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Work spread over threads: a signal stops it through the flag (workers killed), not by an exception in
    the main thread; `Interrupted` is raised when the block ends (also when it ended by another exception)."""
    global _deferring
    with handled():
        _deferring += 1
        try:
            yield
        finally:
            _deferring -= 1
            check()


def _on_signal(signum: int, _frame: object) -> None:
    if not request(signum):  # a second signal: the user means it
        _leave(signum, "second signal")
    threading.Thread(target=_watchdog, args=(signum,), name="kbeval-interrupt-grace", daemon=True).start()
    if not _deferring:
        raise Interrupted(signum)


def _kill_all() -> None:
    with _lock:
        kills = list(_kills.values())
    for kill in kills:
        _quietly(kill)


def _quietly(kill: Kill) -> None:
    with contextlib.suppress(Exception):
        kill()


def _watchdog(signum: int) -> None:
    """Leave if the work has not wound down within GRACE seconds (something waits on what a kill cannot end)."""
    if not _finished.wait(GRACE):
        _leave(signum, f"still winding down after {GRACE:.0f} s")


_finished = threading.Event()
atexit.register(_finished.set)  # the process is leaving normally: the watchdog has nothing to do


def _leave(signum: int, why: str) -> None:
    _kill_all()
    with contextlib.suppress(Exception):
        sys.stderr.write(f"\nkbeval: interrupted by {signal.Signals(signum).name} ({why}); leaving now\n")
        sys.stderr.flush()
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()  # the private temp folder and the fork servers go
    os._exit(128 + signum)
