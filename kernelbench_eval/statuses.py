"""The statuses a verdict can have, once: the list, how the terminal and the HTML report colour each, and
how a run's statuses are counted (every table, summary and badge uses these, so a new status is added here
and nowhere else)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Literal, get_args

Status = Literal[
    "ok",
    "incorrect",
    "compile_error",
    "load_error",
    "runtime_error",
    "suspicious",
    "timeout",
    "crashed",
    "skipped",
]
STATUSES: tuple[str, ...] = get_args(Status)

# status: (rich style in the terminal, background colour of its badge in report.html)
LOOK: dict[str, tuple[str, str]] = {
    "ok": ("green", "#1a7f37"),
    "suspicious": ("bold yellow", "#9a6700"),
    "incorrect": ("red", "#cf222e"),
    "compile_error": ("magenta", "#8250df"),
    "load_error": ("magenta", "#8250df"),
    "runtime_error": ("red", "#cf222e"),
    "timeout": ("yellow", "#bf8700"),
    "crashed": ("bold red", "#a40e26"),
    "skipped": ("dim", "#6e7781"),
}
UNKNOWN_LOOK = ("", "#6e7781")  # a status of a newer harness, read by this one


def style(status: str) -> str:
    return LOOK.get(status, UNKNOWN_LOOK)[0]


def colour(status: str) -> str:
    return LOOK.get(status, UNKNOWN_LOOK)[1]


def counts(statuses: Iterable[str]) -> dict[str, int]:
    """How many of each status, by name."""
    return dict(sorted(Counter(statuses).items()))
