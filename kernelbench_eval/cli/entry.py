"""The `kbeval` program: the command line (`cli`), with the fork server started first and a quick way out.

Why not `cli.app` directly: importing the command line imports torch (seconds), and so does the fork server
every worker comes from (`forkserver`); started before that import, the server is ready by the time the
first compile or reference needs a worker, instead of starting then. And at the end, tearing down an
interpreter that holds torch takes a second or more that nobody waits for on purpose: once the command is
done (its files written and closed, its output flushed, the `atexit` handlers run: the fork server and the
private temp folder go there), the process leaves with `os._exit`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading

from kernelbench_eval import interrupts
from kernelbench_eval.isolation.teardown import skip_library_finalizers

WORKER_COMMANDS = frozenset({"run", "eval", "problems", "profile", "selftest"})  # commands that start workers
COMMANDS = WORKER_COMMANDS | {"report", "compare", "gate"}


def main() -> None:
    code: object = 0
    try:
        with interrupts.handled():  # first: a Ctrl-C while torch imports is one line too, never a traceback
            if _starts_workers_here(sys.argv[1:]):
                from kernelbench_eval.isolation.workerenv import prestart  # light: no torch

                prestart()
            from kernelbench_eval.cli.app import app

            clicks = _click_exceptions()
            try:
                returned = app(prog_name="kbeval", standalone_mode=False)  # (click's own exits come back here)
                code = returned if isinstance(returned, int) else 0
            except clicks.ClickException as exc:  # a usage error: one line, not click's usage block
                if type(exc).__name__ == "NoArgsIsHelpError":  # `kbeval` alone: the help, as asked
                    print(exc.format_message())
                    leave(0)
                command = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] in COMMANDS else ""
                print(f"error: {exc.format_message()} (kbeval {command} --help says more)".replace("  ", " "),
                      file=sys.stderr)
                code = exc.exit_code
    except SystemExit as exc:
        code = exc.code
    except interrupts.Interrupted as exc:  # every process it started is killed; nothing unfinished recorded
        with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone
            print(f"\nkbeval: {exc}", file=sys.stderr, flush=True)
        code = exc.exit_code
    leave(code)


def _click_exceptions():  # noqa: ANN202 (a module)
    """The exceptions of the click that typer runs on: its own vendored copy in newer releases, else click."""
    try:
        from typer._click import exceptions  # type: ignore[import-not-found]
    except ImportError:
        from click import exceptions
    return exceptions


def _starts_workers_here(argv: list[str]) -> bool:
    """A command that starts workers on this host (with Ray, lanes and compiles run elsewhere)."""
    ray = "--backend=ray" in argv or any(a == "--backend" and b == "ray" for a, b in zip(argv, argv[1:], strict=False))
    return bool(argv) and argv[0] in WORKER_COMMANDS and not ray and "--help" not in argv


def leave(code: object) -> None:
    """Exit as the interpreter would (threads joined, `atexit` handlers, output flushed), minus its teardown."""
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"), as the interpreter reports it
        print(code, file=sys.stderr)
        code = 1
    shutdown = getattr(threading, "_shutdown", None)  # what the interpreter runs first at exit: threading's
    if shutdown is not None:  # own exit hooks (thread pools), then every non-daemon thread joined
        shutdown()
    else:
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
    skip_library_finalizers()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code & 0xFF)
