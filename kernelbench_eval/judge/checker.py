"""The checker's life: the reference's worker process, started once per problem and lane, and what befalls it
while the problem's candidates are judged (parked between uses, broken when it fails, put back as opened).

Apart from `reference` because the worker's life is the same whatever it is asked: every request under the
reference's time limit, a failure marking it broken (so the lane opens the problem again for the next
candidate), and its peak memory noted from every reply.
"""

from __future__ import annotations

import shutil
import tempfile
from contextlib import ExitStack
from pathlib import Path

from kernelbench_eval.isolation.process import WorkerFailure, WorkerProcess
from kernelbench_eval.judge.measure import Deadline
from kernelbench_eval.judge.refguard import Sched, settle_reference, snapshot
from kernelbench_eval.requests import ParkRequest, R, Request


class ReferenceFailure(WorkerFailure):
    """The checker failed while a candidate was being judged: the reference must be opened again."""


class Checker:
    """The reference's worker (None until `start`), in a folder of its own that no candidate reads."""

    def __init__(self, log: Path, env: dict[str, str], time_limit: float) -> None:
        self.log, self.env, self.time_limit = log, env, time_limit  # env: the lane's (its GPU)
        self.workdir = Path(tempfile.mkdtemp(prefix="kbeval-ref-"))
        self.worker: WorkerProcess | None = None
        self.sched: dict[int, Sched] = {}  # how its threads were scheduled once opened (`refguard`)
        self.broken = False  # it failed mid-candidate: open the problem again for the next one
        self.parked = False  # it freed what only a timing needed (until its lane uses it again)
        self.peak_bytes: int | None = None  # its peak memory, as its replies reported it
        self._stack = ExitStack()

    def start(self) -> WorkerProcess:
        self.worker = self._stack.enter_context(WorkerProcess(self.workdir, self.log, self.env,
                                                              time_limit=self.time_limit, role="checker"))
        return self.worker

    def ask(self, req: Request[R], deadline: Deadline) -> R:
        """A request while the reference is being opened: a failure is the problem's (`ReferenceSide.error`)."""
        assert self.worker is not None
        return self.worker.call(req, deadline.left())

    def call(self, req: Request[R]) -> R:
        """A request once it is open; a failure marks it broken and is raised as a ReferenceFailure."""
        assert self.worker is not None
        try:
            reply = self.worker.call(req, self.time_limit)
            self.note_peak(reply.peak_bytes)
            return reply
        except WorkerFailure as exc:
            self.broken = True
            raise ReferenceFailure("crashed", f"the reference's worker failed ({exc.message})") from exc

    def note_peak(self, peak: int | None) -> None:
        if peak is not None:
            self.peak_bytes = max(self.peak_bytes or 0, peak)

    @property
    def pid(self) -> int | None:
        return self.worker.proc.pid if self.worker is not None and self.worker.proc else None

    def remember_sched(self) -> None:
        """How its threads are scheduled now, just opened: what `settle` puts back."""
        self.sched = snapshot(self.pid) if self.pid is not None else {}

    def settle(self) -> None:
        """Put it back as opened before a candidate starts; what could not be put back marks it broken (the next
        candidate gets a reference opened afresh)."""
        pid = self.pid
        if pid is not None and self.sched and not settle_reference(pid, self.sched):
            self.broken = True

    def mark_broken(self) -> None:
        """Something beside it (`refguard.Guard`) left it in a state it cannot be trusted in."""
        self.broken = True

    def park(self) -> None:
        """Free its timing leftovers while other problems are judged; a failure marks it broken."""
        if self.parked or self.worker is None or self.broken:
            return
        try:
            self.call(ParkRequest())
            self.parked = True
        except ReferenceFailure:
            pass  # broken now: the next candidate of this problem opens it again

    def unpark(self) -> None:
        """In use again (the worker takes back what it freed as it is asked for it)."""
        self.parked = False

    def close(self) -> None:
        self._stack.close()
        shutil.rmtree(self.workdir, ignore_errors=True)
