"""What the pipeline keeps of each reference so that no candidate can change what the next one is judged on.

Two things a candidate (same user) could otherwise alter between discovery and a later candidate's check:
the problem's file (the reference imports it) and the reference's input files (every candidate gets copies
of them). `References` hands the lanes the harness's private copy of each problem's discovered bytes
(`discover.pinned`, re-verified before every candidate) and seals each reference's input files the moment
its session opens (`private.seal_inputs`), checking the seal after every candidate; an altered set is
closed, so the next candidate's reference regenerates it. Until evaluate.py verifies each copy it makes
(`private.copy_sealed`), this after-the-fact check is the defence. A Ray lane keeps its reference in its
actor, out of reach from here: only the problem copy applies there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kernelbench_eval import private
from kernelbench_eval.discover import Problem, pinned


class References:
    def __init__(self, problems: dict[str, Problem]) -> None:
        self.problems = problems  # as discovered (bytes kept)
        self._pinned: dict[str, Problem] = {}
        self._seals: dict[int, tuple[Any, dict[str, str]]] = {}  # id(lane) -> (its session, input digests)

    def problem(self, problem_id: str) -> Problem:
        """The problem as the reference imports it: the verified private copy (`ProblemChanged`, `OSError`)."""
        problem = self._pinned.get(problem_id)
        if problem is None:
            problem = self._pinned[problem_id] = pinned(self.problems[problem_id])
        else:
            pinned(problem)  # re-verified, and rewritten if altered, before each candidate
        return problem

    def open(self, lane: Any, problem: Problem, ref_log: Path) -> str | None:
        """Open (or keep) a local lane's reference and seal its inputs; the problem's warning when opened now."""
        open_session = getattr(lane, "_session_for", None)
        if open_session is None or not open_session(problem, ref_log):
            return None
        session = lane.session
        self._seals[id(lane)] = (session, {} if session.error else private.seal_inputs(session.workdir))
        return session.warning

    def intact(self, lane: Any) -> bool:
        """False, with the lane's reference closed (to be regenerated), when its sealed inputs changed."""
        session = getattr(lane, "session", None)
        sealed = self._seals.get(id(lane))
        if session is None or sealed is None or sealed[0] is not session or session.error:
            return True
        if private.seal_inputs(session.workdir) == sealed[1]:
            return True
        lane.close()
        del self._seals[id(lane)]
        return False
