"""What the pipeline keeps of each problem so that no candidate can change what the next one is judged on.

A candidate runs as the same user, so it could edit a problem's file between discovery and the reference's
import (adding dead work to slow the reference, say) and restore it with its old mtime. `References` hands the
lanes the harness's private copy of each problem's discovered bytes (`discover.pinned`), re-verified before
every candidate. The reference's inputs need no such care: the checker makes them from secret seeds and keeps
them in its own (non-dumpable) memory, never in a file (`judge.reference`).
"""

from __future__ import annotations

from kernelbench_eval.discover.corpus import Problem, pinned


class References:
    def __init__(self, problems: dict[str, Problem]) -> None:
        self.problems = problems  # as discovered (bytes kept)
        self._pinned: dict[str, Problem] = {}

    def problem(self, problem_id: str) -> Problem:
        """The problem as the reference imports it: the verified private copy (`ProblemChanged`, `OSError`)."""
        problem = self._pinned.get(problem_id)
        if problem is None:
            problem = self._pinned[problem_id] = pinned(self.problems[problem_id])
        else:
            pinned(problem)  # re-verified, and rewritten if altered, before each candidate
        return problem
