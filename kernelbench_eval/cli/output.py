"""Where the command line writes: results to stdout, warnings and errors to stderr, each error one line.

Bad input must cost one clear line and exit 2, never a traceback: every command raises `usage_error(...)`
for it, so the wording and the exit code are decided here once.
"""

from __future__ import annotations

from pathlib import Path

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from kernelbench_eval.records import Verdict
from kernelbench_eval.results.report import load_run

console = Console()
err = Console(stderr=True)


def warn(message: str) -> None:
    err.print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True)


def usage_error(message: object) -> typer.Exit:
    """One line on stderr, exit 2; pydantic's multi-line errors are cut to their first field's."""
    if isinstance(message, ValidationError):
        first = message.errors()[0]
        message = f"--{'-'.join(str(p) for p in first['loc']).replace('_', '-')}: {first['msg']}"
    err.print(f"[red]error:[/] {escape(str(message))}", soft_wrap=True)
    return typer.Exit(2)


def load_run_or_exit(run_dir: Path) -> list[Verdict]:
    try:
        return load_run(run_dir)
    except (OSError, ValueError) as exc:  # missing, unreadable, or a folder where verdicts.jsonl should be
        raise usage_error(exc if isinstance(exc, (FileNotFoundError, ValueError)) else f"{run_dir}: {exc}") from exc
