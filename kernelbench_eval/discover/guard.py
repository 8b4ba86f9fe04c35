"""What the pipeline keeps of each problem so that no candidate can change what the next one is judged on.

A candidate runs as the same user, so it could edit a problem's file between discovery and the reference's
import (adding dead work to slow the reference, say) and restore it with its old mtime. `References` hands the
lanes the harness's private copy of each problem's discovered bytes (`discover.pinned`), re-verified before
every candidate. The reference's inputs need no such care: the checker makes them from secret seeds and keeps
them in its own (non-dumpable) memory, never in a file (`judge.reference_side`). What the reference says names the
user's file, never the copy (`user_paths`).
"""

from __future__ import annotations

import threading

from kernelbench_eval.discover.corpus import Problem, pinned


class References:
    def __init__(self, problems: dict[str, Problem]) -> None:
        self.problems = problems  # as discovered (bytes kept)
        self._pinned: dict[str, Problem] = {}
        self._lock = threading.Lock()  # lanes and build threads ask at once; a copy is written by one at a time

    def problem(self, problem_id: str) -> Problem:
        """The problem as the reference imports it (and a build's warm-up and names read it): the verified private
        copy (`ProblemChanged`, `OSError`)."""
        with self._lock:
            problem = self._pinned.get(problem_id)
            if problem is None:
                problem = self._pinned[problem_id] = pinned(self.problems[problem_id])
            else:
                pinned(problem)  # re-verified, and rewritten if altered, before each candidate
            return problem


def user_paths(problem: Problem, text: str) -> str:
    """`text` with the harness's private copy of `problem` named as the user's file.

    Why: the reference imports the private copy (`pinned`), so its errors (a problem without `get_inputs`, a
    traceback's file) name `<temp>/kbeval-run-.../problems/<hash>/<file>.py`, a path nobody can open or fix.
    """
    if problem.origin is None:
        return text
    for private in sorted({str(problem.path.resolve()), str(problem.path)}, key=len, reverse=True):
        text = text.replace(private, str(problem.origin))
    return text
