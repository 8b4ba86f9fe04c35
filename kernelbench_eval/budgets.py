"""Every time limit of a run in one value, `Budgets`: what each limit bounds, and its default, written here once.

Why one value: the command line has two options for them, and each sets two limits (`Budgets.of`: `--timeout`
bounds a candidate's evaluation and its problem's reference, `--compile-timeout` a build and the torch.compile
baseline). Below the command line every limit is read from here by name, where it is enforced, so a limit
cannot be confused with another or take a default written somewhere else.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Budgets:
    """Seconds each thing may take before its worker is killed (a `timeout` verdict, or a reference error)."""

    # one candidate's evaluation, from its load (after any wait for its build's lock): trials and timing together
    candidate: float = 300.0
    # opening a problem's reference (its inputs, expected outputs and eager baseline), each later request to its
    # checker, and each timing of the reference alone
    reference: float = 300.0
    # one candidate's build: its import (which builds its extensions) and its warm-up call together
    build: float = 600.0
    # the reference under torch.compile, in a worker of its own (compiling included)
    compiled_baseline: float = 600.0
    # `kbeval problems`: one problem imported and its input shapes made, in a worker of its own
    describe: float = 120.0

    @classmethod
    def of(cls, timeout: float, compile_timeout: float) -> Budgets:
        """The limits the command line's `--timeout` and `--compile-timeout` set."""
        return cls(candidate=timeout, reference=timeout, build=compile_timeout, compiled_baseline=compile_timeout)


DEFAULT = Budgets()
